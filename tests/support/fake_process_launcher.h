#pragma once
// A ProcessLauncher that starts nothing: it records each spec, hands out made-up pids, and
// keeps a duplicate of the descriptor a process would inherit, so a test can read what the
// agent writes to it.
#include <fcntl.h>
#include <unistd.h>

#include <map>
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
  }

  std::variant<agent::LaunchedProcess, std::string> launch(
      const agent::ProcessSpec& spec) override {
    if (!fail_with.empty()) return fail_with;
    specs.push_back(spec);
    const pid_t pid = next_pid++;
    inherited[pid] = spec.inherit_fd >= 0 ? ::fcntl(spec.inherit_fd, F_DUPFD_CLOEXEC, 0) : -1;
    return agent::LaunchedProcess{pid, -1, -1};
  }

  bool signal_group(pid_t pgid, int sig) override {
    signals.emplace_back(pgid, sig);
    return true;
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
  std::map<pid_t, int> inherited;  ///< pid -> duplicate of its inherited descriptor
  std::string fail_with;           ///< launch() returns this error when not empty
  pid_t next_pid = 4000000;        ///< made up: waitpid() on it finds no child of the test
};

}  // namespace ddprun::testing
