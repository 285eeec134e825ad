#include "agent/line_buffer.h"

#include "common/strings.h"

#include <cctype>
#include <optional>

namespace ddprun::agent {

std::vector<LinePiece> LineBuffer::feed(std::string_view bytes) {
  std::vector<LinePiece> pieces;
  for (char c : bytes) {
    if (c == '\n') {
      pieces.push_back({std::move(pending_), true});
      pending_.clear();
      progress_ = last_cr_ = false;
      continue;
    }
    pending_ += c;
    // Something after a '\r' (not a "\r\n" line end): a bar that redraws itself.
    progress_ = progress_ || last_cr_;
    last_cr_ = c == '\r';
    if (pending_.size() >= max_line_) {
      pieces.push_back({std::move(pending_), false});
      pending_.clear();
    }
  }
  // A '\r' that ends the read waits for the next byte: a "\r\n" split between two reads stays
  // one line's end.
  const std::size_t give = pending_.ends_with('\r') ? pending_.size() - 1 : pending_.size();
  if (progress_ && give > 0) {
    pieces.push_back({pending_.substr(0, give), false});
    pending_.erase(0, give);
  }
  return pieces;
}

std::vector<LinePiece> LineBuffer::give_held() {
  std::vector<LinePiece> pieces;
  if (!holds()) return pieces;
  const std::size_t give = last_cr_ ? pending_.size() - 1 : pending_.size();
  pieces.push_back({pending_.substr(0, give), false});
  pending_.erase(0, give);
  return pieces;
}

std::vector<LinePiece> LineBuffer::finish() {
  std::vector<LinePiece> pieces;
  if (!pending_.empty()) pieces.push_back({std::move(pending_), false});
  pending_.clear();
  progress_ = last_cr_ = false;
  return pieces;
}

std::string console_prefix(std::string_view tmpl, const std::string& role, int rank,
                           int local_rank) {
  return console_prefix(tmpl, role, std::to_string(rank), std::to_string(local_rank));
}

std::string console_prefix(std::string_view tmpl, const std::string& role, const std::string& ranks,
                           const std::string& local_ranks) {
  if (tmpl.empty()) return "[" + role + local_ranks + "]:";
  auto value_of = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "role_name") return role;
    if (name == "rank") return ranks;
    if (name == "local_rank") return local_ranks;
    return std::nullopt;
  };
  return common::safe_substitute(tmpl, value_of);
}

}  // namespace ddprun::agent
