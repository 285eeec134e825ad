#include "rendezvous/admission.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rendezvous/limits.h"

namespace ddprun::rdzv {

namespace {

/// The first setting on which `join` disagrees with the job, as a message naming both values.
std::optional<std::string> settings_mismatch(const JobState& s, const Join& join) {
  const auto mismatch = [&](const std::string& option, const std::string& theirs,
                            const std::string& ours) -> std::optional<std::string> {
    if (theirs == ours) return std::nullopt;
    return "node " + join.name + " was started with " + option + " " + theirs + ", but job '" +
           s.run_id + "' runs with " + option + " " + ours + " (set by node " + s.settings_from +
           "): start every node with the same value";
  };
  if (auto m = mismatch("--nproc_per_node", std::to_string(join.settings.nproc_per_node),
                        std::to_string(s.settings.nproc_per_node))) {
    return m;
  }
  if (auto m = mismatch("--nnodes", nnodes_text(join.settings), nnodes_text(s.settings))) return m;
  if (auto m = mismatch("--max_restarts", std::to_string(join.settings.max_restarts),
                        std::to_string(s.settings.max_restarts))) {
    return m;
  }
  if (auto m = mismatch("--restart_window", seconds_text(join.settings.restart_window),
                        seconds_text(s.settings.restart_window))) {
    return m;
  }
  if (auto m = mismatch("--crash_loop_stop", std::to_string(join.settings.crash_loop_limit),
                        std::to_string(s.settings.crash_loop_limit))) {
    return m;
  }
  if (auto m = mismatch("--fatal_exit_codes", codes_text(join.settings.fatal_exit_codes),
                        codes_text(s.settings.fatal_exit_codes))) {
    return m;
  }
  if (auto m = mismatch("--quarantine_after", std::to_string(join.settings.quarantine_after),
                        std::to_string(s.settings.quarantine_after))) {
    return m;
  }
  return mismatch("--quarantine_cooldown", cooldown_text(join.settings), cooldown_text(s.settings));
}

/// The most restarts a job with these settings can have counted: any number with a window.
bool possible_restart_count(const RdzvSettings& settings, int restart_count) {
  if (restart_count < 0) return false;
  return settings.restart_window.count() > 0 || restart_count <= settings.max_restarts;
}

}  // namespace

std::string seconds_text(Millis ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000);
  return fmt::format("{:.3f}", static_cast<double>(ms.count()) / 1000.0);
}

std::string codes_text(const std::vector<int>& codes) {
  if (codes.empty()) return "(none)";
  return fmt::format("{}", fmt::join(codes, ","));
}

std::string cooldown_text(const RdzvSettings& settings) {
  return seconds_text(settings.quarantine_cooldown) + ":" +
         seconds_text(settings.quarantine_cooldown_max);
}

std::string nnodes_text(const RdzvSettings& settings) {
  if (settings.min_nodes == settings.max_nodes) return std::to_string(settings.min_nodes);
  return std::to_string(settings.min_nodes) + ":" + std::to_string(settings.max_nodes);
}

std::optional<common::Error> check_settings(const RdzvSettings& settings,
                                            const std::string& node_name) {
  const std::string node = "node " + node_name + " was started with ";
  if (settings.min_nodes < 1) {
    return common::Error{node + "--nnodes " + nnodes_text(settings) +
                         ": the minimum must be at least 1"};
  }
  if (settings.min_nodes > settings.max_nodes) {
    return common::Error{node + "--nnodes " + nnodes_text(settings) + ": the minimum (" +
                         std::to_string(settings.min_nodes) + ") is larger than the maximum (" +
                         std::to_string(settings.max_nodes) + ")"};
  }
  if (settings.nproc_per_node < 1) {
    return common::Error{node + "--nproc_per_node " + std::to_string(settings.nproc_per_node) +
                         ": it must be at least 1"};
  }
  if (settings.max_restarts < 0) {
    return common::Error{node + "--max_restarts " + std::to_string(settings.max_restarts) +
                         ": it must be 0 or more"};
  }
  if (settings.restart_window.count() < 0) {
    return common::Error{node + "--restart_window " + seconds_text(settings.restart_window) +
                         ": it must be 0 or more"};
  }
  if (settings.crash_loop_limit < 0 || settings.crash_loop_limit == 1) {
    return common::Error{node + "--crash_loop_stop " + std::to_string(settings.crash_loop_limit) +
                         ": it must be 0 (off) or 2 or more"};
  }
  if (settings.quarantine_after < 0) {
    return common::Error{node + "--quarantine_after " + std::to_string(settings.quarantine_after) +
                         ": it must be 0 (off) or more"};
  }
  if (settings.quarantine_cooldown.count() < 0 ||
      settings.quarantine_cooldown_max < settings.quarantine_cooldown ||
      settings.quarantine_cooldown_max > kMaxQuarantineCooldown) {
    return common::Error{node + "--quarantine_cooldown " + cooldown_text(settings) +
                         ": it must be SECONDS[:MAX] with 0 <= SECONDS <= MAX <= " +
                         seconds_text(kMaxQuarantineCooldown)};
  }
  if (settings.restart_backoff.count() < 0 ||
      settings.restart_backoff_max < settings.restart_backoff ||
      settings.restart_backoff_max > kMaxRestartBackoff) {
    return common::Error{node + "--restart_backoff " + seconds_text(settings.restart_backoff) +
                         ":" + seconds_text(settings.restart_backoff_max) +
                         ": it must be SECONDS[:MAX] with 0 <= SECONDS <= MAX <= " +
                         seconds_text(kMaxRestartBackoff)};
  }
  if (settings.fatal_exit_codes.size() > 255) {
    return common::Error{node + "--fatal_exit_codes with " +
                         std::to_string(settings.fatal_exit_codes.size()) +
                         " codes: there are only 255"};
  }
  for (const int code : settings.fatal_exit_codes) {
    if (code < 1 || code > 255)
      return common::Error{node + "--fatal_exit_codes " + codes_text(settings.fatal_exit_codes) +
                           ": " + std::to_string(code) + " is no failing exit code (1 to 255)"};
  }
  // The command line checks the same table (launcher/cli.cpp), so only a peer that is not a
  // ddprun of this version gets here.
  for (const SettingLimit& limit : kSettingLimits) {
    const long long value = setting_value(settings, limit);
    if (value < limit.min || value > limit.max) {
      return common::Error{node + "--rdzv_conf " + std::string(limit.conf_key) + "=" +
                           conf_value_text(limit, value) + ": it is out of range: allowed " +
                           describe_range(limit)};
    }
  }
  return std::nullopt;
}

