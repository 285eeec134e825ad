// Several ddprun agents on one machine, each advertising its own 127.0.0.x address, meeting at
// an embedded server or at ddprun-rdzvd.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "rendezvous/free_port.h"
#include "tests/integration/ddprun_runs.h"

using namespace ddprun::testing;

namespace {

const std::string kFastConf = kFastRdzvConf;

int free_port() {
  auto p = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(p.ok());
  return *p;
}

/// One agent: `ddprun --rdzv_backend c10d --rdzv_endpoint E --rdzv_id ID --local_addr A ...`.
std::unique_ptr<Subprocess> start_node(const std::string& endpoint, const std::string& addr,
                                       const std::vector<std::string>& flags,
                                       const std::vector<std::string>& actions) {
  std::vector<std::string> all{"--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                               "--rdzv_id",      "job",  "--local_addr",    addr};
  all.insert(all.end(), flags.begin(), flags.end());
  return std::make_unique<Subprocess>(ddprun_fake(all, actions));
}

std::string node_addr(int i) { return loopback_node_addr(i); }

}  // namespace

TEST_CASE("three agents with an embedded server get unique ranks and one master",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(start_node(endpoint, node_addr(i), {"--nnodes", "3", "--nproc_per_node", "2"},
                               {kPrintLayout}));
  JobLayout layout;
  for (auto& node : nodes) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    layout.add(r.out, 2);
  }
  CHECK(layout.ranks == std::multiset<int>{0, 1, 2, 3, 4, 5});
  CHECK(layout.group_ranks == std::set<std::string>{"0", "1", "2"});
  CHECK(layout.world_sizes == std::set<std::string>{"6"});
  CHECK(layout.masters.size() == 1);
}

TEST_CASE("the standalone daemon hosts a job and nodes honour --node_rank",
          "[integration][multinode]") {
  const int port = free_port();
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port), "--host", "127.0.0.1"});
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // node_rank 1 starts first and still gets group rank 1.
  auto second = start_node(endpoint, node_addr(0),
                           {"--nnodes", "2", "--node_rank", "1", "--rdzv_conf", "is_host=0"},
                           {"env=GROUP_RANK,RANK,MASTER_ADDR"});
  auto first = start_node(endpoint, node_addr(1),
                          {"--nnodes", "2", "--node_rank", "0", "--rdzv_conf", "is_host=0"},
                          {"env=GROUP_RANK,RANK,MASTER_ADDR"});
  auto r1 = second->wait(kJobLimit);
  auto r0 = first->wait(kJobLimit);
  INFO(r0.out << r0.err << r1.out << r1.err << daemon.err_so_far());
  CHECK(r0.exit_code == 0);
  CHECK(r1.exit_code == 0);
  CHECK(contains(r0.out, "[default0]:GROUP_RANK=0"));
  CHECK(contains(r1.out, "[default0]:GROUP_RANK=1"));
  // Group rank 0 publishes its own --local_addr as MASTER_ADDR.
  CHECK(contains(r1.out, "[default0]:MASTER_ADDR=" + node_addr(1)));
  CHECK(contains(daemon.err_so_far(), "round 0 complete with 2 node(s)"));
  daemon.send(SIGTERM);
  daemon.wait(std::chrono::seconds(10));
}

TEST_CASE("the static backend gives workers --master_addr and --master_port as given",
          "[integration][multinode]") {
  const int port = free_port();
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int rank : {1, 0}) {
    nodes.push_back(std::make_unique<Subprocess>(ddprun_fake(
        {"--nnodes", "2", "--node_rank", std::to_string(rank), "--master_addr", "127.0.0.1",
         "--master_port", std::to_string(port), "--local_addr", node_addr(rank)},
        {"env=GROUP_RANK,MASTER_ADDR,MASTER_PORT"})));
  }
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    const int rank = i == 0 ? 1 : 0;
    CHECK(contains(r.out, "[default0]:GROUP_RANK=" + std::to_string(rank)));
    CHECK(contains(r.out, "[default0]:MASTER_ADDR=127.0.0.1"));
    CHECK(contains(r.out, "[default0]:MASTER_PORT=" + std::to_string(port)));
  }
}

