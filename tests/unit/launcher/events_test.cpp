#include "launcher/events.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

using namespace ddprun::launcher;

namespace {

std::string line(double t, const std::string& event, const std::string& extra = "") {
  return "{\"t\":" + std::to_string(t) + ",\"event\":\"" + event + "\",\"node\":\"n1\"" +
         (extra.empty() ? "" : "," + extra) + "}\n";
}

}  // namespace

TEST_CASE("a recovery is cut into phases that end with the slowest node or rank",
          "[launcher][unit]") {
  const std::string log =
      line(9.0, "workers_started", "\"restart_count\":0") + line(10.000, "fault_injected") +
      line(10.002, "failure_detected", "\"rank\":3,\"exit_code\":0,\"signal\":9,\"how\":\"exit\"") +
      line(10.010, "teardown_done") + line(10.030, "teardown_done") +  // two nodes
      line(10.035, "rendezvous_complete") + line(10.040, "rendezvous_complete") +
      line(10.041, "workers_started", "\"restart_count\":1") +
      line(10.045, "workers_started", "\"restart_count\":1") + line(10.150, "worker_main") +
      line(10.200, "pg_ready") + line(10.300, "pg_ready") + line(10.350, "snapshot_loaded") +
      line(10.400, "first_step") + line(10.420, "first_step") + "not json\n";
  const EventSummary s = summarize_events(log);
  CHECK(s.malformed_lines == 1);
  REQUIRE(s.recoveries.size() == 1);
  const Recovery& r = s.recoveries[0];
  CHECK(r.restart_count == 1);
  CHECK(r.cause == "rank 3 killed by signal 9 (exit) on n1");
  CHECK(*r.detect_ms == Approx(2.0));
  CHECK(*r.teardown_ms == Approx(28.0));
  CHECK(*r.rendezvous_ms == Approx(10.0));
  CHECK(*r.spawn_ms == Approx(5.0));
  REQUIRE(r.process_start_ms);
  CHECK(*r.process_start_ms == Approx(105.0));
  CHECK(*r.pg_init_ms == Approx(150.0));
  CHECK(*r.snapshot_load_ms == Approx(50.0));
  CHECK(*r.first_step_ms == Approx(70.0));
  CHECK(r.total_ms == Approx(420.0));
  const std::string table = format_summary(s);
  CHECK(table.find("recovery 1 (restart count 1): rank 3 killed by signal 9") != std::string::npos);
  CHECK(table.find("process start      105.0") != std::string::npos);
  CHECK(table.find("pg init            150.0") != std::string::npos);
  CHECK(summary_json(s)["recoveries"][0]["total_ms"].get<double>() == Approx(420.0));
}

TEST_CASE("each failure round is its own recovery, and missing phases stay empty",
          "[launcher][unit]") {
  const std::string log =
      line(1.0, "failure_detected", "\"rank\":0,\"exit_code\":1") + line(1.1, "teardown_done") +
      line(1.2, "rendezvous_complete") + line(1.3, "workers_started", "\"restart_count\":1") +
      line(2.0, "failure_detected", "\"rank\":1,\"exit_code\":2") + line(2.5, "teardown_done") +
      line(2.6, "rendezvous_complete") + line(2.7, "workers_started", "\"restart_count\":2");
  const EventSummary s = summarize_events(log);
  REQUIRE(s.recoveries.size() == 2);
  CHECK_FALSE(s.recoveries[0].detect_ms);
  CHECK_FALSE(s.recoveries[0].pg_init_ms);
  CHECK(s.recoveries[0].total_ms == Approx(300.0));
  CHECK(s.recoveries[1].restart_count == 2);
  CHECK(*s.recoveries[1].teardown_ms == Approx(500.0));
  CHECK(format_summary(summarize_events(line(1.0, "job_end"))) == "no recovery in 1 event(s)\n");
}

