// The rendezvous on etcd v3 (--rdzv_backend etcd-v3) with real ddprun agents and fake workers
// against a real three-member etcd on 127.0.0.1 (tests/etcd/etcd_cluster.h): ranks, world sizes
// and restart counts as with c10d, the etcd leader killed while the job trains, a follower paused,
// an agent killed and its lease expiring, and a finished job's keys deleted.

#include <signal.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <set>

#include "rendezvous/free_port.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/ddprun_runs.h"

using namespace ddprun::testing;
using namespace std::chrono_literals;

namespace {

/// Fast keep-alive: a lease of 3 s, so a killed agent is lost quickly.
const std::string kEtcdConf =
    "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,"
    "connect_timeout=30,close_timeout=5";

/// One agent of job "job" on the etcd cluster, advertising 127.0.0.(i+2); `endpoints` (the
/// members in the order the agent tries them) when not empty.
std::unique_ptr<Subprocess> start_node(const EtcdCluster& etcd, int i,
                                       const std::vector<std::string>& flags,
                                       const std::vector<std::string>& actions,
                                       const std::string& endpoints = "") {
  std::vector<std::string> all{"--rdzv_backend",  "etcd-v3",
                               "--rdzv_endpoint", endpoints.empty() ? etcd.endpoints() : endpoints,
                               "--rdzv_id",       "job",
                               "--local_addr",    loopback_node_addr(i),
                               "--rdzv_conf",     kEtcdConf};
  all.insert(all.end(), flags.begin(), flags.end());
  return std::make_unique<Subprocess>(ddprun_fake(all, actions));
}

/// What the agents printed so far and the job's keys, for a failed wait's message.
std::string err_of(const std::vector<std::unique_ptr<Subprocess>>& nodes,
                   const EtcdCluster* etcd = nullptr) {
  std::string out;
  if (etcd) out += "--- keys\n" + etcd->etcdctl({"get", "--prefix", "/ddprun/job/"}).out;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    out += "--- node " + std::to_string(i) + "\n" + nodes[i]->err_so_far();
  return out;
}

/// The keys under /ddprun/job/ (etcdctl's key lines).
std::string job_keys(const EtcdCluster& etcd) {
  auto r = etcd.etcdctl({"get", "--prefix", "--keys-only", "/ddprun/job/"});
  return r.out;
}

/// Each node ends with 0, its workers printed "finished" once, in attempt 0, and no restart.
void check_finished_without_restart(std::vector<std::unique_ptr<Subprocess>>& nodes) {
  for (auto& node : nodes) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(count_of(r.out, "finished") == 1);
    CHECK(count_of(r.out, "TORCHELASTIC_RESTART_COUNT=0") == 1);
    CHECK_FALSE(contains(r.err, "restarting workers"));
  }
}

/// Waits for the cluster, then turns its authentication on (EtcdCluster::enable_auth).
void ready_with_auth(const EtcdCluster& etcd) {
  REQUIRE(etcd.wait_ready());
  auto auth = etcd.enable_auth();
  INFO(auth.out << auth.err);
  REQUIRE(auth.exit_code == 0);
}

/// A password file of mode 600 named `name` in `dir`.
std::string password_file(const TempDir& dir, const std::string& name,
                          const std::string& password) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << password << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

}  // namespace

TEST_CASE("three agents on etcd get unique ranks and one master and leave no keys",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(
        start_node(etcd, i, {"--nnodes", "3", "--nproc_per_node", "2"}, {kPrintLayout}));
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
  // A finished job's keys are deleted.
  CHECK(wait_until([&] { return job_keys(etcd).empty(); }, 10s));
  INFO(job_keys(etcd));
}

TEST_CASE("a worker failure on one node of an etcd job restarts both with one restart count",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(
        etcd, i,
        {"--nnodes", "2", "--nproc_per_node", "2", "--max_restarts", "2", "--node_rank",
         std::to_string(i)},
        // Attempt 0: rank 3 (node 1) fails, the others wait to be stopped. Attempt 1: all pass.
        {"env=TORCHELASTIC_RESTART_COUNT,GROUP_RANK,WORLD_SIZE", "exit_if_restart=1:0",
         "exit_if_rank=3:5", "hang"}));
  for (int i = 0; i < 2; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    // --node_rank is honoured and ranks are stable across the restart.
    CHECK(count_of(r.out, "GROUP_RANK=" + std::to_string(i)) >= 2);
    CHECK(count_of(r.out, "GROUP_RANK=" + std::to_string(1 - i)) == 0);
    CHECK(count_of(r.out, "WORLD_SIZE=4") >= 2);
    CHECK(count_of(r.out, "TORCHELASTIC_RESTART_COUNT=1") == 2);
    CHECK(count_of(r.err, "restarting workers: restart 1 of 2") == 1);
  }
}

