#pragma once
#include <sys/types.h>

#include <map>
#include <optional>
#include <set>
#include <string>

#include "agent/process_launcher.h"
#include "agent/worker.h"
#include "agent/worker_env.h"

namespace ddprun::agent {

/// The environment variable that tells a process it is a standby, and which descriptor the
/// agent's hand-over arrives on.
inline constexpr const char* kStandbyFdVariable = "DDPRUN_STANDBY_FD";

/// The hand-over message: the complete environment of the worker the standby becomes.
std::string encode_standby_handover(const EnvMap& env);

/// Standby processes for --standby_workers: one per local rank, started while the group runs.
/// Each has the program loaded and waits in the worker SDK (WorkerContext::from_env) for the
/// environment of the worker it becomes. A restart hands a standby its round's environment
/// instead of starting a process, which takes process start-up (exec and loading libtorch,
/// about 1 s) off the time to recovery. See docs/design.md, "Standby workers".
///
///   agent                                      standby (worker SDK)
///   socketpair, launch, DDPRUN_STANDBY_FD=<fd> -> exec, load libraries, main(), from_env():
///                                               read <fd> until end of file
///   restart: write {"env": {...}}, close     -> replace the environment, continue as worker
///   job end or discard: close, SIGKILL       -> end of file with no message: exit 0
class StandbyPool {
 public:
  explicit StandbyPool(ProcessLauncher& launcher) : launcher_(launcher) {}
  ~StandbyPool() { clear(); }
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  /// Starts a standby for `local_rank` from `spec` (its environment from build_standby_env),
  /// unless one is alive or the pool was disabled. Returns why it could not start, or "".
  std::string start(int local_rank, ProcessSpec spec);

  /// Hands the standby of `local_rank` the environment of its worker: the process, with its
  /// output pipes, is then the worker's. std::nullopt when there is no live standby or the
  /// hand-over failed (that standby is discarded).
  std::optional<LaunchedProcess> hand_over(int local_rank, const EnvMap& worker_env);

  /// Called for every reaped child: true when `pid` was a standby. A standby that ends on its
  /// own (the program does not wait in the SDK) disables the pool, with a warning.
  bool on_exit(pid_t pid, const ExitStatus& status);

  /// Ends every standby (closes its hand-over socket, SIGKILL) and reaps it.
  void clear();

  /// False once a standby ended on its own.
  bool enabled() const { return enabled_; }
  bool has(int local_rank) const { return standbys_.count(local_rank) > 0; }
  /// The pid of the live standby of `local_rank`, -1 when there is none.
  pid_t pid_of(int local_rank) const {
    auto it = standbys_.find(local_rank);
    return it == standbys_.end() ? -1 : it->second.process.pid;
  }

 private:
  struct Standby {
    LaunchedProcess process;
    int handover_fd = -1;  ///< the agent's end of the hand-over socket pair
  };
  void discard(Standby& s);

  ProcessLauncher& launcher_;
  std::map<int, Standby> standbys_;  ///< by local rank
  std::set<pid_t> discarded_;        ///< killed by us, not yet reaped
  bool enabled_ = true;
};

}  // namespace ddprun::agent
