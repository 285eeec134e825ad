#include "agent/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddprun::agent {

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::string> EventLog::open(const std::string& path, std::string node) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) return "cannot open the event log " + path + ": " + std::strerror(errno);
  node_ = std::move(node);
  return std::nullopt;
}

double monotonic_seconds(common::TimePoint at) {
  return std::chrono::duration<double>(at.time_since_epoch()).count();
}

void EventLog::write(const std::string& event, const nlohmann::json& fields, common::TimePoint at) {
  if (fd_ < 0) return;
  nlohmann::json line = {
      {"t", monotonic_seconds(at)},
      {"time",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"node", node_},
      {"event", event}};
  if (fields.is_object())
    for (const auto& [key, value] : fields.items())
      if (!line.contains(key)) line[key] = value;
  // One write() per line with O_APPEND: lines of several agents sharing a file do not mix.
  const std::string text =
      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk must not stop the job; the log is best effort
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace ddprun::agent