TEST_CASE("a worker failure on one node restarts every node with one restart count",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(
        endpoint, node_addr(i),
        {"--nnodes", "2", "--nproc_per_node", "2", "--max_restarts", "2", "--node_rank",
         std::to_string(i)},
        // Attempt 0: rank 3 (node 1) fails, the others wait to be stopped. Attempt 1: all pass.
        {"env=TORCHELASTIC_RESTART_COUNT,GROUP_RANK", "exit_if_restart=1:0", "exit_if_rank=3:5",
         "hang"}));
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    // Ranks are stable: whatever both attempts printed shows this node's one group rank.
    CHECK(count_of(r.out, "GROUP_RANK=" + std::to_string(i)) >= 2);
    CHECK(count_of(r.out, "GROUP_RANK=" + std::to_string(1 - i)) == 0);
    CHECK(count_of(r.out, "TORCHELASTIC_RESTART_COUNT=1") == 2);
    CHECK(count_of(r.err, "restarting workers: restart 1 of 2") == 1);
    CHECK_FALSE(contains(r.err, "restart 2 of 2"));
  }
}

TEST_CASE("with restarts used up a failure ends every node with the root cause's code",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(endpoint, node_addr(i),
                               {"--nnodes", "2", "--node_rank", std::to_string(i)},
                               {"exit_if_rank=1:7", "hang"}));
  auto r0 = nodes[0]->wait(kJobLimit);
  auto r1 = nodes[1]->wait(kJobLimit);
  INFO(r0.err << r1.err);
  CHECK(r0.exit_code == 7);
  CHECK(r1.exit_code == 7);
  CHECK(contains(r1.err, "Root Cause"));
  CHECK(contains(r0.err, "the job failed on another node"));
  CHECK(contains(r0.err, "exit code 7"));
}

TEST_CASE("a node killed with SIGKILL under --nnodes 2:3 leaves survivors that carry on",
          "[integration][multinode][fault]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(start_node(
        endpoint, node_addr(i),
        {"--nnodes", "2:3", "--max_restarts", "1", "--node_rank", std::to_string(i), "--rdzv_conf",
         kFastConf},
        // Round 0 (3 nodes) runs until the loss; the restarted round of 2 nodes finishes.
        {"pidfile=" + pids, "env=GROUP_WORLD_SIZE", "hang_unless=GROUP_WORLD_SIZE=2", "exit=0"}));
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 3; }, kJobLimit));
  // The node that does not host the server dies with its agent.
  nodes[2]->send(SIGKILL);
  nodes[2]->wait(std::chrono::seconds(10));
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=3"));
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=2"));
    CHECK(contains(r.err, "restarting workers: restart 1 of 1"));
    CHECK(contains(r.err, node_addr(2)));
  }
  // The killed agent's worker did not outlive it.
  for (const auto& [rank, pid] : read_pids(pids)) CHECK(wait_gone(pid));
}

TEST_CASE("an agent arriving while the job runs under its maximum scales it up",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> flags{"--nnodes", "2:3", "--rdzv_conf", kFastConf};
  const std::vector<std::string> actions{"env=GROUP_WORLD_SIZE,TORCHELASTIC_RESTART_COUNT",
                                         "hang_unless=GROUP_WORLD_SIZE=3", "exit=0"};
  auto a = start_node(endpoint, node_addr(0), flags, actions);
  auto b = start_node(endpoint, node_addr(1), flags, actions);
  REQUIRE(a->wait_for_output("GROUP_WORLD_SIZE=2", kJobLimit));
  REQUIRE(b->wait_for_output("GROUP_WORLD_SIZE=2", kJobLimit));
  auto c = start_node(endpoint, node_addr(2), flags, actions);
  for (auto* node : {a.get(), b.get(), c.get()}) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=3"));
    // Scaling up is not a restart.
    CHECK_FALSE(contains(r.out, "TORCHELASTIC_RESTART_COUNT=1"));
  }
}

