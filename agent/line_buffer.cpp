#include "agent/line_buffer.h"

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

}  // namespace ddprun::agent
