#include "agent/group_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "agent/process_tree.h"
#include "agent/watcher_record.h"

namespace ddprun::agent {
namespace {

constexpr std::array<std::pair<CleanupMode, std::string_view>, 3> kModeNames = {{
    {CleanupMode::Auto, "auto"},
    {CleanupMode::Cgroup, "cgroup"},
    {CleanupMode::Subreaper, "subreaper"},
}};

/// How long the agent (at its end) and the watcher (after the agent's death) wait for killed
/// processes to leave a cgroup before giving up on removing it.
constexpr int kRemoveWaitMs = 2000;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Writes `text` to a cgroup control file; returns errno, 0 on success.
int write_control(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = n < 0 ? errno : 0;
  ::close(fd);
  return err;
}

/// Removes `dir` and the cgroups directly below it (ours are one level deep); true when gone.
bool remove_cgroup(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      ::rmdir((dir + "/" + e->d_name).c_str());
    }
    ::closedir(d);
  }
  return ::rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

/// How often the subreaper watcher looks for sessions that the agent's descendants started
/// (setsid): one started less than this before the agent is SIGKILLed can be missed.
constexpr int kSessionScanMs = 1000;
/// At most this many such sessions are kept.
constexpr std::size_t kMaxSessions = 65536;
/// Every this many looks, the processes settled as outside the agent's tree are read again.
constexpr int kResettleLooks = 30;

/// The subreaper watcher's name (its comm): another ddprun's watcher, which leads a session of
/// its own below a ddprun it runs as a worker of, is left to do its own work.
constexpr char kWatcherName[] = "ddprun-watcher";

/// Whether `pid` is a ddprun watcher (its comm).
bool is_watcher(pid_t pid) {
  return read_text("/proc/" + std::to_string(pid) + "/comm") == std::string(kWatcherName) + "\n";
}

using NotedMap = std::map<pid_t, NotedSession>;

/// The sessions of the job, kept by the watcher while the agent lives: each worker's, told by
/// tell() before the worker's exec (and by the agent for a standby), and those that scan()
/// finds the agent's descendants in, other than the agent's, the watcher's own and another
/// ddprun watcher's (setsid), each led by a descendant or by a process gone. A session none of
/// them is in any more at a look is dropped: while the agent lives every member of such a
/// session is below it (an orphan moves up to the agent, a subreaper), so it is over and its
/// id may be taken by anyone's. One whose leader's pid is now another process's is over too
/// (the kernel gives a session's id to no one while anything is in it). A process whose parent
/// is known not to be below the agent is never below it (an orphan moves up, not down), so its
/// /proc/<pid>/stat is read once, not at every scan: a scan lists the processes and reads the
/// stat of the agent, its descendants and the processes not yet settled.
struct SessionNotes {
  pid_t agent, agent_session, own_session;
  NotedMap sessions;
  std::set<pid_t> others;  ///< settled: not below the agent
  int looks = 0;

  void forget() { sessions.clear(); }
  bool empty() const { return sessions.empty(); }

  /// A worker's session, told before its exec: noted, its leader a member, when it is the
  /// agent's child (a worker, or a standby the agent adopted), until a look finds it empty. A
  /// note of that id with another leader (one emptied since the last look, its pid taken by
  /// this worker) is replaced; one with this leader (a standby seen by a look) is kept.
  void tell(pid_t sid) {
    const auto leader = read_process(sid);
    if (!leader || leader->session != sid || leader->parent != agent) return;
    const auto kept = sessions.find(sid);
    if (kept == sessions.end() || kept->second.leader_start != leader->start_time)
      sessions.insert_or_assign(sid, NotedSession{leader->start_time, {{sid, leader->start_time}}});
  }

