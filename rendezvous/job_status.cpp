#include "rendezvous/job_status.h"

#include <algorithm>
#include <string>
#include <vector>

#include "rendezvous/rank_assignment.h"

namespace ddprun::rdzv {

using common::name_of;

nlohmann::json describe_job(const JobState& state, TimePoint now) {
  nlohmann::json nodes = nlohmann::json::array();
  // Every node by name (numeric-aware, node_id breaking ties), then ...
  std::vector<const NodeEntry*> listed;
  listed.reserve(state.nodes.size());
  for (const NodeEntry& entry : state.nodes) listed.push_back(&entry);
  std::sort(listed.begin(), listed.end(), [](const NodeEntry* a, const NodeEntry* b) {
    const std::string& name_a = a->second.request.name;
    const std::string& name_b = b->second.request.name;
    if (natural_less(name_a, name_b)) return true;
    if (natural_less(name_b, name_a)) return false;
    return a->first < b->first;
  });
  std::stable_sort(listed.begin(), listed.end(), [](const NodeEntry* a, const NodeEntry* b) {
    // Participants in group-rank order first, then everyone else by name.
    const int rank_a = a->second.group_rank;
    const int rank_b = b->second.group_rank;
    if ((rank_a < 0) != (rank_b < 0)) return rank_b < 0;
    return rank_a >= 0 && rank_a < rank_b;
  });
  if (listed.size() > kMaxNodesInStatus) listed.resize(kMaxNodesInStatus);
  for (const NodeEntry* listed_node : listed) {
    const auto& [id, node] = *listed_node;
    // No node_id: it is what a connection speaks for a node with, so status never shows it.
    nlohmann::json entry = {
        {"name", node.request.name},
        {"state", std::string(name_of(node.state, kNodeStateNames))},
        {"group_rank", node.group_rank},
        {"last_seen_s",
         std::chrono::duration_cast<std::chrono::duration<double>>(now - node.last_seen).count()},
    };
    if (node.request.node_rank) entry["node_rank"] = *node.request.node_rank;
    if (node.state == NodeState::Quarantined) {
      // How long it sits out, and why (--quarantine_after)
      if (auto it = state.standing.find(node_identity(id, node.request));
          it != state.standing.end()) {
        if (it->second.until)
          entry["quarantine_left_s"] = std::max(
              0.0,
              std::chrono::duration_cast<std::chrono::duration<double>>(*it->second.until - now)
                  .count());
        entry["quarantined"] = it->second.why;
      }
    }
    if (node.state == NodeState::KeptOut && node.request.kept_out)
      entry["kept_out"] = *node.request.kept_out;  // why its health check failed
    nodes.push_back(std::move(entry));
  }
  const RdzvSettings& settings = state.settings;
  nlohmann::json job = {
      {"run_id", state.run_id},
      {"phase", std::string(name_of(state.phase, kJobPhaseNames))},
      {"round", state.round},
      {"restart_count", state.restart_count},
      {"settings",
       {{"min_nodes", settings.min_nodes},
        {"max_nodes", settings.max_nodes},
        {"nproc_per_node", settings.nproc_per_node},
        {"max_restarts", settings.max_restarts},
        {"join_timeout_s", settings.join_timeout.count() / 1000.0},
        {"last_call_timeout_s", settings.last_call_timeout.count() / 1000.0},
        {"close_timeout_s", settings.close_timeout.count() / 1000.0},
        {"keep_alive_interval_s", settings.keep_alive_interval.count() / 1000.0},
        {"keep_alive_max_attempt", settings.keep_alive_max_attempt},
        {"quarantine_after", settings.quarantine_after}}},
      {"settings_from", state.settings_from},
      {"nodes", std::move(nodes)},
      {"node_count", state.nodes.size()},
      {"spares",
       state.phase == JobPhase::Running
           ? std::count_if(state.nodes.begin(), state.nodes.end(),
                           [](const auto& n) { return n.second.state == NodeState::WaitListed; })
           : 0},
      {"quarantined",
       std::count_if(state.nodes.begin(), state.nodes.end(),
                     [](const auto& n) { return n.second.state == NodeState::Quarantined; })},
      {"kept_out", state.index.count_of(NodeState::KeptOut)},
  };
  if (state.phase == JobPhase::Joining && !state.settings_from.empty()) {
    // The round being formed: who joined, who is awaited (told to restart, not back yet), how
    // many more it needs, and the deadlines that end it.
    int joined = 0;
    int awaited_count = 0;
    nlohmann::json awaited = nlohmann::json::array();
    for (const NodeEntry* listed_node : listed) {  // listed nodes, in the table's order
      const NodeRecord& node = listed_node->second;
      if (node.state == NodeState::Stopping && awaited.size() < kMaxNamesInStatusForming)
        awaited.push_back(node.request.name);
    }
    for (const auto& [id, node] : state.nodes) {
      joined += node.state == NodeState::Joined;
      awaited_count += node.state == NodeState::Stopping;
    }
    const auto seconds_until = [&](TimePoint t) {
      return std::chrono::duration_cast<std::chrono::duration<double>>(t - now).count();
    };
    nlohmann::json forming = {
        {"joined", joined},
        {"awaited", std::move(awaited)},
        {"awaited_count", awaited_count},
        {"more_needed", std::max(0, settings.min_nodes - joined)},
    };
    if (joined < settings.min_nodes)
      forming["join_timeout_in_s"] = seconds_until(state.round_started + settings.join_timeout);
    if (state.last_call) forming["last_call_in_s"] = seconds_until(*state.last_call);
    // The nodes' --restart_backoff pause: the round forms after it.
    if (state.round_started > now) forming["pause_ends_in_s"] = seconds_until(state.round_started);
    job["forming"] = std::move(forming);
  }
  if (state.closed) {
    job["outcome"] = std::string(name_of(state.closed->outcome, kJobOutcomeNames));
    job["message"] = state.closed->message;
  }
  return job;
}

}  // namespace ddprun::rdzv
