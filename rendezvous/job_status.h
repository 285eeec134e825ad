#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>

#include "common/clock.h"
#include "rendezvous/rdzv_state.h"

// One job as `ddprun status` shows it (the JSON of a status reply, docs/operations.md#status).
// Pure. Every enum is named through its table (kJobPhaseNames, kNodeStateNames in
// rdzv_state.h; kJobOutcomeNames in protocol.h), the same rows the wire uses.

namespace ddprun::rdzv {

/// At most this many awaited nodes are named in "forming" ("awaited_count" counts them all).
constexpr std::size_t kMaxNamesInStatusForming = 64;

/// The job as `ddprun status` shows it: run id, phase, round, restart count, settings, and
/// per node: name, state, group rank, seconds since last seen (never the node_id, which a
/// connection speaks for its node with); at most kMaxNodesInStatus nodes, participants first
/// in group-rank order, then the rest by name. While a round forms, "forming" says who joined,
/// who is awaited, how many more it needs and the time left (docs/operations.md#status).
nlohmann::json describe_job(const JobState& state, common::TimePoint now);

}  // namespace ddprun::rdzv