  void scan() {
    // Settled pids are read again now and then: one gone and taken again by a process below
    // the agent between two looks would stay unread.
    if (++looks % kResettleLooks == 0) others.clear();
    std::map<pid_t, ProcessIds> ids;
    std::set<pid_t> listed;
    for (pid_t pid : list_processes()) {
      listed.insert(pid);
      if (others.count(pid) > 0) continue;
      if (auto read = read_process(pid)) ids.emplace(pid, *read);
    }
    // A pid gone from the list may come back as another process.
    for (auto it = others.begin(); it != others.end();)
      it = listed.count(*it) > 0 ? std::next(it) : others.erase(it);
    // Every ancestor of a descendant, up to the agent, is a descendant too: read above.
    std::map<pid_t, pid_t> parents;
    for (const auto& [pid, id] : ids) parents.emplace_hint(parents.end(), pid, id.parent);
    const std::vector<pid_t> below = descendants_of(parents, agent, {});
    const std::set<pid_t> descendants(below.begin(), below.end());
    settle(ids, descendants);
    NotedMap now;
    std::set<pid_t> refused;  ///< not to be noted this look
    std::set<pid_t> over;     ///< kept before, another's now (its leader's pid taken)
    // Notes `pid` as a member of session `sid`: kept from before while it is the same one (its
    // leader gone, or the process noted as its leader), or new when `may_add` and its leader is
    // not a ddprun watcher.
    auto note = [&](pid_t sid, pid_t pid, unsigned long long start, bool may_add) {
      auto at = now.find(sid);
      if (at == now.end()) {
        if (refused.count(sid) > 0) return;
        const auto read = ids.find(sid);
        const std::optional<ProcessIds> leader =
            read != ids.end() ? std::optional<ProcessIds>(read->second) : read_process(sid);
        const auto kept = sessions.find(sid);
        const bool same = kept != sessions.end() &&
                          (!leader || (kept->second.leader_start != 0 &&
                                       leader->start_time == kept->second.leader_start));
        if (kept != sessions.end() && !same) over.insert(sid);
        if (same) {
          at = now.emplace(sid, NotedSession{kept->second.leader_start, {}}).first;
        } else {
          if (!may_add || now.size() >= kMaxSessions) return;
          if (leader && is_watcher(sid)) {
            refused.insert(sid);
            return;
          }
          at = now.emplace(sid, NotedSession{leader ? leader->start_time : 0, {}}).first;
        }
      }
      at->second.members.emplace(pid, start);
    };
    auto noted = [&](pid_t pid, const ProcessIds& id, bool may_add) {
      const pid_t sid = id.session;
      if (sid > 0 && sid != agent_session && sid != own_session)
        note(sid, pid, id.start_time, may_add);
    };
    for (pid_t pid : descendants) noted(pid, ids.at(pid), true);
    // A process read but not settled (its parent ended before it was read, and it may be on its
    // way up to the agent) keeps a session already noted, adds none.
    for (const auto& [pid, id] : ids)
      if (pid != agent && descendants.count(pid) == 0 && others.count(pid) == 0)
        noted(pid, id, false);
    // The agent died during this look: its orphans were moving up and out of its tree. Keep
    // what was noted before, but what was found over.
    if (::getppid() != agent) {
      for (pid_t sid : over) sessions.erase(sid);
      for (auto& [sid, kept] : now) sessions.insert_or_assign(sid, std::move(kept));
      return;
    }
    sessions = std::move(now);
  }

