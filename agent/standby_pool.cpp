#include "agent/standby_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "common/log.h"
#include "common/signals.h"
#include "common/strings.h"

namespace ddprun::agent {
namespace {}  // namespace

bool is_start_only_variable(const std::string& name) {
  return name.rfind("PYTHON", 0) == 0 || name.rfind("LD_", 0) == 0 || name == "GLIBC_TUNABLES";
}

EnvMap parse_envp(const std::vector<std::string>& envp) {
  EnvMap env;
  for (const std::string& kv : envp)
    if (auto eq = kv.find('='); eq != std::string::npos)
      env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  return env;
}

std::string start_only_differences(const EnvMap& a, const EnvMap& b) {
  std::set<std::string> names;
  for (const auto& [name, value] : a)
    if (is_start_only_variable(name) && (!b.count(name) || b.at(name) != value)) names.insert(name);
  for (const auto& [name, value] : b)
    if (is_start_only_variable(name) && !a.count(name)) names.insert(name);
  return common::join({names.begin(), names.end()}, ", ");
}

std::string standby_memory_shortfall(const std::string& meminfo, int local_world_size) {
  std::istringstream lines(meminfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name, unit;
    long long kib = -1;
    if (!(words >> name >> kib >> unit) || name != "MemAvailable:" || unit != "kB") continue;
    const long long need =
        kStandbyMemoryBaseMiB + static_cast<long long>(local_world_size) * kStandbyMemoryPerRankMiB;
    if (kib / 1024 >= need) return "";
    return fmt::format(
        "{} MiB of memory available (MemAvailable), and Python standbys for {} local rank(s) "
        "need {} MiB",
        kib / 1024, local_world_size, need);
  }
  return "";
}

std::string encode_standby_handover(const EnvMap& env, const PythonHandover& python) {
  nlohmann::json message{{"env", env}};
  if (!python.script_argv.empty()) message["argv"] = python.script_argv;
  if (!python.cmdline.empty()) message["cmdline"] = python.cmdline;
  return message.dump();
}

std::string StandbyPool::start(int local_rank, ProcessSpec spec) {
  if (!enabled_ || has(local_rank)) return "";
  // A socket pair rather than a pipe: send() with MSG_NOSIGNAL reports a gone standby as EPIPE
  // without raising SIGPIPE, and MSG_DONTWAIT never blocks the agent.
  EnvMap start_env = parse_envp(spec.envp);
  auto launched = launch_with_channel(*launcher_, std::move(spec), SOCK_STREAM,
                                      common::kStandbyFdVariable, 1 << 20);  // a large environment
  if (!launched) return launched.error().message;
  Standby s;
  s.process = launched->process;
  s.handover_fd = launched->agent_fd;
  s.start_env = std::move(start_env);
  spdlog::debug("standby for local rank {} started (pid {})", local_rank, s.process.pid);
  standbys_.emplace(local_rank, s);
  return "";
}

void StandbyPool::adopt(int local_rank, LaunchedProcess process, int handover_fd,
                        EnvMap start_env) {
  Standby s{process, handover_fd, std::move(start_env)};
  if (!enabled_ || has(local_rank)) return discard(s);
  spdlog::debug("standby for local rank {} forked (pid {})", local_rank, process.pid);
  standbys_.emplace(local_rank, std::move(s));
}

std::map<int, int> StandbyPool::begin_hand_over(const std::map<int, EnvMap>& worker_envs,
                                                std::vector<std::string>& warnings,
                                                const std::map<int, PythonHandover>& python) {
  std::map<int, int> fds;
  for (const auto& [local_rank, env] : worker_envs) {
    auto it = standbys_.find(local_rank);
    if (it == standbys_.end()) continue;
    Standby s = std::move(it->second);
    standbys_.erase(it);
    // A variable read only when the process started cannot be changed now: never run the
    // worker with a value other than its own.
    if (std::string names = start_only_differences(s.start_env, env); !names.empty()) {
      warnings.push_back(fmt::format(
          "local rank {} starts afresh instead of from its standby (pid {}): {} differ(s) from "
          "the standby's, and only take effect when a process starts",
          local_rank, s.process.pid, names));
      discard(s);
      continue;
    }
    auto told = python.find(local_rank);
    const std::string message =
        encode_standby_handover(env, told == python.end() ? PythonHandover{} : told->second);
    ssize_t n;
    do {
      n = ::send(s.handover_fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(message.size())) {
      // Ended but not reaped yet (EPIPE), or a hand-over larger than the buffer: start afresh.
      spdlog::debug("standby for local rank {} (pid {}) not used: {}", local_rank, s.process.pid,
                    n < 0 ? std::strerror(errno) : "short write");
      discard(s);
      continue;
    }
    ::shutdown(s.handover_fd, SHUT_WR);  // end of file ends the message; the ack comes back
    fds[local_rank] = s.handover_fd;
    sent_.emplace(local_rank, std::move(s));
  }
  return fds;
}

bool StandbyPool::on_ack_readable(int local_rank, std::vector<std::string>& warnings) {
  auto it = sent_.find(local_rank);
  if (it == sent_.end()) return true;
  Standby& s = it->second;
  char ack = 0;
  ssize_t got;
  do {
    got = ::recv(s.handover_fd, &ack, 1, MSG_DONTWAIT);
  } while (got < 0 && errno == EINTR);
  if (got < 0 && errno == EAGAIN) return false;
  if (got == 1 && ack == common::kStandbyAck) {
    // Init -> Healthy for this rank: the standby took the hand-over and is the worker.
    close_fd(s.handover_fd);
    taken_.emplace(local_rank, s.process);
  } else {
    warnings.push_back(
        fmt::format("the standby for local rank {} (pid {}) ended without taking its hand-over: "
                    "starting the rank afresh",
                    local_rank, s.process.pid));
    discard(s);
  }
  sent_.erase(it);
  return true;
}

std::map<int, LaunchedProcess> StandbyPool::end_hand_over(std::chrono::milliseconds ack_timeout,
                                                          std::vector<std::string>& warnings) {
  for (auto& [local_rank, s] : sent_) {
    warnings.push_back(fmt::format(
        "the standby for local rank {} (pid {}) did not acknowledge its hand-over within {} ms "
        "(still loading the program?): killing it and starting the rank afresh",
        local_rank, s.process.pid, ack_timeout.count()));
    discard(s);
  }
  sent_.clear();
  return std::exchange(taken_, {});
}

std::map<int, LaunchedProcess> StandbyPool::hand_over(const std::map<int, EnvMap>& worker_envs,
                                                      std::vector<std::string>& warnings,
                                                      std::chrono::milliseconds ack_timeout,
                                                      const std::map<int, PythonHandover>& python) {
  std::map<int, int> waiting = begin_hand_over(worker_envs, warnings, python);
  // Every standby was sent its message: wait for all the acknowledgements at once, so the
  // deadline bounds the whole restart, not each rank.
  const auto deadline = std::chrono::steady_clock::now() + ack_timeout;
  while (!waiting.empty()) {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (const auto& [local_rank, fd] : waiting) {
      fds.push_back(pollfd{fd, POLLIN, 0});
      ranks.push_back(local_rank);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int ready =
        ::poll(fds.data(), fds.size(),
               static_cast<int>(std::max<long long>(0, static_cast<long long>(left.count()))));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;  // the deadline passed (or poll failed): the rest are discarded
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents != 0 && on_ack_readable(ranks[i], warnings)) waiting.erase(ranks[i]);
  }
  return end_hand_over(ack_timeout, warnings);
}

bool StandbyPool::on_exit(pid_t pid, const ExitStatus& status) {
  if (discarded_.erase(pid) > 0) return true;
  for (auto it = standbys_.begin(); it != standbys_.end(); ++it) {
    if (it->second.process.pid != pid) continue;
    // Ended by a signal: someone else's (the program's own failures exit), so the hint about
    // exit codes does not apply, and the caller may find it the job's own stop signal.
    warning_ =
        status.signal != 0
            ? fmt::format(
                  "the standby for local rank {} (pid {}) was killed by {} from outside ddprun "
                  "before it was needed; starting workers afresh from now on",
                  it->first, pid, common::signal_name(status.signal))
            : fmt::format(
                  "the standby for local rank {} (pid {}) ended on its own (exit code {}) before "
                  "it was needed: {}; starting workers afresh from now on",
                  it->first, pid, status.code, exit_hint_);
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
  launcher_->signal_group(s.process.pid, SIGKILL);
  discarded_.insert(s.process.pid);
}

void StandbyPool::clear() {
  for (auto& [local_rank, s] : sent_) discard(s);
  sent_.clear();
  // Acknowledged but not yet workers: the job ended before the group started.
  for (auto& [local_rank, process] : taken_) {
    Standby s{process, -1, {}};  // its hand-over socket was closed at the acknowledgement
    discard(s);
  }
  taken_.clear();
  while (!standbys_.empty()) {
    discard(standbys_.begin()->second);
    standbys_.erase(standbys_.begin());
  }
  // Reap what SIGKILL ended, so nothing is left as a zombie of ours.
  for (pid_t pid : discarded_) launcher_->wait(pid);
  discarded_.clear();
}

}  // namespace ddprun::agent
