// The workers' stdin (agent/worker_stdin.h): ddprun's own, as torchrun's workers inherit the
// launcher's; a terminal's lines through the agent's relay.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

/// A worker that prompts, reads one line and says what it read (or that its stdin ended).
const char* const kAsker = "printf 'name? '; if read -r x; then echo \"GOT $x\"; else echo EOF; fi";

}  // namespace

TEST_CASE("workers read what is piped to ddprun, as torchrun's read the launcher's stdin",
          "[agent][integration]") {
  auto piped = run_command({"/bin/sh", "-c",
                            "printf 'hello\\n' | \"$0\" --nproc_per_node 1 "
                            "--no_python /bin/sh -c \"$1\"",
                            DDPRUN_BIN, kAsker},
                           {}, kJobLimit);
  INFO(piped.out << piped.err);
  CHECK(piped.exit_code == 0);
  CHECK(contains(piped.out, "[default0]:name? GOT hello"));
  // /dev/null, as Subprocess gives: end of file at once.
  auto none = run_command(
      {DDPRUN_BIN, "--nproc_per_node", "1", "--no_python", "/bin/sh", "-c", kAsker}, {}, kJobLimit);
  INFO(none.out << none.err);
  CHECK(none.exit_code == 0);
  CHECK(contains(none.out, "[default0]:name? EOF"));
}

namespace {

/// Reads the terminal's master side into `seen` until it holds `want` or `limit` passes.
bool read_until(int master, std::string& seen, const std::string& want,
                std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (seen.find(want) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) return false;  // the terminal's last process closed it
    seen.append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

TEST_CASE("a worker reads a line typed in ddprun's terminal, after its prompt is shown",
          "[agent][integration]") {
  // ddprun in the foreground of a terminal of its own (a pseudo-terminal this test holds), as
  // in an interactive shell: the worker leads a process group of its own, so it reads through
  // the agent's relay, and its prompt, a part of a line, is shown before the answer is typed.
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const std::string slave = ::ptsname(master);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    const int tty = ::open(slave.c_str(), O_RDWR);
    if (tty < 0 || ::ioctl(tty, TIOCSCTTY, 0) != 0) ::_exit(126);
    for (int fd = 0; fd <= 2; ++fd) ::dup2(tty, fd);
    if (tty > 2) ::close(tty);
    ::execl(DDPRUN_BIN, DDPRUN_BIN, "--nproc_per_node", "1", "--no_python", "/bin/sh", "-c", kAsker,
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  REQUIRE(pid > 0);
  std::string seen;
  const bool prompted = read_until(master, seen, "[default0]:name? ", std::chrono::seconds(30));
  INFO(seen);
  CHECK(prompted);
  if (prompted) {
    const std::string answer = "world\n";
    CHECK(::write(master, answer.data(), answer.size()) == static_cast<ssize_t>(answer.size()));
    // The terminal's echo of the answer ended the prompt's line: the next one has its prefix.
    CHECK(read_until(master, seen, "[default0]:GOT world", std::chrono::seconds(30)));
  }
  // ddprun ends with its worker; bounded, then killed.
  int status = 0;
  pid_t ended = 0;
  for (int i = 0; i < 300 && ended == 0; ++i) {
    std::string ignored;
    // Keeps it drained; once no process holds the terminal, a read fails at once.
    if (!read_until(master, ignored, "\x01", std::chrono::milliseconds(100))) ::usleep(100'000);
    ended = ::waitpid(pid, &status, WNOHANG);
  }
  if (ended == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  CHECK(ended == pid);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  ::close(master);
}
