#include "agent/line_buffer.h"

#include "common/strings.h"

#include <cctype>
#include <optional>

namespace ddprun::agent {

std::vector<std::string> LineBuffer::feed(std::string_view bytes) {
  std::vector<std::string> lines;
  for (char c : bytes) {
    if (c == '\n') {
      lines.push_back(std::move(pending_));
      pending_.clear();
      continue;
    }
    pending_ += c;
    if (pending_.size() >= max_line_) {
      lines.push_back(std::move(pending_));
      pending_.clear();
    }
  }
  return lines;
}

std::vector<std::string> LineBuffer::finish() {
  std::vector<std::string> lines;
  if (!pending_.empty()) lines.push_back(std::move(pending_));
  pending_.clear();
  return lines;
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
