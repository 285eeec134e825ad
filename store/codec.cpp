#include "store/codec.h"

#include <array>
#include <cstring>
#include <optional>

namespace ddprun::store {

namespace {

// Opcode tables, indexed by the byte on the wire (tcpstore research note, sections 2 and 3).
// The legacy table also takes 9-12, which the 2.0-2.3 builds sent with the same layouts.
constexpr std::array<Op, 13> kLegacyOps = {
    Op::Set,      Op::CompareSet, Op::Get,       Op::Add,       Op::Check,
    Op::Wait,     Op::NumKeys,    Op::WatchKey,  Op::DeleteKey, Op::Append,
    Op::MultiGet, Op::MultiSet,   Op::CancelWait};
constexpr std::array<Op, 18> kV2Ops = {
    Op::Validate,   Op::Set,     Op::CompareSet, Op::Get,      Op::Add,      Op::Check,
    Op::Wait,       Op::NumKeys, Op::DeleteKey,  Op::Append,   Op::MultiGet, Op::MultiSet,
    Op::CancelWait, Op::Ping,    Op::QueuePush,  Op::QueuePop, Op::QueueLen, Op::ListKeys};

std::optional<Op> op_of(Dialect dialect, std::uint8_t code) {
  if (dialect == Dialect::Legacy) {
    if (code < kLegacyOps.size()) return kLegacyOps[code];
  } else if (code < kV2Ops.size()) {
    return kV2Ops[code];
  }
  return std::nullopt;
}

std::optional<std::uint8_t> code_of(Dialect dialect, Op op) {
  if (dialect == Dialect::Legacy) {
    for (std::size_t i = 0; i < kLegacyOps.size(); ++i)
      if (kLegacyOps[i] == op) return static_cast<std::uint8_t>(i);
  } else {
    for (std::size_t i = 0; i < kV2Ops.size(); ++i)
      if (kV2Ops[i] == op) return static_cast<std::uint8_t>(i);
  }
  return std::nullopt;
}

/// Reads fields from the front of a byte string; the first shortage or bad field sticks.
class Reader {
 public:
  /// `copy`: the fields' bytes are returned; without, only their lengths are checked and
  /// skipped (measuring whether a request is complete costs nothing per byte).
  Reader(std::string_view bytes, const StoreLimits& limits, bool copy)
      : bytes_(bytes), limits_(limits), copy_(copy) {}

  bool ok() const { return status_ == DecodeStatus::Complete; }
  DecodeStatus status() const { return status_; }
  const std::string& error() const { return error_; }
  std::size_t used() const { return pos_; }
  /// When NeedMore: the bytes the input must hold before the field it stopped in is whole.
  std::size_t need() const { return need_; }

  template <typename T>
  T integer() {
    T value{};
    if (!take(sizeof(T))) return value;
    std::memcpy(&value, bytes_.data() + pos_ - sizeof(T), sizeof(T));  // little-endian hosts
    return value;
  }

  /// A u64 length and that many bytes, at most `cap` of them.
  std::string blob(const char* field, std::size_t cap) {
    const auto len = integer<std::uint64_t>();
    if (!ok()) return {};
    if (len > cap) {
      fail(std::string(field) + " length " + std::to_string(len) + " is over the limit of " +
           std::to_string(cap) + " bytes");
      return {};
    }
    if (!take(static_cast<std::size_t>(len)) || !copy_) return {};
    return std::string(bytes_.substr(pos_ - len, len));
  }

  std::string key() { return blob("key", limits_.max_key_bytes); }
  std::string value(const char* field = "value") { return blob(field, limits_.max_value_bytes); }

  /// A u64 count of keys, at most max_keys_per_request.
  std::size_t count() {
    const auto n = integer<std::uint64_t>();
    if (!ok()) return 0;
    if (n > limits_.max_keys_per_request) {
      fail("key count " + std::to_string(n) + " is over the limit of " +
           std::to_string(limits_.max_keys_per_request));
      return 0;
    }
    return static_cast<std::size_t>(n);
  }

