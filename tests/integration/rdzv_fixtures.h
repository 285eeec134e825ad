#pragma once
// Shared by the rendezvous integration tests (hostile peers, TLS): a daemon on a free port,
// two agents of one job, and secret files.
#include <signal.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/free_port.h"
#include "tests/integration/ddprun_runs.h"

namespace ddprun::testing {

inline int free_port() {
  auto p = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(std::holds_alternative<int>(p));
  return std::get<int>(p);
}

/// A daemon on a free port of 127.0.0.1, with extra flags; stopped with SIGTERM at the end.
struct Daemon {
  int port = free_port();
  std::unique_ptr<Subprocess> process;
  explicit Daemon(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv{RDZVD_BIN, "--port", std::to_string(port), "--host", "127.0.0.1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    process = std::make_unique<Subprocess>(argv);
    REQUIRE(wait_until([&] { return contains(process->err_so_far(), "listening on"); },
                       std::chrono::seconds(10)));
  }
  ~Daemon() {
    process->send(SIGTERM);
    process->wait(std::chrono::seconds(10));
  }
  bool alive() const { return process_alive(process->pid()); }
};

/// Two agents of job "job" at `endpoint` (127.0.0.2 and .3, fast keep-alive), each running
/// one fake worker with `actions`; `flags` go before the common ones.
inline std::vector<std::unique_ptr<Subprocess>> start_two_nodes(
    const std::string& endpoint, const std::vector<std::string>& flags,
    const std::vector<std::string>& actions, const std::string& conf = "") {
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> all = flags;
    all.insert(all.end(), {"--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                           endpoint, "--rdzv_id", "job", "--local_addr", loopback_node_addr(i),
                           "--rdzv_conf", kFastRdzvConf + conf});
    nodes.push_back(std::make_unique<Subprocess>(ddprun_fake(all, actions)));
  }
  return nodes;
}

/// A secret file of mode 600 holding `content`.
inline std::string secret_file(const TempDir& dir, const std::string& name,
                               const std::string& content) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << content << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

}  // namespace ddprun::testing
