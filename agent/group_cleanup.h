#pragma once
#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/process_tree.h"
#include "common/result.h"

namespace ddprun::agent {

/// --cleanup: how the agent makes sure no descendant of a worker outlives its group, or the
/// agent itself when the agent is SIGKILLed. See docs/design.md, "Process hygiene".
enum class CleanupMode {
  Auto,       ///< cgroup where a cgroup v2 tree is delegated to us, else subreaper
  Cgroup,     ///< a cgroup v2 per group, and a watcher that writes cgroup.kill if the agent dies
  Subreaper,  ///< the /proc walk, and a watcher that kills the workers' sessions, and the
              ///< sessions it saw their descendants start, if the agent dies: nothing
              ///< survives but what started a session of its own less than a second before
};

/// "auto", "cgroup", "subreaper": the one name table of CleanupMode (flag values and messages).
std::string_view cleanup_mode_name(CleanupMode mode);
std::optional<CleanupMode> parse_cleanup_mode(std::string_view text);

/// Where the cgroup v2 hierarchy is mounted, from the text of /proc/self/mountinfo (the first
/// "cgroup2" mount); nullopt when there is none.
std::optional<std::string> cgroup2_mount_point(const std::string& mountinfo);

/// This process's cgroup v2 path ("/user.slice/x.scope"), from the text of /proc/self/cgroup
/// (its "0::" line); nullopt when there is none.
std::optional<std::string> cgroup2_own_path(const std::string& proc_self_cgroup);

/// A session the subreaper watcher keeps while the agent lives (a worker's, or one a descendant
/// started with setsid): its leader's start time (0: gone when first seen) and the processes
/// in it at the last look, each a pid and its start time (for a worker's session told before
/// its exec and not looked at since: the worker).
struct NotedSession {
  unsigned long long leader_start = 0;
  std::set<std::pair<pid_t, unsigned long long>> members;
};

/// Whether session `sid`, noted as `noted`, is still that one in `ids` (read_process_ids()):
/// its leader alive and the same process; or, the leader gone, the leader or another process
/// in it at the last look (a worker dies with the agent, by PR_SET_PDEATHSIG, and what it
/// started since that look is still the job's), the other still in it. A session's id is its
/// leader's pid, which the kernel gives no other process while anything is in the session; a
/// session found empty at a look is dropped, so what later has its id is never taken for it,
/// but for one emptied and its id taken again since the last look (at most a second).
bool still_noted(const std::map<pid_t, ProcessIds>& ids, pid_t sid, const NotedSession& noted);

/// What this agent's temporary directories are named after: "<pid>.<start time>" (the start
/// time keeps a later process that gets the same pid from matching). The report socket's
/// directory is `ddprun-sock-<tag>-XXXXXX` and the error files' (without --log_dir) is
/// `ddprun-<tag>-XXXXXX` in the temporary directory ($TMPDIR, else /tmp); the agent removes
/// them as it ends (or keeps the error files a failure report names: keep_error_files()), and
/// its watcher removes what is left once the agent is gone (after a SIGKILL, all of them):
/// remove_agent_temp_dirs.
std::string temp_dir_tag();

/// Removes the directories in `dir` of the agent tagged `tag` (temp_dir_tag), the error files'
/// only when not `keep_error_files`: only directories (not links), owned by this user.
/// Returns how many it removed.
int remove_agent_temp_dirs(const std::string& dir, const std::string& tag, bool keep_error_files);

/// Kills what is left of each worker group, and everything at the end.
///
///   agent (child subreaper) ----- pipe (write end, close-on-exec) -----> watcher
///     |-- workers of group N  (in <own cgroup>/ddprun-<pid>/group-N)       read() blocks until
///     |     \-- setsid'd grandchildren (same cgroup; ours once orphaned)   the agent is gone,
///     \-- standbys            (in <own cgroup>/ddprun-<pid>/standby)       then cgroup.kill on
///                                                                          ddprun-<pid>, rmdir;
///                                                                          the agent's temporary
///                                                                          directories go too
/// Without a cgroup (subreaper) each worker writes its session (it leads one, as it leads its
/// process group) to the watcher's pipe before exec, and the agent writes each standby's before
/// a hand-over; once a group's processes are killed the agent tells the watcher to forget them
/// all. If the agent dies first, the watcher SIGKILLs whatever is left in those sessions (the
/// workers' background children, also those in process groups of their own) and in the
/// sessions it saw the agent's descendants start (setsid; it looks each second), each while it
/// is still the one noted (still_noted); one a look finds empty is dropped.
/// A group's end kills every descendant of the agent but the standbys (a /proc walk), and with
/// a cgroup also writes the group's cgroup.kill.
class GroupCleanup {
 public:
  ~GroupCleanup();
  GroupCleanup(const GroupCleanup&) = delete;
  GroupCleanup& operator=(const GroupCleanup&) = delete;

