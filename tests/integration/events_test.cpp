// --event_log, ddprun events summarize, and the watchdog for hung workers.
#include <signal.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/ddprun_runs.h"

using namespace ddprun::testing;

namespace {

/// The events' names, in order.
std::vector<std::string> event_names(const std::string& path) {
  std::vector<std::string> names;
  for (const auto& e : events_of(path))
    if (e.is_object() && e.contains("event") && e["event"].is_string()) names.push_back(e["event"]);
  return names;
}

}  // namespace

TEST_CASE("the event log tells a failure and its recovery, and summarize cuts it into phases",
          "[integration][events]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "2", "--max_restarts", "1", "--event_log", log},
                  {"report=pg_ready", "exit_if_restart=1:0", "exit_if_rank=1:3", "hang"}));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto names = event_names(log);
  const std::vector<std::string> expected{
      "rendezvous_start", "rendezvous_complete", "workers_started",  "failure_detected",
      "restart",          "teardown_done",       "rendezvous_start", "rendezvous_complete",
      "workers_started",  "job_closed",          "job_end"};
  std::vector<std::string> agent_events;
  for (const auto& n : names)
    if (n != "pg_ready") agent_events.push_back(n);
  CHECK(agent_events == expected);
  CHECK(count_of(read_file(log), "\"event\":\"pg_ready\"") >= 2);
  CHECK(contains(read_file(log), "\"source\":\"worker\""));

  auto summary = run_command({DDPRUN_BIN, "events", "summarize", log});
  INFO(summary.out << summary.err);
  CHECK(summary.exit_code == 0);
  CHECK(contains(summary.out, "recovery 1 (restart count 1): rank 1 exited with 3 (exit)"));
  CHECK(contains(summary.out, "pg init"));
  auto as_json = run_command({DDPRUN_BIN, "events", "summarize", log, "--json"});
  CHECK(contains(as_json.out, "\"pg_init_ms\""));
  CHECK(run_command({DDPRUN_BIN, "events", "summarize", dir.path() + "/missing"}).exit_code == 64);
}

TEST_CASE("a worker that stops reporting progress is killed by the watchdog and restarted",
          "[integration][events]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  // Attempt 0: rank 1 reports once, then stops itself (SIGSTOP): hung, not dead.
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "2", "--max_restarts", "1", "--watchdog_timeout", "0.5",
                   "--event_log", log},
                  {"report=heartbeat", "exit_if_restart=1:0", "exit_if_rank=0:0", "signal=19"}),
      {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.err, "made no progress for"));
  CHECK(contains(r.err, "restarting workers: restart 1 of 1"));
  CHECK(contains(read_file(log), "\"how\":\"watchdog\""));
}

TEST_CASE("the watchdog's failure report says the worker was hung", "[integration][events]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "1", "--watchdog_timeout", "0.3"},
                                   {"report=heartbeat", "hang"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK(contains(r.err, "killed by the watchdog (--watchdog_timeout)"));
  // The failure line, which the other nodes see as the restart's reason, says so too.
  CHECK(contains(r.err,
                 "failed with signal SIGKILL (9), killed by the watchdog: no progress for "
                 "more than 300 ms (--watchdog_timeout); stopping the group"));
}

TEST_CASE("a hung worker's native stacks are in the log and the event log before it is killed",
          "[integration][events]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "1", "--watchdog_timeout", "0.3", "--event_log", log},
                  {"report=heartbeat", "hang"}),
      {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK(contains(r.err, "native stacks of worker rank 0 (local rank 0, pid "));
  CHECK(contains(r.err, "made no progress for more than 300 ms (--watchdog_timeout):"));
  // eu-stack names the frames: the worker sleeps in main.
  CHECK(contains(r.err, " main"));
  const std::string events = read_file(log);
  CHECK(contains(events, "\"event\":\"stacks_dumped\""));
  CHECK(events.find("stacks_dumped") < events.find("failure_detected"));
}

TEST_CASE("a worker that never reports is never touched by the watchdog", "[integration][events]") {
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "1", "--watchdog_timeout", "0.2"}, {"sleep=800", "exit=0"}),
      {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
}

TEST_CASE("an event log that cannot be written warns and counts its lost events, and the job runs",
          "[integration][events]") {
  // /dev/full opens, and every write to it fails with ENOSPC, as on a full disk.
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "1", "--event_log", "/dev/full"}, {"print=ran", "exit=0"}));
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "ran"));
  CHECK(count_of(r.err, "cannot write the event log /dev/full: No space left on device") == 1);
  CHECK(contains(r.err, "event(s) could not be written to the event log /dev/full"));
}

TEST_CASE("failures in a row pause 0, then 1, then 2 s before the next round",
          "[integration][events][backoff]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  auto r = run_command(ddprun_fake({"--nproc_per_node", "1", "--max_restarts", "3", "--event_log",
                                    log, "--restart_backoff", "1:30", "--crash_loop_stop", "0"},
                                   {"exit=3"}),
                       {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 75);
  const auto delayed = events_named(log, "restart_delayed");
  REQUIRE(delayed.size() == 2);  // none after the first failure; none after the last
  CHECK(delayed[0]["delay_ms"] == 1000);
  CHECK(delayed[0]["failures_in_a_row"] == 2);
  CHECK(delayed[1]["delay_ms"] == 2000);
  CHECK(contains(r.err, "waiting 1.0 s before the next round: 2 failures in a row"));
  // Each pause is kept: the round after it starts no earlier than it says.
  const auto starts = events_named(log, "rendezvous_start");
  REQUIRE(starts.size() == 4);
  for (std::size_t i = 0; i < delayed.size(); ++i)
    CHECK(starts[i + 2]["t"].get<double>() - delayed[i]["t"].get<double>() >=
          delayed[i]["delay_ms"].get<double>() / 1000.0);
}

TEST_CASE("a SIGTERM during the pause before the next round ends the job at once",
          "[integration][events][backoff]") {
  TempDir dir;
  const std::string log = dir.path() + "/events.jsonl";
  Subprocess job(ddprun_fake({"--nproc_per_node", "1", "--max_restarts", "5", "--event_log", log,
                              "--restart_backoff", "30:60"},
                             {"exit=3"}));
  REQUIRE(wait_until([&] { return !events_named(log, "restart_delayed").empty(); }, kJobLimit));
  job.send(SIGTERM);
  const auto r = job.wait(std::chrono::seconds(20));  // far less than the 30 s pause
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 143);
  CHECK(events_named(log, "workers_started").size() == 2);  // no round after the pause
}

TEST_CASE("a --restart_backoff value ddprun cannot use is refused, naming it",
          "[integration][backoff]") {
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"-1", "expected SECONDS or SECONDS:MAX"},
           {"5:2", "the maximum (2) is shorter than the first pause (5)"},
           {"1:2:3", "expected SECONDS or SECONDS:MAX"},
           {"99999", "at most 86400 seconds"}}) {
    auto r = run_command(ddprun_fake({"--restart_backoff", value}, {"print=ran"}), {}, kJobLimit);
    INFO(value << ": " << r.err);
    CHECK(r.exit_code == 64);
    CHECK(contains(r.err, "--restart_backoff " + value + ": " + says));
    CHECK_FALSE(contains(r.out, "ran"));
  }
}