TEST_CASE("the etcd leader killed while an etcd job trains causes no restart", "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  const std::string gate = dir.path() + "/gate";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(etcd, i, {"--nnodes", "2", "--max_restarts", "1"},
                               {"pidfile=" + pids, "env=TORCHELASTIC_RESTART_COUNT",
                                "wait_lines=" + gate + ":1", "print=finished"}));
  if (!wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  const int leader = etcd.leader();
  REQUIRE(leader >= 0);
  etcd.kill(leader);
  // Longer than the lease's TTL: the keep-alives must fail over for the nodes to stay.
  std::this_thread::sleep_for(4s);
  std::ofstream(gate) << "go\n";
  check_finished_without_restart(nodes);
}

namespace {

/// Three agents of a job of 2 to 3 nodes, whose workers train until their round has 2 nodes;
/// the agent that joined last (so the driver survives) gets `sig`. The survivors' results.
std::vector<CommandResult> survivors_of_third_node_stopped_by(int sig) {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(start_node(
        etcd, i, {"--nnodes", "2:3", "--max_restarts", "1", "--node_rank", std::to_string(i)},
        // Round 0 (3 nodes) runs until the loss; the re-formed round of 2 nodes finishes.
        {"pidfile=" + pids, "env=GROUP_WORLD_SIZE", "hang_unless=GROUP_WORLD_SIZE=2", "exit=0"}));
  if (!wait_until([&] { return read_pids(pids).size() == 3; }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  nodes[2]->send(sig);
  nodes[2]->wait(30s);
  std::vector<CommandResult> survivors;
  for (int i = 0; i < 2; ++i) survivors.push_back(nodes[i]->wait(kJobLimit));
  for (const auto& [rank, pid] : read_pids(pids)) CHECK(wait_gone(pid));
  return survivors;
}

}  // namespace

TEST_CASE("an agent of an etcd job killed with SIGKILL leaves survivors that re-form",
          "[etcd][rdzv]") {
  for (const CommandResult& r : survivors_of_third_node_stopped_by(SIGKILL)) {
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=3"));
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=2"));
    CHECK(contains(r.err, "restarting workers: restart 1 of 1"));
    CHECK(contains(r.err, loopback_node_addr(2)));
    CHECK(contains(r.err, "disconnected without leaving"));
  }
}

TEST_CASE("an agent of an etcd job stopped with SIGTERM is reported as left, not lost",
          "[etcd][rdzv]") {
  for (const CommandResult& r : survivors_of_third_node_stopped_by(SIGTERM)) {
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=2"));
    CHECK(contains(r.err, "left (received SIGTERM)"));
    CHECK_FALSE(contains(r.err, "disconnected without leaving"));
  }
}

TEST_CASE("the driving agent of an etcd job killed with SIGKILL is replaced by a survivor",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  // The first node starts alone and drives; the others come once it does.
  nodes.push_back(start_node(
      etcd, 0, {"--nnodes", "2:3", "--max_restarts", "1", "--node_rank", "0"},
      {"pidfile=" + pids, "env=GROUP_WORLD_SIZE", "hang_unless=GROUP_WORLD_SIZE=2", "exit=0"}));
  if (!wait_until([&] { return contains(nodes[0]->err_so_far(), "drives the rendezvous"); },
                  kJobLimit))
    FAIL(err_of(nodes, &etcd));
  for (int i = 1; i < 3; ++i)
    nodes.push_back(start_node(
        etcd, i, {"--nnodes", "2:3", "--max_restarts", "1", "--node_rank", std::to_string(i)},
        {"pidfile=" + pids, "env=GROUP_WORLD_SIZE", "hang_unless=GROUP_WORLD_SIZE=2", "exit=0"}));
  if (!wait_until([&] { return read_pids(pids).size() == 3; }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  nodes[0]->send(SIGKILL);
  nodes[0]->wait(10s);
  for (int i = 1; i < 3; ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "GROUP_WORLD_SIZE=2"));
    CHECK(contains(r.err, "restarting workers: restart 1 of 1"));
  }
}

TEST_CASE("the etcd leader killed while a round forms delays nothing and restarts nothing",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  nodes.push_back(start_node(etcd, 0, {"--nnodes", "2"}, {"env=TORCHELASTIC_RESTART_COUNT"}));
  REQUIRE(
      wait_until([&] { return contains(nodes[0]->err_so_far(), "waiting for nodes"); }, kJobLimit));
  const int leader = etcd.leader();
  REQUIRE(leader >= 0);
  etcd.kill(leader);
  nodes.push_back(start_node(etcd, 1, {"--nnodes", "2"}, {"env=TORCHELASTIC_RESTART_COUNT"}));
  for (auto& node : nodes) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(count_of(r.out, "TORCHELASTIC_RESTART_COUNT=0") == 1);
    CHECK_FALSE(contains(r.err, "restarting workers"));
  }
}

TEST_CASE("an etcd follower paused while a round forms and while the job trains changes nothing",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  // Followers only: etcd 3.4.23 lets a leader that resumes after a pause longer than a lease's
  // TTL revoke the leases it saw expire (etcd issue 15247), which no client can prevent.
  const int leader = etcd.leader();
  REQUIRE(leader >= 0);
  std::vector<int> followers;
  for (int i = 0; i < etcd.size(); ++i)
    if (i != leader) followers.push_back(i);
  // The agents try the first follower first, the second next, the leader last.
  const auto members = etcd.members();
  const std::string endpoints = members[followers[0]].text() + "," + members[followers[1]].text() +
                                "," + members[leader].text();
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  const std::string gate = dir.path() + "/gate";
  WorkerSweeper sweeper(pids);
  const std::vector<std::string> actions{"pidfile=" + pids, "env=TORCHELASTIC_RESTART_COUNT",
                                         "wait_lines=" + gate + ":1", "print=finished"};
  const std::vector<std::string> flags{"--nnodes", "2", "--max_restarts", "1"};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  nodes.push_back(start_node(etcd, 0, flags, actions, endpoints));
  if (!wait_until([&] { return contains(nodes[0]->err_so_far(), "waiting for nodes"); }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  // The member the agents use holds its connections and answers nothing (as a member that
  // hangs or sits behind a half-open partition) while the second node joins.
  etcd.pause(followers[0]);
  nodes.push_back(start_node(etcd, 1, flags, actions, endpoints));
  const bool formed = wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit);
  etcd.resume(followers[0]);
  if (!formed) FAIL(err_of(nodes, &etcd));
  // While the job trains, the member they moved to, for longer than the lease's TTL (3 s).
  etcd.pause(followers[1]);
  std::this_thread::sleep_for(5s);
  etcd.resume(followers[1]);
  REQUIRE(etcd.wait_ready());
  for (const auto& [rank, pid] : read_pids(pids)) CHECK(process_alive(pid));
  std::ofstream(gate) << "go\n";
  check_finished_without_restart(nodes);
}

TEST_CASE("every etcd member down for a while leaves an etcd job training until etcd is back",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  const std::string gate = dir.path() + "/gate";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(etcd, i, {"--nnodes", "2", "--max_restarts", "1"},
                               {"pidfile=" + pids, "env=TORCHELASTIC_RESTART_COUNT",
                                "wait_lines=" + gate + ":1", "print=finished"}));
  if (!wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  for (int i = 0; i < etcd.size(); ++i) etcd.kill(i);
  // Longer than the lease's TTL (3 s): the agents notice and warn; the workers run on.
  REQUIRE(wait_until(
      [&] {
        return contains(nodes[0]->err_so_far(), "lost the etcd cluster") &&
               contains(nodes[1]->err_so_far(), "lost the etcd cluster");
      },
      20s));
  for (int i = 0; i < etcd.size(); ++i) etcd.start(i);
  REQUIRE(etcd.wait_ready());
  REQUIRE(wait_until(
      [&] {
        return count_of(nodes[0]->err_so_far() + nodes[1]->err_so_far(),
                        "reconnected to the rendezvous") == 2;
      },
      30s));
  for (const auto& [rank, pid] : read_pids(pids)) CHECK(process_alive(pid));
  std::ofstream(gate) << "go\n";
  check_finished_without_restart(nodes);
}

TEST_CASE(
    "ddprun status reads a running etcd job's nodes, ranks and a node kept out by its health "
    "check from etcd, and the kept-out node ends with the job",
    "[etcd][rdzv][health]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  const std::string gate = dir.path() + "/gate";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(etcd, i, {"--nnodes", "2", "--node_rank", std::to_string(i)},
                               {"pidfile=" + pids, "wait_lines=" + gate + ":1"}));
  if (!wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  // A third node whose health check fails: held in etcd's state as kept out, never placed.
  nodes.push_back(start_node(etcd, 2,
                             {"--nnodes", "2", "--health_check", "echo 'gpu0: ECC errors'; exit 1",
                              "--health_check_interval", "600"},
                             {"print=ran"}));
  const auto status_now = [&] {
    return run_command({DDPRUN_BIN, "status", "--rdzv_backend", "etcd-v3", "--rdzv_endpoint",
                        etcd.endpoints(), "--rdzv_id", "job"},
                       {}, 30s);
  };
  if (!wait_until([&] { return contains(status_now().out, "kept out (health check"); }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  auto status = status_now();
  INFO(status.out << status.err);
  CHECK(status.exit_code == 0);
  CHECK(contains(status.out, "job job: running, round 0, restarts 0 of 0, --nnodes 2:2"));
  CHECK(contains(status.out, loopback_node_addr(0)));
  CHECK(contains(status.out, loopback_node_addr(1)));
  CHECK(contains(status.out, loopback_node_addr(2) + " kept out (health check: gpu0: ECC errors"));
  auto missing = run_command({DDPRUN_BIN, "status", "--rdzv_backend", "etcd-v3", "--rdzv_endpoint",
                              etcd.endpoints(), "--rdzv_id", "other"},
                             {}, 30s);
  CHECK(missing.exit_code == 1);
  CHECK(contains(missing.out, "no job 'other' at etcd 127.0.0.1:"));
  // A state no ddprun can read (written by hand here) is named; the listing still shows the rest.
  REQUIRE(etcd.etcdctl({"put", "/ddprun/broken/state", "not json"}).exit_code == 0);
  auto listing = run_command(
      {DDPRUN_BIN, "status", "--rdzv_backend", "etcd-v3", "--rdzv_endpoint", etcd.endpoints()}, {},
      30s);
  INFO(listing.out << listing.err);
  CHECK(listing.exit_code == 0);
  CHECK(contains(listing.out, "job job: running"));
  CHECK(contains(listing.err, "ddprun status: job 'broken' left out: "));
  CHECK(contains(listing.err, "/ddprun/broken/state"));
  auto broken = run_command({DDPRUN_BIN, "status", "--rdzv_backend", "etcd-v3", "--rdzv_endpoint",
                             etcd.endpoints(), "--rdzv_id", "broken"},
                            {}, 30s);
  CHECK(broken.exit_code != 0);
  CHECK(contains(broken.err, "/ddprun/broken/state"));
  std::ofstream(gate) << "go\n";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto r = nodes[i]->wait(kJobLimit);
    INFO("node " << i << ":\n" << r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK_FALSE(contains(r.out, "ran"));
    if (i == 2) CHECK(contains(r.err, "the job ended while this node was kept out"));
  }
}

TEST_CASE("agents log in to an etcd with authentication with etcd_user and etcd_password_file",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  ready_with_auth(etcd);
  TempDir dir;
  const std::string good = password_file(dir, "good", "annpw");
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(
        etcd, i,
        {"--nnodes", "2", "--rdzv_conf", kEtcdConf + ",etcd_user=ann,etcd_password_file=" + good},
        {"env=WORLD_SIZE"}));
  for (auto& node : nodes) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "WORLD_SIZE=2"));
  }
  // A wrong password, or none, ends the agent at once with etcd's answer and the fix: no retry
  // can cure it (connect_timeout 600 s is far past the command's limit).
  const std::string wrong = password_file(dir, "wrong", "not her password");
  auto refused =
      start_node(etcd, 0,
                 {"--nnodes", "2", "--rdzv_conf",
                  kEtcdConf + ",connect_timeout=600,etcd_user=ann,etcd_password_file=" + wrong},
                 {"env=WORLD_SIZE"});
  auto r = refused->wait(kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, "etcd refused this node: "));
  CHECK(contains(r.err, "authentication failed"));
  CHECK(contains(r.err, "check --rdzv_conf etcd_user and the password in etcd_password_file"));
  auto anonymous =
      start_node(etcd, 0, {"--nnodes", "2", "--rdzv_conf", kEtcdConf + ",connect_timeout=600"},
                 {"env=WORLD_SIZE"});
  auto a = anonymous->wait(kJobLimit);
  INFO(a.err);
  REQUIRE_FALSE(a.timed_out);
  CHECK(a.exit_code == 69);
  CHECK(contains(a.err, "give --rdzv_conf etcd_user and etcd_password_file"));
}

