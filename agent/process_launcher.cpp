#include "agent/process_launcher.h"

#include "agent/watcher_record.h"
#include "common/open_files.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace ddprun::agent {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

common::Result<int> open_channel(ProcessSpec& spec, int socket_type, const std::string& fd_variable,
                                 int send_buffer, int receive_buffer) {
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, socket_type | SOCK_CLOEXEC, 0, fds) != 0)
    return common::Error{std::string("socketpair: ") + std::strerror(errno)};
  ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
  if (receive_buffer > 0)
    ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  spec.inherit_fd = fds[0];
  spec.envp.push_back(fd_variable + "=" + std::to_string(fds[0]));
  return fds[1];
}

common::Result<ChannelProcess> launch_with_channel(ProcessLauncher& launcher, ProcessSpec spec,
                                                   int socket_type, const std::string& fd_variable,
                                                   int send_buffer, int receive_buffer) {
  auto channel = open_channel(spec, socket_type, fd_variable, send_buffer, receive_buffer);
  if (!channel) return channel.error();
  int agent_fd = *channel;
  auto launched = launcher.launch(spec);
  close_fd(spec.inherit_fd);
  if (!launched) {
    close_fd(agent_fd);
    return launched.error();
  }
  return ChannelProcess{*launched, agent_fd};
}

