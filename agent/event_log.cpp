#include "agent/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/fd_write.h"
#include "common/log.h"

namespace ddprun::agent {

EventLog::~EventLog() {
  if (fd_ < 0) return;
  if (lost_ > 0) spdlog::warn("{} event(s) could not be written to the event log {}", lost_, path_);
  ::close(fd_);
}

std::optional<common::Error> EventLog::open(const std::string& path, std::string node) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    return common::Error{"cannot open the event log " + path + ": " + std::strerror(errno)};
  node_ = std::move(node);
  path_ = path;
  return std::nullopt;
}

double monotonic_seconds(common::TimePoint at) {
  return std::chrono::duration<double>(at.time_since_epoch()).count();
}

void EventLog::write(std::string_view event, const nlohmann::json& fields, common::TimePoint at) {
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
  // A full disk must not stop the job: the event is lost, and the user told so once.
  if (const int err = common::write_all(fd_, text); err != 0 && lost_++ == 0)
    spdlog::warn(
        "cannot write the event log {}: {}; the job goes on, and events are lost until "
        "writes succeed again",
        path_, std::strerror(err));
}

}  // namespace ddprun::agent
