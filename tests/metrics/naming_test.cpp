// ddprun's own naming rules over every family the daemon and the agent export
// (docs/operations.md#metrics); promtool checks the format but not these conventions.
#include <catch2/catch.hpp>
#include <chrono>

#include "agent/agent_metrics.h"
#include "launcher/events.h"
#include "metrics/exposition.h"
#include "rendezvous/server_metrics.h"
#include "tests/metrics/http_client.h"
#include "tests/support/polling.h"

namespace ddprun::metrics {
namespace {

using namespace std::chrono_literals;
using testing::sample;

/// Every family of the daemon, with a series in each labelled family.
void exercise(rdzv::ServerMetrics& m) {
  m.connection_accepted();
  m.bad_frame();
  m.refused(rdzv::RefusalKind::Protocol);
  m.refused(rdzv::RefusalKind::Unauthorized);
  m.http_auth_failure();
  m.set_gauges({{"job", 2}}, {{rdzv::JobPhase::Running, 1}}, 3);
  rdzv::StepResult r;
  r.messages.resize(2);
  r.messages[0].node_id = rdzv::NodeId("n1");
  r.messages[0].message = rdzv::RoundReady{};
  r.messages[1].node_id = rdzv::NodeId("n2");
  r.messages[1].message = rdzv::Refused{rdzv::RefusalKind::Mismatch, "x"};
  m.stepped({}, rdzv::Tick{}, r, common::TimePoint{} + std::chrono::seconds(2));
}

/// Every family of the agent, with a recovery's phases.
void exercise(agent::AgentMetrics& m) {
  const common::TimePoint t0{};
  m.observe(ddprun::agent::event_named("failure_detected"), {{"how", "exit"}}, t0);
  m.observe(ddprun::agent::event_named("restart"), {{"restart_count", 1}}, t0 + 10ms);
  m.observe(ddprun::agent::event_named("teardown_done"), {}, t0 + 1s);
  m.observe(ddprun::agent::event_named("rendezvous_complete"), {{"round", 1}, {"restart_count", 1}},
            t0 + 3s);
  m.observe(ddprun::agent::event_named("standbys_started"), {{"count", 2}}, t0 + 2s);
  m.observe(ddprun::agent::event_named("workers_started"), {{"count", 2}, {"from_standby", 2}},
            t0 + 3500ms);
  m.observe(ddprun::agent::event_named("standbys_started"), {{"count", 2}}, t0 + 4s);
  m.observe(ddprun::agent::event_named("zygote_ready"), {}, t0 + 4s);
  m.observe(ddprun::agent::event_named("log_write_failed"), {{"path", "/x"}, {"bytes_lost", 10}},
            t0 + 5s);
  m.observe(ddprun::agent::event_named("quarantined"), {{"reason", "r"}, {"cooldown_s", 30.0}},
            t0 + 6s);
  m.observe(ddprun::agent::event_named("quarantine_over"), {{"message", "m"}}, t0 + 36s);
}

}  // namespace

TEST_CASE("every family the daemon exports follows ddprun's naming rules", "[metrics][unit]") {
  rdzv::ServerMetrics m;
  exercise(m);
  const auto families = m.registry().Collect();
  CHECK(families.size() == 15);
  CHECK(naming_problems(families) == std::vector<std::string>{});
}

TEST_CASE("every family the agent exports follows ddprun's naming rules", "[metrics][unit]") {
  agent::AgentMetrics m;
  exercise(m);
  const auto families = m.registry().Collect();
  CHECK(families.size() == 17);
  CHECK(naming_problems(families) == std::vector<std::string>{});
}

TEST_CASE("the daemon counts as lost only the nodes a disconnect or a deadline removed",
          "[metrics][unit]") {
  rdzv::ServerMetrics m;
  // Every refusal kind is there from the start, at 0, so that increase() sees the first one.
  for (const auto& [kind, name] : rdzv::kRefusalNames)
    CHECK(sample(serialize(m.registry()),
                 "ddprun_rdzv_refused_joins_total{kind=\"" + std::string(name) + "\"}") == 0);
  rdzv::ServerMetrics::Before before;
  before.phase = rdzv::JobPhase::Joining;
  before.nodes = 2;
  const common::TimePoint now{};
  // A quarantine that ends lets the node go to join again: one node fewer, nobody lost.
  rdzv::StepResult released;
  m.stepped(before, rdzv::Tick{}, released, now);
  CHECK(sample(serialize(m.registry()), "ddprun_rdzv_node_losses_total") == 0);
  // A node dropped for silence (a deadline) and one that disconnected are lost.
  rdzv::StepResult dropped;
  dropped.removed = {"host-b"};
  m.stepped(before, rdzv::Tick{}, dropped, now);
  m.stepped(before, rdzv::Disconnected{"c"}, dropped, now);
  CHECK(sample(serialize(m.registry()), "ddprun_rdzv_node_losses_total") == 2);
  // A node that left, or the nodes of a job that had ended, are not.
  rdzv::FromNode leave;
  leave.node_id = "d";
  leave.message = rdzv::Leave{"received SIGTERM"};
  m.stepped(before, leave, dropped, now);
  before.phase = rdzv::JobPhase::Closed;
  m.stepped(before, rdzv::Tick{}, dropped, now);
  CHECK(sample(serialize(m.registry()), "ddprun_rdzv_node_losses_total") == 2);
}

TEST_CASE("the naming check finds each kind of bad name", "[metrics][unit]") {
  prometheus::Registry r;
  prometheus::BuildCounter().Name("ddprun_restarts").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("ddprun_workers_total").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("ddprun_round_latency_ms").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("ddprun_round_latency").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("ddprun_seconds_spent").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("rdzv_jobs").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("ddprun_JobCount").Help("h").Register(r).Add({});
  prometheus::BuildGauge().Name("ddprun_nodes").Help("").Register(r).Add({});
  prometheus::BuildHistogram()
      .Name("ddprun_round")
      .Help("h")
      .Register(r)
      .Add({}, prometheus::Histogram::BucketBoundaries{1});
  prometheus::BuildGauge().Name("ddprun_jobs").Help("h").Register(r).Add({{"Job", "a"}});
  prometheus::BuildGauge().Name("ddprun_ok_seconds").Help("h").Register(r).Add({});
  const auto problems = naming_problems(r.Collect());
  auto about = [&](const std::string& name, const std::string& what) {
    for (const auto& p : problems)
      if (p.rfind(name + ": ", 0) == 0 && p.find(what) != std::string::npos) return true;
    return false;
  };
  CHECK(about("ddprun_restarts", "a counter must end in _total"));
  CHECK(about("ddprun_workers_total", "only counters end in _total"));
  CHECK(about("ddprun_round_latency_ms", "'ms' is not a base unit"));
  CHECK(about("ddprun_round_latency", "a name about time must end in _seconds"));
  CHECK(about("ddprun_seconds_spent", "must be the last word"));
  CHECK(about("rdzv_jobs", "ddprun_ prefix"));
  CHECK(about("ddprun_JobCount", "snake_case"));
  CHECK(about("ddprun_nodes", "no help text"));
  CHECK(about("ddprun_round", "a histogram must name its unit"));
  CHECK(about("ddprun_jobs", "bad label name 'Job'"));
  CHECK_FALSE(about("ddprun_ok_seconds", ""));
}

TEST_CASE("the daemon exports one node series per job for the first 100 jobs only",
          "[metrics][unit]") {
  rdzv::ServerMetrics m;
  std::map<std::string, std::size_t> nodes;
  for (int i = 0; i < 150; ++i)
    nodes[std::string(i < 10 ? "job00" : i < 100 ? "job0" : "job") + std::to_string(i)] = 2;
  m.set_gauges(nodes, {{rdzv::JobPhase::Running, 150}}, 300);
  std::string text = serialize(m.registry());
  CHECK(testing::count_of(text, "ddprun_rdzv_job_nodes{") == 100);
  CHECK(sample(text, "ddprun_rdzv_job_nodes{job=\"job099\"}") == 2);
  CHECK(std::isnan(sample(text, "ddprun_rdzv_job_nodes{job=\"job100\"}")));
  CHECK(sample(text, "ddprun_rdzv_nodes") == 300);
  CHECK(sample(text, "ddprun_rdzv_jobs{phase=\"running\"}") == 150);
  CHECK(sample(text, "ddprun_rdzv_connections") == 300);

  // Jobs that ended lose their series; the next in line get one.
  nodes.erase("job000");
  m.set_gauges(nodes, {{rdzv::JobPhase::Running, 149}}, 298);
  text = serialize(m.registry());
  CHECK(std::isnan(sample(text, "ddprun_rdzv_job_nodes{job=\"job000\"}")));
  CHECK(sample(text, "ddprun_rdzv_job_nodes{job=\"job100\"}") == 2);
  CHECK(testing::count_of(text, "ddprun_rdzv_job_nodes{") == 100);
}

TEST_CASE("the metrics and events summarize see the same recoveries with the same phases",
          "[metrics][unit]") {
  // Node b's log: first restarted because node a failed (no failure of its own), then a failure
  // of its own with a back-off pause. Both readers are fed the same events.
  const std::vector<std::pair<double, nlohmann::json>> events{
      {10.0,
       {{"event", "restart"},
        {"reason", "worker failure on node a"},
        {"counted", true},
        {"restart_count", 1}}},
      {10.4, {{"event", "teardown_done"}}},
      {10.5, {{"event", "rendezvous_start"}}},
      {11.0, {{"event", "rendezvous_complete"}, {"round", 1}}},
      {11.2, {{"event", "workers_started"}, {"count", 2}, {"restart_count", 1}}},
      {12.0, {{"event", "first_step"}}},
      {20.0, {{"event", "failure_detected"}, {"rank", 1}, {"exit_code", 3}, {"how", "exit"}}},
      {20.01,
       {{"event", "restart"},
        {"reason", "worker failure on node b"},
        {"counted", true},
        {"restart_count", 2}}},
      {20.2, {{"event", "teardown_done"}}},
      {20.3, {{"event", "restart_delayed"}, {"delay_ms", 2000}}},
      {22.3, {{"event", "rendezvous_start"}}},
      {22.5, {{"event", "rendezvous_complete"}, {"round", 2}}},
      {22.6, {{"event", "workers_started"}, {"count", 2}, {"restart_count", 2}}},
  };
  agent::AgentMetrics m;
  std::string log;
  for (const auto& [t, e] : events) {
    nlohmann::json fields = e;
    fields.erase("event");
    m.observe(agent::event_named(e["event"].get<std::string>()), fields,
              common::TimePoint(
                  std::chrono::duration_cast<common::Duration>(std::chrono::duration<double>(t))));
    nlohmann::json line = e;
    line["t"] = t;
    log += line.dump() + "\n";
  }
  const launcher::EventSummary summary = launcher::summarize_events(log);
  const std::string text = serialize(m.registry());
  REQUIRE(summary.recoveries.size() == 2);
  CHECK(sample(text, "ddprun_agent_recoveries_total") == 2);
  CHECK(summary.recoveries[0].cause == "restart: worker failure on node a");
  CHECK(summary.recoveries[1].cause == "rank 1 exited with 3 (exit)");
  const launcher::Recovery& last = summary.recoveries[1];
  auto phase = [&](const char* name) {
    return sample(text,
                  std::string("ddprun_agent_last_recovery_phase_seconds{phase=\"") + name + "\"}");
  };
  CHECK(*last.teardown_ms == Approx(200.0));
  CHECK(phase("teardown") == Approx(*last.teardown_ms / 1000.0));
  CHECK(*last.backoff_ms == Approx(2100.0));  // from the teardown to the rejoin
  CHECK(phase("backoff") == Approx(*last.backoff_ms / 1000.0));
  CHECK(phase("rendezvous") == Approx(*last.rendezvous_ms / 1000.0));
  CHECK(phase("spawn") == Approx(*last.spawn_ms / 1000.0));
  CHECK(phase("total") == Approx(last.total_ms / 1000.0));
  CHECK(last.total_ms == Approx(2600.0));
}

TEST_CASE("the agent's metrics follow a recovery from its events", "[metrics][unit]") {
  agent::AgentMetrics m;
  exercise(m);
  const std::string text = serialize(m.registry());
  CHECK(sample(text, "ddprun_agent_worker_failures_total{kind=\"exit\"}") == 1);
  CHECK(sample(text, "ddprun_agent_worker_failures_total{kind=\"watchdog\"}") == 0);
  CHECK(sample(text, "ddprun_agent_restarts_total") == 1);
  CHECK(sample(text, "ddprun_agent_recoveries_total") == 1);  // the restart joins the failure
  CHECK(sample(text, "ddprun_agent_job_restarts") == 1);
  CHECK(sample(text, "ddprun_agent_rendezvous_round") == 1);
  CHECK(sample(text, "ddprun_agent_workers") == 2);
  CHECK(sample(text, "ddprun_agent_standby_workers") == 2);
  CHECK(sample(text, "ddprun_agent_zygote_ready") == 1);
  CHECK(sample(text, "ddprun_agent_log_lost_bytes") == 10);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"teardown\"}") == 1);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"rendezvous\"}") == 2);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"spawn\"}") == 0.5);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"total\"}") == 3.5);
}

