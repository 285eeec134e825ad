#pragma once
#include <optional>
#include <string>

#include "common/result.h"

namespace ddprun::agent {

/// The kernel's per-process limits that bound how many workers one agent can run.
struct ProcessLimits {
  long long open_files = -1;       ///< RLIMIT_NOFILE soft limit (-1: unlimited)
  long long open_files_hard = -1;  ///< its hard limit, the most `ulimit -n` can raise it to
  long long processes = -1;        ///< RLIMIT_NPROC soft limit (-1: unlimited)
  bool processes_apply = false;    ///< RLIMIT_NPROC binds this user (it does not bind root)
};

/// This process's limits (getrlimit, geteuid).
ProcessLimits current_process_limits();

/// What each worker costs the agent.
struct WorkerNeeds {
  bool log_files = false;  ///< --redirects/--tee: up to two open log files per worker
  bool standbys = false;   ///< --standby_workers: a standby process, its pipes and socket
};

/// Descriptors the agent holds whatever the worker count (console, event loop, sockets, the
/// pipes of one launch, cgroup files), with room to spare.
inline constexpr long long kBaseDescriptors = 64;

/// Refuses, before anything starts, a worker count the limits cannot hold: the message names
/// the limit, its value, what the count needs and the fix. nullopt when the count fits.
std::optional<common::Error> check_worker_limits(int workers, const WorkerNeeds& needs,
                                                 const ProcessLimits& limits);

}  // namespace ddprun::agent