TEST_CASE("an etcd endpoint that is another HTTP service ends the node at once, saying so",
          "[etcd][rdzv]") {
  // The other service: an agent's metrics port, which answers a POST with 405. Before, the
  // node retried it as an unreachable etcd for the whole connect_timeout.
  auto port = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(port.ok());
  Subprocess service(ddprun_fake(
      {"--standalone", "--nproc_per_node", "1", "--metrics_port", std::to_string(*port)},
      {"print=serving", "hang"}));
  REQUIRE(service.wait_for_output("serving", kJobLimit));
  auto r = run_command(ddprun_fake({"--nnodes", "1", "--rdzv_backend", "etcd-v3", "--rdzv_endpoint",
                                    "127.0.0.1:" + std::to_string(*port), "--rdzv_id", "job",
                                    "--rdzv_conf", "connect_timeout=600"},
                                   {"print=should-not-run"}),
                       {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, "HTTP 405 without an etcd error (not etcd's v3 API)"));
  CHECK(contains(r.err, "is no etcd member: give each member's client URL in --rdzv_endpoint"));
  CHECK_FALSE(contains(r.out, "should-not-run"));
  service.send(SIGTERM);
  CHECK_FALSE(service.wait(kJobLimit).timed_out);
}

TEST_CASE("ddprun status logs in to an etcd with authentication as the agents do", "[etcd][rdzv]") {
  EtcdCluster etcd;
  ready_with_auth(etcd);
  TempDir dir;
  const std::string login =
      ",etcd_user=ann,etcd_password_file=" + password_file(dir, "good", "annpw");
  const std::string pids = dir.path() + "/pids";
  const std::string gate = dir.path() + "/gate";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(
        etcd, i,
        {"--nnodes", "2", "--node_rank", std::to_string(i), "--rdzv_conf", kEtcdConf + login},
        {"pidfile=" + pids, "wait_lines=" + gate + ":1"}));
  if (!wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit)) FAIL(err_of(nodes));
  const auto status = [&](const std::string& conf) {
    std::vector<std::string> args{DDPRUN_BIN,        "status",         "--rdzv_backend", "etcd-v3",
                                  "--rdzv_endpoint", etcd.endpoints(), "--rdzv_id",      "job"};
    if (!conf.empty()) {
      args.push_back("--rdzv_conf");
      args.push_back(conf);
    }
    return run_command(args, {}, 30s);
  };
  // The agents' own --rdzv_conf, pasted: the keys that do not reach etcd are ignored.
  auto in = status(kEtcdConf + login);
  INFO(in.out << in.err);
  CHECK(in.exit_code == 0);
  CHECK(contains(in.out, "job job: running, round 0, restarts 0 of 0, --nnodes 2:2"));
  CHECK(contains(in.out, loopback_node_addr(0)));
  CHECK(contains(in.out, loopback_node_addr(1)));
  // Without a login etcd refuses the read; with a wrong password the login fails.
  auto anonymous = status("");
  INFO(anonymous.out << anonymous.err);
  CHECK(anonymous.exit_code == 69);
  CHECK(contains(anonymous.err, "cannot get the status from etcd"));
  auto wrong =
      status("etcd_user=ann,etcd_password_file=" + password_file(dir, "wrong", "not her password"));
  INFO(wrong.out << wrong.err);
  CHECK(wrong.exit_code == 69);
  CHECK(contains(wrong.err, "authentication failed"));
  auto half = status("etcd_user=ann");
  CHECK(half.exit_code == 64);
  CHECK(contains(half.err, "etcd_user and etcd_password_file go together"));
  std::ofstream(gate) << "go\n";
  for (auto& node : nodes) CHECK(node->wait(kJobLimit).exit_code == 0);
}

