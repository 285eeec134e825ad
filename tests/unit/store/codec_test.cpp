#include "store/codec.h"

#include <catch2/catch.hpp>
#include <string>

using namespace ddprun::store;

namespace {

/// Bytes from a hex string with optional spaces, as the protocol note writes captures.
std::string hex(const std::string& text) {
  std::string out;
  std::string digits;
  for (char c : text)
    if (c != ' ') digits += c;
  for (std::size_t i = 0; i + 1 < digits.size(); i += 2)
    out += static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16));
  return out;
}

Decoded decode(Dialect d, const std::string& bytes) { return decode_request(d, bytes, {}); }

}  // namespace

TEST_CASE("a 1.13 set captured on the wire decodes to its key and value", "[store][unit]") {
  const std::string bytes = hex("00 0300000000000000 2f6b31 0200000000000000 7631");
  const Detected d = detect_dialect(bytes);
  REQUIRE(d.status == DecodeStatus::Complete);
  CHECK(d.dialect == Dialect::Legacy);
  CHECK(d.used == 0);
  const Decoded r = decode(Dialect::Legacy, bytes);
  REQUIRE(r.status == DecodeStatus::Complete);
  CHECK(r.used == bytes.size());
  CHECK(r.request.op == Op::Set);
  CHECK(r.request.keys == std::vector<std::string>{"/k1"});
  CHECK(r.request.values == std::vector<std::string>{"v1"});
}

TEST_CASE("a 2.x connection is told apart by its validation magic", "[store][unit]") {
  const Detected d = detect_dialect(hex("00 CEF7853C 0D 2A000000"));
  REQUIRE(d.status == DecodeStatus::Complete);
  CHECK(d.dialect == Dialect::V2);
  CHECK(d.used == 5);
  const Decoded ping = decode(Dialect::V2, hex("0D 2A000000"));
  REQUIRE(ping.status == DecodeStatus::Complete);
  CHECK(ping.request.op == Op::Ping);
  CHECK(ping.request.word == 42);
}

TEST_CASE("a first byte of zero needs four more bytes before the dialect is known",
          "[store][unit]") {
  CHECK(detect_dialect("").status == DecodeStatus::NeedMore);
  CHECK(detect_dialect(hex("00 CEF785")).status == DecodeStatus::NeedMore);
  // A 1.13 client whose first op is ADD of init/ starts with 03.
  CHECK(detect_dialect(hex("03")).dialect == Dialect::Legacy);
}

TEST_CASE("the same opcode byte means different ops in the two dialects", "[store][unit]") {
  const std::string get_113 = hex("02 0300000000000000 2f6b31");
  CHECK(decode(Dialect::Legacy, get_113).request.op == Op::Get);
  const std::string add = hex("03 0400000000000000 2f636e74 feffffffffffffff");
  const Decoded legacy_add = decode(Dialect::Legacy, add);
  REQUIRE(legacy_add.status == DecodeStatus::Complete);
  CHECK(legacy_add.request.op == Op::Add);
  CHECK(legacy_add.request.delta == -2);
  // In 2.x, 03 is GET and 07 is GETNUMKEYS (WATCH_KEY in 1.13).
  CHECK(decode(Dialect::V2, hex("03 0300000000000000 2f6b31")).request.op == Op::Get);
  // 1.13's GET bytes read as a 2.x COMPARE_SET, still missing its two values.
  CHECK(decode(Dialect::V2, get_113).status == DecodeStatus::NeedMore);
  CHECK(decode(Dialect::V2, hex("07")).request.op == Op::NumKeys);
  CHECK(decode(Dialect::Legacy, hex("07 0300000000000000 2f776b")).request.op == Op::WatchKey);
}

TEST_CASE("a request split at every byte needs more until its last byte", "[store][unit]") {
  const Request wait{Op::Wait, {"/a", "/bb"}, {}, 0, 0};
  const std::string bytes = encode_request(Dialect::V2, wait);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    CHECK(decode(Dialect::V2, bytes.substr(0, n)).status == DecodeStatus::NeedMore);
  const Decoded r = decode(Dialect::V2, bytes + "extra");
  REQUIRE(r.status == DecodeStatus::Complete);
  CHECK(r.used == bytes.size());
  CHECK(r.request == wait);
}

