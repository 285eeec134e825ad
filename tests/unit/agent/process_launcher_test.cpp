// The POSIX launcher's set-up between fork and exec that the agent's cleanup relies on: a
// worker tells the subreaper watcher its own process group before exec, and keeps no copy of
// the watcher's pipe after it (docs/design.md, "Process hygiene").
#include "agent/process_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "agent/watcher_record.h"

using namespace ddprun::agent;

namespace {

/// A pipe like the watcher's: both ends close-on-exec.
struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    close_fd(r);
    close_fd(w);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
};

/// Whether `fd` is readable (data or end of file) within `ms`.
bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

/// SIGKILLs and reaps a started process, and closes its output pipes.
void end(PosixProcessLauncher& launcher, LaunchedProcess& p) {
  ::kill(p.pid, SIGKILL);
  launcher.wait(p.pid);
  close_fd(p.stdout_fd);
  close_fd(p.stderr_fd);
}

}  // namespace

TEST_CASE(
    "a started process leads its own session, writes a T record of it to the watcher's pipe "
    "and keeps no copy of it",
    "[agent][unit]") {
  PosixProcessLauncher launcher;
  Pipe watcher;
  ProcessSpec spec{"/bin/sleep", {"sleep", "30"}, {}};
  spec.watcher_fd = watcher.w;
  auto started = launcher.launch(spec);
  REQUIRE(started);
  LaunchedProcess p = *started;
  close_fd(watcher.w);  // the agent's end: now only the process could hold one
  REQUIRE(readable_within(watcher.r, 5'000));
  WatcherRecord record;
  REQUIRE(::read(watcher.r, &record, sizeof record) == static_cast<ssize_t>(sizeof record));
  CHECK(record.kind == 'T');
  CHECK(record.session == p.pid);
  CHECK(::getpgid(p.pid) == p.pid);
  CHECK(::getsid(p.pid) == p.pid);
  // End of file while the process runs: it closed its copy at exec.
  REQUIRE(readable_within(watcher.r, 5'000));
  char more = 0;
  CHECK(::read(watcher.r, &more, 1) == 0);
  CHECK(::kill(p.pid, 0) == 0);
  end(launcher, p);
}

TEST_CASE("a process whose watcher is gone still starts, with SIGPIPE's default action",
          "[agent][unit]") {
  PosixProcessLauncher launcher;
  Pipe watcher;
  close_fd(watcher.r);  // the write gets EPIPE
  // The child inherits the default action, as from a parent that does not ignore SIGPIPE.
  struct sigaction dfl {
  }, old{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, &old);
  ProcessSpec spec{"/bin/sh", {"sh", "-c", "grep '^SigIgn' /proc/self/status"}, {}};
  spec.watcher_fd = watcher.w;
  auto started = launcher.launch(spec);
  ::sigaction(SIGPIPE, &old, nullptr);
  REQUIRE(started);
  LaunchedProcess p = *started;
  int status = 0;
  REQUIRE(::waitpid(p.pid, &status, 0) == p.pid);
  INFO("wait status " << status);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The mask of ignored signals: SIGUSR1 and SIGUSR2 (the preemption notices), not SIGPIPE.
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(p.stdout_fd, buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<std::size_t>(n));
  REQUIRE(out.rfind("SigIgn:", 0) == 0);
  const unsigned long ignored = std::stoul(out.substr(out.find(':') + 1), nullptr, 16);
  CHECK((ignored & (1UL << (SIGPIPE - 1))) == 0);
  CHECK((ignored & (1UL << (SIGUSR1 - 1))) != 0);
  close_fd(p.stdout_fd);
  close_fd(p.stderr_fd);
}

TEST_CASE("has_ended sees a child that ended, and leaves it for reap", "[agent][unit]") {
  PosixProcessLauncher launcher;
  auto running = launcher.launch(ProcessSpec{"/bin/sleep", {"sleep", "30"}, {}});
  REQUIRE(running);
  LaunchedProcess sleeper = *running;
  CHECK_FALSE(launcher.has_ended(sleeper.pid));
  end(launcher, sleeper);
  auto started = launcher.launch(ProcessSpec{"/bin/sh", {"sh", "-c", "exit 3"}, {}});
  REQUIRE(started);
  LaunchedProcess p = *started;
  bool ended = false;
  for (int i = 0; i < 1000 && !ended; ++i) {
    ended = launcher.has_ended(p.pid);
    if (!ended) ::usleep(5'000);
  }
  CHECK(ended);
  CHECK(launcher.has_ended(p.pid));  // looked at, not reaped
  int status = 0;
  REQUIRE(::waitpid(p.pid, &status, 0) == p.pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK_FALSE(launcher.has_ended(p.pid));  // reaped: no child of that pid
  close_fd(p.stdout_fd);
  close_fd(p.stderr_fd);
}
