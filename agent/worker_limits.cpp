#include "agent/worker_limits.h"

#include <sys/resource.h>
#include <unistd.h>

namespace ddprun::agent {
namespace {

long long finite(rlim_t value) {
  return value == RLIM_INFINITY ? -1 : static_cast<long long>(value);
}

}  // namespace

ProcessLimits current_process_limits() {
  ProcessLimits limits;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    limits.open_files = finite(rl.rlim_cur);
    limits.open_files_hard = finite(rl.rlim_max);
  }
  if (::getrlimit(RLIMIT_NPROC, &rl) == 0) limits.processes = finite(rl.rlim_cur);
  // The kernel does not apply RLIMIT_NPROC to root (nor to CAP_SYS_RESOURCE/CAP_SYS_ADMIN).
  limits.processes_apply = ::geteuid() != 0;
  return limits;
}

std::optional<common::Error> check_worker_limits(int workers, const WorkerNeeds& needs,
                                                 const ProcessLimits& limits) {
  // Per worker: the read ends of its stdout and stderr pipes; its two log files; a standby's
  // two pipes and hand-over socket.
  const long long per_worker = 2 + (needs.log_files ? 2 : 0) + (needs.standbys ? 3 : 0);
  const long long files = kBaseDescriptors + per_worker * workers;
  if (limits.open_files >= 0 && files > limits.open_files) {
    std::string hard = limits.open_files_hard < 0 ? std::string("unlimited")
                                                  : std::to_string(limits.open_files_hard);
    return common::Error{"--nproc_per_node " + std::to_string(workers) + " needs about " +
                         std::to_string(files) + " open files (" + std::to_string(per_worker) +
                         " per worker), more than RLIMIT_NOFILE allows (" +
                         std::to_string(limits.open_files) + "); raise it with `ulimit -n " +
                         std::to_string(files) + "` (hard limit " + hard +
                         ") or start fewer workers"};
  }
  // The workers, their standbys, and the cgroup watcher.
  const long long processes = 1 + static_cast<long long>(workers) * (needs.standbys ? 2 : 1);
  if (limits.processes_apply && limits.processes >= 0 && processes > limits.processes)
    return common::Error{"--nproc_per_node " + std::to_string(workers) + " needs at least " +
                         std::to_string(processes) +
                         " processes, more than RLIMIT_NPROC allows this user (" +
                         std::to_string(limits.processes) + "); raise it with `ulimit -u " +
                         std::to_string(processes + 64) + "` or start fewer workers"};
  return std::nullopt;
}

}  // namespace ddprun::agent
