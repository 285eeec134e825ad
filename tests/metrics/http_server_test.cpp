// The metrics endpoint against clients that are wrong, hostile or silent: none of them stops
// the server from answering the next scrape (docs/operations.md#security).
#include "metrics/http_server.h"

#include <prometheus/counter.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <thread>

#include "metrics/exposition.h"
#include "tests/metrics/http_client.h"
#include "tests/support/polling.h"

namespace ddprun::metrics {
namespace {

using namespace std::chrono_literals;
using testing::http_get;
using testing::HttpPeer;

/// An endpoint serving one counter, on its own io_context thread; shut down by cancellation.
struct Endpoint {
  prometheus::Registry registry;
  boost::asio::io_context io;
  HttpServer server;
  std::thread thread;
  std::atomic<int> scrapes{0};

  explicit Endpoint(HttpLimits limits = {})
      : server(io, metrics_handler(registry, [this] { ++scrapes; }), limits) {
    prometheus::BuildCounter()
        .Name("ddprun_test_events_total")
        .Help("Events")
        .Register(registry)
        .Add({})
        .Increment(3);
    REQUIRE_FALSE(server.listen("127.0.0.1", 0).has_value());
    thread = std::thread([this] { io.run(); });
  }
  ~Endpoint() {
    boost::asio::post(io, [this] { server.shutdown(); });
    thread.join();  // returns only if the shutdown left nothing pending
  }
  bool answers() {
    const auto reply = http_get(server.port(), "/metrics");
    return reply.status == 200 &&
           reply.body.find("ddprun_test_events_total 3") != std::string::npos;
  }
};

}  // namespace

TEST_CASE("GET /metrics answers the registry in the text format 0.0.4", "[metrics][http]") {
  Endpoint e;
  const auto reply = http_get(e.server.port(), "/metrics");
  REQUIRE(reply.status == 200);
  CHECK(reply.head.find("Content-Type: text/plain; version=0.0.4; charset=utf-8") !=
        std::string::npos);
  CHECK(reply.body.find("# TYPE ddprun_test_events_total counter") != std::string::npos);
  CHECK(reply.body.find("ddprun_test_events_total 3") != std::string::npos);
}

TEST_CASE("another path is 404 and another method 405", "[metrics][http]") {
  Endpoint e;
  CHECK(http_get(e.server.port(), "/").status == 404);
  CHECK(http_get(e.server.port(), "/metricsx").status == 404);
  HttpPeer peer(e.server.port());
  REQUIRE(peer.send_bytes("POST /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"));
  const auto not_allowed = testing::parse_reply(peer.read_to_end(10s));
  CHECK(not_allowed.status == 405);
  CHECK(not_allowed.head.find("Allow: GET, HEAD\r\n") != std::string::npos);
  // With a body too; a GET with one is a bad request.
  HttpPeer post(e.server.port());
  REQUIRE(post.send_bytes("POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"));
  CHECK(testing::parse_reply(post.read_to_end(10s)).status == 405);
  HttpPeer get(e.server.port());
  REQUIRE(get.send_bytes("GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"));
  CHECK(testing::parse_reply(get.read_to_end(10s)).status == 400);
  CHECK(e.answers());
}

TEST_CASE("one connection may scrape several times", "[metrics][http]") {
  Endpoint e;
  HttpPeer peer(e.server.port());
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
  REQUIRE(
      peer.send_bytes(get + get + "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"));
  bool closed = false;
  const std::string all = peer.read_to_end(10s, &closed);
  CHECK(closed);
  CHECK(testing::count_of(all, "HTTP/1.1 200 OK") == 3);
}

TEST_CASE("garbage is answered 400 and closed and the next scrape works", "[metrics][http]") {
  Endpoint e;
  HttpPeer peer(e.server.port());
  REQUIRE(peer.send_bytes(std::string("\x16\x03\x01\x02\x00\x01\x00 not http\r\n\r\n", 20)));
  bool closed = false;
  const auto reply = testing::parse_reply(peer.read_to_end(10s, &closed));
  CHECK(reply.status == 400);
  CHECK(closed);
  CHECK(e.answers());
}

TEST_CASE("an oversized request is refused without reading it all", "[metrics][http]") {
  HttpLimits limits;
  limits.max_request_bytes = 4096;
  Endpoint e(limits);
  HttpPeer peer(e.server.port());
  // One header of 1 MiB: the server answers (431) and closes long before it has all of it.
  peer.send_bytes("GET /metrics HTTP/1.1\r\nX-Big: " + std::string(1 << 20, 'a') + "\r\n\r\n");
  bool closed = false;
  const auto reply = testing::parse_reply(peer.read_to_end(10s, &closed));
  CHECK(closed);
  CHECK((reply.status == 431 || reply.status == 0));  // 0: reset before the answer was read
  CHECK(e.scrapes == 0);
  CHECK(e.answers());
}

TEST_CASE("a silent connection is closed at the deadline and does not block scrapes",
          "[metrics][http]") {
  HttpLimits limits;
  limits.io_timeout = 300ms;
  Endpoint e(limits);
  HttpPeer silent(e.server.port());
  HttpPeer slow(e.server.port());
  REQUIRE(slow.send_bytes("GET /metr"));  // half a request line, then nothing
  CHECK(e.answers());                     // served while both are open
  bool closed = false;
  silent.read_to_end(10s, &closed);
  CHECK(closed);
  closed = false;
  slow.read_to_end(10s, &closed);
  CHECK(closed);
  CHECK(e.answers());
}

TEST_CASE("a connection beyond the limit takes the place of the one idle longest",
          "[metrics][http][security]") {
  HttpLimits limits;
  limits.max_sessions = 4;
  Endpoint e(limits);
  std::vector<std::unique_ptr<HttpPeer>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<HttpPeer>(e.server.port()));
    REQUIRE(idle.back()->send_bytes("G"));  // accepted and held, waiting for the rest
  }
  // A scrape is served: the connection that waited longest was closed to make room.
  CHECK(e.answers());
  bool closed = false;
  idle.front()->read_to_end(10s, &closed);
  CHECK(closed);
}

TEST_CASE("keep-alive clients at the session limit do not lock out a scrape",
          "[metrics][http][security]") {
  HttpLimits limits;
  limits.max_sessions = 4;
  Endpoint e(limits);
  // Four clients scrape once each and keep their connections open, as Prometheus does.
  std::vector<std::unique_ptr<HttpPeer>> kept;
  for (int i = 0; i < 4; ++i) {
    kept.push_back(std::make_unique<HttpPeer>(e.server.port()));
    REQUIRE(kept.back()->send_bytes("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE(testing::wait_until([&] { return e.scrapes == i + 1; }, 10s));
  }
  for (int i = 0; i < 3; ++i) CHECK(e.answers());
  CHECK(e.scrapes == 7);
}

}  // namespace ddprun::metrics