TEST_CASE("agents speak TLS to etcd members that require client certificates", "[etcd][rdzv]") {
  EtcdPki pki;
  EtcdCluster etcd(3, pki.tls());
  REQUIRE(etcd.wait_ready());
  const std::string tls = ",tls_ca=" + pki.path("ca.pem") + ",tls_cert=" + pki.path("client.pem") +
                          ",tls_key=" + pki.path("client.key");
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(
        start_node(etcd, i, {"--nnodes", "2", "--rdzv_conf", kEtcdConf + tls}, {"env=WORLD_SIZE"}));
  for (auto& node : nodes) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "WORLD_SIZE=2"));
  }
}

TEST_CASE("an etcd that refuses the job's state as too large ends every node saying so",
          "[etcd][rdzv]") {
  // A node's join fits in 1,200 bytes, the job's state with its notices does not: before, the
  // driver retried five times a second forever and the other node waited without a word.
  EtcdCluster etcd(1, std::nullopt, {"--max-request-bytes", "1200"});
  REQUIRE(etcd.wait_ready());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(etcd, i, {"--nnodes", "2"}, {"print=should-not-run"}));
  for (auto& node : nodes) {
    auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 69);
    CHECK(contains(r.err, "as too large ("));
    CHECK(contains(r.err, "raise --max-request-bytes on every etcd member"));
    CHECK_FALSE(contains(r.out, "should-not-run"));
  }
}