TEST_CASE("the daemon killed and restarted mid-run does not stop the job, and gets its port back",
          "[integration][multinode][fault]") {
  TempDir dir;
  const std::string go = dir.path() + "/go";
  const int port = free_port();
  const std::vector<std::string> daemon_argv{RDZVD_BIN, "--port", std::to_string(port)};
  auto daemon = std::make_unique<Subprocess>(daemon_argv);
  REQUIRE(wait_until([&] { return contains(daemon->err_so_far(), "listening on"); }, kJobLimit));
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // No is_host=0: the endpoint names this machine, so each node could host the rendezvous on
  // the daemon's port while it is down.
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(
        start_node(endpoint, node_addr(i), {"--nnodes", "2", "--rdzv_conf", kFastConf},
                   {"print=started", "wait_lines=" + go + ":1", "env=TORCHELASTIC_RESTART_COUNT"}));
  for (auto& n : nodes) REQUIRE(n->wait_for_output("started", kJobLimit));
  daemon->send(SIGKILL);
  daemon->wait(std::chrono::seconds(10));
  // As a service manager would: the daemon starts again a while later, on the same port.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  daemon = std::make_unique<Subprocess>(daemon_argv);
  REQUIRE(wait_until(
      [&] {
        return contains(daemon->err_so_far(), "listening on") || !process_alive(daemon->pid());
      },
      kJobLimit));
  INFO(daemon->err_so_far());
  CHECK(contains(daemon->err_so_far(), "listening on"));
  // The nodes re-register their running round with the new daemon.
  REQUIRE(wait_until(
      [&] {
        return count_of(daemon->err_so_far(), "adopted") > 0 ||
               count_of(nodes[0]->err_so_far(), "reconnected") > 0;
      },
      kJobLimit));
  { std::ofstream(go) << "go\n"; }
  for (auto& n : nodes) {
    auto r = n->wait(kJobLimit);
    INFO(r.out << r.err << daemon->err_so_far());
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "TORCHELASTIC_RESTART_COUNT=0"));
    CHECK_FALSE(contains(r.err, "restarting workers"));
    CHECK_FALSE(contains(r.err, "hosting the rendezvous"));
  }
}

TEST_CASE("an IPv6 loopback endpoint works", "[integration][multinode]") {
  auto p = ddprun::rdzv::find_free_port("::1");
  REQUIRE(p.ok());
  const std::string endpoint = "[::1]:" + std::to_string(*p);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(std::make_unique<Subprocess>(ddprun_fake(
        {"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "v6"},
        {"env=GROUP_RANK"})));
  std::set<std::string> seen;
  for (auto& n : nodes) {
    auto r = n->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    seen.insert(env_printed_by(r.out, "[default0]:")["GROUP_RANK"]);
  }
  CHECK(seen == std::set<std::string>{"0", "1"});
}

TEST_CASE("a node started with another --nproc_per_node is refused naming both values",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto a =
      start_node(endpoint, node_addr(0),
                 {"--nnodes", "2", "--nproc_per_node", "2", "--rdzv_conf", kFastConf}, {"exit=0"});
  REQUIRE(wait_until([&] { return contains(a->err_so_far(), "waiting for nodes"); }, kJobLimit));
  auto r =
      start_node(endpoint, node_addr(1), {"--nnodes", "2", "--nproc_per_node", "3"}, {"exit=0"})
          ->wait(kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, "--nproc_per_node 3"));
  CHECK(contains(r.err, "--nproc_per_node 2"));
  CHECK(contains(r.err, node_addr(0)));
  a->send(SIGTERM);
  CHECK(a->wait(kJobLimit).exit_code == 128 + SIGTERM);
}

TEST_CASE("a join timeout names the nodes that came, the ones missing and the wait",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto r =
      start_node(endpoint, node_addr(0),
                 {"--nnodes", "2", "--node_rank", "0", "--rdzv_conf", "join_timeout=1"}, {"exit=0"})
          ->wait(kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, node_addr(0)));
  CHECK(contains(r.err, "node_rank 1"));
  CHECK(contains(r.err, "1 s"));
}

