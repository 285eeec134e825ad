#pragma once
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/process_launcher.h"
#include "agent/worker.h"
#include "agent/worker_env.h"
#include "common/standby_protocol.h"

namespace ddprun::agent {

/// How long standbys have, all together, to acknowledge a hand-over. A standby that is still
/// loading its program (or never reads the descriptor) is discarded after this and its rank
/// starts afresh: a hand-over that nobody took would otherwise leave the rank without a worker.
inline constexpr std::chrono::milliseconds kHandoverAckTimeout{2000};

/// Variables that act only when a process starts (the dynamic loader's, the Python
/// interpreter's): a standby whose value differs from its worker's is not used.
bool is_start_only_variable(const std::string& name);

/// The start-only variables whose values differ between two environments, comma-separated
/// ("" when they agree).
std::string start_only_differences(const EnvMap& a, const EnvMap& b);

/// An environment from "K=V" strings.
EnvMap parse_envp(const std::vector<std::string>& envp);

/// Python standbys need at least this much available memory (MemAvailable) for the zygote, an
/// interpreter with torch imported (about 225 MiB RSS, docs/benchmarks.md), and the script's
/// own imports...
inline constexpr long long kStandbyMemoryBaseMiB = 1024;
/// ...and this much per local rank: the most a forked standby could come to hold if none of
/// its pages stayed shared with the zygote.
inline constexpr long long kStandbyMemoryPerRankMiB = 256;

/// Why a node has too little memory for Python standbys (MemAvailable in the text of
/// /proc/meminfo below kStandbyMemoryBaseMiB + local_world_size x kStandbyMemoryPerRankMiB),
/// or "" when it has enough or the text does not say.
std::string standby_memory_shortfall(const std::string& meminfo, int local_world_size);

/// What a Python standby is told besides its worker's environment.
struct PythonHandover {
  /// The script and arguments it runs instead of its own (standby_script_argv); empty: its own.
  std::vector<std::string> script_argv;
  /// The worker's command line as a fresh start of it has it (argv_for_local_rank of the
  /// worker's command), which the standby shows in /proc/<pid>/cmdline once it is the worker;
  /// empty: not said.
  std::vector<std::string> cmdline;
};

/// The hand-over message: the complete environment of the worker the standby becomes and, for a
/// Python standby, what `python` says (fields left out when empty).
std::string encode_standby_handover(const EnvMap& env, const PythonHandover& python = {});

/// Standby processes for --standby_workers: one per local rank, started while the group runs.
/// Each has the program loaded and waits for the environment of the worker it becomes: a C++
/// program in the worker SDK (WorkerContext::from_env), a Python script in ddprun's bootstrap
/// (agent/python/ddprun_standby.py), which has imported torch. A restart hands a standby its
/// round's environment instead of starting a process, which takes process start-up (exec and
/// loading libtorch or importing torch, about 1 s) off the time to recovery. See
/// docs/design.md, "Standby workers".
///
///   agent                                      standby (worker SDK or Python bootstrap)
///   socketpair, launch, DDPRUN_STANDBY_FD=<fd> -> exec, load libraries, wait: read <fd>
///                                                 until end of file
///   restart: write {"env": {...}}, shut down   -> read, check, write the ack byte, close;
///   the writing side, wait for the ack            continue as the worker
///   ack within kHandoverAckTimeout: a worker
///   none (still loading, gone): SIGKILL, the rank starts afresh
///   job end or discard: close, SIGKILL         -> end of file with no message: exit 0
class StandbyPool {
 public:
  explicit StandbyPool(ProcessLauncher& launcher) : launcher_(&launcher) {}
  ~StandbyPool() { clear(); }
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  /// Starts a standby for `local_rank` from `spec` (its environment from build_standby_env),
  /// unless one is alive or the pool was disabled. Returns why it could not start, or "".
  std::string start(int local_rank, ProcessSpec spec);

