#pragma once
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "agent/worker.h"
#include "common/result.h"

namespace ddprun::agent {

/// What to start: a resolved executable, its argv and its complete environment.
struct ProcessSpec {
  std::string executable;  ///< a path (resolve_executable has already searched PATH)
  std::vector<std::string> argv;
  std::vector<std::string> envp;  ///< "K=V" strings
  /// A descriptor the process keeps across exec under the same number (-1: none); every other
  /// descriptor of the agent is close-on-exec.
  int inherit_fd = -1;
  /// An open cgroup.procs file (GroupCleanup) the process moves itself into before exec, so
  /// that everything it forks is in that cgroup from the start (-1: stay in the agent's).
  int cgroup_procs_fd = -1;
  /// The subreaper watcher's pipe (GroupCleanup::watcher_fd), to which the process writes its
  /// own session (also its process group) before exec, so that the watcher knows it before the
  /// process can fork
  /// (-1: none).
  int watcher_fd = -1;
  /// The CPUs the process is bound to before exec (--numa_binding); empty: the agent's.
  std::vector<int> cpus = {};
  /// Its stdin (WorkerStdin::fd); -1: /dev/null.
  int stdin_fd = -1;
};

/// A started process: its pid (also its session's and process group's id) and the read ends of its
/// stdout/stderr pipes, owned by the caller.
struct LaunchedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
};

/// A child that ended and was reaped.
struct ProcessExit {
  pid_t pid = -1;
  ExitStatus status;
};

/// Starts workers and reaps what ends. Every process leads its own session (without a
/// controlling terminal) and process group, and is bound to die with the agent (PR_SET_PDEATHSIG).
/// The agent calls reap() when a child ended (on SIGCHLD, or when notify_exits' callback says so);
/// it is the only place children are collected, so a test's fake sees every exit the agent acts on.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  /// Starts a process; on failure returns why (e.g. "exec /x: No such file or directory").
  virtual common::Result<LaunchedProcess> launch(const ProcessSpec& spec) = 0;
  /// Sends `sig` to every process in group `pgid`; true if any process received it.
  virtual bool signal_group(pid_t pgid, int sig) = 0;
  /// Whether child `pid` has ended and waits to be reaped (reap() collects it).
  virtual bool has_ended(pid_t pid) = 0;
  /// Reaps every child that has ended, without blocking (as a child subreaper the agent's
  /// children include its workers' orphans).
  virtual std::vector<ProcessExit> reap() = 0;
  /// Waits for `pid`, already sent SIGKILL, to end and reaps it (nothing when it was reaped).
  virtual void wait(pid_t pid) = 0;
  /// How the agent hears that a child may have ended, to call reap(). false: by SIGCHLD (the
  /// POSIX launcher; the agent's signal set catches it). A launcher that says so itself (a
  /// test's fake) keeps `exited`, calls it for each end, and returns true; the agent then
  /// reaps on its event loop, after the call.
  virtual bool notify_exits(std::function<void()> exited) {
    (void)exited;
    return false;
  }
};

/// fork + execve with a close-on-exec error pipe, so a failed exec is reported with its errno.
class PosixProcessLauncher final : public ProcessLauncher {
 public:
  common::Result<LaunchedProcess> launch(const ProcessSpec& spec) override;
  bool signal_group(pid_t pgid, int sig) override;
  bool has_ended(pid_t pid) override;
  std::vector<ProcessExit> reap() override;
  void wait(pid_t pid) override;
};

/// Closes `fd` when it is open and marks it closed (-1).
void close_fd(int& fd);

/// A process started with one end of a new Unix socket pair, and the agent's end: how a
/// standby or the Python zygote is told what to do.
struct ChannelProcess {
  LaunchedProcess process;
  int agent_fd = -1;
};

/// A new Unix socket pair of `socket_type` for a process about to start from `spec`: the child's
/// end goes into `spec` (inherit_fd, and its number in the environment variable `fd_variable`),
/// the agent's end is returned and sends with `send_buffer` bytes of room (the child's end
/// receives with `receive_buffer`, when not 0). On failure, why. The caller closes
/// spec.inherit_fd once the process has it.
common::Result<int> open_channel(ProcessSpec& spec, int socket_type, const std::string& fd_variable,
                                 int send_buffer, int receive_buffer = 0);

/// Starts `spec` with one end of a socket pair of `socket_type` inherited, its descriptor number
/// in the environment variable `fd_variable`; the agent's end sends with `send_buffer` bytes of
/// room (the child's end receives with `receive_buffer`, when not 0). On failure, why.
common::Result<ChannelProcess> launch_with_channel(ProcessLauncher& launcher, ProcessSpec spec,
                                                   int socket_type, const std::string& fd_variable,
                                                   int send_buffer, int receive_buffer = 0);

}  // namespace ddprun::agent
