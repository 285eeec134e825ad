#include "rendezvous/rank_assignment.h"

#include <algorithm>
#include <optional>

namespace ddprun::rdzv {

std::vector<const NodeId*> assign_group_ranks(const NodeTable& nodes,
                                              const std::vector<const NodeId*>& participants) {
  // Each participant looked up once: the sorts below compare these, not map look-ups by id
  // (16,384 participants would otherwise cost millions of string comparisons per round).
  struct Entry {
    const NodeId* id;
    const NodeJoin* request;
    std::optional<int> previous;  ///< its group rank in the last round
  };
  const auto name_less = [](const Entry& a, const Entry& b) {
    if (natural_less(a.request->name, b.request->name)) return true;
    if (natural_less(b.request->name, a.request->name)) return false;
    return *a.id < *b.id;
  };
  const int n = static_cast<int>(participants.size());
  std::vector<const NodeId*> by_rank(participants.size(), nullptr);
  std::vector<bool> taken(participants.size(), false);

  // --node_rank first, in its order: equal to the given values when 0..k-1 are all there.
  std::vector<Entry> ranked;
  std::vector<Entry> holders;    // survivors: keep their previous rank while it fits
  std::vector<Entry> newcomers;  // the rest
  for (const NodeId* id : participants) {
    const NodeRecord& node = nodes.at(*id);
    Entry entry{id, &node.request,
                node.previous_rank < 0 ? std::nullopt : std::optional<int>(node.previous_rank)};
    (node.request.node_rank ? ranked : entry.previous ? holders : newcomers).push_back(entry);
  }
  std::sort(ranked.begin(), ranked.end(), [&](const Entry& a, const Entry& b) {
    const int rank_a = *a.request->node_rank;
    const int rank_b = *b.request->node_rank;
    return rank_a != rank_b ? rank_a < rank_b : name_less(a, b);
  });
  int next_rank = 0;
  for (const Entry& entry : ranked) {
    taken[static_cast<std::size_t>(next_rank)] = true;
    by_rank[static_cast<std::size_t>(next_rank++)] = entry.id;
  }

  // Survivors keep their previous rank while it still fits and nobody took it.
  std::sort(holders.begin(), holders.end(), [&](const Entry& a, const Entry& b) {
    return *a.previous != *b.previous ? *a.previous < *b.previous : name_less(a, b);
  });
  std::sort(newcomers.begin(), newcomers.end(), name_less);
  std::vector<Entry> unplaced;
  for (const Entry& entry : holders) {
    const int previous = *entry.previous;
    if (previous >= 0 && previous < n && !taken[static_cast<std::size_t>(previous)]) {
      taken[static_cast<std::size_t>(previous)] = true;
      by_rank[static_cast<std::size_t>(previous)] = entry.id;
    } else {
      unplaced.push_back(entry);
    }
  }
  // Everyone else fills the lowest free ranks: displaced holders first, then newcomers.
  unplaced.insert(unplaced.end(), newcomers.begin(), newcomers.end());
  std::size_t free_rank = 0;
  for (const Entry& entry : unplaced) {
    while (taken[free_rank]) ++free_rank;
    taken[free_rank] = true;
    by_rank[free_rank] = entry.id;
  }
  return by_rank;
}

bool natural_less(const std::string& a, const std::string& b) {
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      // Compare the digit runs as numbers of any length: skip leading zeros, then the longer
      // run is larger, else the first differing digit decides.
      std::size_t end_a = i;
      std::size_t end_b = j;
      while (end_a < a.size() && is_digit(a[end_a])) ++end_a;
      while (end_b < b.size() && is_digit(b[end_b])) ++end_b;
      std::size_t start_a = i;
      std::size_t start_b = j;
      while (start_a + 1 < end_a && a[start_a] == '0') ++start_a;
      while (start_b + 1 < end_b && b[start_b] == '0') ++start_b;
      const std::size_t length_a = end_a - start_a;
      const std::size_t length_b = end_b - start_b;
      if (length_a != length_b) return length_a < length_b;
      const int order = a.compare(start_a, length_a, b, start_b, length_b);
      if (order != 0) return order < 0;
      i = end_a;
      j = end_b;
      continue;
    }
    if (a[i] != b[j]) {
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    }
    ++i;
    ++j;
  }
  if ((i < a.size()) != (j < b.size())) return j < b.size();  // a proper prefix comes first
  // Equal as numbers ("n01" and "n1"): plain order keeps this a strict weak ordering.
  return a < b;
}

}  // namespace ddprun::rdzv
