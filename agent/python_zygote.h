#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <variant>

#include "agent/process_launcher.h"
#include "agent/worker.h"
#include "agent/worker_env.h"

namespace ddprun::agent {

/// How long a fork request may take before the zygote is given up (a fork of an interpreter
/// with torch takes milliseconds).
inline constexpr std::chrono::milliseconds kZygoteForkTimeout{5000};

/// The node's Python zygote, for --standby_workers with a Python script: one interpreter on
/// ddprun's bootstrap (agent/python/ddprun_standby.py --zygote) that imports torch and the
/// script's imports once, says it is ready, and then forks standbys on request. Each standby is
/// a copy of that interpreter (copy-on-write: torch's pages are shared), made in milliseconds,
/// and is adopted by the agent, a child subreaper, so it is reaped and signalled like any
/// process the agent started. See docs/design.md, "Standby workers".
///
///   agent                                         zygote
///   SOCK_SEQPACKET pair, launch with
///   DDPRUN_ZYGOTE_FD=<its end>               ->   import torch, the script's imports
///   control socket readable: on_readable()   <-   {"ready": pid}
///   launch(spec): {"env": ...} with the      ->   fork, fork again (the middle process exits:
///   hand-over fd and two pipes attached            the standby becomes the agent's child)
///   wait for the reply (kZygoteForkTimeout)  <-   {"pid": n} or {"error": "..."}
///   stop(): close, SIGKILL, reap             ->   end of file: exit 0
///
/// As a ProcessLauncher it makes standbys for StandbyPool: launch(spec) forks one whose
/// environment is spec.envp and whose hand-over descriptor is spec.inherit_fd (spec.executable,
/// spec.argv and spec.cgroup_procs_fd are the zygote's own: the fork stays in its cgroup).
class PythonZygote final : public ProcessLauncher {
 public:
  enum class State { Idle, Starting, Ready, Gone };

  explicit PythonZygote(ProcessLauncher& launcher) : launcher_(launcher) {}
  ~PythonZygote() override { stop(); }
  PythonZygote(const PythonZygote&) = delete;
  PythonZygote& operator=(const PythonZygote&) = delete;

  /// Launches the interpreter from `spec` (the bootstrap command with --zygote, the standby
  /// environment): Idle -> Starting. Returns why it could not, or "".
  std::string start(ProcessSpec spec);

  /// The agent's end of the control socket, readable once the zygote is ready or has ended
  /// (-1 unless Starting or Ready). Owned here.
  int control_fd() const { return control_fd_; }

  /// Reads what made control_fd() readable while Starting: Starting -> Ready on its ready
  /// message, Starting -> Gone (the zygote is killed; failure() says why) on anything else.
  State on_readable();

  /// Called for every reaped child: true when `pid` was the zygote (-> Gone).
  bool on_exit(pid_t pid, const ExitStatus& status);

  /// Forks a standby (Ready only). A zygote that does not answer within kZygoteForkTimeout
  /// or answers nonsense is killed (-> Gone).
  std::variant<LaunchedProcess, std::string> launch(const ProcessSpec& spec) override;
  bool signal_group(pid_t pgid, int sig) override { return launcher_.signal_group(pgid, sig); }
  /// The forks are the agent's children (a subreaper adopts them): its launcher reaps them.
  std::vector<ProcessExit> reap() override { return launcher_.reap(); }
  void wait(pid_t pid) override { launcher_.wait(pid); }

  /// Ends the zygote: closes the control socket (it exits on end of file), SIGKILL, reap.
  void stop();

  State state() const { return state_; }
  pid_t pid() const { return process_.pid; }
  /// Why the zygote is Gone, for a warning: how it ended and the last line it wrote to stderr.
  const std::string& failure() const { return failure_; }

 private:
  void give_up(std::string why);
  std::string stderr_tail();

  ProcessLauncher& launcher_;
  State state_ = State::Idle;
  LaunchedProcess process_;
  int control_fd_ = -1;
  EnvMap start_env_;  ///< what the zygote started with: its forks' start-only variables
  bool reaped_ = false;
  std::string failure_;
};

}  // namespace ddprun::agent
