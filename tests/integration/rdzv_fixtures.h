#pragma once
// Shared by the rendezvous integration tests (hostile peers, TLS): a daemon on a free port,
// two agents of one job, and secret files.
#include <signal.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/free_port.h"
#include "tests/integration/ddprun_runs.h"

namespace ddprun::testing {

inline int free_port() {
  auto p = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(p.ok());
  return *p;
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

/// A one-node job "job" whose agent hosts the rendezvous at 127.0.0.1:port: two fake workers
/// print "started", wait for a line in a gate file, then print "finished". The constructor
/// waits until both started; finish() opens the gate and checks that the job ended well.
struct HostingAgent {
  TempDir dir;
  const int port = free_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  std::unique_ptr<Subprocess> process;

  explicit HostingAgent(const std::vector<std::string>& flags = {},
                        const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> all{"--nnodes",       "1",    "--nproc_per_node", "2",
                                 "--rdzv_backend", "c10d", "--rdzv_endpoint",  endpoint,
                                 "--rdzv_id",      "job"};
    all.insert(all.end(), flags.begin(), flags.end());
    process = std::make_unique<Subprocess>(
        ddprun_fake(all,
                    {"print=started", "wait_lines=" + dir.path() + "/gate:1", "print=finished"}),
        env);
    REQUIRE(wait_until([&] { return count_of(process->out_so_far(), "started") == 2; }, kJobLimit));
  }
  std::string err_so_far() const { return process->err_so_far(); }
  void finish() {
    std::ofstream(dir.path() + "/gate") << "go\n";
    const auto r = process->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(count_of(r.out, "finished") == 2);
  }
};

/// A secret file of mode 600 holding `content`.
inline std::string secret_file(const TempDir& dir, const std::string& name,
                               const std::string& content) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << content << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

}  // namespace ddprun::testing