  /// Adds to `others` each process read whose parent is known not to be below the agent: none
  /// (0), settled before, or settled here and not younger than it (a younger parent has taken
  /// the pid of the one that ended); passes until none is new, a few for a deep tree. One whose
  /// parent was gone before it was read stays unsettled and is read again next time.
  void settle(const std::map<pid_t, ProcessIds>& ids, const std::set<pid_t>& descendants) {
    for (bool more = true; more;) {
      more = false;
      for (const auto& [pid, id] : ids) {
        if (pid == agent || descendants.count(pid) > 0 || others.count(pid) > 0) continue;
        const auto parent = ids.find(id.parent);
        const bool parent_out =
            id.parent <= 0 || (others.count(id.parent) > 0 &&
                               (parent == ids.end() || parent->second.start_time <= id.start_time));
        if (parent_out) {
          others.insert(pid);
          more = true;
        }
      }
    }
  }
};

/// SIGKILLs every process in one of the sessions of `notes` that is still that one
/// (still_noted, judged at the first scan), scanning again while a scan finds one (what they
/// fork meanwhile; a few scans at most).
void kill_left(const SessionNotes& notes) {
  std::set<pid_t> killed;
  std::set<pid_t> ours;
  for (int scan = 0; scan < 4; ++scan) {
    const std::map<pid_t, ProcessIds> ids = read_process_ids();
    if (scan == 0)
      for (const auto& [sid, noted] : notes.sessions)
        if (still_noted(ids, sid, noted)) ours.insert(sid);
    bool found = false;
    for (const auto& [pid, id] : ids) {
      // A 'Z' main thread may have other threads still running: signalled too.
      if (ours.count(id.session) > 0 && killed.insert(pid).second) {
        ::kill(pid, SIGKILL);
        found = true;
      }
    }
    if (!found) break;
  }
}

/// "<pid>.<start time>" of process `pid` (start time 0 when it cannot be read).
std::string process_tag(pid_t pid) {
  const auto ids = read_process(pid);
  return std::to_string(pid) + "." + std::to_string(ids ? ids->start_time : 0);
}

/// Where the agent's temporary directories are, and what names them (temp_dir_tag), worked
/// out by the agent before the fork: the watcher changes its directory to /, and a relative
/// $TMPDIR would then name another place.
struct AgentTemp {
  std::string dir;
  std::string tag;
};

/// The watcher: waits for the agent's end (EOF on the pipe, whether the agent exited or was
/// SIGKILLed), then kills what is left in the node's cgroup and removes it, or, without one,
/// what is left in the workers' sessions it was told of (by each worker before its exec, and
/// by the agent for a standby) and in the sessions it saw the agent's descendants in (each
/// second); then removes the agent's temporary directories. It runs in a fork of a process
/// with one thread, so the calls below are safe; it holds nothing of the agent's.
[[noreturn]] void watch(int pipe_r, const std::string& node_dir, pid_t agent,
                        const AgentTemp& temp) {
  const pid_t agent_session = ::getsid(0);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP})
    ::signal(sig, SIG_IGN);
  // Named before it leads a session of its own: an outer ddprun's watcher never notes that
  // session (is_watcher).
  ::prctl(PR_SET_NAME, kWatcherName);
  ::setsid();  // out of the terminal's process group: a Ctrl-C or kill -9 -<pgid> misses it
  const int devnull = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
  if (pipe_r != 3) {
    ::dup2(pipe_r, 3);
    pipe_r = 3;
  }
  if (::syscall(SYS_close_range, 4U, ~0U, 0U) != 0)
    for (int fd = 4; fd < 65536; ++fd) ::close(fd);
  if (::chdir("/") != 0) {
  }
  const pid_t own_session = ::getsid(0);
  // Without a cgroup, the watcher is told each worker's session before the worker's exec, and
  // a descendant that calls setsid leaves it; once the agent is gone nothing links either to
  // the agent any more, so the sessions are noted while the agent lives.
  const bool scan = node_dir.empty();
  SessionNotes notes{agent, agent_session, own_session, {}, {}, 0};
  WatcherRecord record;
  std::size_t have = 0;
  bool keep_error_files = false;
  using Clock = std::chrono::steady_clock;
  auto next_scan = Clock::now() + std::chrono::milliseconds(kSessionScanMs);
  while (true) {
    if (scan) {
      // Each second, also while records keep coming (a group restarting at once, in a loop).
      if (Clock::now() >= next_scan) {
        if (::getppid() == agent) notes.scan();
        next_scan = Clock::now() + std::chrono::milliseconds(kSessionScanMs);
      }
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_scan - Clock::now());
      pollfd ready{pipe_r, POLLIN, 0};
      const int r = ::poll(&ready, 1, static_cast<int>(std::max<long long>(0, wait.count())) + 1);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;  // time to scan
      // Otherwise a record, the agent's end, or poll() failing: read() blocks for what comes.
    }
    const ssize_t n = ::read(pipe_r, reinterpret_cast<char*>(&record) + have, sizeof record - have);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
    if (n < 0) continue;
    have += static_cast<std::size_t>(n);
    if (have < sizeof record) continue;
    have = 0;
    if (record.kind == 'T') notes.tell(record.session);
    if (record.kind == 'F') notes.forget();  // killed with the group, or the job's end
    if (record.kind == 'K') keep_error_files = true;
  }
  // A normal end told it to forget every session: nothing to do.
  if (!notes.empty()) kill_left(notes);
  // A normal end removed the directory already: ENOENT, nothing to do.
  if (!node_dir.empty() && write_control(node_dir + "/cgroup.kill", "1") != ENOENT) {
    for (int waited = 0; waited < kRemoveWaitMs && !remove_cgroup(node_dir); waited += 20)
      ::usleep(20 * 1000);
  }
  // Once nothing of the job can write there: what a SIGKILL left (after a planned end, nothing
  // is left but the error files a failure report named, kept for the user to read).
  if (!temp.dir.empty()) remove_agent_temp_dirs(temp.dir, temp.tag, keep_error_files);
  ::_exit(0);
}

}  // namespace

