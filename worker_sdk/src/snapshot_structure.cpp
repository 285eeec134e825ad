#include "ddprun/sdk/snapshot_structure.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

namespace ddprun::sdk {
namespace {

// ---- bytes ------------------------------------------------------------------------------------

/// Text from the file for a message: printable ASCII as it is, other bytes as \xNN, at most
/// `max` bytes of it.
std::string printable(std::string_view s, size_t max = 64) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

std::string hex_of(uint64_t v) {
  char out[24];
  std::snprintf(out, sizeof out, "0x%llx", static_cast<unsigned long long>(v));
  return out;
}

/// Little-endian reads from a file whose size the caller has checked against.
class Bytes {
 public:
  explicit Bytes(std::string_view s)
      : p_(reinterpret_cast<const unsigned char*>(s.data())), n_(s.size()) {}
  uint64_t size() const { return n_; }
  /// True when [at, at + len) lies inside the file.
  bool has(uint64_t at, uint64_t len) const { return at <= n_ && len <= n_ - at; }
  uint16_t u16(uint64_t at) const { return static_cast<uint16_t>(p_[at] | p_[at + 1] << 8); }
  uint32_t u32(uint64_t at) const {
    return static_cast<uint32_t>(u16(at)) | static_cast<uint32_t>(u16(at + 2)) << 16;
  }
  uint64_t u64(uint64_t at) const {
    return static_cast<uint64_t>(u32(at)) | static_cast<uint64_t>(u32(at + 4)) << 32;
  }
  std::string_view view(uint64_t at, uint64_t len) const {
    return {reinterpret_cast<const char*>(p_ + at), static_cast<size_t>(len)};
  }

 private:
  const unsigned char* p_;
  uint64_t n_;
};

// ---- zip --------------------------------------------------------------------------------------

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr uint64_t kLocalSize = 30;
constexpr uint64_t kCentralSize = 46;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kLocatorSize = 20;
constexpr uint64_t kEnd64Size = 56;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kFlagEncrypted = 0x0001 | 0x0040;
constexpr uint16_t kFlagDataDescriptor = 0x0008;

/// A central directory entry with where its local header and data lie.
struct Entry {
  ZipRecord record;
  uint64_t header = 0;  // offset of its local header
};

/// The central directory's place and size, from the end record (and its zip64 twin).
struct Directory {
  uint64_t entries = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
  uint64_t limit = 0;  // the first end record: the directory stops before it
};

std::variant<Directory, std::string> read_end_records(const Bytes& f) {
  if (f.size() < kEndSize)
    return "the file is " + std::to_string(f.size()) +
           " bytes, too short for a zip (its end record alone is 22)";
  // The end record is the last 22 bytes, followed by a comment of up to 65535 bytes: the last
  // signature whose comment length reaches exactly to the end of the file.
  const uint64_t lowest = f.size() > kEndSize + 0xffff ? f.size() - kEndSize - 0xffff : 0;
  std::optional<uint64_t> end_at;
  for (uint64_t at = f.size() - kEndSize;; --at) {
    if (f.u32(at) == kEndSig && at + kEndSize + f.u16(at + 20) == f.size()) {
      end_at = at;
      break;
    }
    if (at == lowest) break;
  }
  if (!end_at) return std::string("no zip end record at the end of the file (torn, or not a zip)");
  const uint64_t e = *end_at;
  if (f.u16(e + 4) != 0 || f.u16(e + 6) != 0)
    return "zip end record: a multi-disk archive (disk " + std::to_string(f.u16(e + 4)) + ")";
  Directory d;
  d.entries = f.u16(e + 10);
  d.size = f.u32(e + 12);
  d.offset = f.u32(e + 16);
  d.limit = e;
  if (f.u16(e + 8) != d.entries)
    return "zip end record: " + std::to_string(f.u16(e + 8)) + " entries on this disk but " +
           std::to_string(d.entries) + " in all (a multi-disk archive)";
  const bool zip64 = e >= kLocatorSize && f.u32(e - kLocatorSize) == kLocator64Sig;
  if (!zip64) {
    if (d.entries == 0xffff || d.size == 0xffffffff || d.offset == 0xffffffff)
      return std::string("zip end record: its fields say zip64, but there is no zip64 locator");
    return d;
  }
  // miniz (torch's writer) always adds the zip64 end record and its locator.
  const uint64_t loc = e - kLocatorSize;
  const uint64_t end64 = f.u64(loc + 8);
  if (f.u32(loc + 4) != 0 || f.u32(loc + 16) > 1)
    return std::string("zip64 locator: a multi-disk archive");
  if (end64 > loc || loc - end64 < kEnd64Size)
    return "zip64 locator: its end record offset " + std::to_string(end64) +
           " is not 56 bytes or more before the locator at " + std::to_string(loc);
  if (f.u32(end64) != kEnd64Sig)
    return "zip64 end record: no signature at offset " + std::to_string(end64) +
           " where the locator points";
  if (f.u64(end64 + 4) != loc - end64 - 12)
    return "zip64 end record: its size field (" + std::to_string(f.u64(end64 + 4)) +
           ") does not reach the locator at " + std::to_string(loc);
  const uint64_t here64 = f.u64(end64 + 24);
  const uint64_t entries64 = f.u64(end64 + 32);
  const uint64_t size64 = f.u64(end64 + 40);
  const uint64_t offset64 = f.u64(end64 + 48);
  if (f.u32(end64 + 16) != 0 || f.u32(end64 + 20) != 0 || here64 != entries64)
    return std::string("zip64 end record: a multi-disk archive");
  auto agree = [](uint64_t classic, uint64_t saturated, uint64_t wide) {
    return classic == saturated || classic == wide;
  };
  if (!agree(d.entries, 0xffff, entries64) || !agree(d.size, 0xffffffff, size64) ||
      !agree(d.offset, 0xffffffff, offset64))
    return "zip end records disagree: " + std::to_string(d.entries) + " entries, " +
           std::to_string(d.size) + " directory bytes at " + std::to_string(d.offset) +
           " in the classic one; " + std::to_string(entries64) + ", " + std::to_string(size64) +
           " at " + std::to_string(offset64) + " in the zip64 one";
  d.entries = entries64;
  d.size = size64;
  d.offset = offset64;
  d.limit = end64;
  return d;
}

/// A record name's characters: no control bytes, no backslash (a zip name is '/'-separated).
bool plain_name(std::string_view name) {
  return !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f || c == '\\';
  });
}