  /// Takes `process`, started elsewhere (forked by the Python zygote) with the other end of
  /// `handover_fd` and the environment `start_env`, as the standby of `local_rank` (the pool
  /// owns the descriptor from now on).
  void adopt(int local_rank, LaunchedProcess process, int handover_fd, EnvMap start_env);

  /// Hands each standby named in `worker_envs` (by local rank) the environment of its worker,
  /// then waits at most `ack_timeout` in all for the acknowledgements. Returns, by local rank,
  /// the processes that acknowledged: each, with its output pipes, is now its rank's worker.
  /// Ranks without a live standby are left out; a standby that did not acknowledge in time,
  /// could not be written to, or was started with a different value of a start-only variable
  /// (is_start_only_variable) is discarded and its rank left out, so the caller starts it
  /// afresh. `warnings` gets one line for each standby discarded for a reason a user should know.
  /// `python`: by local rank, what a Python standby is told besides the environment
  /// (encode_standby_handover).
  std::map<int, LaunchedProcess> hand_over(
      const std::map<int, EnvMap>& worker_envs, std::vector<std::string>& warnings,
      std::chrono::milliseconds ack_timeout = kHandoverAckTimeout,
      const std::map<int, PythonHandover>& python = {});

  /// The same, without waiting, for an event loop (StandbySupply): sends each standby named in
  /// `worker_envs` its hand-over and returns the descriptors its acknowledgement arrives on, by
  /// local rank; the loop calls on_ack_readable for each as it becomes readable, and
  /// end_hand_over once every rank is settled or the deadline passed. Only one hand-over is out
  /// at a time.
  std::map<int, int> begin_hand_over(const std::map<int, EnvMap>& worker_envs,
                                     std::vector<std::string>& warnings,
                                     const std::map<int, PythonHandover>& python = {});
  /// Reads what arrived for `local_rank`'s hand-over: true once the rank is settled (it
  /// acknowledged, or it ended without doing so and was discarded), false to wait on.
  bool on_ack_readable(int local_rank, std::vector<std::string>& warnings);
  /// Ends the hand-over: every standby that has not acknowledged is discarded (a warning says
  /// it did not within `ack_timeout`); returns the processes that took over, by local rank.
  std::map<int, LaunchedProcess> end_hand_over(std::chrono::milliseconds ack_timeout,
                                               std::vector<std::string>& warnings);
  /// Ranks whose acknowledgement is still awaited.
  size_t awaiting_acks() const { return sent_.size(); }

  /// Called for every reaped child: true when `pid` was a standby. A standby that ends on its
  /// own (the program does not wait in the SDK) disables the pool, and leaves a warning for
  /// take_warning() that, for an exit code, ends with the hint (set_exit_hint).
  bool on_exit(pid_t pid, const ExitStatus& status);
  /// The warning the last on_exit left ("" when none), once.
  std::string take_warning() { return std::exchange(warning_, std::string()); }

  /// Disables the pool for the rest of the job and ends every standby.
  void disable() {
    enabled_ = false;
    clear();
  }

  /// What the warning about a standby that ended on its own says the user can do.
  void set_exit_hint(std::string hint) { exit_hint_ = std::move(hint); }

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
    EnvMap start_env;      ///< the environment it was started with
  };
  void discard(Standby& s);

  ProcessLauncher* launcher_;
  std::map<int, Standby> standbys_;  ///< by local rank
  /// The hand-over under way: sent, the acknowledgement awaited; and acknowledged (workers).
  std::map<int, Standby> sent_;
  std::map<int, LaunchedProcess> taken_;
  std::set<pid_t> discarded_;  ///< killed by us, not yet reaped
  bool enabled_ = true;
  std::string warning_;
  std::string exit_hint_ =
      "--standby_workers needs a program that calls the ddprun worker SDK's "
      "WorkerContext::from_env";
};

}  // namespace ddprun::agent
