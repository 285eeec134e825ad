// `ddprun status --watch` against a daemon whose round is forming: snapshots one after another
// when stdout is not a terminal, who joined and what is still needed, and a clean end on SIGTERM.
#include <signal.h>

#include <catch2/catch.hpp>

#include "tests/integration/rdzv_fixtures.h"

namespace ddprun::testing {

using namespace std::chrono_literals;

TEST_CASE("ddprun status --watch shows a forming round until its iterations are done",
          "[metrics][status-watch][integration]") {
  Daemon daemon;
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);
  // One node of a two-node job: the round waits for the second.
  Subprocess node(ddprun_fake(
      {"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
       endpoint, "--rdzv_id", "job", "--rdzv_conf", kFastRdzvConf, "--local_addr", "127.0.0.1"},
      {"print=running"}));
  const std::vector<std::string> watch{DDPRUN_BIN, "status",       "--rdzv_endpoint",
                                       endpoint,   "--watch",      "--interval",
                                       "0.2",      "--iterations", "3"};
  REQUIRE(wait_until([&] { return contains(run_command(watch).out, "1 joined"); }, kJobLimit));
  const auto r = run_command(watch, {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  // Not a terminal: three snapshots in a row, no screen control codes.
  CHECK(count_of(r.out, "ddprun status " + endpoint + " at ") == 3);
  CHECK_FALSE(contains(r.out, "\x1b["));
  CHECK(contains(r.out, "job job: joining, round 0"));
  CHECK(contains(r.out, "  round 0 forming: 1 joined ("));
  CHECK(contains(r.out, "; 1 more needed; join timeout in "));
  node.send(SIGTERM);
  node.wait(kJobLimit);
}

TEST_CASE("ddprun status --watch ends cleanly on SIGTERM and keeps asking a daemon that is gone",
          "[metrics][status-watch][integration]") {
  std::unique_ptr<Subprocess> watch;
  {
    Daemon daemon;
    watch = std::make_unique<Subprocess>(std::vector<std::string>{
        DDPRUN_BIN, "status", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(daemon.port),
        "--watch", "--interval", "0.2", "--timeout", "1"});
    REQUIRE(watch->wait_for_output("no jobs at 127.0.0.1:", kJobLimit));
  }
  // The daemon stopped: the watch says so and goes on.
  REQUIRE(watch->wait_for_output("; asking again", kJobLimit));
  watch->send(SIGTERM);
  const auto r = watch->wait(kJobLimit);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(r.timed_out);
}

TEST_CASE("ddprun status refuses --interval without --watch", "[metrics][status-watch]") {
  const auto r =
      run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", "127.0.0.1:1", "--interval", "1"});
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "--watch"));
}

}  // namespace ddprun::testing
