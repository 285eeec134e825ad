#include "ddprun/sdk/snapshot_structure.h"

#include <catch2/catch.hpp>
#include <cstring>

using namespace ddprun::sdk;
using namespace std::string_literals;

namespace {

void put16(std::string& out, uint64_t v) {
  for (int i = 0; i < 2; ++i) out += static_cast<char>(v >> (8 * i) & 0xff);
}
void put32(std::string& out, uint64_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>(v >> (8 * i) & 0xff);
}
void put64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>(v >> (8 * i) & 0xff);
}
void set32(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>(v >> (8 * i) & 0xff);
}
void set64(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>(v >> (8 * i) & 0xff);
}

struct Record {
  std::string name;
  std::string data;
};

/// Where the builder put things, for tests that break them.
struct Layout {
  std::vector<size_t> local;    // local header offsets, in record order
  std::vector<size_t> central;  // central directory entry offsets
  size_t end64 = 0;             // zip64 end record
  size_t end = 0;               // classic end record
};

/// A zip laid out as torch's writer (miniz) lays it out: each record's local header with a data
/// descriptor flag and zero sizes, an "FB" extra field padding its data to 64 bytes, the data, a
/// data descriptor; then the central directory, a zip64 end record, its locator, the end record.
/// With `wide`, each central directory entry keeps its sizes and offset in a zip64 extra field
/// (as miniz writes them past 4 GiB) and only 0xffffffff in the fixed fields.
std::string make_zip(const std::vector<Record>& records, Layout* layout = nullptr,
                     bool wide = false) {
  Layout l;
  std::string out;
  for (const Record& r : records) {
    l.local.push_back(out.size());
    put32(out, 0x04034b50);
    put16(out, 0);
    put16(out, 0x0808);  // data descriptor, UTF-8 names
    put16(out, 0);       // stored
    put32(out, 0);       // time, date
    put32(out, 0);       // crc (in the descriptor)
    put32(out, 0);
    put32(out, 0);
    put16(out, r.name.size());
    const size_t unpadded = out.size() + 2 + r.name.size() + 4;
    const size_t pad = (64 - unpadded % 64) % 64;
    put16(out, 4 + pad);
    out += r.name;
    out += "FB";
    put16(out, pad);
    out += std::string(pad, 'Z');
    out += r.data;
    put32(out, 0x08074b50);
    put32(out, 0);
    put32(out, r.data.size());
    put32(out, r.data.size());
  }
  const size_t dir = out.size();
  for (size_t i = 0; i < records.size(); ++i) {
    l.central.push_back(out.size());
    put32(out, 0x02014b50);
    put16(out, 0);
    put16(out, 0);
    put16(out, 0x0808);
    put16(out, 0);
    put32(out, 0);
    put32(out, 0);  // crc: the structure check leaves it to miniz
    put32(out, wide ? 0xffffffff : records[i].data.size());
    put32(out, wide ? 0xffffffff : records[i].data.size());
    put16(out, records[i].name.size());
    put16(out, wide ? 28 : 0);  // extra
    put16(out, 0);              // comment
    put16(out, 0);              // disk
    put16(out, 0);              // internal attributes
    put32(out, 0);              // external attributes
    put32(out, wide ? 0xffffffff : l.local[i]);
    out += records[i].name;
    if (wide) {
      put16(out, 0x0001);
      put16(out, 24);
      put64(out, records[i].data.size());
      put64(out, records[i].data.size());
      put64(out, l.local[i]);
    }
  }
  const size_t dir_size = out.size() - dir;
  l.end64 = out.size();
  put32(out, 0x06064b50);
  put64(out, 44);
  put16(out, 0x031e);
  put16(out, 0x2d);
  put32(out, 0);
  put32(out, 0);
  put64(out, records.size());
  put64(out, records.size());
  put64(out, dir_size);
  put64(out, dir);
  put32(out, 0x07064b50);
  put32(out, 0);
  put64(out, l.end64);
  put32(out, 1);
  l.end = out.size();
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, records.size());
  put16(out, records.size());
  put32(out, dir_size);
  put32(out, dir);
  put16(out, 0);
  if (layout) *layout = l;
  return out;
}

