#include "agent/process_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "common/strings.h"

namespace ddprun::agent {
namespace {

/// Enough for a process tree that forks while it is killed; cgroup.kill (--cleanup cgroup) has
/// no such limit.
constexpr int kMaxScans = 16;

/// The next field of `rest` (fields are separated by spaces), taken off it; "" at the end.
std::string_view next_field(std::string_view& rest) {
  const auto begin = rest.find_first_not_of(' ');
  if (begin == std::string_view::npos) return rest = {};
  rest.remove_prefix(begin);
  const auto end = std::min(rest.find(' '), rest.size());
  const std::string_view field = rest.substr(0, end);
  rest.remove_prefix(end);
  return field;
}

}  // namespace

std::optional<ProcessIds> ids_from_stat(const std::string& stat) {
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::string_view rest(stat);
  rest.remove_prefix(close + 1);
  rest = rest.substr(0, std::min(rest.find('\n'), rest.size()));
  const std::string_view state = next_field(rest);
  const auto parent = common::parse_int(next_field(rest));
  const auto group = common::parse_int(next_field(rest));
  const auto session = common::parse_int(next_field(rest));
  if (state.empty() || !parent || !group || !session || *parent < 0) return std::nullopt;
  ProcessIds ids{static_cast<pid_t>(*parent), static_cast<pid_t>(*group),
                 static_cast<pid_t>(*session), state.size() == 1 ? state[0] : '\0'};
  // The start time is the 22nd field: 15 more after the session (proc(5)).
  for (int i = 0; i < 15; ++i) next_field(rest);
  if (const auto start = common::parse_int(next_field(rest)); start && *start >= 0)
    ids.start_time = static_cast<unsigned long long>(*start);
  return ids;
}

std::optional<ProcessIds> read_process(pid_t pid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // ended while we looked
  // One line of a few hundred bytes (the command name in it is short).
  char text[1024];
  ssize_t n;
  do {
    n = ::read(fd, text, sizeof text - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return ids_from_stat(std::string(text, static_cast<std::size_t>(n)));
}

std::vector<pid_t> list_processes() {
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (const dirent* entry = ::readdir(proc)) {
    auto pid = common::parse_int(entry->d_name);
    if (pid && *pid > 0 && *pid <= std::numeric_limits<pid_t>::max())
      pids.push_back(static_cast<pid_t>(*pid));
  }
  ::closedir(proc);
  return pids;
}

char read_process_state(pid_t pid) {
  auto ids = read_process(pid);
  return ids ? ids->state : '\0';
}

std::optional<pid_t> parent_from_stat(const std::string& stat) {
  auto ids = ids_from_stat(stat);
  if (!ids) return std::nullopt;
  return ids->parent;
}

std::map<pid_t, ProcessIds> read_process_ids() {
  std::map<pid_t, ProcessIds> found;
  for (pid_t pid : list_processes())
    if (auto ids = read_process(pid)) found.emplace(pid, *ids);
  return found;
}

int forbid_core_dumps(const std::vector<pid_t>& groups) {
  int lowered = 0;
  // Again while a scan lowers some (at most kMaxScans): a process forked in the group while
  // the last scan ran has its parent's limit as it was.
  for (int scan = 0; scan < kMaxScans; ++scan) {
    int now = 0;
    for (const auto& [pid, ids] : read_process_ids()) {
      if (std::find(groups.begin(), groups.end(), ids.group) == groups.end()) continue;
      rlimit limit{};
      if (::prlimit(pid, RLIMIT_CORE, nullptr, &limit) != 0 || limit.rlim_cur == 0) continue;
      limit.rlim_cur = 0;
      if (::prlimit(pid, RLIMIT_CORE, &limit, nullptr) == 0) ++now;
    }
    lowered += now;
    if (now == 0) break;
  }
  return lowered;
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
