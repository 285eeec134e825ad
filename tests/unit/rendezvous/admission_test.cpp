#include "rendezvous/admission.h"

#include <catch2/catch.hpp>

#include "rendezvous/protocol.h"

using namespace ddprun::rdzv;

namespace {

RdzvSettings two_to_three() {
  RdzvSettings settings;
  settings.min_nodes = 2;
  settings.max_nodes = 3;
  settings.nproc_per_node = 4;
  settings.max_restarts = 2;
  return settings;
}

Join join_of(const std::string& name, RdzvSettings settings = two_to_three()) {
  Join join;
  join.run_id = "my_job";
  join.node_id = name + ":1:x";
  join.name = name;
  join.addr = name;
  join.master_port = 29500;
  join.settings = settings;
  return join;
}

/// The refusal of `join` by a job that no node has joined yet.
std::optional<Refused> first_join(const Join& join) {
  return check_join(new_job("my_job", {}), join);
}

}  // namespace

TEST_CASE("settings no job can run with are refused naming the flag as the user typed it",
          "[rdzv][unit]") {
  RdzvSettings settings = two_to_three();
  std::string expected;
  SECTION("--nnodes minimum over the maximum") {
    settings.min_nodes = 5;
    expected =
        "node a was started with --nnodes 5:3: the minimum (5) is larger than the maximum (3)";
  }
  SECTION("--nproc_per_node 0") {
    settings.nproc_per_node = 0;
    expected = "node a was started with --nproc_per_node 0: it must be at least 1";
  }
  SECTION("a --rdzv_conf duration outside the limits table, in seconds") {
    settings.join_timeout = Millis(2'000'000'000);
    expected =
        "node a was started with --rdzv_conf join_timeout=2000000: it is out of range: allowed "
        "0 to 86400 seconds";
  }
  SECTION("a --rdzv_conf count outside the limits table") {
    settings.keep_alive_max_attempt = 1000;
    expected =
        "node a was started with --rdzv_conf keep_alive_max_attempt=1000: it is out of range: "
        "allowed 1 to 100";
  }
  const auto refused = first_join(join_of("a", settings));
  REQUIRE(refused);
  CHECK(refused->kind == RefusalKind::Protocol);
  CHECK(refused->message == expected);
  REQUIRE(check_settings(settings, "a"));
  CHECK(check_settings(settings, "a")->message == expected);
}

TEST_CASE("a keep-alive interval under the limit names the value in seconds", "[rdzv][unit]") {
  RdzvSettings settings = two_to_three();
  settings.keep_alive_interval = Millis(1);
  const auto refused = first_join(join_of("a", settings));
  REQUIRE(refused);
  CHECK(refused->message ==
        "node a was started with --rdzv_conf keep_alive_interval=0.001: it is out of range: "
        "allowed 0.01 to 3600 seconds");
}

TEST_CASE("a negative --node_rank is refused as a bad rank with the allowed range",
          "[rdzv][unit]") {
  Join join = join_of("a");
  join.node_rank = -1;
  const auto refused = first_join(join);
  REQUIRE(refused);
  CHECK(refused->kind == RefusalKind::BadRank);
  CHECK(refused->message ==
        "node a was started with --node_rank -1, but job 'my_job' has at most 3 nodes (--nnodes "
        "2:3): use a --node_rank from 0 to 2");
}

TEST_CASE("an impossible restart count or re-registered round is refused naming the values",
          "[rdzv][unit]") {
  Join join = join_of("a");
  SECTION("a negative restart count") {
    join.restart_count = -1;
    const auto refused = first_join(join);
    REQUIRE(refused);
    CHECK(refused->message == "node a claims restart count -1, impossible with --max_restarts 2");
  }
  SECTION("a group rank outside the claimed world") {
    join.resume = RoundClaim{0, 7, 2, 0, "10.0.0.1", 29500, false};
    const auto refused = first_join(join);
    REQUIRE(refused);
    CHECK(refused->kind == RefusalKind::Protocol);
    CHECK(refused->message ==
          "node a re-registered an impossible round: group rank 7 of 2 nodes in round 0, restart "
          "count 0 (--nnodes 2:3, --max_restarts 2)");
  }
}

TEST_CASE("settings a job can run with are admitted", "[rdzv][unit]") {
  CHECK_FALSE(first_join(join_of("a")));
  CHECK_FALSE(check_settings(two_to_three(), "a"));
}