/// data.pkl as torch::pickle_save writes it: protocol 2, dicts tagged with their type through
/// torch.jit._pickle.restore_type_tag, each tensor a _rebuild_tensor_v2 call on a persistent id.
class Pickle {
 public:
  Pickle() { out_ = "\x80\x02"; }
  Pickle& op(char c) {
    out_ += c;
    return *this;
  }
  Pickle& str(const std::string& s) {
    out_ += 'X';
    put32(out_, s.size());
    out_ += s;
    return *this;
  }
  Pickle& integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      put16(out_, v);
    } else {
      out_ += '\x8a';
      out_ += '\x08';
      put64(out_, static_cast<uint64_t>(v));
    }
    return *this;
  }
  Pickle& global(const std::string& module, const std::string& name) {
    out_ += 'c' + module + '\n' + name + '\n';
    return *this;
  }
  Pickle& ints(const std::vector<int64_t>& v) {
    op('(');
    for (int64_t x : v) integer(x);
    return op('t');
  }
  /// One tensor viewing storage `key` (`numel` elements of torch.<storage>).
  Pickle& tensor(const std::string& key, const std::string& storage, int64_t numel, int64_t offset,
                 const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    global("torch._utils", "_rebuild_tensor_v2").op('(');
    op('(').str("storage").global("torch", storage).str(key).str("cpu").integer(numel).op('t');
    op('Q').integer(offset).ints(sizes).ints(strides).op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
  Pickle& dict_begin() { return global("torch.jit._pickle", "restore_type_tag").op('}').op('('); }
  Pickle& dict_end(const std::string& type) { return op('u').str(type).op('\x86').op('R'); }
  std::string done() { return out_ + "."; }

 private:
  std::string out_;
};

std::string floats(size_t n) { return std::string(4 * n, '\x01'); }

/// A snapshot like ddprun's: metadata, a model dict of two tensors, the optimizer's bytes.
std::string snapshot_pickle() {
  return Pickle()
      .dict_begin()
      .str("format")
      .str("ddprun-snapshot")
      .str("epoch")
      .integer(3)
      .str("model")
      .dict_begin()
      .str("fc.weight")
      .tensor("0", "FloatStorage", 32, 0, {4, 8}, {8, 1})
      .str("fc.bias")
      .tensor("1", "FloatStorage", 4, 0, {4}, {1})
      .dict_end("Dict[str, Tensor]")
      .str("optimizer")
      .tensor("2", "ByteStorage", 10, 0, {10}, {1})
      .dict_end("Dict[str, Any]")
      .done();
}

std::vector<Record> snapshot_records() {
  return {{"archive/data/0", floats(32)},
          {"archive/data/1", floats(4)},
          {"archive/data/2", std::string(10, 'o')},
          {"archive/data.pkl", snapshot_pickle()},
          {"archive/version", "3\n"}};
}

std::string error_of(const std::string& file) {
  auto r = check_snapshot_structure(file);
  REQUIRE(std::holds_alternative<std::string>(r));
  return std::get<std::string>(r);
}

}  // namespace

TEST_CASE("a snapshot in the shape of torch::pickle_save passes with its tensors listed",
          "[sdk][unit]") {
  const std::string file = make_zip(snapshot_records());
  auto r = check_snapshot_structure(file);
  INFO((std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : ""));
  REQUIRE(std::holds_alternative<SnapshotStructure>(r));
  const SnapshotStructure& s = std::get<SnapshotStructure>(r);
  CHECK(s.archive == "archive");
  REQUIRE(s.records.size() == 5);
  CHECK(s.records[3].name == "archive/data.pkl");
  CHECK(file.substr(s.records[0].offset, s.records[0].size) == floats(32));
  CHECK(s.records[0].offset % 64 == 0);
  REQUIRE(s.tensors.size() == 3);
  CHECK(s.tensors[0].name == "model.fc.weight");
  CHECK(s.tensors[0].dtype == "float32");
  CHECK(s.tensors[0].storage_key == "0");
  CHECK(s.tensors[0].sizes == std::vector<int64_t>{4, 8});
  CHECK(s.tensors[0].strides == std::vector<int64_t>{8, 1});
  CHECK(s.tensors[1].name == "model.fc.bias");
  CHECK(s.tensors[2].name == "optimizer");
  CHECK(s.tensors[2].dtype == "uint8");
}