TEST_CASE("a pause of --restart_backoff is its own phase, and the summary says how the job ended",
          "[launcher][unit][policy]") {
  const std::string log =
      line(1.0, "failure_detected", "\"rank\":0,\"exit_code\":1") + line(1.1, "teardown_done") +
      line(1.1, "restart_delayed", "\"delay_ms\":2000,\"failures_in_a_row\":2") +
      line(3.1, "rendezvous_start") + line(3.2, "rendezvous_complete") +
      line(3.3, "workers_started", "\"restart_count\":2") +
      line(4.0, "failure_detected", "\"rank\":0,\"exit_code\":1") + line(4.1, "teardown_done") +
      line(4.2, "job_closed", "\"message\":\"a crash loop\",\"do_not_requeue\":true") +
      line(4.3, "job_end", "\"exit_code\":78");
  const EventSummary s = summarize_events(log);
  // The second failure ended the job: no recovery (it was listed as one, "restart count 0").
  REQUIRE(s.recoveries.size() == 1);
  CHECK(*s.recoveries[0].backoff_ms == Approx(2000.0));
  CHECK(*s.recoveries[0].rendezvous_ms == Approx(100.0));
  CHECK(s.exit_code == 78);
  CHECK(s.do_not_requeue);
  const std::string table = format_summary(s);
  CHECK(table.find("back-off          2000.0") != std::string::npos);
  CHECK(table.find("the job ended with exit 78 (do not requeue): a crash loop") !=
        std::string::npos);
  CHECK(summary_json(s)["end"]["exit_code"] == 78);
  CHECK(summary_json(s)["recoveries"][0]["backoff_ms"].get<double>() == Approx(2000.0));
}

TEST_CASE("a quarantine is its own phase, and the restart count is the restart's",
          "[launcher][unit][policy]") {
  // The rendezvous quarantines this node after its failure: it sits out 16 s, then joins again.
  const std::string log =
      line(1.0, "failure_detected", "\"rank\":0,\"exit_code\":3") +
      line(1.01, "restart", "\"reason\":\"quarantined\",\"counted\":true,\"restart_count\":4") +
      line(1.02, "quarantined", "\"cooldown_s\":16") + line(1.1, "teardown_done") +
      line(17.1, "quarantine_over", "\"message\":\"m\"") + line(17.2, "rendezvous_start") +
      line(17.5, "rendezvous_complete");
  const EventSummary s = summarize_events(log);
  REQUIRE(s.recoveries.size() == 1);
  const Recovery& r = s.recoveries[0];
  CHECK(r.restart_count == 4);  // no workers_started yet: the restart's count
  CHECK(*r.teardown_ms == Approx(100.0));
  CHECK(*r.quarantine_ms == Approx(16000.0));
  CHECK(*r.rendezvous_ms == Approx(400.0));  // not the cooldown
  const std::string table = format_summary(s);
  CHECK(table.find("recovery 1 (restart count 4)") != std::string::npos);
  CHECK(table.find("quarantine       16000.0") != std::string::npos);
  CHECK(summary_json(s)["recoveries"][0]["quarantine_ms"].get<double>() == Approx(16000.0));
  // Without a quarantine there is no such row.
  CHECK(format_summary(summarize_events(line(1.0, "failure_detected", "\"rank\":0") +
                                        line(1.1, "teardown_done") +
                                        line(1.2, "rendezvous_complete")))
            .find("quarantine") == std::string::npos);
}

TEST_CASE("a hung worker's recovery begins at its silence, and the recoveries' time is summed",
          "[launcher][unit]") {
  const std::string log = line(1.0, "failure_detected",
                               "\"rank\":1,\"signal\":6,\"how\":\"watchdog\",\"silent_ms\":3500") +
                          line(1.1, "teardown_done") + line(1.2, "rendezvous_complete") +
                          line(1.3, "workers_started", "\"restart_count\":1") +
                          line(2.0, "failure_detected", "\"rank\":0,\"exit_code\":1") +
                          line(2.5, "teardown_done") + line(2.6, "rendezvous_complete") +
                          line(2.7, "workers_started", "\"restart_count\":2");
  const EventSummary s = summarize_events(log);
  REQUIRE(s.recoveries.size() == 2);
  CHECK(*s.recoveries[0].detect_ms == Approx(3500.0));
  CHECK(s.recoveries[0].total_ms == Approx(3800.0));
  CHECK(s.recoveries[1].total_ms == Approx(700.0));
  CHECK(format_summary(s).find("time in recovery: 4500.0 ms over 2 recoveries") !=
        std::string::npos);
  CHECK(summary_json(s)["recovery_ms_total"].get<double>() == Approx(4500.0));
}

