#include "agent/line_buffer.h"

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

namespace {

bool identifier_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

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
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    if (tmpl[i] != '$' || i + 1 == tmpl.size()) {
      out += tmpl[i++];
      continue;
    }
    if (tmpl[i + 1] == '$') {  // "$$" is one "$"
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = tmpl[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1);
    size_t end = start;
    if (end < tmpl.size() && identifier_start(tmpl[end]))
      while (end < tmpl.size() && identifier_char(tmpl[end])) ++end;
    const bool closed = !braced || (end < tmpl.size() && tmpl[end] == '}');
    std::optional<std::string> value;
    if (end > start && closed) value = value_of(tmpl.substr(start, end - start));
    if (!value) {  // safe_substitute keeps what it cannot replace
      out += '$';
      ++i;
      continue;
    }
    out += *value;
    i = end + (braced ? 1 : 0);
  }
  return out;
}

}  // namespace ddprun::agent