std::variant<std::vector<Entry>, std::string> read_directory(const Bytes& f, const Directory& d) {
  if (d.offset > d.limit || d.size > d.limit - d.offset)
    return "zip central directory: offset " + std::to_string(d.offset) + " + size " +
           std::to_string(d.size) + " runs past its end record at " + std::to_string(d.limit);
  // Checked before anything is parsed, so a huge count costs nothing.
  if (d.entries > d.size / kCentralSize)
    return "zip end record: " + std::to_string(d.entries) +
           " entries cannot fit in a central directory of " + std::to_string(d.size) +
           " bytes (46 bytes each at least)";
  std::vector<Entry> out;
  const uint64_t dir_end = d.offset + d.size;
  uint64_t at = d.offset;
  for (uint64_t i = 0; i < d.entries; ++i) {
    const std::string where = "zip central directory entry " + std::to_string(i);
    if (dir_end - at < kCentralSize || f.u32(at) != kCentralSig)
      return where + ": no entry signature at offset " + std::to_string(at);
    const uint16_t flags = f.u16(at + 8);
    const uint16_t method = f.u16(at + 10);
    uint64_t csize = f.u32(at + 20);
    uint64_t usize = f.u32(at + 24);
    const uint64_t name_len = f.u16(at + 28);
    const uint64_t extra_len = f.u16(at + 30);
    const uint64_t comment_len = f.u16(at + 32);
    uint64_t disk = f.u16(at + 34);
    uint64_t header = f.u32(at + 42);
    if (kCentralSize + name_len + extra_len + comment_len > dir_end - at)
      return where + ": its name, extra field and comment run past the directory's end";
    const std::string_view name = f.view(at + kCentralSize, name_len);
    if (!plain_name(name))
      return where + ": name \"" + printable(name) + "\" is empty or has control characters";
    const std::string rec = "record " + printable(name, 256);
    if (flags & kFlagEncrypted) return rec + ": encrypted (zip flags " + hex_of(flags) + ")";
    if (method != 0)
      return rec + ": compression method " + std::to_string(method) +
             " (torch stores records uncompressed, method 0)";
    // zip64 extra field: the 8-byte values of exactly the fields saturated above, in this order.
    const uint64_t extra_at = at + kCentralSize + name_len;
    const bool wide_usize = usize == 0xffffffff;
    const bool wide_csize = csize == 0xffffffff;
    const bool wide_header = header == 0xffffffff;
    const bool wide_disk = disk == 0xffff;
    bool have_zip64 = false;
    for (uint64_t x = 0; x + 4 <= extra_len;) {
      const uint16_t id = f.u16(extra_at + x);
      const uint64_t len = f.u16(extra_at + x + 2);
      if (len > extra_len - x - 4)
        return rec + ": extra field " + hex_of(id) + " of " + std::to_string(len) +
               " bytes runs past its extra area";
      if (id == kZip64ExtraId && !have_zip64) {
        have_zip64 = true;
        const uint64_t need = 8 * (wide_usize + wide_csize + wide_header) + 4 * wide_disk;
        if (len < need)
          return rec + ": its zip64 extra field is " + std::to_string(len) +
                 " bytes, too short for the " + std::to_string(need) + " it must hold";
        uint64_t v = extra_at + x + 4;
        if (wide_usize) usize = f.u64(v), v += 8;
        if (wide_csize) csize = f.u64(v), v += 8;
        if (wide_header) header = f.u64(v), v += 8;
        if (wide_disk) disk = f.u32(v);
      }
      x += 4 + len;
    }
    if ((wide_usize || wide_csize || wide_header || wide_disk) && !have_zip64)
      return rec + ": its sizes or offset say zip64, but it has no zip64 extra field";
    if (disk != 0) return rec + ": on disk " + std::to_string(disk) + " of a multi-disk archive";
    if (csize != usize)
      return rec + ": stored, yet its compressed size " + std::to_string(csize) +
             " differs from its size " + std::to_string(usize);
    // The local header, then the data, all before the central directory.
    if (header > d.offset || d.offset - header < kLocalSize)
      return rec + ": its local header offset " + std::to_string(header) +
             " is not before the central directory at " + std::to_string(d.offset);
    if (f.u32(header) != kLocalSig)
      return rec + ": no local header signature at offset " + std::to_string(header);
    const uint16_t local_flags = f.u16(header + 6);
    const uint16_t local_method = f.u16(header + 8);
    const uint64_t local_csize = f.u32(header + 18);
    const uint64_t local_usize = f.u32(header + 22);
    const uint64_t local_name_len = f.u16(header + 26);
    const uint64_t local_extra_len = f.u16(header + 28);
    if (local_method != 0)
      return rec + ": its local header says compression method " + std::to_string(local_method);
    if (kLocalSize + local_name_len + local_extra_len > d.offset - header)
      return rec + ": its local header at " + std::to_string(header) +
             " runs into the central directory";
    if (f.view(header + kLocalSize, local_name_len) != name)
      return rec + ": its local header names it \"" +
             printable(f.view(header + kLocalSize, local_name_len)) + "\"";
    // With a data descriptor (torch's writer sets flag 3) the local sizes are zero; without one
    // they must be the directory's, unless they defer to a zip64 extra field.
    if (!(local_flags & kFlagDataDescriptor) && local_csize != 0xffffffff &&
        (local_csize != csize || local_usize != usize))
      return rec + ": its local header says " + std::to_string(local_usize) +
             " bytes, the central directory " + std::to_string(usize);
    const uint64_t data = header + kLocalSize + local_name_len + local_extra_len;
    if (usize > d.offset - data)
      return rec + ": its " + std::to_string(usize) + " bytes at offset " + std::to_string(data) +
             " run past the central directory at " + std::to_string(d.offset);
    Entry entry;
    entry.record.name = std::string(name);
    entry.record.offset = data;
    entry.record.size = usize;
    entry.header = header;
    out.push_back(std::move(entry));
    at += kCentralSize + name_len + extra_len + comment_len;
  }
  if (at != dir_end)
    return "zip central directory: " + std::to_string(dir_end - at) + " stray bytes after its " +
           std::to_string(d.entries) + " entries";
  // No two entries share a name or a byte.
  std::vector<const Entry*> by_name;
  for (const Entry& e : out) by_name.push_back(&e);
  std::sort(by_name.begin(), by_name.end(),
            [](const Entry* a, const Entry* b) { return a->record.name < b->record.name; });
  for (size_t i = 1; i < by_name.size(); ++i)
    if (by_name[i]->record.name == by_name[i - 1]->record.name)
      return "record " + printable(by_name[i]->record.name, 256) +
             " appears twice in the zip directory";
  std::vector<const Entry*> by_place = by_name;
  std::sort(by_place.begin(), by_place.end(),
            [](const Entry* a, const Entry* b) { return a->header < b->header; });
  for (size_t i = 1; i < by_place.size(); ++i) {
    const Entry& a = *by_place[i - 1];
    const Entry& b = *by_place[i];
    if (a.record.offset + a.record.size > b.header)
      return "record " + printable(a.record.name, 256) + " (bytes " + std::to_string(a.header) +
             " to " + std::to_string(a.record.offset + a.record.size) + ") overlaps record " +
             printable(b.record.name, 256) + " at " + std::to_string(b.header);
  }
  return out;
}

