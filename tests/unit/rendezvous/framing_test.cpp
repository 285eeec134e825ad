#include "rendezvous/framing.h"

#include <catch2/catch.hpp>
#include <string>

using namespace ddprun::rdzv;
using nlohmann::json;

namespace {

/// A raw 4-byte big-endian header announcing `size` body bytes.
std::string header(std::uint32_t size) {
  return {static_cast<char>(size >> 24), static_cast<char>((size >> 16) & 0xff),
          static_cast<char>((size >> 8) & 0xff), static_cast<char>(size & 0xff)};
}

}  // namespace

TEST_CASE("a frame is a big-endian length followed by the JSON text", "[rdzv][unit]") {
  const std::string frame = encode_frame(json{{"a", 1}});
  CHECK(frame == header(7) + R"({"a":1})");
}

TEST_CASE("an encoded message decodes back to the same message", "[rdzv][unit]") {
  const json message = {{"type", "join"}, {"node", "n1"}, {"ranks", {0, 1, 2}}, {"name", "ünï"}};
  FrameDecoder decoder;
  decoder.feed(encode_frame(message));
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Complete);
  CHECK(got.body == message);
  CHECK(got.error.empty());
  CHECK(decoder.next().status == DecodeStatus::NeedMore);
  CHECK(decoder.buffered_bytes() == 0);
}

TEST_CASE("two frames in one feed come out one per call, in order", "[rdzv][unit]") {
  FrameDecoder decoder;
  decoder.feed(encode_frame(json{{"seq", 1}}) + encode_frame(json{{"seq", 2}}));
  DecodeResult first = decoder.next();
  REQUIRE(first.status == DecodeStatus::Complete);
  CHECK(first.body["seq"] == 1);
  DecodeResult second = decoder.next();
  REQUIRE(second.status == DecodeStatus::Complete);
  CHECK(second.body["seq"] == 2);
  CHECK(decoder.next().status == DecodeStatus::NeedMore);
}

TEST_CASE("a frame fed one byte at a time is reassembled", "[rdzv][unit]") {
  const json message = {{"type", "keep-alive"}, {"round", 42}};
  const std::string frame = encode_frame(message);
  FrameDecoder decoder;
  for (std::size_t i = 0; i + 1 < frame.size(); ++i) {
    decoder.feed(frame.substr(i, 1));
    INFO("after " << i + 1 << " of " << frame.size() << " bytes");
    REQUIRE(decoder.next().status == DecodeStatus::NeedMore);
  }
  decoder.feed(frame.substr(frame.size() - 1));
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Complete);
  CHECK(got.body == message);
}

TEST_CASE("a header split across feeds waits for the rest of the header", "[rdzv][unit]") {
  const std::string frame = encode_frame(json{{"x", true}});
  FrameDecoder decoder;
  decoder.feed(frame.substr(0, 2));
  CHECK(decoder.next().status == DecodeStatus::NeedMore);
  decoder.feed(frame.substr(2, 3));  // rest of the header and one body byte
  CHECK(decoder.next().status == DecodeStatus::NeedMore);
  decoder.feed(frame.substr(5));
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Complete);
  CHECK(got.body["x"] == true);
}

TEST_CASE("an oversized length is refused from the header alone", "[rdzv][unit]") {
  FrameDecoder decoder;
  decoder.feed(header(5000000));  // no body bytes at all
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Bad);
  CHECK(got.error == "frame of 5000000 bytes is over the 1048576-byte limit");
}

TEST_CASE("an HTTP peer is named as one, not as an oversized frame", "[rdzv][unit]") {
  for (const char* start : {"HTTP/1.1 200 OK\r\n", "GET / HTTP/1.1\r\n"}) {
    FrameDecoder decoder;
    decoder.feed(start);
    DecodeResult got = decoder.next();
    REQUIRE(got.status == DecodeStatus::Bad);
    CHECK_THAT(got.error, Catch::StartsWith("the peer speaks HTTP, not the rendezvous protocol"));
  }
}

