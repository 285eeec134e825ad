#pragma once
// Where the next group's standbys come from (--standby_workers): a StandbyPool of one standby
// per local rank, started a while after each group (StandbySettings::delay), and for a Python
// script the node's zygote (agent/python_zygote.h), which imports torch while the first rendezvous
// forms and forks every standby. LocalAgent asks it for handed-over workers when a group starts and
// hands it every reaped pid first.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/deadline_timer.h"
#include "agent/event_names.h"
#include "agent/group_cleanup.h"
#include "agent/process_launcher.h"
#include "agent/worker.h"
#include "agent/worker_command.h"
#include "agent/worker_env.h"
#include "common/clock.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct StandbySettings {
  bool enabled = false;  ///< --standby_workers resolved to on
  /// For a Python script: the bootstrap the standbys (and the zygote) run; "" when the program
  /// itself waits (the C++ worker SDK).
  std::string python_bootstrap;
  PythonStandbyOptions python;  ///< --standby_preload, --standby_cuda
  WorkerSpec spec;
  EnvMap agent_env;
  std::string run_id;
  /// Needed for a zygote (a subreaper adopts its forks); without a cgroup, each standby's
  /// session is tracked with it before a hand-over.
  GroupCleanup* cleanup = nullptr;
  /// How long after a group its standbys start (AgentOptions::standby_delay).
  std::chrono::milliseconds delay{1'000};
  /// The standbys' stdin, the workers' (AgentOptions::worker_stdin); the zygote's forks
  /// inherit the zygote's.
  int stdin_fd = -1;
};

class StandbySupply {
 public:
  /// `emit` writes an event-log line (zygote_started, zygote_ready, standbys_started). The
  /// standbys' delay and the zygote's and the hand-over's deadlines are `timers` on `clock`.
  StandbySupply(boost::asio::io_context& io, ProcessLauncher& launcher, const common::Clock& clock,
                DeadlineTimers& timers, StandbySettings settings,
                std::function<void(EventName, const nlohmann::json&)> emit);
  ~StandbySupply();
  StandbySupply(const StandbySupply&) = delete;
  StandbySupply& operator=(const StandbySupply&) = delete;

  /// For a Python script: starts the zygote importing torch; `settled(ready)` is called once,
  /// when it is ready or has failed (or was not ready within a minute). Returns whether it
  /// started (and so whether `settled` will be called).
  bool start_zygote(std::function<void(bool ready)> settled);

  /// A group starts with `executable`: hands each local rank's standby the environment in
  /// `envs` (by local rank; forking standbys from a ready zygote first), and calls `done` with
  /// the processes that took over, by local rank: they are workers now. The acknowledgements
  /// are awaited on the event loop (kHandoverAckTimeout at most), never by blocking it; `done`
  /// may be called before hand_over returns (nothing to wait for). Not called once stop()ped.
  void hand_over(const std::string& executable, const std::map<int, EnvMap>& envs,
                 std::function<void(std::map<int, LaunchedProcess>)> done);
  /// A hand-over is under way (its `done` not called yet).
  bool handing_over() const;
  /// The group started: standbys for its next restart start a while from now.
  void schedule(const std::string& executable);
  /// The agent started: a C++ program's standbys start a while from now too, so that an agent
  /// still waiting for its first round then (a spare) has them loaded when a lost node's ranks
  /// come to it. (A Python script's zygote imports meanwhile: start_zygote.) The first group
  /// re-arms the same timer (schedule), so an agent whose round forms at once starts none early.
  void prewarm();

  /// Called for every reaped pid first: true when it was a standby or the zygote.
  bool on_exit(pid_t pid, const ExitStatus& status);
  /// The standbys and the zygote, which ending a group must spare.
  std::set<pid_t> pids() const;
  /// Ends every standby and the zygote (the job is over).
  void stop();
  /// The agent stops on a signal: the standbys and the zygote ending now (the same signal
  /// reached them) are not warned of.
  void quiet();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
