#include "agent/line_dedup.h"

#include <algorithm>

#include "agent/line_buffer.h"

namespace ddprun::agent {

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    if (j - i >= 2) {
      out += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    } else {
      for (size_t k = i; k <= j; ++k) out += (k > i ? "," : "") + std::to_string(ranks[k]);
    }
    i = j + 1;
  }
  return out;
}

LineDedup::LineDedup(common::Duration window, std::string prefix_template, std::string role,
                     size_t max_pending, size_t max_pending_bytes)
    : window_(window),
      template_(std::move(prefix_template)),
      role_(std::move(role)),
      max_pending_(std::max<size_t>(1, max_pending)),
      max_pending_bytes_(max_pending_bytes) {}

std::vector<ConsoleLine> LineDedup::offer(int fd, int rank, int local_rank, const std::string& line,
                                          common::TimePoint now) {
  std::vector<ConsoleLine> out = due(now);
  const auto key = std::make_pair(fd, line);
  if (auto it = index_.find(key); it != index_.end()) {
    Pending& p = pending_[it->second - popped_];
    // Another rank's copy joins it; the same rank printing it again is a new line.
    if (std::find(p.local_ranks.begin(), p.local_ranks.end(), local_rank) == p.local_ranks.end()) {
      p.ranks.push_back(rank);
      p.local_ranks.push_back(local_rank);
      return out;
    }
  }
  if (pending_.size() >= max_pending_) pop_front(out);
  while (!pending_.empty() && pending_bytes_ + line.size() > max_pending_bytes_) pop_front(out);
  pending_bytes_ += line.size();
  pending_.push_back(Pending{fd, line, {rank}, {local_rank}, now + window_});
  index_[key] = popped_ + pending_.size() - 1;
  return out;
}

std::vector<ConsoleLine> LineDedup::due(common::TimePoint now) {
  std::vector<ConsoleLine> out;
  while (!pending_.empty() && pending_.front().deadline <= now) pop_front(out);
  return out;
}

std::vector<ConsoleLine> LineDedup::flush() {
  std::vector<ConsoleLine> out;
  while (!pending_.empty()) pop_front(out);
  return out;
}

std::optional<common::TimePoint> LineDedup::next_deadline() const {
  if (pending_.empty()) return std::nullopt;
  return pending_.front().deadline;
}

void LineDedup::pop_front(std::vector<ConsoleLine>& out) {
  const Pending& p = pending_.front();
  out.push_back(render(p));
  const auto key = std::make_pair(p.fd, p.line);
  if (auto it = index_.find(key); it != index_.end() && it->second == popped_) index_.erase(it);
  pending_bytes_ -= p.line.size();
  pending_.pop_front();
  ++popped_;
}

ConsoleLine LineDedup::render(const Pending& p) const {
  return ConsoleLine{
      p.fd, console_prefix(template_, role_, rank_ranges(p.ranks), rank_ranges(p.local_ranks)) +
                p.line + "\n"};
}

}  // namespace ddprun::agent
