#include "rendezvous/server_metrics.h"

#include <algorithm>

namespace ddprun::rdzv {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

/// Round latency buckets, in seconds: a local round forms in milliseconds, a large job's first
/// round waits for its last node (the join timeout is 600 s by default).
const prometheus::Histogram::BucketBoundaries kRoundLatencyBuckets{
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

}  // namespace

ServerMetrics::ServerMetrics()
    : jobs_family_(BuildGauge()
                       .Name("ddprun_rdzv_jobs")
                       .Help("Jobs the rendezvous server holds, by phase")
                       .Register(registry_)),
      nodes_(BuildGauge()
                 .Name("ddprun_rdzv_nodes")
                 .Help("Live nodes of all jobs")
                 .Register(registry_)
                 .Add({})),
      job_nodes_family_(BuildGauge()
                            .Name("ddprun_rdzv_job_nodes")
                            .Help("Live nodes of one job (the first 100 jobs by run id)")
                            .Register(registry_)),
      connections_(BuildGauge()
                       .Name("ddprun_rdzv_connections")
                       .Help("Rendezvous connections open now")
                       .Register(registry_)
                       .Add({})),
      accepted_(BuildCounter()
                    .Name("ddprun_rdzv_connections_accepted_total")
                    .Help("Rendezvous connections accepted")
                    .Register(registry_)
                    .Add({})),
      refused_family_(BuildCounter()
                          .Name("ddprun_rdzv_refused_frames_total")
                          .Help("Frames the server refused: undecodable (bad_frame) or against "
                                "the protocol (protocol)")
                          .Register(registry_)),
      bad_frames_(refused_family_.Add({{"reason", "bad_frame"}})),
      auth_failures_(BuildCounter()
                         .Name("ddprun_rdzv_authentication_failures_total")
                         .Help("Connections that failed to prove the shared secret")
                         .Register(registry_)
                         .Add({})),
      http_auth_failures_(BuildCounter()
                              .Name("ddprun_rdzv_http_authentication_failures_total")
                              .Help("Requests to the metrics port (status page, /status, "
                                    "/metrics with --metrics_auth) refused for a wrong secret")
                              .Register(registry_)
                              .Add({})),
      refused_joins_(BuildCounter()
                         .Name("ddprun_rdzv_refused_joins_total")
                         .Help("Joins the rendezvous refused, by kind (mismatch, bad rank, "
                               "duplicate rank, closed job, dropped node, protocol)")
                         .Register(registry_)),
      rounds_(BuildCounter()
                  .Name("ddprun_rdzv_rounds_completed_total")
                  .Help("Rendezvous rounds completed, all jobs")
                  .Register(registry_)
                  .Add({})),
      restarts_(BuildCounter()
                    .Name("ddprun_rdzv_restarts_total")
                    .Help("Counted restarts (worker failures and node losses), all jobs")
                    .Register(registry_)
                    .Add({})),
      node_losses_(BuildCounter()
                       .Name("ddprun_rdzv_node_losses_total")
                       .Help("Nodes lost without leaving: disconnected or silent past the "
                             "keep-alive window")
                       .Register(registry_)
                       .Add({})),
      nodes_by_state_(BuildGauge()
                          .Name("ddprun_rdzv_nodes_by_state")
                          .Help("Live nodes of all jobs by state: wait_listed nodes are spares, "
                                "quarantined ones sit out a cooldown (--quarantine_after)")
                          .Register(registry_)),
      quarantines_(BuildCounter()
                       .Name("ddprun_rdzv_quarantines_total")
                       .Help("Nodes quarantined because their workers kept failing "
                             "(--quarantine_after), all jobs")
                       .Register(registry_)
                       .Add({})),
      round_latency_(BuildHistogram()
                         .Name("ddprun_rdzv_round_latency_seconds")
                         .Help("Time from a round's start (its first join, or the restart that "
                               "opened it) to its completion")
                         .Register(registry_)
                         .Add({}, kRoundLatencyBuckets)) {
  refused_family_.Add({{"reason", "protocol"}});
  // Every kind from the start, at 0: increase() sees the first refusal of each.
  for (const auto& [kind, name] : kRefusalNames) refused_joins_.Add({{"kind", std::string(name)}});
  for (const auto& [phase, name] : kJobPhaseNames) jobs_family_.Add({{"phase", std::string(name)}});
  for (const auto& [state, name] : kNodeStateNames)
    nodes_by_state_.Add({{"state", std::string(name)}});
}

void ServerMetrics::refused(RefusalKind kind) {
  if (kind == RefusalKind::Unauthorized)
    auth_failures_.Increment();
  else
    refused_family_.Add({{"reason", "protocol"}}).Increment();
}

void ServerMetrics::stepped(const Before& before, const Event& event, const StepResult& after,
                            TimePoint now) {
  for (const Outgoing& out : after.messages) {
    if (const auto* ready = std::get_if<RoundReady>(&out.message);
        ready && ready->group_rank == 0) {
      // One RoundReady per participant: group rank 0's counts the round once.
      rounds_.Increment();
      // From the end of the nodes' --restart_backoff pause; a round whose nodes paused less
      // than the longest pause allowed completes before it (0).
      round_latency_.Observe(
          std::max(0.0, std::chrono::duration<double>(now - before.round_started).count()));
    } else if (const auto* restart = std::get_if<Restart>(&out.message);
               restart && restart->quarantine.count() > 0) {
      quarantines_.Increment();
    } else if (const auto* refused = std::get_if<Refused>(&out.message)) {
      refused_joins_.Add({{"kind", std::string(common::name_of(refused->kind, kRefusalNames))}})
          .Increment();
    }
  }
  if (after.state.restart_count > before.restart_count)
    restarts_.Increment(after.state.restart_count - before.restart_count);
  // The nodes a disconnect or a deadline removed were lost (a Leave is not a loss, nor the end
  // of a closed job or its tombstone, nor a quarantined node let go to join again).
  const bool may_lose =
      std::holds_alternative<Disconnected>(event) || std::holds_alternative<Tick>(event);
  if (may_lose && before.phase != JobPhase::Closed && !after.erase && !after.removed.empty())
    node_losses_.Increment(static_cast<double>(after.removed.size()));
}

void ServerMetrics::set_gauges(const std::map<std::string, std::size_t>& nodes_by_job,
                               const std::map<JobPhase, std::size_t>& jobs_by_phase,
                               std::size_t connections,
                               const std::map<NodeState, std::size_t>& nodes_by_state) {
  for (const auto& [state, name] : kNodeStateNames) {
    auto it = nodes_by_state.find(state);
    nodes_by_state_.Add({{"state", std::string(name)}})
        .Set(it == nodes_by_state.end() ? 0.0 : static_cast<double>(it->second));
  }
  for (const auto& [phase, name] : kJobPhaseNames) {
    auto it = jobs_by_phase.find(phase);
    jobs_family_.Add({{"phase", std::string(name)}})
        .Set(it == jobs_by_phase.end() ? 0.0 : static_cast<double>(it->second));
  }
  std::size_t total = 0;
  for (const auto& [job, count] : nodes_by_job) total += count;
  nodes_.Set(static_cast<double>(total));
  connections_.Set(static_cast<double>(connections));
  std::map<std::string, std::size_t> shown;
  for (const auto& [job, count] : nodes_by_job) {
    if (shown.size() >= kMaxJobsExported) break;
    shown.emplace(job, count);
  }
  // Series of jobs that are gone, or no longer among the first kMaxJobsExported, go away.
  for (auto it = job_nodes_.begin(); it != job_nodes_.end();) {
    if (shown.count(it->first)) {
      ++it;
      continue;
    }
    job_nodes_family_.Remove(it->second);
    it = job_nodes_.erase(it);
  }
  for (const auto& [job, count] : shown) {
    auto [it, fresh] = job_nodes_.try_emplace(job, nullptr);
    if (fresh) it->second = &job_nodes_family_.Add({{"job", job}});
    it->second->Set(static_cast<double>(count));
  }
}

}  // namespace ddprun::rdzv
