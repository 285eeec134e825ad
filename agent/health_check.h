#pragma once
// The health gate (--health_check): before a node joins a round (the first, and every one after
// a restart) it checks itself, and a node that fails is kept out of the job's rounds (the
// rendezvous lists it and tells it the job's end), says why, and checks again after
// --health_check_interval. Two parts:
//
//  - built-in checks, which need no script: the directories the job writes to are writable and
//    have room, and nothing the node had at its first check has gone since (NVIDIA GPUs on the
//    PCI bus, network interfaces of a device that were up, InfiniBand ports that were ACTIVE);
//  - the user's command, run with /bin/sh -c, bounded by --health_check_timeout: exit 0 passes.
//
// builtin_health_problems() is pure but for the files it reads under a root the tests replace
// with a fake sysfs tree; HealthCheckRunner is the executor's part (the agent's event loop).
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/deadline_timer.h"
#include "agent/process_launcher.h"
#include "agent/worker_env.h"
#include "common/clock.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

/// What the built-in checks read, and where.
struct HealthInputs {
  std::string sysfs_root = "/sys";
  /// Directories the job writes to (--log_dir, the error files' directory): each must be
  /// writable and have at least min_free_bytes free.
  std::vector<std::string> dirs;
  std::uint64_t min_free_bytes = 64ull << 20;
};

/// What the node had at its first check: later checks fail when some of it has gone.
struct HealthBaseline {
  bool taken = false;
  int nvidia_gpus = 0;
  std::set<std::string> nics_up;    ///< interfaces of a device (not virtual) that were up
  std::set<std::string> ib_active;  ///< "mlx5_0/1": InfiniBand ports that were ACTIVE
};

/// The built-in checks: one line per problem found ("" list: healthy). The first call fills
/// `baseline`; later calls compare with it.
std::vector<std::string> builtin_health_problems(const HealthInputs& inputs,
                                                 HealthBaseline& baseline);

/// How one health check ended.
struct HealthResult {
  bool ok = true;
  std::string why;  ///< "" when ok; else the problems, or how the command ended
  /// The command's output: its last 4 KiB, from the first whole line on, after a line saying
  /// how much went before when more came.
  std::string output;
  long long ms = 0;  ///< how long the check took
};

/// Runs the gate's checks on the agent's event loop: the built-in ones at once, then the
/// command (when there is one) as a child of the agent in its own session, its output
/// read through a pipe, killed (the whole group) when it runs past the timeout. The agent
/// passes every reaped pid to on_exit(); the check's own is taken. Nothing here waits: a
/// command the kernel keeps from dying (a hung mount) fails the check at its timeout, and its
/// exit, whenever it comes, is taken and dropped.
class HealthCheckRunner {
 public:
  /// The command's timeout and the grace after it are `timers` on `clock`.
  HealthCheckRunner(boost::asio::io_context& io, ProcessLauncher& launcher,
                    const common::Clock& clock, DeadlineTimers& timers, HealthInputs inputs,
                    std::string command, std::chrono::milliseconds timeout, EnvMap env);
  ~HealthCheckRunner();
  HealthCheckRunner(const HealthCheckRunner&) = delete;
  HealthCheckRunner& operator=(const HealthCheckRunner&) = delete;

  /// Where the command's processes go, so that a SIGKILL of the agent kills them too
  /// (GroupCleanup): the cgroup.procs descriptor it joins, the subreaper watcher's pipe on
  /// which it tells its session (ProcessSpec; -1: none).
  void place(int cgroup_procs_fd, int watcher_fd);
  /// Starts a check; `done` runs on the event loop once it has ended (never inside run()).
  void run(std::function<void(HealthResult)> done);
  /// A reaped child: true when it was the check's command (which then completes the check).
  bool on_exit(pid_t pid, ExitStatus status);
  /// Kills a check that still runs, without waiting for it; its `done` never runs.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