std::string temp_dir_tag() { return process_tag(::getpid()); }

int remove_agent_temp_dirs(const std::string& dir, const std::string& tag, bool keep_error_files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string socket_dirs = "ddprun-sock-" + tag + "-";
  const std::string error_dirs = "ddprun-" + tag + "-";
  std::vector<fs::path> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool ours =
        name.rfind(socket_dirs, 0) == 0 || (!keep_error_files && name.rfind(error_dirs, 0) == 0);
    if (!ours) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid())
      found.push_back(it->path());
  }
  int removed = 0;
  for (const fs::path& path : found) {
    std::error_code gone;
    if (fs::remove_all(path, gone) > 0 && !gone) ++removed;
  }
  return removed;
}

std::string_view cleanup_mode_name(CleanupMode mode) {
  for (const auto& [m, name] : kModeNames)
    if (m == mode) return name;
  return "?";
}

std::optional<CleanupMode> parse_cleanup_mode(std::string_view text) {
  for (const auto& [m, name] : kModeNames)
    if (name == text) return m;
  return std::nullopt;
}

std::optional<std::string> cgroup2_mount_point(const std::string& mountinfo) {
  std::istringstream lines(mountinfo);
  for (std::string line; std::getline(lines, line);) {
    // "36 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw": the type follows " - ".
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream after(line.substr(dash + 3));
    std::string type;
    if (!(after >> type) || type != "cgroup2") continue;
    std::istringstream before(line.substr(0, dash));
    std::string id, parent, devices, root, mount_point;
    if (before >> id >> parent >> devices >> root >> mount_point) return mount_point;
  }
  return std::nullopt;
}

bool still_noted(const std::map<pid_t, ProcessIds>& ids, pid_t sid, const NotedSession& noted) {
  if (const auto leader = ids.find(sid); leader != ids.end())
    return noted.leader_start != 0 && leader->second.start_time == noted.leader_start;
  for (const auto& [pid, start] : noted.members) {
    if (pid == sid) return true;  // the leader, there at the last look
    if (const auto member = ids.find(pid);
        member != ids.end() && member->second.session == sid && member->second.start_time == start)
      return true;
  }
  return false;
}

std::optional<std::string> cgroup2_own_path(const std::string& proc_self_cgroup) {
  std::istringstream lines(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return std::nullopt;
}

GroupCleanup::~GroupCleanup() {
  if (group_fd_ >= 0) ::close(group_fd_);
  if (standby_fd_ >= 0) ::close(standby_fd_);
  if (watcher_pipe_ >= 0) ::close(watcher_pipe_);
}

/// Forks the watcher of `node_dir` ("" without a cgroup): its pid and the pipe's write end,
/// or why not.
common::Result<std::pair<pid_t, int>> start_watcher(const std::string& node_dir) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return common::Error{std::string("pipe: ") + std::strerror(errno)};
  const pid_t parent = ::getpid();
  AgentTemp temp{"", temp_dir_tag()};
  std::error_code no_temp;  // then the watcher removes nothing
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(no_temp);
  if (!no_temp) temp.dir = std::filesystem::absolute(tmp, no_temp).string();
  if (no_temp) temp.dir.clear();
  const pid_t watcher = ::fork();
  if (watcher == 0) {
    ::close(fds[1]);
    watch(fds[0], node_dir, parent, temp);
  }
  ::close(fds[0]);
  if (watcher < 0) {
    ::close(fds[1]);
    return common::Error{std::string("fork: ") + std::strerror(errno)};
  }
  return std::make_pair(watcher, fds[1]);
}