// ---- data.pkl ---------------------------------------------------------------------------------

struct Dtype {
  std::string_view storage;  // the class torch.<storage> in the persistent id
  std::string_view name;
  int64_t size;
};

// What torch::pickle_save (c10::toString(dtype) + "Storage") and torch.save
// (TypedStorage.pickle_storage_type()) name the storages of plain CPU tensors.
constexpr Dtype kDtypes[] = {
    {"FloatStorage", "float32", 4},
    {"DoubleStorage", "float64", 8},
    {"HalfStorage", "float16", 2},
    {"BFloat16Storage", "bfloat16", 2},
    {"LongStorage", "int64", 8},
    {"IntStorage", "int32", 4},
    {"ShortStorage", "int16", 2},
    {"CharStorage", "int8", 1},
    {"ByteStorage", "uint8", 1},
    {"BoolStorage", "bool", 1},
    {"ComplexHalfStorage", "complex32", 4},
    {"ComplexFloatStorage", "complex64", 8},
    {"ComplexDoubleStorage", "complex128", 16},
};

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kGlobal,
  kTuple,
  kDict,
  kList,
  kStorage,
  kTensor
};

/// A pickle value as far as the check needs it. Strings point into data.pkl; tuples are shared,
/// so a memo fetch copies a pointer, never a tree.
struct Value {
  Kind kind = Kind::kNone;
  uint32_t depth = 0;     // tuples nested inside, this one included
  int64_t number = 0;     // kInt, kBool; the index of a kStorage, kTensor, kDict or kList
  std::string_view text;  // kString; kGlobal: the module
  std::string_view name;  // kGlobal: the name inside the module
  std::shared_ptr<const std::vector<Value>> items;  // kTuple
};

