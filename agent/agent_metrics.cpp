#include "agent/agent_metrics.h"

#include <algorithm>

namespace ddprun::agent {

using nlohmann::json;
using prometheus::BuildCounter;
using prometheus::BuildGauge;

namespace {

/// The failure kinds failure_detected names (local_agent.cpp's how_detected); anything else is
/// "other", so the label's values stay a fixed set.
constexpr const char* kFailureKinds[] = {"exit", "watchdog", "launch", "other"};

double seconds(common::Duration d) { return std::chrono::duration<double>(d).count(); }

/// A phase's gauge value: its seconds, 0 when the recovery has not reached it.
double gauge_seconds(const std::optional<double>& ms) { return ms ? *ms / 1000.0 : 0.0; }

}  // namespace

AgentMetrics::AgentMetrics()
    : workers_(BuildGauge()
                   .Name("ddprun_agent_workers")
                   .Help("Workers of this node's running group (0 between groups)")
                   .Register(registry_)
                   .Add({})),
      restarts_(BuildCounter()
                    .Name("ddprun_agent_restarts_total")
                    .Help("Restarts of this node's worker group the rendezvous asked for")
                    .Register(registry_)
                    .Add({})),
      job_restarts_(BuildGauge()
                        .Name("ddprun_agent_job_restarts")
                        .Help("The job's counted restarts so far, as the rendezvous reports them "
                              "(compare with --max_restarts)")
                        .Register(registry_)
                        .Add({})),
      failures_(BuildCounter()
                    .Name("ddprun_agent_worker_failures_total")
                    .Help("Worker failures this node detected, by kind: exit (non-zero exit or "
                          "signal), watchdog (hung), launch (did not start)")
                    .Register(registry_)),
      round_(BuildGauge()
                 .Name("ddprun_agent_rendezvous_round")
                 .Help("The rendezvous round of this node's current worker group")
                 .Register(registry_)
                 .Add({})),
      standbys_(BuildGauge()
                    .Name("ddprun_agent_standby_workers")
                    .Help("Standby worker processes ready for the next restart")
                    .Register(registry_)
                    .Add({})),
      zygote_ready_(BuildGauge()
                        .Name("ddprun_agent_zygote_ready")
                        .Help("1 while the Python zygote that forks standbys is ready, else 0")
                        .Register(registry_)
                        .Add({})),
      log_lost_bytes_(BuildGauge()
                          .Name("ddprun_agent_log_lost_bytes")
                          .Help("Bytes of worker output that could not be written to log files "
                                "(as of each file's first failure, and at the job's end)")
                          .Register(registry_)
                          .Add({})),
      recoveries_(BuildCounter()
                      .Name("ddprun_agent_recoveries_total")
                      .Help("Recoveries this node began (a worker failure or a restart)")
                      .Register(registry_)
                      .Add({})),
      backoff_(BuildGauge()
                   .Name("ddprun_agent_restart_backoff_seconds")
                   .Help("The pause of --restart_backoff this node waits out before the next "
                         "round (0 when none)")
                   .Register(registry_)
                   .Add({})),
      delays_(BuildCounter()
                  .Name("ddprun_agent_restart_delays_total")
                  .Help("Rounds this node joined only after a pause of --restart_backoff")
                  .Register(registry_)
                  .Add({})),
      health_failures_(BuildCounter()
                           .Name("ddprun_agent_health_check_failures_total")
                           .Help("Health checks (--health_check) this node failed; each kept it "
                                 "out of the job's rounds for --health_check_interval")
                           .Register(registry_)
                           .Add({})),
      healthy_(BuildGauge()
                   .Name("ddprun_agent_healthy")
                   .Help("1 when this node's last health check passed (or none ran yet), 0 "
                         "while it is kept out after a failed one")
                   .Register(registry_)
                   .Add({})),
      in_rendezvous_(BuildGauge()
                         .Name("ddprun_agent_in_rendezvous")
                         .Help("1 while this node waits for its round to form (for its peers, "
                               "or as a spare for a place), 0 while its workers run or it "
                               "stops")
                         .Register(registry_)
                         .Add({})),
      quarantines_(BuildCounter()
                       .Name("ddprun_agent_quarantines_total")
                       .Help("Times the rendezvous quarantined this node because its workers "
                             "kept failing (--quarantine_after)")
                       .Register(registry_)
                       .Add({})),
      quarantined_(BuildGauge()
                       .Name("ddprun_agent_quarantined")
                       .Help("1 while this node sits out a quarantine, else 0")
                       .Register(registry_)
                       .Add({})),
      phases_(BuildGauge()
                  .Name("ddprun_agent_last_recovery_phase_seconds")
                  .Help("Phases of the last recovery, as ddprun events summarize measures them: "
                        "teardown, backoff, quarantine, rendezvous, spawn, process_start, "
                        "pg_init, snapshot_load, first_step, and total (from the failure to the "
                        "last phase so far)")
                  .Register(registry_)) {
  for (const char* kind : kFailureKinds) failures_.Add({{"kind", kind}});
  healthy_.Set(1);
}

void AgentMetrics::observe(EventName event, const json& fields, common::TimePoint at) {
  // Read defensively: a field of another type is absent, never an exception in the agent.
  auto number = [&](const char* key) -> std::optional<double> {
    if (!fields.is_object() || !fields.contains(key) || !fields[key].is_number()) return {};
    return fields[key].get<double>();
  };
  auto text = [&](const char* key) -> std::string {
    if (!fields.is_object() || !fields.contains(key) || !fields[key].is_string()) return "";
    return fields[key].get<std::string>();
  };

  if (event == EventName::FailureDetected || event == EventName::Restart) {
    if (event == EventName::FailureDetected) {
      const std::string how = text("how");
      bool known = false;
      for (const char* kind : kFailureKinds) known = known || how == kind;
      failures_.Add({{"kind", known ? how : "other"}}).Increment();
    } else {
      restarts_.Increment();
      if (auto count = number("restart_count")) job_restarts_.Set(*count);
    }
  }
  // What a recovery is and where its phases end: agent/recovery_tracker.h, which `ddprun
  // events summarize` uses too.
  if (recoveries_seen_.observe(event, fields, seconds(at.time_since_epoch())))
    recoveries_.Increment();
  if (const auto last = recoveries_seen_.last()) {
    const std::pair<const char*, const std::optional<double>*> phases[] = {
        {"teardown", &last->teardown_ms},     {"backoff", &last->backoff_ms},
        {"quarantine", &last->quarantine_ms}, {"rendezvous", &last->rendezvous_ms},
        {"spawn", &last->spawn_ms},           {"process_start", &last->process_start_ms},
        {"pg_init", &last->pg_init_ms},       {"snapshot_load", &last->snapshot_load_ms},
        {"first_step", &last->first_step_ms}};
    for (const auto& [name, ms] : phases) phases_.Add({{"phase", name}}).Set(gauge_seconds(*ms));
    phases_.Add({{"phase", "total"}}).Set(last->total_ms / 1000.0);
  }
  if (event == EventName::FailureDetected || event == EventName::Restart) return;
  if (event == EventName::HealthCheckFailed) {
    health_failures_.Increment();
    healthy_.Set(0);
  } else if (event == EventName::HealthCheckPassed) {
    healthy_.Set(1);
  } else if (event == EventName::Quarantined) {
    quarantines_.Increment();
    quarantined_.Set(1);
  } else if (event == EventName::QuarantineOver) {
    quarantined_.Set(0);
  }
  if (event == EventName::RestartDelayed) {
    backoff_.Set(number("delay_ms").value_or(0) / 1000.0);
    delays_.Increment();
  } else if (event == EventName::RendezvousStart) {
    backoff_.Set(0);
  }
  // A quarantined node waits in its rendezvous too, but for its cooldown: not for peers.
  if (event == EventName::RendezvousStart)
    in_rendezvous_.Set(quarantined_.Value() > 0 ? 0 : 1);
  else if (event == EventName::RendezvousComplete || event == EventName::JobEnd ||
           event == EventName::Quarantined)
    in_rendezvous_.Set(0);
  if (event == EventName::RendezvousComplete) {
    if (auto r = number("round")) round_.Set(*r);
    if (auto count = number("restart_count")) job_restarts_.Set(*count);
  } else if (event == EventName::WorkersStarted) {
    if (auto count = number("count")) workers_.Set(*count);
    // `from_standby` of the standbys became workers of this group; new ones start next.
    if (auto used = number("from_standby")) standbys_.Set(std::max(0.0, standbys_.Value() - *used));
  } else if (event == EventName::TeardownDone || event == EventName::JobEnd) {
    workers_.Set(0);
    if (event == EventName::JobEnd) {
      standbys_.Set(0);
      zygote_ready_.Set(0);
      if (auto lost = number("log_bytes_lost")) log_lost_bytes_.Set(*lost);
    }
  } else if (event == EventName::StandbysStarted) {
    if (auto count = number("count")) standbys_.Increment(*count);
  } else if (event == EventName::ZygoteReady) {
    zygote_ready_.Set(1);
  } else if (event == EventName::LogWriteFailed) {
    lost_by_file_[text("path")] = static_cast<long long>(number("bytes_lost").value_or(0));
    double total = 0;
    for (const auto& [file, bytes] : lost_by_file_) total += static_cast<double>(bytes);
    log_lost_bytes_.Set(total);
  }
}

}  // namespace ddprun::agent