TEST_CASE("the keys of an etcd job whose agents all died expire with their leases",
          "[etcd][rdzv]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(start_node(etcd, i, {"--nnodes", "2"}, {"pidfile=" + pids, "hang"}));
  if (!wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit))
    FAIL(err_of(nodes, &etcd));
  CHECK(contains(job_keys(etcd), "/ddprun/job/state"));
  for (auto& node : nodes) {
    node->send(SIGKILL);
    node->wait(10s);
  }
  // The nodes' leases (3 s) go first; the job's lease (2 x 3 s + 10 s) takes `state` with it.
  CHECK(wait_until([&] { return job_keys(etcd).empty(); }, 40s));
  INFO(job_keys(etcd));
  for (const auto& [rank, pid] : read_pids(pids)) CHECK(wait_gone(pid));
}

TEST_CASE(
    "on etcd a node whose workers keep failing is quarantined, a spare finishes in its "
    "place, and the node rejoins as a spare after its cooldown",
    "[etcd][rdzv][spares]") {
  EtcdCluster etcd;
  REQUIRE(etcd.wait_ready());
  const std::vector<std::string> flags{"--nnodes",          "2", "--max_restarts",        "3",
                                       "--restart_backoff", "0", "--quarantine_cooldown", "1"};
  // As with the daemon (tests/integration/multinode_test.cpp): the bad node's workers fail
  // after 3 s each time, the good ones train 4 s a round.
  const std::vector<std::string> good{"env=GROUP_RANK", "sleep=4000", "exit=0"};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  nodes.push_back(start_node(etcd, 0, flags, good));
  nodes.push_back(start_node(etcd, 1, flags, {"env=GROUP_RANK", "sleep=3000", "exit=3"}));
  REQUIRE(nodes[0]->wait_for_output("GROUP_RANK=", kJobLimit));
  nodes.push_back(start_node(etcd, 2, flags, good));
  std::vector<CommandResult> results;
  for (auto& node : nodes) results.push_back(node->wait(kJobLimit));
  INFO(err_of(nodes));
  for (const auto& r : results) CHECK(r.exit_code == 0);
  const CommandResult& bad = results[1];
  CHECK(contains(bad.err, "is quarantined for 1 s"));
  CHECK(contains(bad.err, "its quarantine is over"));
  const std::string rank_a = contains(results[0].out, "GROUP_RANK=0") ? "0" : "1";
  const std::string rank_b = rank_a == "0" ? "1" : "0";
  CHECK_FALSE(contains(results[0].out, "GROUP_RANK=" + rank_b));
  CHECK(contains(results[2].out, "[default0]:GROUP_RANK=" + rank_b));
}