std::optional<Refused> check_join(const JobState& s, const Join& join) {
  const std::string& id = join.node_id;
  if (auto invalid = check_settings(join.settings, join.name))
    return Refused{RefusalKind::Protocol, invalid->message};
  const bool first = s.settings_from.empty();
  if (!first) {
    if (auto mismatch = settings_mismatch(s, join))
      return Refused{RefusalKind::Mismatch, *mismatch};
  }
  const RdzvSettings& settings = first ? join.settings : s.settings;
  if (join.node_rank && (*join.node_rank < 0 || *join.node_rank >= settings.max_nodes)) {
    return Refused{RefusalKind::BadRank,
                   "node " + join.name + " was started with --node_rank " +
                       std::to_string(*join.node_rank) + ", but job '" + s.run_id +
                       "' has at most " + std::to_string(settings.max_nodes) + " nodes (--nnodes " +
                       nnodes_text(settings) + "): use a --node_rank from 0 to " +
                       std::to_string(settings.max_nodes - 1)};
  }
  if (join.node_rank) {
    // From the job's index of --node_rank values: a join costs no walk over thousands of nodes.
    auto [first, last] = s.index.by_node_rank.equal_range(*join.node_rank);
    for (auto holder = first; holder != last; ++holder) {
      const NodeId& other_id = *holder->second;
      const NodeRecord& node = s.nodes.at(other_id);
      // A node kept out by its health check holds no place: a replacement may take its rank.
      if (other_id != id && node.state != NodeState::KeptOut) {
        return Refused{RefusalKind::DuplicateRank,
                       "node " + join.name + " was started with --node_rank " +
                           std::to_string(*join.node_rank) + ", which node " + node.request.name +
                           " already holds in job '" + s.run_id +
                           "': give every node its own --node_rank"};
      }
    }
  }
  const bool ranks_held = s.index.previous_ranked > 0 || s.index.count_of(NodeState::Running) > 0 ||
                          s.index.count_of(NodeState::Succeeded) > 0;
  // A node kept out by its health check holds no place: its next join is a newcomer's.
  const auto self = s.nodes.find(id);
  const bool newcomer = self == s.nodes.end() || self->second.state == NodeState::KeptOut;
  // A kept-out join asks for no place, so no group rank: a former member whose rank went to
  // another node in the round that formed without it is told so only when it asks for a round.
  if (join.node_rank && newcomer && ranks_held && join.kept_out.empty()) {
    // A newcomer cannot take a group rank that a live node holds (in the running round, or
    // the one before the round that forms): that would move every worker's MASTER_ADDR.
    // (While round 0 forms nobody holds one, so thousands of first joins walk no nodes.)
    for (const auto& [other_id, node] : s.nodes) {
      const bool holds =
          node.group_rank == *join.node_rank || node.previous_rank == *join.node_rank;
      if (other_id != id && holds) {
        return Refused{RefusalKind::DuplicateRank,
                       "node " + join.name + " was started with --node_rank " +
                           std::to_string(*join.node_rank) + ", but node " + node.request.name +
                           " holds group rank " + std::to_string(*join.node_rank) + " of job '" +
                           s.run_id + "': give every node its own --node_rank, or none"};
      }
    }
  }
  if (!possible_restart_count(settings, join.restart_count)) {
    return Refused{RefusalKind::Protocol, "node " + join.name + " claims restart count " +
                                              std::to_string(join.restart_count) +
                                              ", impossible with --max_restarts " +
                                              std::to_string(settings.max_restarts)};
  }
  if (join.resume) {
    const RoundClaim& claim = *join.resume;
    if (claim.group_world_size < 1 || claim.group_world_size > settings.max_nodes ||
        claim.group_rank < 0 || claim.group_rank >= claim.group_world_size || claim.round < 0 ||
        !possible_restart_count(settings, claim.restart_count)) {
      return Refused{
          RefusalKind::Protocol,
          "node " + join.name + " re-registered an impossible round: group rank " +
              std::to_string(claim.group_rank) + " of " + std::to_string(claim.group_world_size) +
              " nodes in round " + std::to_string(claim.round) + ", restart count " +
              std::to_string(claim.restart_count) + " (--nnodes " + nnodes_text(settings) +
              ", --max_restarts " + std::to_string(settings.max_restarts) + ")"};
    }
  }
  return std::nullopt;
}

}  // namespace ddprun::rdzv
