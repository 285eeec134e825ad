#include "rendezvous/free_port.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

using namespace ddprun::rdzv;

TEST_CASE("a free port is found on IPv4 and IPv6 loopback", "[rdzv][unit]") {
  auto p = find_free_port("127.0.0.1");
  REQUIRE(p.ok());
  CHECK(*p > 1024);
  CHECK(find_free_port("::1").ok());
}

TEST_CASE("the kernel's ephemeral port range is parsed or refused", "[rdzv][unit]") {
  CHECK(parse_port_range("32768\t60999\n") == std::pair{32768, 60999});
  CHECK_FALSE(parse_port_range("32768"));
  CHECK_FALSE(parse_port_range("60999 32768"));
  CHECK_FALSE(parse_port_range("1 2 3"));
  CHECK_FALSE(parse_port_range("0 70000"));
}

TEST_CASE("port candidates avoid the ephemeral range and ports below 10000", "[rdzv][unit]") {
  auto ports = port_candidates({32768, 60999}, 7, 32);
  REQUIRE(ports.size() == 32);
  std::set<int> distinct(ports.begin(), ports.end());
  CHECK(distinct.size() == ports.size());
  for (int p : ports) {
    INFO(p);
    CHECK(p >= 10000);
    CHECK(p <= 65535);
    CHECK((p < 32768 || p > 60999));
  }
  CHECK(port_candidates({32768, 60999}, 7, 32) == ports);
  // Nor the ports of torchrun's and ddprun's defaults and examples (29400, 29500 and near).
  for (unsigned seed = 0; seed < 200; ++seed)
    for (int p : port_candidates({32768, 60999}, seed, 64)) {
      INFO(p);
      CHECK((p < 29400 || p > 29599));
    }
  CHECK(port_candidates({1024, 65535}, 7, 32).empty());
  auto above = port_candidates({1024, 65000}, 3, 8);
  REQUIRE_FALSE(above.empty());
  for (int p : above) CHECK(p > 65000);
}

TEST_CASE("a free port found on loopback lies outside the ephemeral range", "[rdzv][unit]") {
  auto p = find_free_port("127.0.0.1");
  REQUIRE(p.ok());
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  std::stringstream text;
  text << in.rdbuf();
  auto range = parse_port_range(text.str());
  REQUIRE(range);
  INFO(*p);
  CHECK((*p < range->first || *p > range->second));
}
