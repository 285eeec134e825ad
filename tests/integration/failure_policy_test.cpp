// The failure policy as a user meets it: crash loops that stop with "do not requeue" (78), exit
// codes that never restart, a restart budget held against a window, and the refusals of values
// ddprun cannot use. The decisions themselves have transcript tests (rdzv_state_test.cpp,
// agent_state_test.cpp); these run ddprun.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/ddprun_runs.h"

using namespace ddprun::testing;

namespace {

/// No pause between restarts: these tests are about what ends a job, not when it restarts.
const std::vector<std::string> kNoPause{"--restart_backoff", "0"};

std::vector<std::string> with(std::vector<std::string> flags,
                              const std::vector<std::string>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

}  // namespace

TEST_CASE("the same failure three times in a row ends the job with 78, not the whole budget",
          "[integration][policy]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(ddprun_fake(with(kNoPause, {"--nproc_per_node", "2", "--max_restarts", "50",
                                                   "--event_log", log}),
                                   {"exit_if_rank=1:3", "hang"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 78);
  CHECK(events_named(log, "workers_started").size() == 3);
  CHECK(contains(r.err,
                 "the same failure 3 times in a row (--crash_loop_stop 3) with no "
                 "progress in between"));
  const auto detected = events_named(log, "failure_detected");
  REQUIRE(detected.size() == 3);
  CHECK(detected[0]["progress"] == false);
  CHECK(detected[0]["rank"] == 1);
}

TEST_CASE("the exception type of the error file is part of the failure that repeats",
          "[integration][policy]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(ddprun_fake(with(kNoPause, {"--max_restarts", "5", "--event_log", log}),
                                   {"error_file=KeyError: 'lr'", "exit=1"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 78);
  const auto detected = events_named(log, "failure_detected");
  REQUIRE(detected.size() == 3);
  CHECK(detected[2]["exception"] == "KeyError");
  CHECK(contains(r.err, "KeyError: 'lr'"));  // the failure report shows the root cause
}

TEST_CASE("training steps reported between failures are progress: the budget ends the job",
          "[integration][policy]") {
  auto r = run_command(ddprun_fake(with(kNoPause, {"--nproc_per_node", "1", "--max_restarts", "4"}),
                                   {"report=first_step", "sleep=200", "exit=1"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 75);
  CHECK(contains(r.err, "Restarts  : 4 of 4 used"));
}

TEST_CASE("a --progress_file rewritten before each failure is progress: no crash loop",
          "[integration][policy]") {
  TempDir dir;
  const std::string progress = dir.path() + "/latest_iteration";
  // Each start appends to the file (what a checkpoint save would do), then fails the same way.
  auto r =
      run_command(ddprun_fake(with(kNoPause, {"--max_restarts", "4", "--progress_file", progress}),
                              {"pidfile=" + progress, "exit=1"}),
                  {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 75);  // the budget, not a crash loop, ended it
  CHECK(contains(r.err, "Restarts  : 4 of 4 used"));
}

TEST_CASE("a budget no larger than the crash-loop stop is spent whole, then exits 78",
          "[integration][policy]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(
      ddprun_fake(with(kNoPause, {"--max_restarts", "3", "--event_log", log}), {"exit=1"}), {},
      kJobLimit);
  INFO(r.out << r.err);
  // Every restart is spent; the same failure each time still says not to requeue.
  CHECK(r.exit_code == 78);
  CHECK(events_named(log, "workers_started").size() == 4);
  CHECK(contains(r.err, "no restart left: 3 of --max_restarts 3 used; a crash loop"));
}

TEST_CASE("a crash-loop stop of 0 spends the whole budget as torchrun does",
          "[integration][policy]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(ddprun_fake(with(kNoPause, {"--max_restarts", "4", "--crash_loop_stop", "0",
                                                   "--event_log", log}),
                                   {"exit=1"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 75);
  CHECK(events_named(log, "workers_started").size() == 5);
}

