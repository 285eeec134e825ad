#pragma once
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <map>
#include <string>

#include "rendezvous/protocol.h"
#include "rendezvous/rdzv_state.h"

namespace ddprun::rdzv {

/// At most this many jobs get a series of their own in ddprun_rdzv_job_nodes (the first in
/// run-id order); ddprun_rdzv_nodes counts the nodes of every job. A daemon may hold 10,000
/// jobs: one series each would swamp Prometheus (docs/operations.md#metrics).
constexpr std::size_t kMaxJobsExported = 100;

/// The rendezvous server's metrics (ddprun-rdzvd --metrics_port), in a registry of their own.
/// The server counts what it sees at its edges (connections, frames, the handshake) and what
/// step() returned (rounds, restarts, losses, refusals); gauges are read at scrape time. The
/// state machine itself stays pure.
class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  prometheus::Registry& registry() { return registry_; }

  void connection_accepted() { accepted_.Increment(); }
  void bad_frame() { bad_frames_.Increment(); }
  /// A request to the metrics port (status page, /status, /metrics) with a wrong secret.
  void http_auth_failure() { http_auth_failures_.Increment(); }
  /// The server refused a message itself (protocol layer or handshake).
  void refused(RefusalKind kind);
  /// What one step() did to one job: `before` is the job's state as step() received it (its
  /// phase, round and its start, restart count and node count), `after` the result.
  struct Before {
    JobPhase phase = JobPhase::Joining;
    int round = 0;
    TimePoint round_started;
    int restart_count = 0;
    std::size_t nodes = 0;
  };
  void stepped(const Before& before, const Event& event, const StepResult& after, TimePoint now);
  /// Gauges, at scrape time: jobs by phase, nodes (all, and per job for the first
  /// kMaxJobsExported jobs), nodes by state (spares are wait_listed, quarantined ones
  /// quarantined), open connections.
  void set_gauges(const std::map<std::string, std::size_t>& nodes_by_job,
                  const std::map<JobPhase, std::size_t>& jobs_by_phase, std::size_t connections,
                  const std::map<NodeState, std::size_t>& nodes_by_state = {});

 private:
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Gauge>& jobs_family_;
  prometheus::Gauge& nodes_;
  prometheus::Family<prometheus::Gauge>& job_nodes_family_;
  std::map<std::string, prometheus::Gauge*> job_nodes_;
  prometheus::Gauge& connections_;
  prometheus::Counter& accepted_;
  prometheus::Family<prometheus::Counter>& refused_family_;
  prometheus::Counter& bad_frames_;
  prometheus::Counter& auth_failures_;
  prometheus::Counter& http_auth_failures_;
  prometheus::Family<prometheus::Counter>& refused_joins_;
  prometheus::Counter& rounds_;
  prometheus::Counter& restarts_;
  prometheus::Counter& node_losses_;
  prometheus::Family<prometheus::Gauge>& nodes_by_state_;
  prometheus::Counter& quarantines_;
  prometheus::Histogram& round_latency_;
};

}  // namespace ddprun::rdzv
