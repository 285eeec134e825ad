#include "ddprun/sdk/connect_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>

using namespace ddprun;

namespace {

/// A loopback socket bound to a free port, not yet listening; returns {fd, port}.
std::pair<int, int> bound_socket() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return {fd, ntohs(a.sin_port)};
}

}  // namespace

TEST_CASE("the probe returns once the store starts listening", "[sdk][unit]") {
  auto [fd, port] = bound_socket();
  std::thread later([fd = fd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::listen(fd, 4);
  });
  const auto start = std::chrono::steady_clock::now();
  CHECK(sdk::wait_for_listener("127.0.0.1", port, std::chrono::seconds(30)));
  // It waited for listen(): the first tries were refused.
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(200));
  later.join();
  ::close(fd);
}

TEST_CASE("the probe gives up after its limit when nothing listens", "[sdk][unit]") {
  auto [fd, port] = bound_socket();  // bound, never listening: connections are refused
  CHECK_FALSE(sdk::wait_for_listener("127.0.0.1", port, std::chrono::milliseconds(100)));
  // A name that does not resolve, chosen so that no query leaves the machine: a label over 63
  // characters is refused by the resolver library itself (tests talk only to loopback).
  const std::string unresolvable = std::string(64, 'x') + ".invalid";
  CHECK_FALSE(sdk::wait_for_listener(unresolvable, port, std::chrono::milliseconds(50)));
  ::close(fd);
}