TEST_CASE("an exit code of --fatal_exit_codes ends the job at once with 78",
          "[integration][policy]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r =
      run_command(ddprun_fake(with(kNoPause, {"--nproc_per_node", "2", "--max_restarts", "10",
                                              "--fatal_exit_codes", "42,3", "--event_log", log}),
                              {"exit_if_rank=0:3", "hang"}),
                  {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 78);
  CHECK(events_named(log, "workers_started").size() == 1);
  CHECK(contains(r.err, "exit code 3 is one of --fatal_exit_codes 3,42: no restart"));
  // Another code restarts as usual.
  auto other =
      run_command(ddprun_fake(with(kNoPause, {"--max_restarts", "1", "--fatal_exit_codes", "42"}),
                              {"exit_if_restart=1:0", "exit=3"}),
                  {}, kJobLimit);
  INFO(other.out << other.err);
  CHECK(other.exit_code == 0);
}

TEST_CASE("with --restart_window a failure the window has forgotten costs nothing",
          "[integration][policy]") {
  // One restart allowed per 1 s window; the group fails after 1.2 s or more, so the window
  // never holds two restarts, and the job runs until the program succeeds on restart 3.
  auto r = run_command(ddprun_fake(with(kNoPause, {"--max_restarts", "1", "--restart_window", "1",
                                                   "--crash_loop_stop", "0"}),
                                   {"exit_if_restart=3:0", "sleep=1200", "exit=1"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  // The log counts the job's restarts and the window's: never "restart 3 of 1".
  CHECK(contains(r.err, "restarting workers: restart 3 (1 of --max_restarts 1 in the last 1 s)"));
  CHECK_FALSE(contains(r.err, "restart 3 of 1"));
  // Without the window the same job ends after its one restart.
  auto plain =
      run_command(ddprun_fake(with(kNoPause, {"--max_restarts", "1", "--crash_loop_stop", "0"}),
                              {"exit_if_restart=3:0", "sleep=1200", "exit=1"}),
                  {}, kJobLimit);
  INFO(plain.out << plain.err);
  CHECK(plain.exit_code == 75);
}

TEST_CASE("failure policy values ddprun cannot use are refused, naming them",
          "[integration][policy]") {
  for (const auto& [flag, value, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--restart_window", "-5", "expected a number of seconds, 0 (the whole job)"},
           {"--crash_loop_stop", "1", "expected 0 (off) or a number of failures in a row from 2"},
           {"--crash_loop_stop", "x", "expected 0 (off)"},
           {"--fatal_exit_codes", "3,0", "'0' is no failing exit code"},
           {"--fatal_exit_codes", "300", "'300' is no failing exit code"},
           {"--fatal_exit_codes", "3,,4", "'' is no failing exit code"},
           {"--quarantine_after", "-1", "expected 0 (off) or a number of failures in a row"},
           {"--quarantine_cooldown", "60:30",
            "the maximum (30) is shorter than the first "
            "cooldown (60)"},
           {"--quarantine_cooldown", "1:2:3", "expected SECONDS or SECONDS:MAX, e.g. 30:600"},
           {"--quarantine_cooldown", "90000", "at most 86400 seconds (a day)"}}) {
    auto r = run_command(ddprun_fake({flag, value}, {"print=ran"}), {}, kJobLimit);
    INFO(flag << " " << value << ": " << r.err);
    CHECK(r.exit_code == 64);
    CHECK(contains(r.err, flag + " " + value + ": " + says));
    CHECK_FALSE(contains(r.out, "ran"));
  }
}

TEST_CASE("a node whose health check fails stays out until it passes, then trains",
          "[integration][policy][health]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  const std::string count = dir.path() + "/checks";
  // Fails twice, then passes: the third check finds two lines in the file.
  const std::string check = "echo check >> " + count + "; [ $(wc -l < " + count +
                            ") -ge 3 ] || { echo 'gpu0: ECC errors' >&2; exit 1; }";
  auto r = run_command(
      ddprun_fake({"--health_check", check, "--health_check_interval", "0.2", "--event_log", log},
                  {"print=trained"}),
      {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "trained"));
  const auto failed = events_named(log, "health_check_failed");
  REQUIRE(failed.size() == 2);
  CHECK(contains(failed[0]["output"].get<std::string>(), "gpu0: ECC errors"));
  CHECK(failed[1]["failures_in_a_row"] == 2);
  CHECK(events_named(log, "health_check_passed").size() == 1);
  CHECK(contains(r.err, "[health check] gpu0: ECC errors"));
  CHECK(contains(r.err, "this node is kept out of the job's rounds and checks again in"));
  // No round began before the check passed.
  const auto starts = events_named(log, "rendezvous_start");
  REQUIRE_FALSE(starts.empty());
  CHECK(starts[0]["t"].get<double>() > failed[1]["t"].get<double>());
}

TEST_CASE("a single node kept out by its health check ends after the join timeout with exit 69",
          "[integration][policy][health]") {
  auto r =
      run_command(ddprun_fake({"--health_check", "echo 'gpu0: ECC errors'; exit 1",
                               "--health_check_interval", "0.2", "--rdzv_conf", "join_timeout=1"},
                              {"print=trained"}),
                  {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 69);
  CHECK_FALSE(contains(r.out, "trained"));
  CHECK(contains(r.err, "the job ended while this node was kept out by its health check ("));
  CHECK(contains(r.err, "join timeout: waited "));
  CHECK(contains(r.err, "gpu0: ECC errors"));
  CHECK(contains(r.err, "checks again in 0.2 s"));
  CHECK_FALSE(contains(r.err, "rendezvous failed"));  // said once, not twice
}

TEST_CASE("a SIGTERM while a node waits out a failed health check ends ddprun at once",
          "[integration][policy][health]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  Subprocess job(ddprun_fake(
      {"--health_check", "exit 1", "--health_check_interval", "600", "--event_log", log},
      {"print=trained"}));
  REQUIRE(wait_until([&] { return !events_named(log, "health_check_failed").empty(); }, kJobLimit));
  job.send(SIGTERM);
  const auto r = job.wait(std::chrono::seconds(20));
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 143);
  CHECK_FALSE(contains(r.out, "trained"));
}

TEST_CASE("a health check past its timeout is killed and fails", "[integration][policy][health]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/check.pid";
  Subprocess job(ddprun_fake({"--health_check", "echo $$ > " + pidfile + "; exec sleep 600",
                              "--health_check_timeout", "0.5", "--health_check_interval", "600"},
                             {"print=trained"}));
  REQUIRE(wait_until([&] { return contains(job.err_so_far(), "ran past --health_check_timeout"); },
                     kJobLimit));
  const pid_t check = static_cast<pid_t>(std::stol(read_file(pidfile)));
  CHECK(wait_gone(check));
  job.send(SIGTERM);
  const auto r = job.wait(std::chrono::seconds(20));
  CHECK(r.exit_code == 143);
}

TEST_CASE("health check values ddprun cannot use are refused, naming them",
          "[integration][policy][health]") {
  TempDir dir;
  const std::string not_executable = dir.path() + "/check.sh";
  std::ofstream(not_executable) << "exit 0\n";  // created 0644: not executable
  for (const auto& [flag, value, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--health_check", "", "expected builtin, off, or a command"},
           {"--health_check_timeout", "0", "expected a number of seconds, more than 0"},
           {"--health_check_interval", "-1", "expected a number of seconds, more than 0"},
           {"--health_check", "/nonexistent/check.sh --quick",
            "/nonexistent/check.sh: No such file or directory"},
           {"--health_check", not_executable, not_executable + " is not an executable file"}}) {
    auto r = run_command(ddprun_fake({flag, value}, {"print=ran"}), {}, kJobLimit);
    INFO(flag << " " << value << ": " << r.err);
    CHECK(r.exit_code == 64);
    CHECK(contains(r.err, says));
    CHECK_FALSE(contains(r.out, "ran"));
  }
}
