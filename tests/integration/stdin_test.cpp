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
#include <utility>
#include <vector>

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

namespace {

/// ddprun run with `args` in the foreground of a terminal of its own (a pseudo-terminal this
/// test holds, ddprun's controlling one), as from an interactive shell.
class TerminalJob {
 public:
  explicit TerminalJob(std::vector<std::string> args) : args_(std::move(args)) {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master_ < 0 || ::grantpt(master_) != 0 || ::unlockpt(master_) != 0) return;
    const std::string slave = ::ptsname(master_);
    std::vector<char*> argv;
    for (auto& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      const int tty = ::open(slave.c_str(), O_RDWR);
      if (tty < 0 || ::ioctl(tty, TIOCSCTTY, 0) != 0) ::_exit(126);
      for (int fd = 0; fd <= 2; ++fd) ::dup2(tty, fd);
      if (tty > 2) ::close(tty);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  TerminalJob(const TerminalJob&) = delete;
  TerminalJob& operator=(const TerminalJob&) = delete;
  ~TerminalJob() {
    if (pid_ > 0 && !ended_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) ::close(master_);
  }

  bool started() const { return pid_ > 0; }
  /// Reads what the terminal shows into seen() until it holds `want` (bounded: 30 s).
  bool shows(const std::string& want) {
    return read_until(master_, seen_, want, std::chrono::seconds(30));
  }
  const std::string& seen() const { return seen_; }
  bool type(const std::string& line) {
    return ::write(master_, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  }
  /// Whether ddprun exits 0 (bounded: 30 s, the terminal kept drained, then killed).
  bool exits_0() {
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 300 && done == 0; ++i) {
      std::string ignored;
      // Once no process holds the terminal, a read fails at once.
      if (!read_until(master_, ignored, "\x01", std::chrono::milliseconds(100))) ::usleep(100'000);
      done = ::waitpid(pid_, &status, WNOHANG);
    }
    ended_ = done == pid_;
    return ended_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  std::vector<std::string> args_;
  int master_ = -1;
  pid_t pid_ = -1;
  bool ended_ = false;
  std::string seen_;
};

}  // namespace

TEST_CASE("a worker reads a line typed in ddprun's terminal, after its prompt is shown",
          "[agent][integration]") {
  // The worker leads a session of its own, so it reads through the agent's relay, and its
  // prompt, a part of a line, is shown before the answer is typed.
  TerminalJob job({DDPRUN_BIN, "--nproc_per_node", "1", "--no_python", "/bin/sh", "-c", kAsker});
  REQUIRE(job.started());
  const bool prompted = job.shows("[default0]:name? ");
  INFO(job.seen());
  CHECK(prompted);
  if (prompted) {
    CHECK(job.type("world\n"));
    // The terminal's echo of the answer ended the prompt's line: the next one has its prefix.
    CHECK(job.shows("[default0]:GOT world"));
  }
  CHECK(job.exits_0());
}

TEST_CASE("getpass in a worker reads the line typed in ddprun's terminal instead of stopping it",
          "[agent][integration]") {
  // A worker has no controlling terminal (its own session, as torchrun 2.x's): getpass cannot
  // open /dev/tty, warns that the input may be echoed and reads stdin, the agent's relay. In
  // the terminal's session it would open /dev/tty and be stopped (SIGTTOU) as it turned echo
  // off from a background process group, and the job would wait (the test fails so).
  TerminalJob job({DDPRUN_BIN, "--nproc_per_node", "1", "--no_python", "/usr/bin/python3", "-c",
                   "import getpass; print('GOT', getpass.getpass('token: '))"});
  REQUIRE(job.started());
  const bool prompted = job.shows("token: ");
  INFO(job.seen());
  CHECK(prompted);
  if (prompted) {
    CHECK(job.type("s3cret\n"));
    CHECK(job.shows("[default0]:GOT s3cret"));
  }
  CHECK(job.exits_0());
}