TEST_CASE("a snapshot in the shape of Python's torch.save passes", "[sdk][unit]") {
  // Protocol 2 with memo entries: the function and storage type fetched again with BINGET,
  // short tuples as TUPLE1/TUPLE2, plain dicts; the archive named after the file.
  const std::string pickle =
      "\x80\x02}q\x00("
      "X\x05\x00\x00\x00model}q\x01("
      "X\x01\x00\x00\x00w"
      "ctorch._utils\n_rebuild_tensor_v2\nq\x02("
      "(X\x07\x00\x00\x00storageq\x03"
      "ctorch\nFloatStorage\nq\x04"
      "X\x01\x00\x00\x00"
      "0"
      "X\x03\x00\x00\x00"
      "cpuK\x0ctq\x05"
      "QK\x05K\x02K\x02\x86K\x04K\x01\x86\x89"
      "ccollections\nOrderedDict\nq\x06)Rtq\x07R"
      "X\x01\x00\x00\x00"
      "b"
      "h\x02((h\x03h\x04X\x01\x00\x00\x00"
      "1"
      "X\x03\x00\x00\x00"
      "cpuK\x02tQK\x00K\x02\x85K\x01\x85\x89h\x06)RtR"
      "uu."s;
  const std::string file = make_zip({{"s.pt/data.pkl", pickle},
                                     {"s.pt/data/0", floats(12)},
                                     {"s.pt/data/1", floats(2)},
                                     {"s.pt/version", "3\n"}});
  auto r = check_snapshot_structure(file);
  INFO((std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : ""));
  REQUIRE(std::holds_alternative<SnapshotStructure>(r));
  const SnapshotStructure& s = std::get<SnapshotStructure>(r);
  CHECK(s.archive == "s.pt");
  REQUIRE(s.tensors.size() == 2);
  CHECK(s.tensors[0].name == "model.w");
  CHECK(s.tensors[0].storage_offset == 5);
  CHECK(s.tensors[0].strides == std::vector<int64_t>{4, 1});
  CHECK(s.tensors[1].name == "model.b");
  CHECK(s.tensors[1].storage_key == "1");
}

TEST_CASE("a truncated snapshot is refused at every length", "[sdk][unit]") {
  const std::string file = make_zip(snapshot_records());
  for (size_t n = 0; n < file.size(); ++n) {
    auto r = check_snapshot_structure(file.substr(0, n));
    INFO("truncated to " << n << " of " << file.size() << " bytes");
    CHECK(std::holds_alternative<std::string>(r));
  }
  CHECK(error_of(file.substr(0, 10)) ==
        "the file is 10 bytes, too short for a zip (its end record alone is 22)");
  CHECK(error_of(file.substr(0, file.size() / 2)) ==
        "no zip end record at the end of the file (torn, or not a zip)");
}

TEST_CASE("an emptied storage record is refused naming the record and the tensor", "[sdk][unit]") {
  auto records = snapshot_records();
  records[0].data.clear();
  CHECK(error_of(make_zip(records)) ==
        "record archive/data/0 holds 0 bytes but tensor 'model.fc.weight' (float32, shape [4, 8], "
        "offset 0) needs 128");
}

TEST_CASE("a record shorter than a strided view at an offset is refused", "[sdk][unit]") {
  auto with_view = [](int64_t numel, size_t floats_held) {
    const std::string pickle = Pickle()
                                   .dict_begin()
                                   .str("view")
                                   .tensor("0", "FloatStorage", numel, 5, {2, 2}, {4, 1})
                                   .dict_end("Dict[str, Tensor]")
                                   .done();
    return make_zip({{"archive/data/0", floats(floats_held)},
                     {"archive/data.pkl", pickle},
                     {"archive/version", "3\n"}});
  };
  // Elements 5, 6, 9 and 10: 11 floats, 44 bytes.
  CHECK(std::holds_alternative<SnapshotStructure>(check_snapshot_structure(with_view(11, 11))));
  CHECK(error_of(with_view(10, 10)) ==
        "record archive/data/0 holds 40 bytes but tensor 'view' (float32, shape [2, 2], strides "
        "[4, 1], offset 5) needs 44");
  // The view fits, but the record is not the size its storage declares.
  CHECK(error_of(with_view(12, 11)) ==
        "record archive/data/0 holds 44 bytes but data.pkl declares storage '0' as 12 float32 "
        "elements (48 bytes)");
}

