#pragma once
// A ProcessLauncher that starts nothing: it records each spec, hands out made-up pids, and
// keeps a duplicate of the descriptor a process would inherit, so a test can read what the
// agent writes to it. A test ends a made-up process with end(), which tells the agent through
// notify_exits (or, with no agent listening, raises SIGCHLD, as the kernel would), so the agent
// reaps it through reap(); it can make the stop signals end them, and can give processes real
// output pipes to write to.
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>

#include <csignal>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "agent/process_launcher.h"

namespace ddprun::testing {

class FakeProcessLauncher final : public agent::ProcessLauncher {
 public:
  ~FakeProcessLauncher() override {
    for (auto& [pid, fd] : inherited)
      if (fd >= 0) ::close(fd);
    for (auto& [pid, fds] : output)
      for (int fd : {fds.first, fds.second})
        if (fd >= 0) ::close(fd);
  }

  common::Result<agent::LaunchedProcess> launch(const agent::ProcessSpec& spec) override {
    if (!fail_with.empty()) return common::Error{fail_with};
    specs.push_back(spec);
    const pid_t pid = next_pid++;
    inherited[pid] = spec.inherit_fd >= 0 ? ::fcntl(spec.inherit_fd, F_DUPFD_CLOEXEC, 0) : -1;
    running.insert(pid);
    agent::LaunchedProcess launched{pid, -1, -1};
    if (with_pipes) {
      int out[2];
      int err[2];
      if (::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0) {
        launched.stdout_fd = out[0];
        launched.stderr_fd = err[0];
        output[pid] = {out[1], err[1]};
      }
    }
    return launched;
  }

  bool signal_group(pid_t pgid, int sig) override {
    signals.emplace_back(pgid, sig);
    if (running.count(pgid) == 0) return false;
    if (ends_on.count(sig) > 0) end(pgid, agent::ExitStatus{0, sig});
    return true;
  }

  bool has_ended(pid_t pid) override {
    return std::any_of(ended_.begin(), ended_.end(),
                       [pid](const agent::ProcessExit& exit) { return exit.pid == pid; });
  }

  std::vector<agent::ProcessExit> reap() override {
    std::vector<agent::ProcessExit> ended;
    ended.swap(ended_);
    return ended;
  }

  void wait(pid_t pid) override { waited.push_back(pid); }

  bool notify_exits(std::function<void()> exited) override {
    exited_ = std::move(exited);
    return true;
  }

  /// The made-up process `pid` ends with `status`: its output pipes close and the agent is
  /// told (SIGCHLD is raised when no agent listens).
  void end(pid_t pid, agent::ExitStatus status) {
    if (running.erase(pid) == 0) return;
    close_output(pid);
    ended_.push_back(agent::ProcessExit{pid, status});
    if (exited_)
      exited_();
    else
      ::raise(SIGCHLD);
  }

  /// Writes `text` to the stdout (or stderr) pipe of `pid` (with_pipes).
  void write_output(pid_t pid, const std::string& text, bool to_stderr = false) {
    const int fd = to_stderr ? output.at(pid).second : output.at(pid).first;
    if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      throw std::runtime_error("short write to a fake worker's pipe");
  }

  void close_output(pid_t pid) {
    auto it = output.find(pid);
    if (it == output.end()) return;
    for (int fd : {it->second.first, it->second.second})
      if (fd >= 0) ::close(fd);
    output.erase(it);
  }

  /// Everything written to the inherited descriptor of `pid`, up to end of file.
  std::string read_inherited(pid_t pid) {
    std::string all;
    char chunk[4096];
    ssize_t n;
    while ((n = ::read(inherited.at(pid), chunk, sizeof chunk)) > 0)
      all.append(chunk, static_cast<size_t>(n));
    return all;
  }

  std::vector<agent::ProcessSpec> specs;
  std::vector<std::pair<pid_t, int>> signals;
  std::vector<pid_t> waited;
  std::map<pid_t, int> inherited;  ///< pid -> duplicate of its inherited descriptor
  std::set<pid_t> running;         ///< launched and not ended
  std::set<int> ends_on;           ///< signals that end a running process (e.g. SIGTERM)
  bool with_pipes = false;         ///< give each process stdout/stderr pipes
  std::map<pid_t, std::pair<int, int>> output;  ///< pid -> write ends of stdout, stderr
  std::string fail_with;                        ///< launch() returns this error when not empty
  pid_t next_pid = 4000000;                     ///< made up: no real process has it

 private:
  std::function<void()> exited_;  ///< the agent's, from notify_exits
  std::vector<agent::ProcessExit> ended_;
};

}  // namespace ddprun::testing
