// Signals sent to ddprun itself: stop signals tear the group down and set the exit code,
// preemption notices (SIGUSR1) are passed on to the workers.
#include <signal.h>

#include <catch2/catch.hpp>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

/// Starts two hanging workers that record their pids, waits until both run, sends `sig` to
/// ddprun and checks the group is gone and ddprun exits 128+sig.
void check_stop_signal(int sig, const std::string& name) {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  Subprocess job(
      ddprun_fake({"--nproc_per_node", "2"}, {"pidfile=" + pidfile, "print=ready", "hang"}),
      {{"LOGLEVEL", "debug"}});
  REQUIRE(job.wait_for_output("[default0]:ready", kJobLimit));
  REQUIRE(job.wait_for_output("[default1]:ready", kJobLimit));
  job.send(sig);
  auto r = job.wait(kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 128 + sig);
  CHECK(contains(r.err, "received " + name));
  const auto pids = read_pids(pidfile);
  REQUIRE(pids.size() == 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank << " pid " << pid);
    // The workers got the same signal, not an immediate SIGKILL.
    CHECK(contains(r.err, "(pid " + std::to_string(pid) + ") ended: signal " + name));
    CHECK(wait_gone(pid));
  }
}

}  // namespace

TEST_CASE("SIGTERM to ddprun stops the workers and ddprun exits 143", "[agent][integration]") {
  check_stop_signal(SIGTERM, "SIGTERM");
}

TEST_CASE("SIGINT to ddprun stops the workers and ddprun exits 130", "[agent][integration]") {
  check_stop_signal(SIGINT, "SIGINT");
}

TEST_CASE("SIGTERM to ddprun ends workers that ignore it after --shutdown_timeout",
          "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  Subprocess job(ddprun_fake({"--nproc_per_node", "2", "--shutdown_timeout", "1"},
                             {"ignore=15", "pidfile=" + pidfile, "print=ready", "hang"}));
  REQUIRE(job.wait_for_output("[default0]:ready", kJobLimit));
  REQUIRE(job.wait_for_output("[default1]:ready", kJobLimit));
  job.send(SIGTERM);
  // The default --shutdown_timeout is 30 s and the workers hang for 10 minutes.
  auto r = job.wait(std::chrono::seconds(30));
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 143);
  CHECK(contains(r.err, "sending SIGKILL"));
  for (const auto& [rank, pid] : read_pids(pidfile)) CHECK(wait_gone(pid));
}

TEST_CASE("a second SIGINT kills at once workers that ignore the first", "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  // The default --shutdown_timeout (30 s) would otherwise keep them for half a minute.
  Subprocess job(ddprun_fake({"--nproc_per_node", "2"},
                             {"ignore=2", "pidfile=" + pidfile, "print=ready", "hang"}));
  REQUIRE(job.wait_for_output("[default0]:ready", kJobLimit));
  REQUIRE(job.wait_for_output("[default1]:ready", kJobLimit));
  job.send(SIGINT);
  REQUIRE(wait_until([&] { return contains(job.err_so_far(), "received SIGINT"); }, kJobLimit));
  job.send(SIGINT);
  auto r = job.wait(std::chrono::seconds(25));
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 130);
  CHECK(contains(r.err, "received SIGINT again"));
  for (const auto& [rank, pid] : read_pids(pidfile)) CHECK(wait_gone(pid));
}

TEST_CASE("SIGUSR1 listed in --signals_to_handle is forwarded to the workers without stopping them",
          "[agent][integration]") {
  Subprocess job(ddprun_fake({"--nproc_per_node", "2", "--signals_to_handle", "SIGTERM,SIGUSR1"},
                             {"wait_usr1", "print=still running"}));
  // The handlers are installed before the workers say they wait.
  REQUIRE(job.wait_for_output("[default0]:waiting for SIGUSR1", kJobLimit));
  REQUIRE(job.wait_for_output("[default1]:waiting for SIGUSR1", kJobLimit));
  job.send(SIGUSR1);
  auto r = job.wait(kJobLimit);
  INFO(r.out);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:got SIGUSR1"));
  CHECK(contains(r.out, "[default1]:got SIGUSR1"));
  CHECK(contains(r.out, "[default0]:still running"));
  CHECK(contains(r.out, "[default1]:still running"));
  CHECK_FALSE(contains(r.err, "stopping the workers"));
}