TEST_CASE("a view whose strides overlap to stand for more elements than its record is refused",
          "[sdk][unit]") {
  const std::string pickle = Pickle()
                                 .dict_begin()
                                 .str("expanded")
                                 .tensor("0", "FloatStorage", 1, 0, {1000000, 3}, {0, 0})
                                 .dict_end("Dict[str, Tensor]")
                                 .done();
  CHECK(error_of(make_zip({{"archive/data/0", floats(1)},
                           {"archive/data.pkl", pickle},
                           {"archive/version", "3\n"}})) ==
        "record archive/data/0 holds 4 bytes but tensor 'expanded' (float32, shape [1000000, 3], "
        "strides [0, 0], offset 0) has 12000000 bytes of elements (strides that overlap)");
}

TEST_CASE("sizes and offsets in zip64 extra fields are read, and a short one is refused",
          "[sdk][unit]") {
  Layout l;
  const std::string wide = make_zip(snapshot_records(), &l, /*wide=*/true);
  auto r = check_snapshot_structure(wide);
  INFO((std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : ""));
  REQUIRE(std::holds_alternative<SnapshotStructure>(r));
  const auto& records = std::get<SnapshotStructure>(r).records;
  REQUIRE(records.size() == 5);
  CHECK(records[1].size == 16);
  CHECK(wide.substr(records[1].offset, records[1].size) == floats(4));

  std::string bad = wide;  // the zip64 field says 8 bytes: the size alone, not the offset
  const size_t extra = l.central[1] + 46 + std::string("archive/data/1").size();
  bad[extra + 2] = 8;
  CHECK(error_of(bad) ==
        "record archive/data/1: its zip64 extra field is 8 bytes, too short for the 24 it must "
        "hold");
}

TEST_CASE("central directory offsets outside the file or into other records are refused",
          "[sdk][unit]") {
  Layout l;
  const std::string good = make_zip(snapshot_records(), &l);

  std::string bad = good;  // the directory's offset past its end record (both end records)
  set64(bad, l.end64 + 48, l.end64 + 100);
  set32(bad, l.end + 16, l.end64 + 100);
  CHECK_THAT(error_of(bad), Catch::StartsWith("zip central directory: offset "));

  bad = good;  // the classic end record disagrees with the zip64 one
  set32(bad, l.end + 16, 7);
  CHECK_THAT(error_of(bad), Catch::StartsWith("zip end records disagree: "));

  bad = good;  // a local header offset pointing into another record's data
  set32(bad, l.central[1] + 42, l.local[0] + 70);
  CHECK(error_of(bad) == "record archive/data/1: no local header signature at offset " +
                             std::to_string(l.local[0] + 70));

  bad = good;  // a size that reaches into the next record
  set32(bad, l.central[0] + 20, 200);
  set32(bad, l.central[0] + 24, 200);
  CHECK_THAT(error_of(bad), Catch::StartsWith("record archive/data/0 (bytes 0 to ") &&
                                Catch::EndsWith(" overlaps record archive/data/1 at " +
                                                std::to_string(l.local[1])));

  bad = good;  // a size that reaches past the central directory
  set32(bad, l.central[4] + 20, 1000000);
  set32(bad, l.central[4] + 24, 1000000);
  CHECK_THAT(error_of(bad),
             Catch::StartsWith("record archive/version: its 1000000 bytes at offset "));

  bad = good;  // compressed
  bad[l.central[2] + 10] = 8;
  CHECK(error_of(bad) ==
        "record archive/data/2: compression method 8 (torch stores records uncompressed, method "
        "0)");
}

TEST_CASE("a pickle that views a storage with no record is refused naming both", "[sdk][unit]") {
  auto records = snapshot_records();
  records.erase(records.begin() + 1);
  CHECK(error_of(make_zip(records)) ==
        "tensor 'model.fc.bias' (float32, shape [4], offset 0) views storage '1', but the zip has "
        "no record archive/data/1");
}

