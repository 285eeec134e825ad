#pragma once
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "rendezvous/protocol.h"
#include "rendezvous/rdzv_state.h"

// Who may take part in a job: every rule a Join must pass, in one place, each refusal worded for
// the user (the node, the flag as typed, both values, and the fix). protocol.cpp reads a
// message's shape and types only, so these words are the ones a refused user reads.
// step() (rdzv_state.h) asks check_join() before any transition of a Join; a Closed job and a
// dropped id are the state machine's own transitions. docs/design.md#admission lists the rules.

namespace ddprun::rdzv {

/// --nnodes as the user typed it: "2" or "2:4".
std::string nnodes_text(const RdzvSettings& settings);

/// A duration in seconds as a flag takes it: "600", or "0.250" for a fraction.
std::string seconds_text(Millis ms);

/// --quarantine_cooldown as the flag takes it: "30:600".
std::string cooldown_text(const RdzvSettings& settings);

/// The longest quarantine: a day (the wire's 32-bit milliseconds would allow 24 days).
inline constexpr Millis kMaxQuarantineCooldown{86'400'000};

/// --fatal_exit_codes as a list: "3,42", or "(none)".
std::string codes_text(const std::vector<int>& codes);

/// Settings no job can run with, named as the node `node_name` was started with: --nnodes with
/// a minimum under 1 or over the maximum, --nproc_per_node under 1, --max_restarts or
/// --restart_window under 0, --crash_loop_stop 1 or under 0, a fatal exit code outside 1..255,
/// --quarantine_after under 0, a --quarantine_cooldown out of order or over a day, an
/// --rdzv_conf value outside rendezvous/limits.h's table. nullopt when the job can run with them.
std::optional<common::Error> check_settings(const RdzvSettings& settings,
                                            const std::string& node_name);

/// Why `join` cannot take part in `job` (phase Joining or Running), or nullopt. In order:
/// - settings no job can run with (check_settings)                        -> Protocol
/// - --nproc_per_node, --nnodes, --max_restarts or the failure policy's
///   settings (--restart_window, --crash_loop_stop, --fatal_exit_codes,
///   --quarantine_after, --quarantine_cooldown)
///   unlike the job's                                                       -> Mismatch
/// - --node_rank outside 0..max_nodes-1                                     -> BadRank
/// - --node_rank given to another live node, or (for a newcomer) a group rank
///   a live node holds in the running or the previous round                 -> DuplicateRank
/// - a restart count outside 0..--max_restarts (any count >= 0 with a window) -> Protocol
/// - a re-registered round (resume) no job with these settings can have     -> Protocol
/// `join.node_id` must be the connection's id.
std::optional<Refused> check_join(const JobState& job, const Join& join);

}  // namespace ddprun::rdzv