TEST_CASE("an endpoint nobody serves is retried, then named in the error",
          "[integration][multinode]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto r = start_node(endpoint, node_addr(0),
                      {"--nnodes", "2", "--rdzv_conf", "is_host=0,connect_timeout=1"}, {"exit=0"})
               ->wait(kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, "cannot reach the rendezvous server at " + endpoint));
  CHECK(contains(r.err, "Connection refused"));
}

TEST_CASE("an endpoint that never answers is given up on: each attempt waits 5 s at most",
          "[integration][multinode]") {
  // A listener whose accept queue is full: the kernel drops further SYNs, as a firewall or a
  // wrong address would, and a connect would wait for the kernel's two minutes.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 0) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::vector<int> fillers;
  for (int i = 0; i < 3; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    REQUIRE(fd >= 0);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    fillers.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto r = start_node(endpoint, node_addr(0),
                      {"--nnodes", "2", "--rdzv_conf", "is_host=0,connect_timeout=6"}, {"exit=0"})
               ->wait(kJobLimit);
  for (const int fd : fillers) ::close(fd);
  ::close(listener);
  INFO(r.err);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, "is not reachable yet (no answer within 5 s)"));
  // Two attempts of 5 s: past connect_timeout (6 s), and said so.
  CHECK(contains(r.err, "cannot reach the rendezvous server at " + endpoint + " for 1"));
  CHECK(contains(r.err, "(no answer within 5 s); check --rdzv_endpoint"));
}

TEST_CASE("ddprun status shows a running job's nodes with their ranks",
          "[integration][multinode]") {
  const int port = free_port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port)});
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(endpoint, node_addr(i),
                               {"--nnodes", "2", "--node_rank", std::to_string(i)},
                               {"print=started", "hang"}));
  for (auto& n : nodes) REQUIRE(n->wait_for_output("started", kJobLimit));
  auto r = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "job"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "job job: running, round 0"));
  CHECK(contains(r.out, "0          " + node_addr(0) + " running"));
  CHECK(contains(r.out, "1          " + node_addr(1) + " running"));
  auto none = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "x"});
  CHECK(none.exit_code == 1);
  CHECK(contains(none.out, "no job 'x' at " + endpoint));
  // One node stopped by a signal: it exits 128+15, and with no restart left the job fails.
  nodes[1]->send(SIGTERM);
  CHECK(nodes[1]->wait(kJobLimit).exit_code == 128 + SIGTERM);
  auto survivor = nodes[0]->wait(kJobLimit);
  INFO(survivor.err);
  CHECK(survivor.exit_code == 1);
  CHECK(contains(survivor.err, "the job failed on another node"));
  CHECK(contains(survivor.err, node_addr(1)));
}