namespace {

std::vector<char*> to_c_array(const std::vector<std::string>& items) {
  std::vector<char*> out;
  out.reserve(items.size() + 1);
  for (const auto& s : items) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

/// In the forked child: every descriptor from 3 up closes at exec, so a worker inherits only
/// its stdin, stdout, stderr and the one descriptor the spec passes, as torchrun's workers
/// (Python's subprocess closes the rest). Not only the agent's own descriptors opened without
/// O_CLOEXEC by a library: also whatever the shell that started ddprun left open.
void close_on_exec_from_3() {
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  // Before Linux 5.11: one fcntl per possible descriptor (system calls, async-signal-safe).
  rlimit limit{};
  const rlim_t count = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                           ? std::min<rlim_t>(limit.rlim_cur, 1 << 20)
                           : 1 << 16;
  for (int fd = 3; fd < static_cast<int>(count); ++fd) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

/// What the forked child needs, all prepared before fork (the child allocates nothing).
struct ChildSetup {
  const char* exe;
  char* const* argv;
  char* const* envp;
  pid_t parent;
  int out_w, err_w, report_w;  ///< its stdout and stderr; where an exec error is reported
  int inherit_fd, cgroup_procs_fd, watcher_fd;  ///< as in ProcessSpec
  const cpu_set_t* cpus;                        ///< nullptr: the agent's
  int stdin_fd;                                 ///< as in ProcessSpec
};

/// Runs in the forked child: only async-signal-safe calls until execve.
[[noreturn]] void exec_child(const ChildSetup& c) {
  // A session of its own, as torchrun 2.6 starts its workers (`start_new_session`): it leads
  // its process group, and it has no controlling terminal, so a program that opens /dev/tty
  // (getpass) gets ENXIO and falls back to stdin instead of being stopped by SIGTTOU.
  ::setsid();
  // Bound before exec, so every thread the program starts inherits the CPUs. A failure is
  // reported as -errno: the binding failed, not the exec.
  if (c.cpus != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), c.cpus) != 0) {
    int err = -errno;
    ssize_t ignored = ::write(c.report_w, &err, sizeof(err));
    (void)ignored;
    ::_exit(127);
  }
  // "0" is the writer: in the group's cgroup before exec, so before it can fork. A failure
  // leaves it in the agent's cgroup, where the /proc walk still finds what it leaves behind.
  if (c.cgroup_procs_fd >= 0) {
    ssize_t moved = ::write(c.cgroup_procs_fd, "0", 1);
    (void)moved;
  }
  // Without a cgroup, the watcher learns this session before anything in it can fork:
  // should the agent die the moment this worker starts, the watcher still kills what it starts.
  if (c.watcher_fd >= 0) {
    // A watcher gone must not kill this worker (EPIPE instead); every signal is reset below.
    ::signal(SIGPIPE, SIG_IGN);
    const WatcherRecord record{'T', static_cast<std::int32_t>(::getpid())};
    ssize_t told = ::write(c.watcher_fd, &record, sizeof record);
    (void)told;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The agent may have died between fork and prctl; then nobody would kill us later.
  if (::getppid() != c.parent) ::_exit(127);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
  // Preemption notices, which the agent forwards, are ignored until the worker installs a
  // handler (the SDK does, in WorkerContext::from_env): SIGUSR1's default action would kill a
  // worker that does not expect it, or one still starting, and fail the group.
  ::signal(SIGUSR1, SIG_IGN);
  ::signal(SIGUSR2, SIG_IGN);
  const int in = c.stdin_fd >= 0 ? c.stdin_fd : ::open("/dev/null", O_RDONLY);
  if (in >= 0 && in != STDIN_FILENO) ::dup2(in, STDIN_FILENO);
  ::dup2(c.out_w, STDOUT_FILENO);
  ::dup2(c.err_w, STDERR_FILENO);
  close_on_exec_from_3();
  if (c.inherit_fd >= 0) ::fcntl(c.inherit_fd, F_SETFD, 0);
  // The agent raised its own open-file limit for the store's and the rendezvous server's
  // connections; a worker gets the limit ddprun was started with, as under torchrun. After the
  // descriptors are marked: without close_range that walks up to the raised limit.
  common::restore_inherited_open_file_limit();
  ::execve(c.exe, c.argv, c.envp);
  int err = errno;
  ssize_t ignored = ::write(c.report_w, &err, sizeof(err));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

common::Result<LaunchedProcess> PosixProcessLauncher::launch(const ProcessSpec& spec) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, report[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::pipe2(report, O_CLOEXEC) != 0) {
    std::string why = std::string("pipe: ") + std::strerror(errno);
    for (int* fds : {out, err, report}) {
      close_fd(fds[0]);
      close_fd(fds[1]);
    }
    return common::Error{why};
  }
  std::vector<char*> argv = to_c_array(spec.argv);
  std::vector<char*> envp = to_c_array(spec.envp);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : spec.cpus)
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  const ChildSetup setup{spec.executable.c_str(),
                         argv.data(),
                         envp.data(),
                         ::getpid(),
                         out[1],
                         err[1],
                         report[1],
                         spec.inherit_fd,
                         spec.cgroup_procs_fd,
                         spec.watcher_fd,
                         spec.cpus.empty() ? nullptr : &cpus,
                         spec.stdin_fd};
  const pid_t pid = ::fork();
  if (pid == 0) exec_child(setup);
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(report[1]);
  if (pid < 0) {
    std::string why = std::string("fork: ") + std::strerror(errno);
    close_fd(out[0]);
    close_fd(err[0]);
    close_fd(report[0]);
    return common::Error{why};
  }
  // The read below returns once the child has exec'd (or failed to): it leads its session
  // and group by then, so a signal sent to the group right after launch cannot miss. (The
  // parent cannot set the group itself: setsid fails in a process that leads one.)
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close_fd(report[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    // The child is reaped by the caller's SIGCHLD handling like any other exit.
    close_fd(out[0]);
    close_fd(err[0]);
    if (child_errno < 0)
      return common::Error{"binding to CPUs (--numa_binding): " +
                           std::string(std::strerror(-child_errno))};
    return common::Error{"exec " + spec.executable + ": " + std::strerror(child_errno)};
  }
  return LaunchedProcess{pid, out[0], err[0]};
}

bool PosixProcessLauncher::signal_group(pid_t pgid, int sig) {
  if (pgid <= 0) return false;
  return ::kill(-pgid, sig) == 0;
}

bool PosixProcessLauncher::has_ended(pid_t pid) {
  if (pid <= 0) return false;
  siginfo_t info{};
  // WNOWAIT: looked at, left for reap().
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) < 0)
    if (errno != EINTR) return false;
  return info.si_pid == pid;
}

std::vector<ProcessExit> PosixProcessLauncher::reap() {
  std::vector<ProcessExit> ended;
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;  // none ended (0) or no children left (ECHILD)
    ended.push_back(ProcessExit{pid, ExitStatus::from_wait_status(status)});
  }
  return ended;
}

void PosixProcessLauncher::wait(pid_t pid) {
  // EINTR: the agent's SIGCHLD handler ran (one child's death interrupts the wait for another);
  // giving up then would leave the process dying after ddprun has exited. ECHILD: reaped.
  while (pid > 0 && ::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace ddprun::agent
