#pragma once
// Runs a piece of a test in a forked child, for what ends a process (a DDPRUN_CHECK that
// aborts): the test reads how the child ended and what it wrote to stderr.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <utility>

namespace ddprun::testing {

/// Runs `body` in a child process with stderr on a pipe; returns (wait status, stderr). The
/// child exits 0 when `body` returns.
template <typename Body>
std::pair<int, std::string> in_child(Body body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    body();
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string err;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;)
    err.append(buffer, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {status, err};
}

}  // namespace ddprun::testing
