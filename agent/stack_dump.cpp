#include "agent/stack_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/fd_read.h"
#include "common/log.h"

extern char** environ;

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;

/// The tool's argv: eu-stack when installed, else gdb; empty when neither is.
std::vector<std::string> tool_for(pid_t pid) {
  const std::string p = std::to_string(pid);
  if (::access("/usr/bin/eu-stack", X_OK) == 0) return {"/usr/bin/eu-stack", "-p", p};
  if (::access("/usr/bin/gdb", X_OK) == 0)
    return {"/usr/bin/gdb", "-batch", "-nx", "-p", p, "-ex", "thread apply all bt"};
  return {};
}

}  // namespace

std::string native_stacks(pid_t pid, std::chrono::milliseconds timeout, size_t max_bytes) {
  const std::vector<std::string> tool = tool_for(pid);
  if (tool.empty()) return "no native stacks: neither eu-stack (elfutils) nor gdb is installed\n";
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return std::string("no native stacks: pipe: ") + std::strerror(errno) + "\n";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> argv;
  for (const auto& a : tool) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t child = -1;
  const int spawned = ::posix_spawn(&child, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    return "no native stacks: cannot run " + tool[0] + ": " + std::strerror(spawned) + "\n";
  }
  std::string out;
  const bool timed_out =
      common::read_until_end(fds[0], std::chrono::steady_clock::now() + timeout, max_bytes, out);
  ::close(fds[0]);
  if (timed_out) ::kill(child, SIGKILL);
  // The agent's SIGCHLD handler may reap the tool first (ECHILD here): either way it is gone.
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    out += "\n(" + tool[0] + " gave no complete answer within " + std::to_string(timeout.count()) +
           " ms)\n";
  if (out.size() >= max_bytes) out += "\n(cut at " + std::to_string(max_bytes) + " bytes)\n";
  return out;
}

std::vector<nlohmann::json> log_native_stacks(const std::vector<StackTarget>& targets,
                                              const std::string& why,
                                              std::chrono::milliseconds per_worker,
                                              std::chrono::milliseconds budget) {
  const auto until = Clock::now() + budget;
  std::vector<nlohmann::json> dumped;
  for (const StackTarget& t : targets) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    const std::string stacks = left.count() > 0 ? native_stacks(t.pid, std::min(left, per_worker))
                                                : "(no time left for native stacks)\n";
    spdlog::warn("native stacks of worker rank {} (local rank {}, pid {}), {}:\n{}", t.rank,
                 t.local_rank, t.pid, why, stacks);
    dumped.push_back({{"rank", t.rank},
                      {"local_rank", t.local_rank},
                      {"pid", t.pid},
                      {"why", why},
                      {"native", stacks}});
  }
  return dumped;
}

}  // namespace ddprun::agent