TEST_CASE("an unfinished request says how many bytes complete the field it stopped in",
          "[store][unit]") {
  // A MULTI_SET of two keys, the second value 1 MiB: fed only when a field is whole, it is
  // decoded eleven times, not once per 64 KiB read.
  const Request set{Op::MultiSet, {"/a", "/b"}, {"x", std::string(1 << 20, 'v')}, 0, 0};
  const std::string bytes = encode_request(Dialect::Legacy, set);
  std::size_t have = 0;
  int passes = 0;
  Decoded r;
  while (passes < 100) {
    ++passes;
    r = decode(Dialect::Legacy, bytes.substr(0, have));
    if (r.status != DecodeStatus::NeedMore) break;
    REQUIRE(r.need > have);  // never asks for what it has
    REQUIRE(r.need <= bytes.size());
    // One byte short of the need is still not enough.
    CHECK(decode(Dialect::Legacy, bytes.substr(0, r.need - 1)).status == DecodeStatus::NeedMore);
    have = r.need;
  }
  REQUIRE(r.status == DecodeStatus::Complete);
  CHECK(r.request == set);
  CHECK(r.used == bytes.size());
  // Opcode, count, 2 x (key length, key, value length, value): each need ends one field; then
  // the pass that completes the request.
  CHECK(passes == 1 + 1 + 4 * 2 + 1);
}

TEST_CASE("every op round-trips through its encoder in both dialects", "[store][unit]") {
  const std::vector<Request> both = {
      {Op::Set, {"/k"}, {"v"}, 0, 0},
      {Op::CompareSet, {"/k"}, {"", "new"}, 0, 0},
      {Op::Get, {"/k"}, {}, 0, 0},
      {Op::Add, {"/c"}, {}, 7, 0},
      {Op::Check, {"/a", "/b"}, {}, 0, 0},
      {Op::Wait, {"/a"}, {}, 0, 0},
      {Op::NumKeys, {}, {}, 0, 0},
      {Op::DeleteKey, {"/k"}, {}, 0, 0},
      {Op::Append, {"/k"}, {"more"}, 0, 0},
      {Op::MultiGet, {"/a", "/b"}, {}, 0, 0},
      {Op::MultiSet, {"/a", "/b"}, {"1", "2"}, 0, 0},
      {Op::CancelWait, {}, {}, 0, 0},
  };
  for (Dialect d : {Dialect::Legacy, Dialect::V2}) {
    for (const Request& q : both) {
      const std::string bytes = encode_request(d, q);
      const Decoded r = decode(d, bytes);
      INFO(op_name(q.op));
      REQUIRE(r.status == DecodeStatus::Complete);
      CHECK(r.used == bytes.size());
      CHECK(r.request == q);
    }
  }
  for (const Request& q : std::vector<Request>{{Op::Ping, {}, {}, 0, 1234},
                                               {Op::QueuePush, {"/q"}, {"x"}, 0, 0},
                                               {Op::QueuePop, {"/q"}, {}, 0, 0},
                                               {Op::QueueLen, {"/q"}, {}, 0, 0},
                                               {Op::ListKeys, {}, {}, 0, 0}}) {
    INFO(op_name(q.op));
    CHECK(decode(Dialect::V2, encode_request(Dialect::V2, q)).request == q);
  }
}

TEST_CASE("a key over the limit is bad and names the field", "[store][unit]") {
  StoreLimits limits;
  limits.max_key_bytes = 4;
  const Decoded r = decode_request(Dialect::Legacy, hex("02 0500000000000000 2f6b6b6b6b"), limits);
  REQUIRE(r.status == DecodeStatus::Bad);
  CHECK(r.error == "GET: key length 5 is over the limit of 4 bytes");
}

TEST_CASE("a huge value length is refused before its bytes arrive", "[store][unit]") {
  const Decoded r = decode(Dialect::V2, hex("01 0100000000000000 2f ffffffffffffff7f"));
  REQUIRE(r.status == DecodeStatus::Bad);
  CHECK(r.error.find("SET: value length") == 0);
}

TEST_CASE("too many keys in one wait is bad", "[store][unit]") {
  StoreLimits limits;
  limits.max_keys_per_request = 2;
  const Decoded r = decode_request(Dialect::V2, hex("06 0300000000000000"), limits);
  REQUIRE(r.status == DecodeStatus::Bad);
  CHECK(r.error == "WAIT: key count 3 is over the limit of 2");
}

TEST_CASE("an unknown opcode and a wrong magic are bad", "[store][unit]") {
  CHECK(decode(Dialect::Legacy, hex("0D")).error == "unknown opcode 13 in the torch 1.13 dialect");
  CHECK(decode(Dialect::V2, hex("20")).status == DecodeStatus::Bad);
  const Decoded r = decode(Dialect::V2, hex("00 01000000"));
  REQUIRE(r.status == DecodeStatus::Bad);
  CHECK(r.error.find("VALIDATE: validation magic 1") == 0);
}

TEST_CASE("replies use the captured layouts", "[store][unit]") {
  CHECK(encode_i64(3) == hex("0300000000000000"));
  CHECK(encode_bytes("v1") == hex("0200000000000000 7631"));
  CHECK(encode_u32(0x01020304) == hex("04030201"));
  CHECK(encode_watch_push(WatchEvent::Updated, "/wk", "a", "b") ==
        hex("00 0300000000000000 2f776b 0100000000000000 61 0100000000000000 62"));
}