TEST_CASE("a node kept out by its health check is listed by status and ends with the job",
          "[integration][multinode][health]") {
  TempDir dir;
  const std::string go = dir.path() + "/go";
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> flags{"--nnodes", "2", "--rdzv_conf", kFastConf};
  const std::vector<std::string> work{"print=started", "wait_file=" + go, "exit=0"};
  auto a = start_node(endpoint, node_addr(0), flags, work);
  auto b = start_node(endpoint, node_addr(1), flags, work);
  REQUIRE(a->wait_for_output("started", kJobLimit));
  REQUIRE(b->wait_for_output("started", kJobLimit));
  // A fourth whose first check is still running: after a few seconds it is listed too.
  std::vector<std::string> slow_flags = flags;
  slow_flags.insert(slow_flags.end(),
                    {"--health_check", "sleep 600", "--health_check_timeout", "900"});
  auto slow = start_node(endpoint, node_addr(3), slow_flags, {"print=ran"});
  // A third node whose check fails and would not check again for 10 minutes.
  flags.insert(flags.end(), {"--health_check", "echo 'gpu0: ECC errors' >&2; exit 1",
                             "--health_check_interval", "600"});
  auto kept = start_node(endpoint, node_addr(2), flags, {"print=ran"});
  std::string listed;
  REQUIRE(wait_until(
      [&] {
        listed = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint}, {},
                             std::chrono::seconds(10))
                     .out;
        return contains(listed, node_addr(2) + " kept out (health check") &&
               contains(listed, node_addr(3) + " kept out (health check");
      },
      kJobLimit));
  INFO(listed);
  CHECK(contains(listed, node_addr(2) + " kept out (health check: gpu0: ECC errors (the health "
                                        "check `echo"));
  CHECK(contains(listed,
                 node_addr(3) + " kept out (health check: first check still running after 5 s)"));
  CHECK(contains(listed, node_addr(0) + " running"));
  std::ofstream(go).close();
  auto ra = a->wait(kJobLimit);
  auto rb = b->wait(kJobLimit);
  auto rk = kept->wait(kJobLimit);
  auto rs = slow->wait(kJobLimit);
  INFO(ra.err << "\n--- b:\n"
              << rb.err << "\n--- kept out:\n"
              << rk.out << rk.err << "\n--- slow check:\n"
              << rs.out << rs.err);
  // The slow node ends with the job too, its check stopped.
  REQUIRE_FALSE(rs.timed_out);
  CHECK(rs.exit_code == 0);
  CHECK(contains(rs.err, "the health check is still running after 5 s"));
  CHECK_FALSE(contains(rs.out, "ran"));
  CHECK(ra.exit_code == 0);
  CHECK(rb.exit_code == 0);
  // Before, it went on checking (here for 10 minutes) and then hosted the ended job again.
  REQUIRE_FALSE(rk.timed_out);
  CHECK(rk.exit_code == 0);
  CHECK(contains(rk.err, "[health check] gpu0: ECC errors"));
  CHECK(contains(rk.err,
                 "the job ended while this node was kept out by its health check (1 "
                 "failed check(s) in a row): the workers of all 2 nodes succeeded"));
  CHECK_FALSE(contains(rk.out, "ran"));
}

TEST_CASE("when the agent hosting the embedded server dies another node takes the server over",
          "[integration][multinode][fault]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(start_node(endpoint, node_addr(i),
                               {"--nnodes", "2:3", "--max_restarts", "1", "--node_rank",
                                std::to_string(i), "--rdzv_conf", kFastConf},
                               {"pidfile=" + pids, "env=GROUP_WORLD_SIZE,GROUP_RANK",
                                "hang_unless=GROUP_WORLD_SIZE=2", "exit=0"}));
    // The first node hosts the server: wait for it before starting the others.
    if (i == 0)
      REQUIRE(wait_until([&] { return contains(nodes[0]->err_so_far(), "hosting"); }, kJobLimit));
  }
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 3; }, kJobLimit));
  nodes[0]->send(SIGKILL);
  nodes[0]->wait(std::chrono::seconds(10));
  int hosts = 0;
  for (int i = 1; i < 3; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=2"));
    CHECK(contains(r.err, "lost the rendezvous server"));
    hosts += count_of(r.err, "hosting the rendezvous");
  }
  CHECK(hosts == 1);
}