TEST_CASE("a body of exactly the limit is accepted", "[rdzv][unit]") {
  const std::string prefix = R"({"pad":")";
  const std::string body = prefix + std::string(kMaxFrameBytes - prefix.size() - 2, 'x') + "\"}";
  REQUIRE(body.size() == kMaxFrameBytes);
  FrameDecoder decoder;
  decoder.feed(header(static_cast<std::uint32_t>(body.size())) + body);
  CHECK(decoder.next().status == DecodeStatus::Complete);
}

TEST_CASE("a body that is not valid JSON makes the stream bad", "[rdzv][unit]") {
  FrameDecoder decoder;
  decoder.feed(header(5) + "{\"a\":");
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Bad);
  CHECK_THAT(got.error, Catch::StartsWith("frame body is not valid JSON: "));
  CHECK(got.body.is_null());
}

TEST_CASE("an empty body is not valid JSON", "[rdzv][unit]") {
  FrameDecoder decoder;
  decoder.feed(header(0));
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Bad);
  CHECK_THAT(got.error, Catch::StartsWith("frame body is not valid JSON: "));
}

TEST_CASE("a body that is JSON but not an object makes the stream bad", "[rdzv][unit]") {
  for (const json& body : {json::array({1, 2}), json(3), json("hello"), json(nullptr)}) {
    INFO(body.dump());
    FrameDecoder decoder;
    decoder.feed(encode_frame(body));
    DecodeResult got = decoder.next();
    REQUIRE(got.status == DecodeStatus::Bad);
    CHECK_THAT(got.error, Catch::StartsWith("frame body is not a JSON object"));
  }
}

TEST_CASE("a bad stream stays bad even when good frames follow", "[rdzv][unit]") {
  FrameDecoder decoder;
  decoder.feed(header(3) + "[1]" + encode_frame(json{{"ok", 1}}));
  const DecodeResult first = decoder.next();
  REQUIRE(first.status == DecodeStatus::Bad);
  decoder.feed(encode_frame(json{{"ok", 2}}));
  for (int i = 0; i < 3; ++i) {
    DecodeResult again = decoder.next();
    REQUIRE(again.status == DecodeStatus::Bad);
    CHECK(again.error == first.error);
  }
  CHECK(decoder.buffered_bytes() == 0);
}

TEST_CASE("a decoder with nothing fed, or an empty feed, needs more", "[rdzv][unit]") {
  FrameDecoder decoder;
  CHECK(decoder.next().status == DecodeStatus::NeedMore);
  decoder.feed("");
  CHECK(decoder.next().status == DecodeStatus::NeedMore);
}

TEST_CASE("a decoded frame's bytes are released", "[rdzv][unit]") {
  const std::string frame = encode_frame(json{{"n", 1}});
  FrameDecoder decoder;
  decoder.feed(frame + frame.substr(0, 3));
  REQUIRE(decoder.next().status == DecodeStatus::Complete);
  CHECK(decoder.buffered_bytes() == 3);
}

TEST_CASE("a hello in this protocol version is accepted", "[rdzv][unit]") {
  CHECK_FALSE(check_hello(json{{"type", "hello"}, {"protocol", kProtocolVersion}}));
  CHECK_FALSE(check_hello(
      json{{"type", "hello"}, {"protocol", kProtocolVersion}, {"node", "n1"}, {"extra", 1}}));
}

TEST_CASE("a hello in another protocol version names both versions", "[rdzv][unit]") {
  auto error = check_hello(json{{"type", "hello"}, {"protocol", 2}});
  REQUIRE(error);
  CHECK(error->message ==
        "peer speaks rendezvous protocol 2, this ddprun speaks 1: use the same ddprun version on "
        "every node and the daemon");
}