TEST_CASE("the agent's metrics ignore events with fields of an unexpected type",
          "[metrics][unit]") {
  agent::AgentMetrics m;
  const common::TimePoint t0{};
  for (const char* event : {"failure_detected", "restart", "rendezvous_complete", "workers_started",
                            "standbys_started", "log_write_failed", "job_end"}) {
    CHECK_NOTHROW(m.observe(agent::event_named(event),
                            {{"how", 3},
                             {"count", "x"},
                             {"from_standby", true},
                             {"path", 1},
                             {"round", nullptr},
                             {"log_bytes_lost", "x"}},
                            t0));
    CHECK_NOTHROW(m.observe(agent::event_named(event), nlohmann::json::array(), t0));
  }
  CHECK(sample(serialize(m.registry()), "ddprun_agent_worker_failures_total{kind=\"other\"}") == 2);
}

TEST_CASE("the agent's metrics say while it waits for its round to form", "[metrics][unit]") {
  agent::AgentMetrics m;
  const common::TimePoint t0{};
  const auto waiting = [&] {
    return sample(serialize(m.registry()), "ddprun_agent_in_rendezvous");
  };
  CHECK(waiting() == 0);
  m.observe(ddprun::agent::event_named("rendezvous_start"), {{"restart_count", 0}}, t0);
  CHECK(waiting() == 1);
  m.observe(ddprun::agent::event_named("rendezvous_complete"), {{"round", 0}}, t0 + 1s);
  CHECK(waiting() == 0);
  m.observe(ddprun::agent::event_named("rendezvous_start"), {{"restart_count", 1}}, t0 + 2s);
  m.observe(ddprun::agent::event_named("job_end"), {{"exit_code", 69}}, t0 + 3s);
  CHECK(waiting() == 0);
  // A quarantine's cooldown is no wait for peers; the rejoin after it is.
  m.observe(ddprun::agent::event_named("rendezvous_start"), {{"restart_count", 2}}, t0 + 4s);
  m.observe(ddprun::agent::event_named("quarantined"), {{"cooldown_s", 30.0}}, t0 + 5s);
  CHECK(waiting() == 0);
  m.observe(ddprun::agent::event_named("rendezvous_start"), {{"restart_count", 2}}, t0 + 6s);
  CHECK(waiting() == 0);
  m.observe(ddprun::agent::event_named("quarantine_over"), {{"message", "m"}}, t0 + 35s);
  m.observe(ddprun::agent::event_named("rendezvous_start"), {{"restart_count", 2}}, t0 + 36s);
  CHECK(waiting() == 1);
}

