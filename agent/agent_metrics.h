#pragma once
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent/event_names.h"
#include "agent/recovery_tracker.h"
#include "common/clock.h"

namespace ddprun::agent {

/// The agent's metrics (ddprun --metrics_port), derived from the events it records
/// (event_log.h): the agent hands every event to observe(), with or without --event_log, so
/// the metrics and `ddprun events summarize` read the same facts. No clock, no I/O.
class AgentMetrics {
 public:
  AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  prometheus::Registry& registry() { return registry_; }

  /// One event, as the event log writes it: its name, its fields and when it happened.
  void observe(EventName event, const nlohmann::json& fields, common::TimePoint at);

 private:
  prometheus::Registry registry_;
  prometheus::Gauge& workers_;
  prometheus::Counter& restarts_;
  prometheus::Gauge& job_restarts_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Gauge& round_;
  prometheus::Gauge& standbys_;
  prometheus::Gauge& zygote_ready_;
  prometheus::Gauge& log_lost_bytes_;
  prometheus::Counter& recoveries_;
  prometheus::Gauge& backoff_;
  prometheus::Counter& delays_;
  prometheus::Counter& health_failures_;
  prometheus::Gauge& healthy_;
  prometheus::Gauge& in_rendezvous_;
  prometheus::Counter& quarantines_;
  prometheus::Gauge& quarantined_;
  prometheus::Family<prometheus::Gauge>& phases_;
  /// The recoveries, as `ddprun events summarize` cuts them (the same RecoveryTracker).
  RecoveryTracker recoveries_seen_;
  std::map<std::string, long long> lost_by_file_;
};

}  // namespace ddprun::agent
