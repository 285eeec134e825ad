#include "rendezvous/rank_assignment.h"

#include <algorithm>

namespace ddprun::rdzv {

std::map<std::string, int> assign_group_ranks(const std::map<std::string, NodeRecord>& nodes,
                                              const std::vector<std::string>& participants,
                                              const std::map<std::string, int>& previous_ranks) {
  const auto name_less = [&](const std::string& a, const std::string& b) {
    const std::string& name_a = nodes.at(a).request.name;
    const std::string& name_b = nodes.at(b).request.name;
    if (natural_less(name_a, name_b)) return true;
    if (natural_less(name_b, name_a)) return false;
    return a < b;
  };
  const int n = static_cast<int>(participants.size());
  std::map<std::string, int> ranks;
  std::vector<bool> taken(participants.size(), false);

  // --node_rank first, in its order: equal to the given values when 0..k-1 are all there.
  std::vector<std::string> ranked;
  std::vector<std::string> others;
  for (const std::string& id : participants) {
    (nodes.at(id).request.node_rank ? ranked : others).push_back(id);
  }
  std::sort(ranked.begin(), ranked.end(), [&](const std::string& a, const std::string& b) {
    const int rank_a = *nodes.at(a).request.node_rank;
    const int rank_b = *nodes.at(b).request.node_rank;
    return rank_a != rank_b ? rank_a < rank_b : name_less(a, b);
  });
  int next_rank = 0;
  for (const std::string& id : ranked) {
    taken[static_cast<std::size_t>(next_rank)] = true;
    ranks[id] = next_rank++;
  }

  // Survivors keep their previous rank while it still fits and nobody took it.
  std::vector<std::string> holders;
  std::vector<std::string> newcomers;
  for (const std::string& id : others) {
    (previous_ranks.count(id) ? holders : newcomers).push_back(id);
  }
  std::sort(holders.begin(), holders.end(), [&](const std::string& a, const std::string& b) {
    return previous_ranks.at(a) != previous_ranks.at(b)
               ? previous_ranks.at(a) < previous_ranks.at(b)
               : name_less(a, b);
  });
  std::sort(newcomers.begin(), newcomers.end(), name_less);
  std::vector<std::string> unplaced;
  for (const std::string& id : holders) {
    const int previous = previous_ranks.at(id);
    if (previous >= 0 && previous < n && !taken[static_cast<std::size_t>(previous)]) {
      taken[static_cast<std::size_t>(previous)] = true;
      ranks[id] = previous;
    } else {
      unplaced.push_back(id);
    }
  }
  // Everyone else fills the lowest free ranks: displaced holders first, then newcomers.
  unplaced.insert(unplaced.end(), newcomers.begin(), newcomers.end());
  std::size_t free_rank = 0;
  for (const std::string& id : unplaced) {
    while (taken[free_rank]) ++free_rank;
    taken[free_rank] = true;
    ranks[id] = static_cast<int>(free_rank);
  }
  return ranks;
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
