#include "rendezvous/endpoint.h"

#include <catch2/catch.hpp>

using namespace ddprun::rdzv;

TEST_CASE("an endpoint splits into host and port text, with IPv6 in brackets", "[rdzv][unit]") {
  auto parts = std::get<EndpointParts>(split_endpoint("head:29400"));
  CHECK(parts.host == "head");
  CHECK(parts.port == "29400");
  parts = std::get<EndpointParts>(split_endpoint("[fd00::1]:1"));
  CHECK(parts.host == "fd00::1");
  CHECK(parts.port == "1");
  CHECK_FALSE(std::get<EndpointParts>(split_endpoint("[::1]")).port);
  CHECK_FALSE(std::get<EndpointParts>(split_endpoint("head")).port);
  CHECK(std::get<EndpointError>(split_endpoint("[::1:29400")) == EndpointError::MissingBracket);
  CHECK(std::get<EndpointError>(split_endpoint("[::1]29400")) == EndpointError::Malformed);
  CHECK(std::get<EndpointError>(split_endpoint("fd00::1:29400")) == EndpointError::BareIpv6);
}

TEST_CASE("an endpoint parses to host and port, with the default port when none is given",
          "[rdzv][unit]") {
  CHECK(parse_endpoint("head:29603", 29400) == std::pair<std::string, int>{"head", 29603});
  CHECK(parse_endpoint("head", 29400) == std::pair<std::string, int>{"head", 29400});
  CHECK(parse_endpoint("[::1]", 29400) == std::pair<std::string, int>{"::1", 29400});
  CHECK_FALSE(parse_endpoint(":29400", 29400));
  CHECK_FALSE(parse_endpoint("head:70000", 29400));
  CHECK_FALSE(parse_endpoint("head:x", 29400));
}

TEST_CASE("an endpoint is written back with IPv6 addresses in brackets", "[rdzv][unit]") {
  CHECK(format_endpoint("10.0.0.1", 29400) == "10.0.0.1:29400");
  CHECK(format_endpoint("::1", 5) == "[::1]:5");
}