/// A dict or list, or a tensor: where it was first stored, for the tensor names in messages.
struct Placement {
  bool placed = false;
  int64_t parent = -1;  // the container it was stored in
  std::string key;
};

struct Storage {
  std::string key;
  const Dtype* dtype = nullptr;
  int64_t numel = 0;
};

struct Tensor {
  int64_t storage = 0;
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  Placement place;
};

/// Reads data.pkl's opcodes, keeping a stack of the values they would build, without running
/// anything: only the calls torch writes for tensors, dicts and type tags are understood. Every
/// step is bounded by the pickle's size; nothing recurses.
class PickleScanner {
 public:
  explicit PickleScanner(std::string_view data) : data_(data) {}

  /// False with error() set when data.pkl is not a pickle of tensors, dicts and plain values.
  bool scan() {
    for (;;) {
      if (pos_ >= data_.size()) return fail_at(data_.size(), "it ends without a STOP opcode");
      op_at_ = pos_;
      const auto op = static_cast<unsigned char>(data_[pos_++]);
      if (op == '.') return stop();
      if (!step(op)) return false;
    }
  }

  const std::string& error() const { return error_; }
  const std::vector<Storage>& storages() const { return storages_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }

  /// The dict keys from the top down to tensor `t`, joined by '.'.
  std::string tensor_name(const Tensor& t) const {
    if (!t.place.placed) return "(not in a dict)";
    std::vector<const std::string*> parts{&t.place.key};
    int64_t c = t.place.parent;
    // Bounded: a crafted pickle can store dicts in each other.
    for (size_t n = 0; c >= 0 && n < kMaxPickleNesting; ++n) {
      const Placement& p = containers_[static_cast<size_t>(c)];
      if (!p.placed) break;
      parts.push_back(&p.key);
      c = p.parent;
    }
    std::string out;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      if (!out.empty()) out += '.';
      out += **it;
    }
    return out;
  }

 private:
  bool fail_at(size_t at, const std::string& what) {
    error_ = "data.pkl at byte " + std::to_string(at) + ": " + what;
    return false;
  }
  bool fail(const std::string& what) { return fail_at(op_at_, what); }

  bool take(size_t n, const unsigned char*& p) {
    if (data_.size() - pos_ < n) return fail("the opcode's argument runs past the end");
    p = reinterpret_cast<const unsigned char*>(data_.data() + pos_);
    pos_ += n;
    return true;
  }
  bool take_uint(size_t n, uint64_t& v) {
    const unsigned char* p = nullptr;
    if (!take(n, p)) return false;
    v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return true;
  }
  bool take_text(uint64_t n, std::string_view& s) {
    const unsigned char* p = nullptr;
    if (n > data_.size() - pos_)
      return fail("a string of " + std::to_string(n) + " bytes runs past the end");
    if (!take(static_cast<size_t>(n), p)) return false;
    s = std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    return true;
  }
  /// A GLOBAL argument: text up to a newline, at most 256 bytes.
  bool take_line(std::string_view& s) {
    const size_t left = std::min<size_t>(data_.size() - pos_, 257);
    const void* nl = std::memchr(data_.data() + pos_, '\n', left);
    if (!nl) return fail("a GLOBAL name without its newline in 256 bytes");
    const size_t n = static_cast<size_t>(static_cast<const char*>(nl) - (data_.data() + pos_));
    s = data_.substr(pos_, n);
    pos_ += n + 1;
    return true;
  }

  size_t mark() const { return marks_.empty() ? 0 : marks_.back(); }

  bool push(Value v) {
    stack_.push_back(std::move(v));
    return true;
  }
  bool pop(Value& v) {
    if (stack_.size() <= mark()) return fail("an opcode takes a value from an empty stack");
    v = std::move(stack_.back());
    stack_.pop_back();
    return true;
  }
  /// The values above the newest MARK, which is removed.
  bool pop_to_mark(std::vector<Value>& out) {
    if (marks_.empty()) return fail("an opcode needs a MARK and there is none");
    const size_t m = marks_.back();
    marks_.pop_back();
    out.assign(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(m)),
               std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return true;
  }
  bool pop_n(size_t n, std::vector<Value>& out) {
    if (stack_.size() - mark() < n)
      return fail("an opcode takes " + std::to_string(n) + " values; the stack has fewer");
    out.assign(std::make_move_iterator(stack_.end() - static_cast<std::ptrdiff_t>(n)),
               std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return true;
  }

  bool push_tuple(std::vector<Value> items) {
    uint32_t depth = 0;
    for (const Value& v : items) depth = std::max(depth, v.depth);
    if (depth >= kMaxPickleNesting)
      return fail("tuples nested more than " + std::to_string(kMaxPickleNesting) + " deep");
    Value v;
    v.kind = Kind::kTuple;
    v.depth = depth + 1;
    v.items = std::make_shared<const std::vector<Value>>(std::move(items));
    return push(std::move(v));
  }
  bool push_container(Kind kind) {
    Value v;
    v.kind = kind;
    v.number = static_cast<int64_t>(containers_.size());
    containers_.emplace_back();
    return push(std::move(v));
  }
  bool push_int(int64_t n, Kind kind = Kind::kInt) {
    Value v;
    v.kind = kind;
    v.number = n;
    return push(std::move(v));
  }

  /// Remembers where `value` was first stored (container `c`, under `key`).
  void place(int64_t c, const std::string& key, const Value& value) {
    Placement* p = nullptr;
    if (value.kind == Kind::kTensor) p = &tensors_[static_cast<size_t>(value.number)].place;
    if ((value.kind == Kind::kDict || value.kind == Kind::kList) && value.number != c)
      p = &containers_[static_cast<size_t>(value.number)];
    if (!p || p->placed) return;
    p->placed = true;
    p->parent = c;
    p->key = key;
  }
  static std::string key_text(const Value& key) {
    if (key.kind == Kind::kString) return std::string(key.text.substr(0, 256));
    if (key.kind == Kind::kInt) return std::to_string(key.number);
    return "?";
  }

  bool set_items(const std::vector<Value>& pairs) {
    if (pairs.size() % 2 != 0) return fail("SETITEMS with an odd number of values");
    if (stack_.size() <= mark() || stack_.back().kind != Kind::kDict)
      return fail("SETITEM(S) on something that is not a dict");
    const int64_t dict = stack_.back().number;
    for (size_t i = 0; i < pairs.size(); i += 2) place(dict, key_text(pairs[i]), pairs[i + 1]);
    return true;
  }
  bool append(const std::vector<Value>& items) {
    if (stack_.size() <= mark() || stack_.back().kind != Kind::kList)
      return fail("APPEND(S) on something that is not a list");
    const int64_t list = stack_.back().number;
    for (const Value& v : items) {
      place(list, std::to_string(list_sizes_[list]), v);
      ++list_sizes_[list];
    }
    return true;
  }

  bool memo_put(uint64_t index) {
    if (stack_.size() <= mark()) return fail("a memo store with an empty stack");
    memo_[index] = stack_.back();
    return true;
  }
  bool memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end())
      return fail("a memo fetch of entry " + std::to_string(index) + ", never stored");
    return push(it->second);
  }

  /// BINPERSID: ('storage', torch.<Type>Storage, key, location, numel) becomes a storage.
  bool persistent_load() {
    Value id;
    if (!pop(id)) return false;
    const std::vector<Value>* t = id.kind == Kind::kTuple ? id.items.get() : nullptr;
    if (!t || t->size() != 5 || (*t)[0].kind != Kind::kString || (*t)[0].text != "storage" ||
        (*t)[1].kind != Kind::kGlobal || (*t)[2].kind != Kind::kString ||
        (*t)[3].kind != Kind::kString || (*t)[4].kind != Kind::kInt)
      return fail("a persistent id that is not ('storage', type, key, location, numel)");
    const Value& type = (*t)[1];
    const Dtype* dtype = nullptr;
    for (const Dtype& d : kDtypes)
      if (type.text == "torch" && type.name == d.storage) dtype = &d;
    if (!dtype)
      return fail("storage type " + printable(type.text) + "." + printable(type.name) +
                  " is not one of plain CPU tensors");
    const std::string_view key = (*t)[2].text;
    const int64_t numel = (*t)[4].number;
    if (key.empty() || key.size() > 256)
      return fail("a storage key of " + std::to_string(key.size()) + " bytes");
    if (numel < 0)
      return fail("storage '" + printable(key) + "' has " + std::to_string(numel) + " elements");
    auto [it, fresh] = storage_index_.emplace(std::string(key), storages_.size());
    if (fresh) {
      storages_.push_back(Storage{std::string(key), dtype, numel});
    } else {
      const Storage& s = storages_[it->second];
      if (s.dtype != dtype || s.numel != numel)
        return fail("storage '" + printable(key) + "' declared as " + std::to_string(s.numel) +
                    " " + std::string(s.dtype->name) + " and again as " + std::to_string(numel) +
                    " " + std::string(dtype->name) + " elements");
    }
    Value v;
    v.kind = Kind::kStorage;
    v.number = static_cast<int64_t>(it->second);
    return push(std::move(v));
  }

  static bool ints_of(const Value& v, std::vector<int64_t>& out) {
    if (v.kind != Kind::kTuple) return false;
    out.clear();
    for (const Value& x : *v.items) {
      if (x.kind != Kind::kInt || x.number < 0) return false;
      out.push_back(x.number);
    }
    return true;
  }

  /// torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides, requires_grad, hooks[,
  /// metadata]).
  bool rebuild_tensor(const std::vector<Value>& args) {
    if ((args.size() != 6 && args.size() != 7) || args[0].kind != Kind::kStorage)
      return fail("a _rebuild_tensor_v2 call without (storage, offset, sizes, strides, ...)");
    Tensor t;
    t.storage = args[0].number;
    if (args[1].kind != Kind::kInt || args[1].number < 0)
      return fail("a tensor whose storage offset is not an integer >= 0");
    t.offset = args[1].number;
    if (!ints_of(args[2], t.sizes) || !ints_of(args[3], t.strides))
      return fail("a tensor whose sizes or strides are not tuples of integers >= 0");
    if (t.sizes.size() != t.strides.size())
      return fail("a tensor with " + std::to_string(t.sizes.size()) + " sizes but " +
                  std::to_string(t.strides.size()) + " strides");
    Value v;
    v.kind = Kind::kTensor;
    v.number = static_cast<int64_t>(tensors_.size());
    tensors_.push_back(std::move(t));
    return push(std::move(v));
  }

  /// REDUCE: only the calls torch writes for a dict of tensors; anything else is refused.
  bool reduce() {
    Value args, callable;
    if (!pop(args) || !pop(callable)) return false;
    if (args.kind != Kind::kTuple || callable.kind != Kind::kGlobal)
      return fail("REDUCE without a global and an argument tuple");
    const std::vector<Value>& a = *args.items;
    const std::string_view mod = callable.text;
    const std::string_view fn = callable.name;
    if (mod == "torch._utils" && fn == "_rebuild_tensor_v2") return rebuild_tensor(a);
    if (mod == "torch._utils" && fn == "_rebuild_parameter") {
      // nn.Parameter from Python: (tensor, requires_grad, hooks) is the tensor.
      if (a.size() != 3 || a[0].kind != Kind::kTensor)
        return fail("a _rebuild_parameter call without a tensor");
      return push(a[0]);
    }
    if (mod == "collections" && fn == "OrderedDict") {
      if (!a.empty()) return fail("an OrderedDict call with arguments");
      return push_container(Kind::kDict);
    }
    if (mod == "torch.jit._pickle" && fn == "restore_type_tag") {
      // torch::pickle_save tags each dict and list with its type: (value, "Dict[str, Tensor]").
      if (a.size() != 2 || a[1].kind != Kind::kString)
        return fail("a restore_type_tag call without (value, type)");
      return push(a[0]);
    }
    return fail("a call of " + printable(mod) + "." + printable(fn) +
                ", which a snapshot does not hold (only tensors, dicts and plain values)");
  }

  bool step(unsigned char op) {
    uint64_t n = 0;
    std::vector<Value> items;
    Value a, b;
    std::string_view s, t;
    switch (op) {
      case 0x80:  // PROTO
        if (!take_uint(1, n)) return false;
        if (n < 2 || n > 5) return fail("pickle protocol " + std::to_string(n));
        return true;
      case 0x95:  // FRAME: a length hint only
        if (!take_uint(8, n)) return false;
        if (n > data_.size() - pos_) return fail("a FRAME longer than the rest of data.pkl");
        return true;
      case '(':  // MARK
        if (marks_.size() >= kMaxPickleNesting)
          return fail("more than " + std::to_string(kMaxPickleNesting) + " open MARKs");
        marks_.push_back(stack_.size());
        return true;
      case 'N':  // NONE
        return push(Value{});
      case 0x88:  // NEWTRUE
      case 0x89:  // NEWFALSE
        return push_int(op == 0x88, Kind::kBool);
      case 'K':  // BININT1
        return take_uint(1, n) && push_int(static_cast<int64_t>(n));
      case 'M':  // BININT2
        return take_uint(2, n) && push_int(static_cast<int64_t>(n));
      case 'J':  // BININT
        return take_uint(4, n) && push_int(static_cast<int32_t>(static_cast<uint32_t>(n)));
      case 0x8a: {  // LONG1: little-endian two's complement of up to 8 bytes here
        uint64_t len = 0;
        if (!take_uint(1, len)) return false;
        if (len > 8) return fail("an integer of " + std::to_string(len) + " bytes");
        if (!take_uint(static_cast<size_t>(len), n)) return false;
        if (len > 0 && len < 8 && (n >> (8 * len - 1)) & 1) n |= ~uint64_t{0} << (8 * len);
        return push_int(static_cast<int64_t>(n));
      }
      case 'G':  // BINFLOAT
        if (!take_uint(8, n)) return false;
        a.kind = Kind::kFloat;
        return push(std::move(a));
      case 'X':   // BINUNICODE
      case 0x8c:  // SHORT_BINUNICODE
      case 0x8d:  // BINUNICODE8
        if (!take_uint(op == 'X' ? 4 : op == 0x8c ? 1 : 8, n) || !take_text(n, s)) return false;
        a.kind = Kind::kString;
        a.text = s;
        return push(std::move(a));
      case 'c':  // GLOBAL module\nname\n
        if (!take_line(s) || !take_line(t)) return false;
        a.kind = Kind::kGlobal;
        a.text = s;
        a.name = t;
        return push(std::move(a));
      case 0x93:  // STACK_GLOBAL
        if (!pop(b) || !pop(a)) return false;
        if (a.kind != Kind::kString || b.kind != Kind::kString)
          return fail("STACK_GLOBAL without two strings");
        a.kind = Kind::kGlobal;
        a.name = b.text;
        return push(std::move(a));
      case ')':  // EMPTY_TUPLE
        return push_tuple({});
      case 't':  // TUPLE
        return pop_to_mark(items) && push_tuple(std::move(items));
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87:  // TUPLE3
        return pop_n(op - 0x84u, items) && push_tuple(std::move(items));
      case '}':  // EMPTY_DICT
        return push_container(Kind::kDict);
      case ']':  // EMPTY_LIST
        list_sizes_[static_cast<int64_t>(containers_.size())] = 0;
        return push_container(Kind::kList);
      case 's':  // SETITEM
        return pop_n(2, items) && set_items(items);
      case 'u':  // SETITEMS
        return pop_to_mark(items) && set_items(items);
      case 'a':  // APPEND
        return pop_n(1, items) && append(items);
      case 'e':  // APPENDS
        return pop_to_mark(items) && append(items);
      case 'q':  // BINPUT
        return take_uint(1, n) && memo_put(n);
      case 'r':  // LONG_BINPUT
        return take_uint(4, n) && memo_put(n);
      case 0x94:  // MEMOIZE
        return memo_put(memo_.size());
      case 'h':  // BINGET
        return take_uint(1, n) && memo_get(n);
      case 'j':  // LONG_BINGET
        return take_uint(4, n) && memo_get(n);
      case 'Q':  // BINPERSID
        return persistent_load();
      case 'R':  // REDUCE
        return reduce();
      default: {
        char what[96];
        std::snprintf(what, sizeof what,
                      "opcode 0x%02x is not one torch writes for a dict of tensors", op);
        return fail(what);
      }
    }
  }

  bool stop() {
    if (stack_.size() != 1 || !marks_.empty())
      return fail("STOP with " + std::to_string(stack_.size()) + " values and " +
                  std::to_string(marks_.size()) + " MARKs open (one value expected)");
    if (pos_ != data_.size())
      return fail(std::to_string(data_.size() - pos_) + " bytes after STOP");
    return true;
  }

  std::string_view data_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::string error_;
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value> memo_;
  std::vector<Placement> containers_;
  std::unordered_map<int64_t, uint64_t> list_sizes_;
  std::vector<Storage> storages_;
  std::map<std::string, size_t> storage_index_;
  std::vector<Tensor> tensors_;
};

