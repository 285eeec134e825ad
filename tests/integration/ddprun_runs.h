#pragma once
// Shared by the integration tests: build ddprun command lines around fake_worker, read what the
// workers recorded, and wait (bounded) for processes to go away.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/polling.h"
#include "tests/support/subprocess.h"

namespace ddprun::testing {

/// Long enough for a loaded 2-core machine; a healthy run takes well under a second.
inline constexpr std::chrono::seconds kJobLimit{60};

/// `ddprun <flags> --no_python fake_worker <actions>`.
inline std::vector<std::string> ddprun_fake(const std::vector<std::string>& flags,
                                            const std::vector<std::string>& actions) {
  std::vector<std::string> argv{DDPRUN_BIN};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--no_python");
  argv.push_back(FAKE_WORKER_BIN);
  argv.insert(argv.end(), actions.begin(), actions.end());
  return argv;
}

/// The "KEY PID" lines fake_worker's pidfile= and spawn_child= append ("0 1234", "child0 1240").
inline std::map<std::string, pid_t> read_pids(const std::string& path) {
  std::map<std::string, pid_t> pids;
  std::istringstream in(read_file(path));
  std::string key;
  long pid = 0;
  while (in >> key >> pid) pids[key] = static_cast<pid_t>(pid);
  return pids;
}

inline bool wait_gone(pid_t pid, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  return wait_until([pid] { return !process_alive(pid); }, limit);
}

/// SIGKILLs, at the end of a test, the fake_worker processes it recorded that are still running,
/// so a failing test leaves nothing behind. The command line is checked first: a recycled pid
/// that is no longer ours is left alone.
class WorkerSweeper {
 public:
  explicit WorkerSweeper(std::string pidfile) : pidfiles_{std::move(pidfile)} {}
  WorkerSweeper(std::initializer_list<std::string> pidfiles) : pidfiles_(pidfiles) {}
  ~WorkerSweeper() {
    for (const auto& file : pidfiles_)
      for (const auto& [key, pid] : read_pids(file))
        if (pid > 0 && process_alive(pid) &&
            contains(read_file("/proc/" + std::to_string(pid) + "/cmdline"), "fake_worker"))
          ::kill(pid, SIGKILL);
  }
  WorkerSweeper(const WorkerSweeper&) = delete;
  WorkerSweeper& operator=(const WorkerSweeper&) = delete;

 private:
  std::vector<std::string> pidfiles_;
};

/// "NAME=value" lines that one rank printed (fake_worker's env= action), by the console prefix.
inline std::map<std::string, std::string> env_printed_by(const std::string& out,
                                                         const std::string& prefix) {
  std::map<std::string, std::string> env;
  for (const std::string& line : lines_of(out)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const std::string kv = line.substr(prefix.size());
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

/// Every "RANK=" a node's workers printed.
inline std::set<int> worker_ranks(const std::string& out) {
  std::set<int> ranks;
  for (const std::string& line : lines_of(out)) {
    const auto at = line.find("]:RANK=");
    if (at != std::string::npos) ranks.insert(std::stoi(line.substr(at + 7)));
  }
  return ranks;
}

/// The worker action that prints what JobLayout reads.
inline const std::string kPrintLayout = "env=RANK,GROUP_RANK,WORLD_SIZE,MASTER_ADDR,MASTER_PORT";

/// What the nodes of one job printed with kPrintLayout, gathered node by node.
struct JobLayout {
  std::multiset<int> ranks;  ///< a rank printed twice shows twice
  std::set<std::string> group_ranks;
  std::set<std::string> world_sizes;
  std::set<std::string> masters;  ///< MASTER_ADDR:MASTER_PORT

  void add(const std::string& out, int nproc_per_node) {
    for (int local = 0; local < nproc_per_node; ++local) {
      auto env = env_printed_by(out, "[default" + std::to_string(local) + "]:");
      world_sizes.insert(env["WORLD_SIZE"]);
      masters.insert(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]);
      group_ranks.insert(env["GROUP_RANK"]);
    }
    for (int rank : worker_ranks(out)) ranks.insert(rank);
  }
};

/// An event log's lines (--event_log), parsed, in order (a line that is not JSON becomes null).
inline std::vector<nlohmann::json> events_of(const std::string& path) {
  std::vector<nlohmann::json> found;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    found.push_back(nlohmann::json::parse(line, nullptr, false));
  return found;
}

/// The events named `name` in the event log at `path`, in order.
inline std::vector<nlohmann::json> events_named(const std::string& path, const std::string& name) {
  std::vector<nlohmann::json> found;
  for (auto& e : events_of(path))
    if (e.is_object() && e.contains("event") && e["event"] == name) found.push_back(std::move(e));
  return found;
}

}  // namespace ddprun::testing