common::Result<std::unique_ptr<GroupCleanup>> GroupCleanup::start(CleanupMode mode) {
  std::unique_ptr<GroupCleanup> cleanup(new GroupCleanup());
  if (auto why = become_child_subreaper()) return *why;
  // Without a cgroup, a watcher that kills the workers' sessions should the agent die
  // (a failure to start it leaves the /proc walk, which covers every end but a SIGKILL).
  auto use_subreaper = [&cleanup] {
    auto started = start_watcher("");
    if (started) {
      cleanup->watcher_ = started->first;
      cleanup->watcher_pipe_ = started->second;
      cleanup->tracking_ = true;
    }
  };
  if (mode == CleanupMode::Subreaper) {
    use_subreaper();
    return cleanup;
  }

  // Why the cgroup path cannot be used here, or "".
  std::string unusable;
  auto mount = cgroup2_mount_point(read_text("/proc/self/mountinfo"));
  auto own = cgroup2_own_path(read_text("/proc/self/cgroup"));
  std::string node_dir;
  if (!mount) {
    unusable = "no cgroup v2 hierarchy is mounted (none in /proc/self/mountinfo)";
  } else if (!own) {
    unusable = "this process is in no cgroup v2 group (no 0:: line in /proc/self/cgroup)";
  } else {
    std::string parent = *mount + (*own == "/" ? "" : *own);
    node_dir = parent + "/ddprun-" + std::to_string(::getpid());
    if (::mkdir(node_dir.c_str(), 0755) != 0) {
      unusable = "cannot create " + node_dir + ": " + std::strerror(errno) +
                 " (the cgroup tree is not delegated to this user)";
      node_dir.clear();
    } else if (::access((node_dir + "/cgroup.kill").c_str(), F_OK) != 0) {
      unusable = "the kernel has no cgroup.kill (Linux 5.14 or later has it)";
    } else {
      const std::string standby = node_dir + "/standby";
      const int fd = ::mkdir(standby.c_str(), 0755) == 0
                         ? ::open((standby + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC)
                         : -1;
      if (fd < 0) {
        unusable = "cannot create " + standby + ": " + std::strerror(errno);
      } else {
        cleanup->standby_fd_ = fd;
        // Moving a process needs write access to the common ancestor's cgroup.procs too: try
        // it with a process that exits at once.
        const pid_t probe = ::fork();
        if (probe == 0) ::_exit(::write(fd, "0", 1) == 1 ? 0 : (errno & 0x7f));
        int status = 0;
        if (probe < 0) {
          unusable = std::string("fork: ") + std::strerror(errno);
        } else {
          while (::waitpid(probe, &status, 0) < 0 && errno == EINTR) {
          }
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            unusable = "cannot move a process into " + standby + ": " +
                       std::strerror(WIFEXITED(status) ? WEXITSTATUS(status) : EPERM);
        }
      }
    }
  }
  if (unusable.empty()) {
    auto started = start_watcher(node_dir);
    if (!started) {
      unusable = started.error().message;
    } else {
      cleanup->watcher_ = started->first;
      cleanup->watcher_pipe_ = started->second;
    }
  }
  if (unusable.empty()) {
    cleanup->mode_ = CleanupMode::Cgroup;
    cleanup->node_dir_ = node_dir;
    return cleanup;
  }
  if (!node_dir.empty()) remove_cgroup(node_dir);
  if (mode == CleanupMode::Cgroup)
    return common::Error{"--cleanup cgroup: " + unusable +
                         "; run ddprun where a cgroup v2 tree is delegated to its user (a "
                         "systemd unit or scope with Delegate=yes), or pass --cleanup auto"};
  cleanup->no_cgroup_ = unusable;
  use_subreaper();
  return cleanup;  // auto: the subreaper
}

std::string GroupCleanup::describe() const {
  if (mode_ == CleanupMode::Cgroup) return "cgroup " + node_dir_;
  if (!no_cgroup_.empty()) return "subreaper (no cgroup: " + no_cgroup_ + ")";
  return std::string(cleanup_mode_name(mode_));
}

int GroupCleanup::begin_group() {
  if (group_fd_ >= 0) ::close(group_fd_);
  group_fd_ = -1;
  if (!group_dir_.empty()) ended_dirs_.push_back(group_dir_);  // not ended: removed at finish()
  if (node_dir_.empty()) return -1;
  group_dir_ = node_dir_ + "/group-" + std::to_string(groups_++);
  if (::mkdir(group_dir_.c_str(), 0755) == 0)
    group_fd_ = ::open((group_dir_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  // Should the group have no cgroup of its own, its workers stay in the agent's, where the
  // /proc walk still finds them and the watcher cannot: the node's cgroup is the fallback.
  if (group_fd_ < 0) group_dir_.clear();
  return group_fd_;
}

void GroupCleanup::tell_watcher(char kind, pid_t session) {
  if (tracking_) write_record(kind, session);
}

void GroupCleanup::write_record(char kind, pid_t session) {
  if (watcher_pipe_ < 0) return;
  const WatcherRecord record{kind, static_cast<std::int32_t>(session)};
  // Smaller than PIPE_BUF: written whole or not at all. A watcher gone (EPIPE) tracks nothing.
  ssize_t n;
  do {
    n = ::write(watcher_pipe_, &record, sizeof record);
  } while (n < 0 && errno == EINTR);
}

int GroupCleanup::watcher_fd() const { return tracking_ ? watcher_pipe_ : -1; }

void GroupCleanup::track(pid_t session) {
  if (session > 0) tell_watcher('T', session);
}

void GroupCleanup::adopt(pid_t pid) {
  track(pid);
  if (group_fd_ < 0) return;
  const std::string text = std::to_string(pid);
  if (::write(group_fd_, text.data(), text.size()) < 0) {
    // It stays in the standby cgroup: still below the node's, which the watcher kills.
  }
}

int GroupCleanup::end_group(const std::set<pid_t>& spared) {
  std::set<pid_t> keep = spared;
  if (watcher_ > 0) keep.insert(watcher_);
  const int killed = kill_descendants(keep);
  // The group's processes are gone: a session id the watcher holds could be reused.
  tell_watcher('F', 0);
  if (!group_dir_.empty()) {
    write_control(group_dir_ + "/cgroup.kill", "1");
    ended_dirs_.push_back(group_dir_);
    group_dir_.clear();
    ::close(group_fd_);
    group_fd_ = -1;
  }
  remove_ended_groups(0);
  return killed;
}

void GroupCleanup::remove_ended_groups(int wait_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (true) {
    std::vector<std::string> left;
    for (const auto& dir : ended_dirs_)
      if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) left.push_back(dir);
    ended_dirs_ = std::move(left);
    if (ended_dirs_.empty() || std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void GroupCleanup::keep_error_files() {
  write_record('K', 0);  // with a cgroup too (tell_watcher writes only the subreaper's records)
}

void GroupCleanup::finish() {
  std::set<pid_t> keep;
  if (watcher_ > 0) keep.insert(watcher_);
  kill_descendants(keep);
  tell_watcher('F', 0);
  if (!node_dir_.empty()) write_control(node_dir_ + "/cgroup.kill", "1");
  // Killed children of ours are zombies until reaped; reap them rather than leave them to init.
  reap_children_except(keep, kRemoveWaitMs);
  if (node_dir_.empty()) return;
  if (!group_dir_.empty()) ended_dirs_.push_back(group_dir_);
  group_dir_.clear();
  ended_dirs_.push_back(node_dir_ + "/standby");
  ended_dirs_.push_back(node_dir_);
  if (group_fd_ >= 0) ::close(group_fd_);
  if (standby_fd_ >= 0) ::close(standby_fd_);
  group_fd_ = standby_fd_ = -1;
  remove_ended_groups(kRemoveWaitMs);
  // What could not be removed, the watcher tries again when the agent is gone.
}

}  // namespace ddprun::agent