TEST_CASE("oversized counts and sizes are refused before anything is allocated for them",
          "[sdk][unit]") {
  Layout l;
  const std::string good = make_zip(snapshot_records(), &l);
  std::string bad = good;
  set64(bad, l.end64 + 24, 0xffffffffULL);
  set64(bad, l.end64 + 32, 0xffffffffULL);
  bad[l.end + 8] = bad[l.end + 9] = bad[l.end + 10] = bad[l.end + 11] = '\xff';
  CHECK_THAT(error_of(bad), Catch::StartsWith("zip end record: 4294967295 entries cannot fit in "
                                              "a central directory of "));

  auto with_pickle = [](const std::string& pickle) {
    return make_zip(
        {{"archive/data/0", floats(4)}, {"archive/data.pkl", pickle}, {"archive/version", "3\n"}});
  };
  // A string length of 4 GiB in a pickle of 20 bytes.
  CHECK(error_of(with_pickle(std::string("\x80\x02X\xff\xff\xff\xff", 7) + "abc.")) ==
        "data.pkl at byte 2: a string of 4294967295 bytes runs past the end");
  // An element count whose bytes pass 2^64, and a shape whose extent does.
  CHECK(error_of(with_pickle(Pickle()
                                 .dict_begin()
                                 .str("t")
                                 .tensor("0", "FloatStorage", int64_t{1} << 62, 0, {4}, {1})
                                 .dict_end("Dict[str, Tensor]")
                                 .done())) ==
        "record archive/data/0 holds 16 bytes but data.pkl declares storage '0' as "
        "4611686018427387904 float32 elements (past 2^64 bytes)");
  const int64_t huge = int64_t{1} << 40;
  CHECK(error_of(with_pickle(Pickle()
                                 .dict_begin()
                                 .str("t")
                                 .tensor("0", "FloatStorage", 4, 0, {huge, huge}, {huge, 1})
                                 .dict_end("Dict[str, Tensor]")
                                 .done())) ==
        "record archive/data/0 holds 16 bytes but tensor 't' (float32, shape [1099511627776, "
        "1099511627776], offset 0) reaches past 2^64 bytes");
}

TEST_CASE("a pickle that would run code or nest without bound is refused", "[sdk][unit]") {
  auto with_pickle = [](const std::string& pickle) {
    return make_zip({{"archive/data.pkl", pickle}, {"archive/version", "3\n"}});
  };
  CHECK(error_of(with_pickle("\x80\x02\x63os\nsystem\nX\x02\x00\x00\x00id\x85R."s)) ==
        "data.pkl at byte 21: a call of os.system, which a snapshot does not hold (only tensors, "
        "dicts and plain values)");
  // 100,000 tuples in tuples: refused at the limit, not by a stack overflow.
  std::string deep = "\x80\x02N" + std::string(100000, '\x85') + ".";
  CHECK(error_of(with_pickle(deep)) == "data.pkl at byte 67: tuples nested more than 64 deep");
  CHECK(error_of(with_pickle("\x80\x02" + std::string(70, '(') + ".")) ==
        "data.pkl at byte 66: more than 64 open MARKs");
  CHECK(error_of(with_pickle("\x80\x02h\x07.")) ==
        "data.pkl at byte 2: a memo fetch of entry 7, never stored");
}

TEST_CASE("record names outside torch's format are refused", "[sdk][unit]") {
  auto records = snapshot_records();
  records.push_back({"archive/../../etc/passwd", "x"});
  CHECK(error_of(make_zip(records)) ==
        "record archive/../../etc/passwd is not one torch's format has (data.pkl, data/<key>, "
        "version, byteorder)");
  records = snapshot_records();
  records.push_back({"other/data.pkl", "x"});
  CHECK(error_of(make_zip(records)) ==
        "record other/data.pkl is outside the archive directory archive/ of the first record");
  records = snapshot_records();
  records.push_back({"archive/data/1", floats(4)});
  CHECK(error_of(make_zip(records)) == "record archive/data/1 appears twice in the zip directory");
  records = snapshot_records();
  records.pop_back();
  CHECK(error_of(make_zip(records)) == "the zip has no archive/version record");
}

TEST_CASE("no single flipped byte makes the check read out of bounds", "[sdk][unit]") {
  // Under ASan this walks every header field, length and opcode of a valid file.
  const std::string good = make_zip(snapshot_records());
  size_t refused = 0;
  for (size_t at = 0; at < good.size(); ++at) {
    for (unsigned char x : {0x01, 0x80, 0xff}) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ x);
      refused += std::holds_alternative<std::string>(check_snapshot_structure(bad));
    }
  }
  // Padding, timestamps, CRCs and tensor bytes may change freely; most other bytes may not.
  CHECK(refused > good.size() / 2);
}
