#include "rendezvous/connection.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

using namespace ddprun::rdzv;
namespace asio = boost::asio;
using asio::ip::tcp;

TEST_CASE("a peer that never reads its replies is closed once they pass the write limit",
          "[rdzv][unit]") {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);  // connected, and never read from
  client.connect(acceptor.local_endpoint());
  auto conn = std::make_shared<FramedConnection>(acceptor.accept());
  conn->set_write_limit(4 << 20);
  CloseReason why;
  bool closed = false;
  conn->start([](const nlohmann::json&) {},
              [&](const CloseReason& reason) {
                closed = true;
                why = reason;
              });
  // 40 replies of 900 KB: far more than the socket buffers and the 4 MiB limit hold.
  const nlohmann::json big = {{"pad", std::string(900'000, 'x')}};
  for (int i = 0; i < 40 && !closed; ++i) {
    conn->send(big);
    io.run_for(std::chrono::milliseconds(20));
  }
  io.run_for(std::chrono::milliseconds(200));
  REQUIRE(closed);
  CHECK(why.kind == CloseKind::WriteLimit);
  CHECK_THAT(why.text, Catch::Contains("wait unread, over the limit of 4194304"));
  CHECK_FALSE(conn->is_open());
}

TEST_CASE("a peer that reads its replies is never cut by the write limit", "[rdzv][unit]") {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  auto conn = std::make_shared<FramedConnection>(acceptor.accept());
  conn->set_write_limit(4 << 20);
  bool closed = false;
  conn->start([](const nlohmann::json&) {}, [&](const CloseReason&) { closed = true; });
  const nlohmann::json big = {{"pad", std::string(900'000, 'x')}};
  std::array<char, 65536> sink{};
  std::size_t drained = 0;
  for (int i = 0; i < 20; ++i) {
    conn->send(big);
    // Read what arrived, as a healthy peer does.
    for (int j = 0; j < 200 && drained < static_cast<std::size_t>(i + 1) * 900'000; ++j) {
      io.run_for(std::chrono::milliseconds(1));
      boost::system::error_code ec;
      if (client.available(ec) > 0) drained += client.read_some(asio::buffer(sink), ec);
    }
  }
  CHECK_FALSE(closed);
  CHECK(conn->is_open());
  CHECK(drained >= 19u * 900'000);
}