namespace {

/// Two agents of a 2-node job (node 0 hosts the rendezvous unless `daemon_endpoint` is given);
/// node 1's agent is stopped (SIGSTOP) until the others gave it up, then continued: it must
/// stop its workers, join the next round as a new node, and the job must finish with both.
void stopped_node_rejoins(const std::string& daemon_endpoint) {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  const bool embedded = daemon_endpoint.empty();
  const std::string endpoint =
      embedded ? "127.0.0.1:" + std::to_string(free_port()) : daemon_endpoint;
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i) {
    const std::string host = embedded ? (i == 0 ? "is_host=1," : "is_host=0,") : "is_host=0,";
    nodes.push_back(start_node(endpoint, node_addr(i),
                               {"--nnodes", "2", "--max_restarts", "1", "--node_rank",
                                std::to_string(i), "--rdzv_conf", host + kFastConf},
                               // Round 0 runs until the restart; the restarted round finishes.
                               {"pidfile=" + pids, "env=TORCHELASTIC_RESTART_COUNT,GROUP_RANK",
                                "exit_if_restart=1:0", "hang"}));
    if (embedded && i == 0)
      REQUIRE(wait_until([&] { return contains(nodes[0]->err_so_far(), "hosting"); }, kJobLimit));
  }
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit));
  const pid_t first_worker_of_node1 = read_pids(pids).at("1");
  // Keep-alive 0.2 s x 3: node 1 is silent far longer than a window while node 0 restarts.
  nodes[1]->send(SIGSTOP);
  const bool given_up = wait_until(
      [&] { return contains(nodes[0]->err_so_far(), "restarting workers: restart 1 of 1"); },
      kJobLimit);
  nodes[1]->send(SIGCONT);
  REQUIRE(given_up);
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO("node " << i << "\n" << r.out << r.err);
    CHECK(r.exit_code == 0);
    // One restart, counted once, and each node keeps its group rank.
    CHECK(count_of(r.out, "TORCHELASTIC_RESTART_COUNT=1") == 1);
    CHECK_FALSE(contains(r.out, "TORCHELASTIC_RESTART_COUNT=2"));
    CHECK(count_of(r.out, "GROUP_RANK=" + std::to_string(i)) == 2);
  }
  const std::string node1_err = nodes[1]->err_so_far();
  CHECK(contains(node1_err, "joining the job again as a new node"));
  CHECK_FALSE(contains(node1_err, "rendezvous failed"));
  // The round-0 worker of the dropped node was stopped, not left running beside the new one.
  CHECK(wait_gone(first_worker_of_node1));
}

}  // namespace

TEST_CASE("an agent stopped past the keep-alive window rejoins the daemon's job as a new node",
          "[integration][multinode][fault]") {
  const int port = free_port();
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port), "--host", "127.0.0.1"});
  REQUIRE(wait_until([&] { return contains(daemon.err_so_far(), "listening on"); }, kJobLimit));
  stopped_node_rejoins("127.0.0.1:" + std::to_string(port));
  INFO(daemon.err_so_far());
  CHECK(contains(daemon.err_so_far(), "was lost"));
  daemon.send(SIGTERM);
  daemon.wait(std::chrono::seconds(10));
}

TEST_CASE("an agent stopped past the keep-alive window rejoins an agent-hosted job as a new node",
          "[integration][multinode][fault]") {
  stopped_node_rejoins("");
}

TEST_CASE("an agent stopped past the keep-alive window while it waits for a round rejoins it",
          "[integration][multinode][fault]") {
  const int port = free_port();
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port), "--host", "127.0.0.1"});
  REQUIRE(wait_until([&] { return contains(daemon.err_so_far(), "listening on"); }, kJobLimit));
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> flags{"--nnodes", "2", "--rdzv_conf", "is_host=0," + kFastConf};
  const std::vector<std::string> actions{"env=TORCHELASTIC_RESTART_COUNT", "exit=0"};
  auto waiting = start_node(endpoint, node_addr(1), flags, actions);
  REQUIRE(
      wait_until([&] { return contains(waiting->err_so_far(), "waiting for nodes"); }, kJobLimit));
  waiting->send(SIGSTOP);
  const bool dropped =
      wait_until([&] { return contains(daemon.err_so_far(), "was lost"); }, kJobLimit);
  waiting->send(SIGCONT);
  REQUIRE(dropped);
  REQUIRE(wait_until(
      [&] { return contains(waiting->err_so_far(), "joining the job again as a new node"); },
      kJobLimit));
  auto second = start_node(endpoint, node_addr(0), flags, actions);
  for (auto* node : {waiting.get(), second.get()}) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err << daemon.err_so_far());
    CHECK(r.exit_code == 0);
    // Dropped from a forming round: no workers ran, so no restart.
    CHECK(contains(r.out, "TORCHELASTIC_RESTART_COUNT=0"));
  }
  daemon.send(SIGTERM);
  daemon.wait(std::chrono::seconds(10));
}

// ---- spares and quarantine -------------------------------------------------------------------

