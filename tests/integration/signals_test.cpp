// Signals sent to ddprun itself: stop signals tear the group down and set the exit code,
// preemption notices (SIGUSR1), listed in --signals_to_handle or not, are passed on to the
// workers, which start with them ignored.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <thread>

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
  // A person's second Ctrl-C: later than the 100 ms within which a repeat is the same one
  // delivered twice (a terminal's and a wrapper's).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  job.send(SIGINT);
  auto r = job.wait(std::chrono::seconds(25));
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 130);
  CHECK(contains(r.err, "received SIGINT again"));
  for (const auto& [rank, pid] : read_pids(pidfile)) CHECK(wait_gone(pid));
}

TEST_CASE("SIGUSR1 is forwarded to the workers without stopping them, listed or not",
          "[agent][integration]") {
  // The default --signals_to_handle does not name SIGUSR1; ddprun handles it all the same.
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--nproc_per_node", "2"},
        std::vector<std::string>{"--nproc_per_node", "2", "--signals_to_handle",
                                 "SIGTERM,SIGUSR1"}}) {
    Subprocess job(ddprun_fake(flags, {"wait_usr1", "print=still running"}));
    // The handlers are installed before the workers say they wait.
    REQUIRE(job.wait_for_output("[default0]:waiting for SIGUSR1", kJobLimit));
    REQUIRE(job.wait_for_output("[default1]:waiting for SIGUSR1", kJobLimit));
    job.send(SIGUSR1);
    auto r = job.wait(kJobLimit);
    INFO(flags.size());
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
}

TEST_CASE("SIGUSR1 does not kill workers that ignore it, and workers started later are told",
          "[agent][integration]") {
  TempDir dir;
  const std::string go = dir.path() + "/go";
  // No handler in the worker; each attempt prints the variable, then waits for the test's go.
  // The first attempt fails on purpose (exit 3), so a second group starts after the notice.
  Subprocess job(ddprun_fake({"--nproc_per_node", "2", "--max_restarts", "1"},
                             {"env=DDPRUN_CHECKPOINT_REQUESTED", "print=ready",
                              "wait_lines=" + go + ":1", "exit_if_restart=0:3"}),
                 {{"LOGLEVEL", "debug"}});
  REQUIRE(job.wait_for_output("[default0]:ready", kJobLimit));
  REQUIRE(job.wait_for_output("[default1]:ready", kJobLimit));
  job.send(SIGUSR1);
  bool forwarded = false;
  for (int i = 0; i < 600 && !forwarded; ++i) {
    forwarded = contains(job.err_so_far(), "forwarding SIGUSR1 to the workers");
    if (!forwarded) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(forwarded);
  std::ofstream(go) << "go\n";
  auto r = job.wait(kJobLimit);
  INFO(r.out);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  // Both first workers outlived the notice and failed by their own exit, not by SIGUSR1.
  CHECK_FALSE(contains(r.err, "ended: signal SIGUSR1"));
  CHECK(contains(r.err, "restarting workers: restart 1 of 1"));
  CHECK(count_of(r.out, "DDPRUN_CHECKPOINT_REQUESTED=<unset>") == 2);
  CHECK(count_of(r.out, "[default0]:DDPRUN_CHECKPOINT_REQUESTED=1") == 1);
  CHECK(count_of(r.out, "[default1]:DDPRUN_CHECKPOINT_REQUESTED=1") == 1);
}