TEST_CASE("a failure whose teardown a stop signal ended is no recovery", "[launcher][unit]") {
  const std::string log = line(1.0, "failure_detected", "\"rank\":0,\"exit_code\":1") +
                          line(1.1, "signal", "\"signal\":\"SIGTERM\"") +
                          line(1.2, "teardown_done") + line(1.3, "job_end");
  CHECK(summarize_events(log).recoveries.empty());
}

TEST_CASE("a stop by signal after a recovery is not counted in it", "[launcher][unit]") {
  const std::string log = line(1.0, "failure_detected", "\"rank\":0,\"exit_code\":1") +
                          line(1.1, "teardown_done") + line(1.2, "rendezvous_complete") +
                          line(1.3, "workers_started", "\"restart_count\":1") +
                          line(1.4, "first_step") + line(5.0, "signal", "\"signal\":\"SIGTERM\"") +
                          line(5.2, "teardown_done") + line(5.3, "job_end");
  const EventSummary s = summarize_events(log);
  REQUIRE(s.recoveries.size() == 1);
  CHECK(*s.recoveries[0].teardown_ms == Approx(100.0));
  CHECK(*s.recoveries[0].first_step_ms == Approx(100.0));
  CHECK(s.recoveries[0].total_ms == Approx(400.0));
}

TEST_CASE("a line nested 100,000 deep is skipped as not an event, and the rest is summarized",
          "[launcher][unit][security]") {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  const std::string log = line(10.0, "failure_detected", "\"rank\":1") +
                          "{\"t\":10.1,\"event\":\"x\",\"deep\":" + deep + "}\n" +
                          line(10.2, "workers_started", "\"restart_count\":1");
  const EventSummary s = summarize_events(log);
  CHECK(s.malformed_lines == 1);
  REQUIRE(s.recoveries.size() == 1);
  CHECK(s.recoveries[0].restart_count == 1);
}

TEST_CASE("wrong-typed and out-of-range fields read as absent instead of ending the summary",
          "[launcher][unit][security]") {
  const std::string log =
      line(10.0, "failure_detected", "\"rank\":\"one\",\"signal\":[9],\"exit_code\":1e300") +
      line(10.1, "workers_started", "\"restart_count\":1e300") +
      line(20.0, "failure_detected", "\"rank\":2,\"how\":{},\"node\":5") +
      line(20.1, "workers_started", "\"restart_count\":18446744073709551615") +
      "{\"t\":1e999,\"event\":\"x\"}\n" + "{\"t\":\"soon\",\"event\":\"x\"}\n";
  const EventSummary s = summarize_events(log);
  REQUIRE(s.recoveries.size() == 2);
  CHECK(s.recoveries[0].cause == "rank -1 exited with 0 (exit) on n1");
  CHECK(s.recoveries[0].restart_count == 0);
  CHECK(s.recoveries[1].cause == "rank 2 exited with 0 (exit)");
  CHECK(s.recoveries[1].restart_count == 0);
  CHECK(s.malformed_lines == 2);
  CHECK_NOTHROW(format_summary(s));
  CHECK_NOTHROW(summary_json(s).dump());
}

TEST_CASE("control characters in a node's name are printed escaped", "[launcher][unit][security]") {
  const std::string log =
      "{\"t\":10.0,\"event\":\"failure_detected\",\"rank\":1,\"node\":\"n\\u001b[2J\\u009bx\"}\n" +
      line(10.1, "workers_started", "\"restart_count\":1");
  const EventSummary s = summarize_events(log);
  REQUIRE(s.recoveries.size() == 1);
  CHECK(s.recoveries[0].cause == "rank 1 exited with 0 (exit) on n\\x1b[2J\\u009bx");
  CHECK(format_summary(s).find('\x1b') == std::string::npos);
}

TEST_CASE("summarize refuses a FIFO at once instead of waiting for a writer",
          "[launcher][unit][security]") {
  char dir_template[] = "/tmp/ddprun-events-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string fifo = std::string(dir_template) + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(run_events({"summarize", fifo}) == 64);
  ::unlink(fifo.c_str());
  ::rmdir(dir_template);
}