// ---- the whole file ---------------------------------------------------------------------------

std::string shape_text(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

/// The bytes from the storage's start to the end of the last element the view reaches; nullopt
/// past 2^64.
std::optional<uint64_t> extent_bytes(const Tensor& t, int64_t item_size) {
  for (int64_t s : t.sizes)
    if (s == 0) return 0;
  uint64_t last = static_cast<uint64_t>(t.offset);
  for (size_t i = 0; i < t.sizes.size(); ++i) {
    uint64_t step = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(t.sizes[i] - 1),
                               static_cast<uint64_t>(t.strides[i]), &step) ||
        __builtin_add_overflow(last, step, &last))
      return std::nullopt;
  }
  uint64_t bytes = 0;
  if (__builtin_add_overflow(last, uint64_t{1}, &last) ||
      __builtin_mul_overflow(last, static_cast<uint64_t>(item_size), &bytes))
    return std::nullopt;
  return bytes;
}

/// The bytes of the tensor's elements; nullopt past 2^64.
std::optional<uint64_t> element_bytes(const Tensor& t, int64_t item_size) {
  uint64_t n = static_cast<uint64_t>(item_size);
  for (int64_t s : t.sizes)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(s), &n)) return std::nullopt;
  return n;
}

bool contiguous(const Tensor& t) {
  uint64_t expect = 1;  // wraps harmlessly: an overflowing shape fails the extent check anyway
  for (size_t i = t.sizes.size(); i-- > 0;) {
    if (t.sizes[i] != 1 && static_cast<uint64_t>(t.strides[i]) != expect) return false;
    expect *= static_cast<uint64_t>(t.sizes[i]);
  }
  return true;
}