TEST_CASE(
    "a node whose workers fail at every start is quarantined, a spare finishes the job in "
    "its place, and the node rejoins as a spare after its cooldown",
    "[integration][multinode][spares]") {
  const int port = free_port();
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port), "--host", "127.0.0.1"});
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> flags{"--nnodes",
                                       "2",
                                       "--max_restarts",
                                       "3",
                                       "--restart_backoff",
                                       "0",
                                       "--quarantine_cooldown",
                                       "1",
                                       "--rdzv_conf",
                                       kFastConf + ",is_host=0"};
  // Good nodes train for 4 s a round; the bad node's workers fail after 3 s, every time (time
  // enough for the spare to join before the second failure).
  const std::vector<std::string> good{"env=GROUP_RANK", "sleep=4000", "exit=0"};
  auto a = start_node(endpoint, node_addr(0), flags, good);
  auto bad = start_node(endpoint, node_addr(1), flags, {"env=GROUP_RANK", "sleep=3000", "exit=3"});
  REQUIRE(a->wait_for_output("GROUP_RANK=", kJobLimit));
  auto spare = start_node(endpoint, node_addr(2), flags, good);
  auto ra = a->wait(kJobLimit);
  auto rs = spare->wait(kJobLimit);
  auto rb = bad->wait(kJobLimit);
  INFO(ra.out << ra.err << "\n--- bad:\n"
              << rb.out << rb.err << "\n--- spare:\n"
              << rs.out << rs.err << "\n--- daemon:\n"
              << daemon.err_so_far());
  CHECK(ra.exit_code == 0);
  CHECK(rs.exit_code == 0);
  CHECK(rb.exit_code == 0);  // the job succeeded, with the spare in its place
  CHECK(contains(rb.err, "is quarantined for 1 s"));
  CHECK(contains(rb.err, "2 group failures in a row (--quarantine_after 2)"));
  // After its cooldown it checked itself and waited as a spare until the job ended.
  CHECK(contains(rb.err, "its quarantine is over"));
  CHECK(contains(rb.err, "waiting for a place in the job"));
  // The good node kept its group rank in every round; the spare took the bad node's.
  const std::string rank_a = contains(ra.out, "GROUP_RANK=0") ? "0" : "1";
  const std::string rank_b = rank_a == "0" ? "1" : "0";
  CHECK_FALSE(contains(ra.out, "GROUP_RANK=" + rank_b));
  CHECK_FALSE(contains(rs.out, "[default0]:GROUP_RANK=" + rank_a));
  CHECK(contains(rs.out, "[default0]:GROUP_RANK=" + rank_b));
  CHECK(count_of(rb.err, "is quarantined for") >= 1);
  // The daemon's log tells the story: the restarts, the quarantine and the job's end.
  const std::string log = daemon.err_so_far();
  CHECK(contains(log, "warning: job 'job': quarantine: node "));
  CHECK(contains(log, "2 group failures in a row (--quarantine_after 2)"));
  CHECK(contains(log, "info: job 'job': restart (round 1, restart count 1): "));
  CHECK(contains(log, "its quarantine is over"));
  CHECK(contains(log, "info: job 'job': ended: "));
  daemon.send(SIGTERM);
  daemon.wait(std::chrono::seconds(10));
}

