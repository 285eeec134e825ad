#pragma once
#include <sys/types.h>

#include <chrono>
#include <deque>
#include <string>
#include <variant>
#include <vector>

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
///   control socket readable: on_readable()   <-   {"ready": pid, "shared_os_draws": [...]}
///   request_fork(tag, spec): {"env": ...}    ->   fork, fork again (the middle process exits:
///   with the hand-over fd and two pipes            the standby becomes the agent's child)
///   attached; several may be out at once
///   control socket readable: on_replies()    <-   {"pid": n} or {"error": "..."}, one per
///   (kZygoteForkTimeout: time_out())               request, in the order they were sent
///   stop(): close, SIGKILL, reap             ->   end of file: exit 0
///
/// Nothing here blocks: the agent's event loop waits for the control socket to be readable
/// (StandbySupply) and calls on_readable or on_replies.
class PythonZygote {
 public:
  enum class State { Idle, Starting, Ready, Gone };

  explicit PythonZygote(ProcessLauncher& launcher) : launcher_(launcher) {}
  ~PythonZygote() { stop(); }
  PythonZygote(const PythonZygote&) = delete;
  PythonZygote& operator=(const PythonZygote&) = delete;

  /// Launches the interpreter from `spec` (the bootstrap command with --zygote, the standby
  /// environment): Idle -> Starting. Returns why it could not, or "".
  std::string start(ProcessSpec spec);

  /// The agent's end of the control socket, readable once the zygote is ready, has answered a
  /// fork request or has ended (-1 once Gone). Owned here.
  int control_fd() const { return control_fd_; }

  /// Reads what made control_fd() readable while Starting: Starting -> Ready on its ready
  /// message, Starting -> Gone (the zygote is killed; failure() says why) on anything else.
  State on_readable();

  /// Called for every reaped child: true when `pid` was the zygote (-> Gone).
  bool on_exit(pid_t pid, const ExitStatus& status);

  /// Asks the zygote (Ready) to fork a standby whose environment is spec.envp and whose
  /// hand-over descriptor is spec.inherit_fd (the caller closes its copy after); the answer
  /// comes from on_replies() with `tag`. Returns why the request could not be sent, or "".
  std::string request_fork(int tag, const ProcessSpec& spec);

  /// A fork request's answer: the standby, with its output pipes, or why there is none.
  struct Forked {
    int tag = 0;
    common::Result<LaunchedProcess> result;
  };
  /// Reads what made control_fd() readable while Ready: the answers that have arrived, in the
  /// order the requests were sent (end of file or an unasked message: -> Gone). Once the zygote is
  /// Gone (it ended, answered nonsense, or timed out) every request still out is answered
  /// with why.
  std::vector<Forked> on_replies();
  /// Requests sent and not answered yet.
  size_t forks_pending() const { return pending_.size(); }
  /// No answer came within kZygoteForkTimeout: the zygote is given up (-> Gone) and every
  /// request still out is answered with why.
  std::vector<Forked> time_out();

  /// Ends the zygote: closes the control socket (it exits on end of file), SIGKILL, reap; the
  /// requests still out are dropped.
  void stop();

  State state() const { return state_; }
  pid_t pid() const { return process_.pid; }
  /// Why the zygote is Gone, for a warning: how it ended and the last line it wrote to stderr.
  const std::string& failure() const { return failure_; }
  /// Once Ready: the modules it shares although their import drew bytes from the OS (an id or
  /// key made at import, the same in every rank forked from it), as its ready message names
  /// them: at most 16 module names.
  const std::vector<std::string>& shared_os_draws() const { return shared_os_draws_; }

 private:
  void give_up(std::string why);
  std::string stderr_tail();
  /// Every request still out, answered with failure_ (the zygote is Gone).
  void fail_pending(std::vector<Forked>& out);

  /// A request sent: the read ends of the standby's output pipes, until the answer.
  struct Pending {
    int tag = 0;
    int stdout_fd = -1;
    int stderr_fd = -1;
  };
  std::deque<Pending> pending_;

  ProcessLauncher& launcher_;
  State state_ = State::Idle;
  LaunchedProcess process_;
  int control_fd_ = -1;
  EnvMap start_env_;  ///< what the zygote started with: its forks' start-only variables
  bool reaped_ = false;
  std::string failure_;
  std::vector<std::string> shared_os_draws_;
};

}  // namespace ddprun::agent