/// The part of a record name after "<archive>/" that torch's format has.
bool known_record(std::string_view rest) {
  if (rest == "data.pkl" || rest == "version" || rest == ".data/version" || rest == "byteorder" ||
      rest == ".data/serialization_id")
    return true;
  constexpr std::string_view kData = "data/";
  if (rest.substr(0, kData.size()) != kData) return false;
  const std::string_view key = rest.substr(kData.size());
  return !key.empty() && key != "." && key != ".." && key.find('/') == std::string_view::npos;
}

}  // namespace

std::variant<SnapshotStructure, std::string> check_snapshot_structure(std::string_view file) {
  const Bytes f(file);
  auto dir = read_end_records(f);
  if (auto* err = std::get_if<std::string>(&dir)) return *err;
  auto entries = read_directory(f, std::get<Directory>(dir));
  if (auto* err = std::get_if<std::string>(&entries)) return *err;

  SnapshotStructure out;
  for (Entry& e : std::get<std::vector<Entry>>(entries)) out.records.push_back(std::move(e.record));
  if (out.records.empty()) return std::string("the zip holds no records (no data.pkl)");
  // One archive directory holds every record; torch's reader takes it from the first.
  const std::string& first = out.records.front().name;
  out.archive = first.substr(0, first.find('/'));
  if (out.archive.size() == first.size() || out.archive.empty() || out.archive == "." ||
      out.archive == "..")
    return "record " + printable(first, 256) +
           " is not inside an archive directory (torch writes <archive>/data.pkl)";
  std::map<std::string_view, const ZipRecord*> by_name;
  for (const ZipRecord& r : out.records) {
    const std::string_view name = r.name;
    if (name.size() <= out.archive.size() || name.substr(0, out.archive.size()) != out.archive ||
        name[out.archive.size()] != '/')
      return "record " + printable(name, 256) + " is outside the archive directory " +
             printable(out.archive, 256) + "/ of the first record";
    if (!known_record(name.substr(out.archive.size() + 1)))
      return "record " + printable(name, 256) +
             " is not one torch's format has (data.pkl, data/<key>, version, byteorder)";
    by_name[name] = &r;
  }
  const std::string prefix = out.archive + "/";
  auto record = [&](const std::string& rest) -> const ZipRecord* {
    auto it = by_name.find(prefix + rest);
    return it == by_name.end() ? nullptr : it->second;
  };

  const ZipRecord* version = record("version");
  if (!version) version = record(".data/version");
  if (!version) return "the zip has no " + printable(prefix, 256) + "version record";
  const std::string_view v = f.view(version->offset, version->size);
  const std::string_view digits = v.substr(0, v.find('\n'));
  if (digits.empty() || digits.size() > 20 || v.size() > digits.size() + 1 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "record " + printable(version->name, 256) + " holds \"" + printable(v) +
           "\", not a format version number";

  const ZipRecord* pickle = record("data.pkl");
  if (!pickle) return "the zip has no " + printable(prefix, 256) + "data.pkl record";
  if (pickle->size > kMaxPickleBytes)
    return "record " + printable(pickle->name, 256) + " is " + std::to_string(pickle->size) +
           " bytes, more than the " + std::to_string(kMaxPickleBytes >> 20) +
           " MiB a snapshot's pickle may have";
  PickleScanner scanner(f.view(pickle->offset, pickle->size));
  if (!scanner.scan()) return scanner.error();

  // Every tensor inside the record it views; then every storage record exactly its declared size.
  const auto& storages = scanner.storages();
  for (const Tensor& t : scanner.tensors()) {
    const Storage& s = storages[static_cast<size_t>(t.storage)];
    TensorView view;
    view.name = scanner.tensor_name(t);
    view.dtype = std::string(s.dtype->name);
    view.item_size = s.dtype->size;
    view.storage_key = s.key;
    view.storage_offset = t.offset;
    view.sizes = t.sizes;
    view.strides = t.strides;
    std::string described = view.dtype + ", shape " + shape_text(t.sizes);
    if (!contiguous(t)) described += ", strides " + shape_text(t.strides);
    described += ", offset " + std::to_string(t.offset);
    const std::string tensor = "tensor '" + printable(view.name, 256) + "' (" + described + ")";
    const ZipRecord* r = record("data/" + s.key);
    if (!r)
      return tensor + " views storage '" + printable(s.key) + "', but the zip has no record " +
             printable(prefix, 256) + "data/" + printable(s.key);
    const std::optional<uint64_t> need = extent_bytes(t, s.dtype->size);
    if (!need)
      return "record " + printable(r->name, 256) + " holds " + std::to_string(r->size) +
             " bytes but " + tensor + " reaches past 2^64 bytes";
    if (*need > r->size)
      return "record " + printable(r->name, 256) + " holds " + std::to_string(r->size) +
             " bytes but " + tensor + " needs " + std::to_string(*need);
    // Strides that revisit elements (0 for an expanded view) let a small record stand for a
    // huge tensor, which the reader's copy would then allocate. Torch writes none for ddprun.
    const std::optional<uint64_t> own = element_bytes(t, s.dtype->size);
    if (!own || *own > r->size)
      return "record " + printable(r->name, 256) + " holds " + std::to_string(r->size) +
             " bytes but " + tensor + " has " +
             (own ? std::to_string(*own) : std::string("more than 2^64")) +
             " bytes of elements (strides that overlap)";
    out.tensors.push_back(std::move(view));
  }
  for (const Storage& s : storages) {
    const ZipRecord* r = record("data/" + s.key);
    if (!r)
      return "data.pkl declares storage '" + printable(s.key) + "', but the zip has no record " +
             printable(prefix, 256) + "data/" + printable(s.key);
    uint64_t bytes = 0;
    const bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(s.numel),
                                                 static_cast<uint64_t>(s.dtype->size), &bytes);
    if (overflow || bytes != r->size)
      return "record " + printable(r->name, 256) + " holds " + std::to_string(r->size) +
             " bytes but data.pkl declares storage '" + printable(s.key) + "' as " +
             std::to_string(s.numel) + " " + std::string(s.dtype->name) + " elements (" +
             (overflow ? std::string("past 2^64") : std::to_string(bytes)) + " bytes)";
  }
  return out;
}

}  // namespace ddprun::sdk