  /// Sets up the mode asked for. Call before any other process or thread starts: the cgroup
  /// watcher is forked here. An error (a forced cgroup that cannot be used) names the reason
  /// and the fix.
  static common::Result<std::unique_ptr<GroupCleanup>> start(CleanupMode mode);

  /// The mode in effect (never Auto), and where or why: "cgroup /sys/fs/cgroup/ddprun-12",
  /// "subreaper (no cgroup: <reason>)".
  CleanupMode mode() const { return mode_; }
  std::string describe() const;

  /// A new group starts: the descriptor of its cgroup.procs, which each of its workers writes
  /// before exec (ProcessSpec::cgroup_procs_fd); -1 without a cgroup.
  int begin_group();
  /// The cgroup.procs descriptor for standbys (-1 without a cgroup).
  int standby_procs_fd() const { return standby_fd_; }
  /// The same for the agent's other helpers (a health check's command): below the node's
  /// cgroup, which a SIGKILL of the agent kills, and outside every group's, which a group's end
  /// kills.
  int helper_procs_fd() const { return standby_fd_; }
  /// A standby handed over to the current group joins its cgroup (and is tracked, again).
  void adopt(pid_t pid);
  /// A worker of the current group leads `session`: without a cgroup, the watcher kills what
  /// is left in it if the agent dies.
  void track(pid_t session);
  /// Without a cgroup, the watcher's pipe, on which a worker tells its own session between
  /// fork and exec (ProcessSpec::watcher_fd), so that nothing it starts is missed if
  /// the agent dies before track() would have told it; -1 with a cgroup.
  int watcher_fd() const;
  /// The group has ended: SIGKILL every descendant of the agent except the `spared` pids and
  /// theirs (the standbys), and the group's cgroup. Returns how many processes the /proc walk
  /// signalled.
  int end_group(const std::set<pid_t>& spared);
  /// The failure report names error files in the agent's temporary directory, which the
  /// agent keeps for the user to read: the watcher must not remove it once the agent is gone.
  void keep_error_files();
  /// The job has ended: SIGKILL every descendant, reap the agent's children (bounded), remove
  /// the cgroups.
  void finish();
  /// Processes of ours that are not workers: never killed by end_group, never a worker.
  pid_t watcher_pid() const { return watcher_; }

 private:
  GroupCleanup() = default;
  void remove_ended_groups(int wait_ms);

  CleanupMode mode_ = CleanupMode::Subreaper;
  std::string node_dir_;                 ///< <mount><own cgroup>/ddprun-<pid>, "" without
  std::string no_cgroup_;                ///< why auto fell back to the subreaper
  std::string group_dir_;                ///< the current group's cgroup, "" before the first
  std::vector<std::string> ended_dirs_;  ///< killed, to be removed once empty
  int group_fd_ = -1;
  int standby_fd_ = -1;
  int watcher_pipe_ = -1;  ///< the agent's end; the watcher reads EOF when the agent is gone
  pid_t watcher_ = -1;
  int groups_ = 0;
  bool tracking_ = false;  ///< workers' sessions are written to the watcher (subreaper)
  /// Without a cgroup, writes one record to the watcher: 'T' and a worker's session, or 'F'
  /// (forget them all).
  void tell_watcher(char kind, pid_t session);
  /// One record on the watcher's pipe, in either mode (a watcher gone: nothing happens).
  void write_record(char kind, pid_t session);
};

}  // namespace ddprun::agent
