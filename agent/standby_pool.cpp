#include "agent/standby_pool.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

namespace ddprun::agent {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::string encode_standby_handover(const EnvMap& env) {
  return nlohmann::json{{"env", env}}.dump();
}

std::string StandbyPool::start(int local_rank, ProcessSpec spec) {
  if (!enabled_ || has(local_rank)) return "";
  // A socket pair rather than a pipe: send() with MSG_NOSIGNAL reports a gone standby as EPIPE
  // without raising SIGPIPE, and MSG_DONTWAIT never blocks the agent.
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return std::string("socketpair: ") + std::strerror(errno);
  const int buffer = 1 << 20;  // room for a large environment
  ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  spec.inherit_fd = fds[0];
  spec.envp.push_back(std::string(kStandbyFdVariable) + "=" + std::to_string(fds[0]));
  auto launched = launcher_.launch(spec);
  close_fd(fds[0]);
  if (auto* why = std::get_if<std::string>(&launched)) {
    close_fd(fds[1]);
    return *why;
  }
  Standby s;
  s.process = std::get<LaunchedProcess>(launched);
  s.handover_fd = fds[1];
  spdlog::debug("standby for local rank {} started (pid {})", local_rank, s.process.pid);
  standbys_.emplace(local_rank, s);
  return "";
}

std::optional<LaunchedProcess> StandbyPool::hand_over(int local_rank, const EnvMap& worker_env) {
  auto it = standbys_.find(local_rank);
  if (it == standbys_.end()) return std::nullopt;
  Standby s = it->second;
  standbys_.erase(it);
  const std::string message = encode_standby_handover(worker_env);
  ssize_t n;
  do {
    n = ::send(s.handover_fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(message.size())) {
    // Ended but not reaped yet (EPIPE), or a hand-over larger than the buffer: start afresh.
    spdlog::debug("standby for local rank {} (pid {}) not used: {}", local_rank, s.process.pid,
                  n < 0 ? std::strerror(errno) : "short write");
    discard(s);
    return std::nullopt;
  }
  close_fd(s.handover_fd);  // end of file ends the message
  return s.process;
}

bool StandbyPool::on_exit(pid_t pid, const ExitStatus& status) {
  if (discarded_.erase(pid) > 0) return true;
  for (auto it = standbys_.begin(); it != standbys_.end(); ++it) {
    if (it->second.process.pid != pid) continue;
    spdlog::warn(
        "the standby for local rank {} (pid {}) ended on its own ({}) before it was needed: "
        "--standby_workers needs a program that calls the ddprun worker SDK's "
        "WorkerContext::from_env; starting workers afresh from now on",
        it->first, pid,
        status.signal != 0 ? "signal " + std::to_string(status.signal)
                           : "exit code " + std::to_string(status.code));
    // The other standbys run the same program: end them too, without more warnings.
    enabled_ = false;
    for (auto& [local, other] : standbys_) discard(other);
    standbys_.clear();
    discarded_.erase(pid);  // already reaped
    return true;
  }
  return false;
}

void StandbyPool::discard(Standby& s) {
  close_fd(s.handover_fd);
  close_fd(s.process.stdout_fd);
  close_fd(s.process.stderr_fd);
  launcher_.signal_group(s.process.pid, SIGKILL);
  discarded_.insert(s.process.pid);
}

void StandbyPool::clear() {
  while (!standbys_.empty()) {
    discard(standbys_.begin()->second);
    standbys_.erase(standbys_.begin());
  }
  // Reap what SIGKILL ended, so nothing is left as a zombie of ours (ECHILD: already reaped).
  for (pid_t pid : discarded_) ::waitpid(pid, nullptr, 0);
  discarded_.clear();
}

}  // namespace ddprun::agent
