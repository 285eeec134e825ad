#pragma once
#include <sys/types.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"

namespace ddprun::agent {

/// What /proc/<pid>/stat says of a process's relations.
struct ProcessIds {
  pid_t parent = 0;
  pid_t group = 0;    ///< its process group
  pid_t session = 0;  ///< its session
  char state = 0;     ///< 'R', 'S', 'D', 'T' (stopped), 't' (traced), 'Z'...
  /// When it started, in clock ticks after boot (0 when the text stops before): with the pid,
  /// names one process, whose pid may be reused once it is gone.
  unsigned long long start_time = 0;
};

/// The parent, process group, session and start time from the text of /proc/<pid>/stat
/// ("1234 (name) S 1 1234 1234 ..."); nullopt when the text is not in that shape. The command
/// name may hold spaces and parentheses: the fields start after the last ')'.
std::optional<ProcessIds> ids_from_stat(const std::string& stat);

/// The parent pid alone (ids_from_stat).
std::optional<pid_t> parent_from_stat(const std::string& stat);

/// The state letter of /proc/<pid>/stat; 0 when the process is gone or the text unreadable.
char read_process_state(pid_t pid);

/// The ids in /proc/<pid>/stat (plain system calls: the subreaper watcher reads some each
/// second); nullopt when the process is gone or the text unreadable.
std::optional<ProcessIds> read_process(pid_t pid);

/// The pid of every process, as /proc lists them.
std::vector<pid_t> list_processes();

/// Every process's ids, read from /proc (a process gone while it was read is left out).
std::map<pid_t, ProcessIds> read_process_ids();

/// Every process's parent, read from /proc (a process gone while it was read is left out).
std::map<pid_t, pid_t> read_process_parents();

/// Every descendant of `root` in `parents` (pid -> parent pid), `root` itself excluded, leaving
/// out each pid in `spared` together with its own descendants.
std::vector<pid_t> descendants_of(const std::map<pid_t, pid_t>& parents, pid_t root,
                                  const std::set<pid_t>& spared);

/// Sets the core-file limit (RLIMIT_CORE, its soft value; the hard one is kept) of every
/// process in the process groups `groups` to 0, so that a signal sent to them for its report
/// (SIGABRT) leaves no core file (systemd-coredump, a pipe in core_pattern, is told the limit
/// and keeps none either). Scans until a scan lowers none (at most kMaxScans). Returns how
/// many processes it lowered.
int forbid_core_dumps(const std::vector<pid_t>& groups);

/// SIGKILLs every descendant of this process except the `spared` subtrees, scanning /proc again
/// until a scan finds nothing new (a process may fork while the previous scan runs; at most
/// kMaxScans scans). Returns how many processes it signalled. See docs/design.md, "Process
/// hygiene".
int kill_descendants(const std::set<pid_t>& spared);

/// Reaps, without blocking for more than about `limit_ms` in all, the children of this process
/// that have ended or end meanwhile, leaving `spared` alone; returns how many it reaped.
int reap_children_except(const std::set<pid_t>& spared, int limit_ms);

/// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant orphaned by its
/// parent (a worker's setsid'd grandchild whose worker ended) becomes our child, so it stays
/// findable below us and is reaped by us. The error when the kernel refuses.
std::optional<common::Error> become_child_subreaper();

}  // namespace ddprun::agent