TEST_CASE("a failure after the workers restarted begins the next recovery", "[metrics][unit]") {
  agent::AgentMetrics m;
  exercise(m);
  const common::TimePoint t1 = common::TimePoint{} + std::chrono::seconds(100);
  m.observe(ddprun::agent::event_named("failure_detected"), {{"how", "watchdog"}}, t1);
  m.observe(ddprun::agent::event_named("teardown_done"), {}, t1 + 250ms);
  const std::string text = serialize(m.registry());
  CHECK(sample(text, "ddprun_agent_recoveries_total") == 2);
  CHECK(sample(text, "ddprun_agent_worker_failures_total{kind=\"watchdog\"}") == 1);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"teardown\"}") == 0.25);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"rendezvous\"}") == 0);
  CHECK(sample(text, "ddprun_agent_last_recovery_phase_seconds{phase=\"total\"}") == 0.25);
}

TEST_CASE("the agent's metrics show a pause of --restart_backoff while it lasts",
          "[metrics][unit]") {
  agent::AgentMetrics m;
  const common::TimePoint t0{};
  m.observe(ddprun::agent::event_named("restart_delayed"),
            {{"delay_ms", 2000}, {"failures_in_a_row", 3}}, t0);
  std::string text = serialize(m.registry());
  CHECK(sample(text, "ddprun_agent_restart_backoff_seconds") == 2);
  CHECK(sample(text, "ddprun_agent_restart_delays_total") == 1);
  m.observe(ddprun::agent::event_named("rendezvous_start"), {{"restart_count", 3}}, t0 + 2s);
  text = serialize(m.registry());
  CHECK(sample(text, "ddprun_agent_restart_backoff_seconds") == 0);
  CHECK(sample(text, "ddprun_agent_restart_delays_total") == 1);
}

TEST_CASE("the agent's metrics count failed health checks and say whether the node is healthy",
          "[metrics][unit][health]") {
  agent::AgentMetrics m;
  const common::TimePoint t0{};
  CHECK(sample(serialize(m.registry()), "ddprun_agent_healthy") == 1);
  m.observe(ddprun::agent::event_named("health_check_failed"), {{"why", "GPU gone"}}, t0);
  m.observe(ddprun::agent::event_named("health_check_failed"), {{"why", "GPU gone"}}, t0 + 30s);
  std::string text = serialize(m.registry());
  CHECK(sample(text, "ddprun_agent_health_check_failures_total") == 2);
  CHECK(sample(text, "ddprun_agent_healthy") == 0);
  m.observe(ddprun::agent::event_named("health_check_passed"), {{"ms", 3}}, t0 + 60s);
  CHECK(sample(serialize(m.registry()), "ddprun_agent_healthy") == 1);
}

}  // namespace ddprun::metrics
