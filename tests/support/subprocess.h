#pragma once
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::testing {

/// The result of running a command to its end.
struct CommandResult {
  int exit_code = -1;  ///< shell convention: 128+N when killed by signal N
  std::string out;
  std::string err;
  bool timed_out = false;
};

/// A started command whose output is collected into files in a temporary directory.
class Subprocess {
 public:
  /// Starts argv with the current environment plus `extra_env` (values override).
  Subprocess(const std::vector<std::string>& argv,
             const std::map<std::string, std::string>& extra_env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  /// Waits at most `limit`; on timeout kills the process (SIGKILL) and marks timed_out.
  /// Once reaped, returns the same status again (the pid may belong to another process now).
  CommandResult wait(std::chrono::milliseconds limit);
  /// Output so far.
  std::string out_so_far() const;
  std::string err_so_far() const;
  /// Sends a signal to the process.
  void send(int sig);
  /// Polls (every 10 ms, at most `limit`) until stdout contains `text`.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds limit) const;

 private:
  pid_t pid_ = -1;
  std::string dir_;
  bool reaped_ = false;
  int exit_code_ = -1;
  bool timed_out_ = false;
};

/// Runs a command to its end, at most `limit` (default 60 s).
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& extra_env = {},
                          std::chrono::milliseconds limit = std::chrono::seconds(60));

/// True while a process with this pid runs (a zombie counts as ended).
bool process_alive(pid_t pid);

/// True while process `pid` is blocked in system call `number` (SYS_... of <sys/syscall.h>)
/// with `first_argument` (a descriptor, say), as /proc/<pid>/syscall shows it: for example a
/// standby waiting in read() for its hand-over on the descriptor ddprun gave it.
bool blocked_in_syscall(pid_t pid, long number, long first_argument);

/// The value of `name` in the environment process `pid` started with ("" when not set).
std::string environment_of(pid_t pid, const std::string& name);

/// One line per process in the tree under `root` (root included): pid, parent, state, kernel
/// wait channel and command line; for diagnosing a test that timed out.
std::string describe_process_tree(pid_t root);

/// Like run_command, but a command still running at `limit` has its process tree described
/// in the result's `err` before it is killed.
CommandResult run_command_diagnosed(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& extra_env,
                                    std::chrono::milliseconds limit);

/// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The whole content of a file ("" when missing).
std::string read_file(const std::string& path);

}  // namespace ddprun::testing
