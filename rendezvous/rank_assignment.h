#pragma once
#include <map>
#include <string>
#include <vector>

#include "rendezvous/rdzv_state.h"

// Which group rank each participant of a round gets (docs/design.md#rendezvous-state-machine).
// Pure: the state machine (rdzv_state.cpp) calls it when a round completes.

namespace ddprun::rdzv {

/// Group ranks for the participants of a round (node_ids), 0..n-1, as the participants in rank
/// order: element r points at the id (one of `participants`' strings) that gets rank r.
/// - nodes that gave --node_rank are ordered by it (ranks equal node_rank when 0..n-1 are all
///   present; gaps are closed in order);
/// - otherwise a node keeps its previous rank while it is < n and not taken; the remaining
///   nodes fill the lowest free ranks, previous holders first, then newcomers in
///   numeric-aware order of their names ("node2" before "node10"), node_id breaking ties.
/// A node's previous rank is its record's previous_rank.
std::vector<const NodeId*> assign_group_ranks(const NodeTable& nodes,
                                              const std::vector<const NodeId*>& participants);

/// Numeric-aware "less than": digit runs compare as numbers ("n2" < "n10" < "n10a").
bool natural_less(const std::string& a, const std::string& b);

}  // namespace ddprun::rdzv
