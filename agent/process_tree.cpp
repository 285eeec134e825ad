#include "agent/process_tree.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/strings.h"

namespace ddprun::agent {
namespace {

/// Enough for a process tree that forks while it is killed; cgroup.kill (--cleanup cgroup) has
/// no such limit.
constexpr int kMaxScans = 16;

}  // namespace

std::optional<ProcessIds> ids_from_stat(const std::string& stat) {
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  long parent = 0, group = 0, session = 0;
  if (!(fields >> state >> parent >> group >> session) || parent < 0) return std::nullopt;
  return ProcessIds{static_cast<pid_t>(parent), static_cast<pid_t>(group),
                    static_cast<pid_t>(session), state.size() == 1 ? state[0] : '\0'};
}

namespace {

/// The ids in /proc/<pid>/stat; nullopt when the process is gone or the text unreadable.
std::optional<ProcessIds> read_ids(const std::filesystem::path& proc_dir) {
  std::ifstream in(proc_dir / "stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;  // ended while we looked
  return ids_from_stat(stat);
}

}  // namespace

char read_process_state(pid_t pid) {
  auto ids = read_ids(std::filesystem::path("/proc") / std::to_string(pid));
  return ids ? ids->state : '\0';
}

std::optional<pid_t> parent_from_stat(const std::string& stat) {
  auto ids = ids_from_stat(stat);
  if (!ids) return std::nullopt;
  return ids->parent;
}

std::map<pid_t, ProcessIds> read_process_ids() {
  std::map<pid_t, ProcessIds> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    auto pid = common::parse_int(name);
    if (!pid || *pid <= 0) continue;
    if (auto ids = read_ids(entry.path())) found[static_cast<pid_t>(*pid)] = *ids;
  }
  return found;
}

std::map<pid_t, pid_t> read_process_parents() {
  std::map<pid_t, pid_t> parents;
  for (const auto& [pid, ids] : read_process_ids())
    parents.emplace_hint(parents.end(), pid, ids.parent);
  return parents;
}

std::vector<pid_t> descendants_of(const std::map<pid_t, pid_t>& parents, pid_t root,
                                  const std::set<pid_t>& spared) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& [pid, parent] : parents) children[parent].push_back(pid);
  std::vector<pid_t> found;
  std::vector<pid_t> todo{root};
  // A pid appears once in `parents`, so each is visited once and the walk ends.
  while (!todo.empty()) {
    const pid_t at = todo.back();
    todo.pop_back();
    auto it = children.find(at);
    if (it == children.end()) continue;
    for (pid_t child : it->second) {
      if (child == root || spared.count(child) > 0) continue;
      found.push_back(child);
      todo.push_back(child);
    }
  }
  return found;
}

int kill_descendants(const std::set<pid_t>& spared) {
  const pid_t self = ::getpid();
  std::set<pid_t> signalled;
  for (int scan = 0; scan < kMaxScans; ++scan) {
    bool fresh = false;
    for (pid_t pid : descendants_of(read_process_parents(), self, spared)) {
      if (!signalled.insert(pid).second) continue;
      fresh = true;
      ::kill(pid, SIGKILL);
    }
    if (!fresh) break;
  }
  return static_cast<int>(signalled.size());
}

int reap_children_except(const std::set<pid_t>& spared, int limit_ms) {
  const pid_t self = ::getpid();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  int reaped = 0;
  while (true) {
    int left = 0;
    for (const auto& [pid, parent] : read_process_parents()) {
      if (parent != self || spared.count(pid) > 0) continue;
      if (::waitpid(pid, nullptr, WNOHANG) == pid)
        ++reaped;
      else
        ++left;
    }
    if (left == 0 || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return reaped;
}

std::optional<common::Error> become_child_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
    return common::Error{std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + std::strerror(errno)};
  return std::nullopt;
}

}  // namespace ddprun::agent