TEST_CASE("a hello with missing or mistyped fields says what is wrong", "[rdzv][unit]") {
  auto no_protocol = check_hello(json{{"type", "hello"}});
  REQUIRE(no_protocol);
  CHECK_THAT(no_protocol->message, Catch::Contains("no \"protocol\" field") &&
                                       Catch::Contains("speaks rendezvous protocol 1"));

  auto no_type = check_hello(json{{"protocol", 1}});
  REQUIRE(no_type);
  CHECK_THAT(no_type->message, Catch::Contains("no \"type\" field"));

  auto wrong_type = check_hello(json{{"type", "join"}, {"protocol", 1}});
  REQUIRE(wrong_type);
  CHECK_THAT(wrong_type->message, Catch::Contains("\"hello\"") && Catch::Contains("\"join\""));

  auto string_protocol = check_hello(json{{"type", "hello"}, {"protocol", "1"}});
  REQUIRE(string_protocol);
  CHECK_THAT(string_protocol->message, Catch::Contains("must be an integer"));

  auto not_object = check_hello(json::array());
  REQUIRE(not_object);
  CHECK_THAT(not_object->message, Catch::Contains("not a JSON object"));
}

TEST_CASE("a number too large for a double makes the stream bad instead of throwing",
          "[rdzv][unit]") {
  for (const std::string body : {R"({"type":"hello","protocol":1e400})", R"({"x":-1e999})"}) {
    FrameDecoder decoder;
    decoder.feed(header(static_cast<std::uint32_t>(body.size())) + body);
    DecodeResult got = decoder.next();
    INFO(body);
    REQUIRE(got.status == DecodeStatus::Bad);
    CHECK_THAT(got.error, Catch::Contains("not valid JSON"));
  }
}

TEST_CASE("a body nested deeper than the limit is refused before it is parsed", "[rdzv][unit]") {
  const std::string deep =
      R"({"type":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  FrameDecoder decoder;
  decoder.feed(header(static_cast<std::uint32_t>(deep.size())) + deep);
  DecodeResult got = decoder.next();
  REQUIRE(got.status == DecodeStatus::Bad);
  CHECK(got.error == "frame body nests arrays or objects deeper than 32 levels");
  CHECK(decoder.buffered_bytes() == 0);
}

TEST_CASE("nesting up to the limit is accepted and brackets inside strings do not count",
          "[rdzv][unit]") {
  // 31 arrays inside the top-level object: depth 32.
  const std::string ok = R"({"a":)" + std::string(31, '[') + std::string(31, ']') +
                         R"(,"s":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"[[["})";
  FrameDecoder decoder;
  decoder.feed(header(static_cast<std::uint32_t>(ok.size())) + ok);
  DecodeResult got = decoder.next();
  INFO(got.error);
  REQUIRE(got.status == DecodeStatus::Complete);
  CHECK(got.body["s"].get<std::string>().size() == 42);
}

TEST_CASE("a peer's value is quoted short, escaped and never whole", "[rdzv][unit]") {
  CHECK(quote_peer_value(json("hello")) == "\"hello\"");
  CHECK(quote_peer_value(json("a\"b\n")) == "\"a\\\"b\\x0a\"");
  const std::string quoted = quote_peer_value(json(std::string(1 << 20, 'x')));
  CHECK(quoted == "\"" + std::string(64, 'x') + "\"... (1048576 bytes)");
  CHECK(quote_peer_value(json(2)) == "2");
  CHECK(quote_peer_value(json::array({1, 2, 3})) == "an array of 3 item(s)");
  CHECK(quote_peer_value(json{{"a", 1}}) == "an object of 1 field(s)");
}

TEST_CASE("a hello whose fields are huge or deep is refused in a short message", "[rdzv][unit]") {
  json hello = json{{"type", "hello"}, {"protocol", kProtocolVersion}};
  hello["type"] = std::string(1 << 20, 'y');
  auto bad = check_hello(hello);
  REQUIRE(bad);
  CHECK(bad->message.size() < 200);
  hello = json{{"type", "hello"}, {"protocol", kProtocolVersion}};
  json nested = json::array();
  for (int i = 0; i < 20; ++i) nested = json::array({nested});
  hello["protocol"] = nested;
  bad = check_hello(hello);
  REQUIRE(bad);
  CHECK(bad->message == "hello field \"protocol\" must be an integer, got an array of 1 item(s)");
}
