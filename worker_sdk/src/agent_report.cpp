#include "ddprun/sdk/agent_report.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

namespace ddprun::sdk {

namespace {

constexpr std::chrono::milliseconds kHeartbeatEvery{100};

/// The agent's socket, opened on first use; -1 when there is none.
struct Channel {
  int fd = -1;
  sockaddr_un address{};
  int local_rank = 0;
  std::chrono::steady_clock::time_point last_heartbeat{};

  Channel() {
    const char* path = std::getenv("DDPRUN_AGENT_SOCKET");
    if (path == nullptr || *path == '\0' || std::strlen(path) >= sizeof(address.sun_path)) return;
    if (const char* lr = std::getenv("LOCAL_RANK")) local_rank = std::atoi(lr);
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path, sizeof(address.sun_path) - 1);
    fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  ~Channel() {
    if (fd >= 0) ::close(fd);
  }
  void send(const std::string& body) const {
    if (fd < 0) return;
    // A full queue or a gone agent drops the report: MSG_DONTWAIT, errors ignored.
    (void)::sendto(fd, body.data(), body.size(), MSG_DONTWAIT,
                   reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  }
};

std::mutex channel_mutex;

Channel& channel() {
  static Channel c;
  return c;
}

}  // namespace

std::string format_report(const std::string& event, int local_rank, long pid,
                          const ReportFields& fields) {
  nlohmann::json body = {{"event", event}, {"local_rank", local_rank}, {"pid", pid}};
  for (const auto& [key, value] : fields)
    if (!body.contains(key)) body[key] = value;
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void report_to_agent(const std::string& event, const ReportFields& fields) {
  std::lock_guard<std::mutex> lock(channel_mutex);
  Channel& c = channel();
  if (c.fd < 0) return;
  c.send(format_report(event, c.local_rank, ::getpid(), fields));
}

void report_progress() {
  std::lock_guard<std::mutex> lock(channel_mutex);
  Channel& c = channel();
  if (c.fd < 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - c.last_heartbeat < kHeartbeatEvery) return;
  c.last_heartbeat = now;
  c.send(format_report("heartbeat", c.local_rank, ::getpid(), {}));
}

}  // namespace ddprun::sdk