  void fail(std::string why) {
    if (status_ == DecodeStatus::Bad) return;
    status_ = DecodeStatus::Bad;
    error_ = std::move(why);
  }

 private:
  bool take(std::size_t n) {
    if (!ok()) return false;
    if (pos_ + n > limits_.max_request_bytes) {
      fail("request is over the limit of " + std::to_string(limits_.max_request_bytes) + " bytes");
      return false;
    }
    if (bytes_.size() - pos_ < n) {
      status_ = DecodeStatus::NeedMore;
      need_ = pos_ + n;
      return false;
    }
    pos_ += n;
    return true;
  }

  std::string_view bytes_;
  const StoreLimits& limits_;
  bool copy_ = true;
  std::size_t pos_ = 0;
  std::size_t need_ = 0;
  DecodeStatus status_ = DecodeStatus::Complete;
  std::string error_;
};

void append_raw(std::string& out, const void* p, std::size_t n) {
  out.append(static_cast<const char*>(p), n);
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::Validate:
      return "VALIDATE";
    case Op::Set:
      return "SET";
    case Op::CompareSet:
      return "COMPARE_SET";
    case Op::Get:
      return "GET";
    case Op::Add:
      return "ADD";
    case Op::Check:
      return "CHECK";
    case Op::Wait:
      return "WAIT";
    case Op::NumKeys:
      return "GETNUMKEYS";
    case Op::WatchKey:
      return "WATCH_KEY";
    case Op::DeleteKey:
      return "DELETE_KEY";
    case Op::Append:
      return "APPEND";
    case Op::MultiGet:
      return "MULTI_GET";
    case Op::MultiSet:
      return "MULTI_SET";
    case Op::CancelWait:
      return "CANCEL_WAIT";
    case Op::Ping:
      return "PING";
    case Op::QueuePush:
      return "QUEUE_PUSH";
    case Op::QueuePop:
      return "QUEUE_POP";
    case Op::QueueLen:
      return "QUEUE_LEN";
    case Op::ListKeys:
      return "LIST_KEYS";
  }
  return "?";
}

Detected detect_dialect(std::string_view bytes) {
  Detected d;
  if (bytes.empty()) return d;
  d.status = DecodeStatus::Complete;
  // A 2.x client's first byte is VALIDATE (0); a 1.13 client's is any opcode, SET among them.
  if (bytes[0] != 0) return d;
  if (bytes.size() < 5) {
    d.status = DecodeStatus::NeedMore;
    return d;
  }
  std::uint32_t word = 0;
  std::memcpy(&word, bytes.data() + 1, sizeof(word));
  // Not the magic: a 1.13 SET, whose 4 bytes are the low half of its key length. A key length
  // equal to the magic modulo 2^32 would be over a gigabyte, far over max_key_bytes.
  if (word == kValidationMagic) {
    d.dialect = Dialect::V2;
    d.used = 5;
  }
  return d;
}

namespace {

/// One pass over the request at the front of `bytes`: with `copy`, the request itself;
/// without, only its status, length or need.
Decoded decode_pass(Dialect dialect, std::string_view bytes, const StoreLimits& limits, bool copy) {
  Decoded out;
  if (bytes.empty()) {
    out.need = 1;
    return out;
  }
  const auto code = static_cast<std::uint8_t>(bytes[0]);
  const auto op = op_of(dialect, code);
  if (!op) {
    out.status = DecodeStatus::Bad;
    out.error = "unknown opcode " + std::to_string(code) + " in the " +
                (dialect == Dialect::Legacy ? "torch 1.13" : "torch 2.x") + " dialect";
    return out;
  }
  Reader r(bytes.substr(1), limits, copy);
  Request& q = out.request;
  q.op = *op;
  switch (*op) {
    case Op::Validate:
    case Op::Ping:
      q.word = r.integer<std::uint32_t>();
      if (r.ok() && *op == Op::Validate && q.word != kValidationMagic)
        r.fail("validation magic " + std::to_string(q.word) + " is not " +
               std::to_string(kValidationMagic));
      break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush:
      q.keys.push_back(r.key());
      q.values.push_back(r.value());
      break;
    case Op::CompareSet:
      q.keys.push_back(r.key());
      q.values.push_back(r.value("expected value"));
      q.values.push_back(r.value("desired value"));
      break;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
      q.keys.push_back(r.key());
      break;
    case Op::Add:
      q.keys.push_back(r.key());
      q.delta = r.integer<std::int64_t>();
      break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet: {
      const std::size_t n = r.count();
      for (std::size_t i = 0; i < n && r.ok(); ++i) q.keys.push_back(r.key());
      break;
    }
    case Op::MultiSet: {
      const std::size_t n = r.count();
      for (std::size_t i = 0; i < n && r.ok(); ++i) {
        q.keys.push_back(r.key());
        q.values.push_back(r.value());
      }
      break;
    }
    case Op::NumKeys:
    case Op::CancelWait:
    case Op::ListKeys:
      break;
  }
  out.status = r.status();
  if (r.status() == DecodeStatus::Bad) {
    out.error = std::string(op_name(*op)) + ": " + r.error();
    out.request = {};
  } else if (r.status() == DecodeStatus::NeedMore) {
    out.request = {};
    out.need = 1 + r.need();
  } else {
    out.used = 1 + r.used();
  }
  return out;
}

}  // namespace

Decoded decode_request(Dialect dialect, std::string_view bytes, const StoreLimits& limits) {
  // Measured first: a request still arriving costs a walk over its length fields, not a copy
  // of every byte so far (which made a 128 MiB request cost minutes, read 64 KiB at a time).
  Decoded measured = decode_pass(dialect, bytes, limits, /*copy=*/false);
  if (measured.status != DecodeStatus::Complete) return measured;
  return decode_pass(dialect, bytes, limits, /*copy=*/true);
}

std::string encode_u8(std::uint8_t value) { return std::string(1, static_cast<char>(value)); }

std::string encode_u32(std::uint32_t value) {
  std::string out;
  append_raw(out, &value, sizeof(value));
  return out;
}

std::string encode_i64(std::int64_t value) {
  std::string out;
  append_raw(out, &value, sizeof(value));
  return out;
}

std::string encode_bytes(std::string_view value) {
  const std::uint64_t len = value.size();
  std::string out;
  out.reserve(sizeof(len) + value.size());
  append_raw(out, &len, sizeof(len));
  out.append(value);
  return out;
}

std::string encode_watch_push(WatchEvent event, std::string_view key, std::string_view old_value,
                              std::string_view new_value) {
  return encode_u8(static_cast<std::uint8_t>(event)) + encode_bytes(key) + encode_bytes(old_value) +
         encode_bytes(new_value);
}

std::string encode_request(Dialect dialect, const Request& q) {
  const auto code = code_of(dialect, q.op);
  if (!code) return {};
  std::string out = encode_u8(*code);
  auto count = [&out](std::size_t n) {
    const std::uint64_t v = n;
    append_raw(out, &v, sizeof(v));
  };
  switch (q.op) {
    case Op::Validate:
    case Op::Ping:
      out += encode_u32(q.word);
      break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush:
      out += encode_bytes(q.keys.at(0)) + encode_bytes(q.values.at(0));
      break;
    case Op::CompareSet:
      out +=
          encode_bytes(q.keys.at(0)) + encode_bytes(q.values.at(0)) + encode_bytes(q.values.at(1));
      break;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
      out += encode_bytes(q.keys.at(0));
      break;
    case Op::Add:
      out += encode_bytes(q.keys.at(0)) + encode_i64(q.delta);
      break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet:
      count(q.keys.size());
      for (const auto& k : q.keys) out += encode_bytes(k);
      break;
    case Op::MultiSet:
      count(q.keys.size());
      for (std::size_t i = 0; i < q.keys.size(); ++i)
        out += encode_bytes(q.keys[i]) + encode_bytes(q.values.at(i));
      break;
    case Op::NumKeys:
    case Op::CancelWait:
    case Op::ListKeys:
      break;
  }
  return out;
}

}  // namespace ddprun::store