TEST_CASE(
    "an agent killed with SIGKILL is replaced by a waiting spare; the survivor keeps its "
    "group rank",
    "[integration][multinode][spares][fault]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> flags{"--nnodes", "2",           "--max_restarts",
                                       "1",        "--rdzv_conf", kFastConf};
  // Round 0 runs until the loss; the restarted round finishes.
  const std::vector<std::string> actions{"pidfile=" + pids, "env=GROUP_RANK",
                                         "hang_unless=TORCHELASTIC_RESTART_COUNT=1", "exit=0"};
  auto host = start_node(endpoint, node_addr(0), flags, actions);
  auto lost = start_node(endpoint, node_addr(1), flags, actions);
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit));
  auto spare = start_node(endpoint, node_addr(2), flags, actions);
  // The spare has joined once status lists it; the kill comes after.
  REQUIRE(wait_until(
      [&] {
        auto r = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint}, {},
                             std::chrono::seconds(10));
        return contains(r.out, "spare");
      },
      kJobLimit));
  lost->send(SIGKILL);
  lost->wait(std::chrono::seconds(10));
  auto rh = host->wait(kJobLimit);
  auto rs = spare->wait(kJobLimit);
  INFO(rh.out << rh.err << "\n--- spare:\n" << rs.out << rs.err);
  CHECK(rh.exit_code == 0);
  CHECK(rs.exit_code == 0);
  const std::string rank_host = contains(rh.out, "GROUP_RANK=0") ? "0" : "1";
  const std::string rank_lost = rank_host == "0" ? "1" : "0";
  CHECK(count_of(rh.out, "GROUP_RANK=" + rank_host) == 2);  // both rounds, the same rank
  CHECK(contains(rs.out, "[default0]:GROUP_RANK=" + rank_lost));
  for (const auto& [rank, pid] : read_pids(pids)) CHECK(wait_gone(pid));
}

TEST_CASE(
    "a hang is not blamed on a node whose worker was only waiting: the first watchdog to fire "
    "is a waiting node's, and nobody is quarantined",
    "[integration][multinode][spares]") {
  const int port = free_port();
  Subprocess daemon({RDZVD_BIN, "--port", std::to_string(port), "--host", "127.0.0.1"});
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> flags{
      "--nnodes",           "2", "--max_restarts",     "1",
      "--restart_backoff",  "0", "--quarantine_after", "1",
      "--watchdog_timeout", "2", "--rdzv_conf",        kFastConf + ",is_host=0"};
  // As in a collective hang, both workers go silent; the waiting one (asleep) first, so its
  // node's watchdog fires first. Each first shows progress every 0.3 s, well within the
  // watchdog's 2 s (the GROUP_RANK line counts too): the waiting one for 3 s, then it sleeps;
  // the one that hung for 9 s, then it stops itself (SIGSTOP), 4 s after the other's watchdog.
  auto reporting = [](int times, const std::string& then) {
    std::vector<std::string> actions{"env=GROUP_RANK", "exit_if_restart=1:0"};
    for (int i = 0; i < times; ++i)
      actions.insert(actions.end(), {"report=heartbeat", "sleep=300"});
    actions.push_back(then);
    return actions;
  };
  auto waiting = start_node(endpoint, node_addr(0), flags, reporting(10, "hang"));
  auto hung = start_node(endpoint, node_addr(1), flags, reporting(30, "signal=19"));
  REQUIRE(waiting->wait_for_output("GROUP_RANK=", kJobLimit));
  auto spare = start_node(endpoint, node_addr(2), flags, {"env=GROUP_RANK", "exit=0"});
  auto rw = waiting->wait(kJobLimit);
  auto rh = hung->wait(kJobLimit);
  auto rs = spare->wait(kJobLimit);
  INFO(rw.out << rw.err << "\n--- hung:\n"
              << rh.out << rh.err << "\n--- spare:\n"
              << rs.out << rs.err << "\n--- daemon:\n"
              << daemon.err_so_far());
  CHECK(rw.exit_code == 0);
  CHECK(rh.exit_code == 0);
  CHECK(rs.exit_code == 0);
  // Asleep ("S"), or runnable ("R") when a loaded machine samples it just as one of its sleeps
  // ended: either way not stopped, so not blamed.
  CHECK((contains(rw.err, "it is not stopped (state S): it may be waiting for a peer that hung") ||
         contains(rw.err, "it is not stopped (state R): it may be waiting for a peer that hung")));
  CHECK(contains(rh.err, "no node is blamed: its worker was waiting for a peer"));
  // With --quarantine_after 1 and a spare, blaming the waiting node would have quarantined it.
  CHECK_FALSE(contains(rw.err + rh.err + rs.err, "is quarantined"));
  CHECK_FALSE(contains(rs.out, "GROUP_RANK="));  // the spare was never needed
  daemon.send(SIGTERM);
  daemon.wait(std::chrono::seconds(10));
}
