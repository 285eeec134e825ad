// A broken or hostile peer on the rendezvous port, played by a raw socket, against the daemon
// and against an agent that hosts the rendezvous while its workers train: one bad connection is
// closed, everything else carries on (docs/operations.md#security).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "rendezvous/free_port.h"
#include "rendezvous/protocol.h"
#include "tests/integration/ddprun_runs.h"
#include "tests/integration/rdzv_fixtures.h"
#include "tests/support/raw_peer.h"

using namespace ddprun::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

/// The frames the issue reports as crashes: a number out of a double's range, and 100,000
/// nested arrays (about 200 KB) in the fields a refusal used to quote whole.
std::vector<std::string> crashing_bodies() {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  return {R"({"type":"hello","protocol":1e400})", R"({"type":"hello","protocol":-1e999})",
          R"({"type":)" + deep + R"(,"protocol":1})",
          R"({"type":"hello","protocol":)" + deep + "}"};
}

/// A join for job `run_id` from a made-up node.
json join_body(const std::string& run_id, const std::string& node) {
  ddprun::rdzv::Join join;
  join.run_id = run_id;
  join.node_id = node + ":1:x";
  join.name = node;
  join.addr = "127.0.0.1";
  join.master_port = 1;
  join.settings.min_nodes = 2;
  join.settings.max_nodes = 2;
  return ddprun::rdzv::to_json(ddprun::rdzv::AgentMessage{join});
}

}  // namespace

TEST_CASE("frames that used to crash the daemon close only their own connection",
          "[integration][security]") {
  Daemon daemon;
  RawPeer bystander(daemon.port);
  REQUIRE(bystander.greet());
  for (const std::string& body : crashing_bodies()) {
    INFO(body.substr(0, 60));
    RawPeer attacker(daemon.port);
    attacker.send_body(body);
    CHECK(attacker.closed_by_server(10s));
    CHECK(daemon.alive());
  }
  // The bystander's connection still works, and so does status.
  CHECK(bystander.send_json(
      ddprun::rdzv::to_json(ddprun::rdzv::AgentMessage{ddprun::rdzv::StatusQuery{}})));
  auto reply = bystander.read_frame(10s);
  REQUIRE(reply);
  CHECK((*reply)["type"] == "status_reply");
  CHECK(status_answers(daemon.port));
  const std::string log = daemon.process->err_so_far();
  CHECK(contains(log, "deeper than 32 levels"));
  CHECK(contains(log, "number overflow"));
}

TEST_CASE("a refusal quotes at most 64 characters of the peer's value", "[integration][security]") {
  Daemon daemon;
  RawPeer peer(daemon.port);
  peer.send_json(json{{"type", std::string(900'000, 'z')}, {"protocol", 1}});
  auto refused = peer.read_frame(10s);
  REQUIRE(refused);
  CHECK((*refused)["type"] == "refused");
  const std::string message = (*refused)["message"];
  CHECK(message.size() < 200);
  CHECK(contains(message, std::string(64, 'z') + "\"... (900000 bytes)"));
  CHECK(peer.closed_by_server(10s));
}

TEST_CASE("an agent hosting the rendezvous keeps training through frames that used to crash it",
          "[integration][security]") {
  HostingAgent agent;
  for (const std::string& body : crashing_bodies()) {
    RawPeer attacker(agent.port);
    attacker.send_body(body);
    CHECK(attacker.closed_by_server(10s));
  }
  CHECK(status_answers(agent.port));
  agent.finish();
}

TEST_CASE("a connection with no hello, or stalled inside a frame, is closed after its timeout",
          "[integration][security]") {
  Daemon daemon({"--hello_timeout", "0.3", "--stalled_frame_timeout", "0.5"});
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (int i = 0; i < 50; ++i) idle.push_back(std::make_unique<RawPeer>(daemon.port));
  idle.front()->send_bytes(std::string(2, '\0'));  // two bytes of a header, then silence
  RawPeer greeted(daemon.port);
  REQUIRE(greeted.greet());
  greeted.send_bytes(frame_header(100) + "{\"type\":");  // part of a frame, then silence
  for (auto& peer : idle) CHECK(peer->closed_by_server(10s));
  CHECK(greeted.closed_by_server(10s));
  // A greeted connection that is quiet between whole frames stays open.
  RawPeer quiet(daemon.port);
  REQUIRE(quiet.greet("status"));
  std::this_thread::sleep_for(1s);
  CHECK(quiet.send_json(
      ddprun::rdzv::to_json(ddprun::rdzv::AgentMessage{ddprun::rdzv::StatusQuery{}})));
  auto reply = quiet.read_frame(10s);
  REQUIRE(reply);
  CHECK((*reply)["type"] == "status_reply");
}

TEST_CASE("an agent hosting the rendezvous closes silent and stalled connections and trains on",
          "[integration][security]") {
  HostingAgent agent;
  // The embedded server's limits are the defaults: no hello within 10 s, no progress inside a
  // frame for 30 s.
  RawPeer silent(agent.port);
  RawPeer stalled(agent.port);
  REQUIRE(stalled.greet());
  stalled.send_bytes(frame_header(100) + "{\"type\":");
  CHECK(silent.closed_by_server(20s));
  CHECK(stalled.closed_by_server(40s));
  CHECK(contains(agent.err_so_far(), "closed: no hello within 10000 ms"));
  CHECK(contains(agent.err_so_far(), "no progress for 30000 ms"));
  CHECK(status_answers(agent.port));
  agent.finish();
}

TEST_CASE("partial frames over the daemon's input budget close the connection holding the most",
          "[integration][security]") {
  Daemon daemon({"--max_buffered_bytes", std::to_string(2 << 20)});
  const std::string part = frame_header(1 << 20) + std::string(900'000, ' ');
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i < 3; ++i) {
    peers.push_back(std::make_unique<RawPeer>(daemon.port));
    peers.back()->send_bytes(part);
  }
  // 2.7 MB against a 2 MiB budget: the connection holding the most is closed once the total
  // goes over, and its bytes go back to the budget, so the other two fit.
  int closed = 0;
  for (auto& peer : peers) closed += peer->closed_by_server(1s) ? 1 : 0;
  CHECK(closed == 1);
  CHECK(contains(daemon.process->err_so_far(), "it held the largest unfinished message"));
  CHECK(contains(daemon.process->err_so_far(), "over the server's limit of 2097152 bytes"));
  CHECK(status_answers(daemon.port));
  // Closing the third connection gave its bytes back to the budget.
  RawPeer fourth(daemon.port);
  fourth.send_bytes(frame_header(1 << 20) + std::string(100'000, ' '));
  CHECK_FALSE(fourth.closed_by_server(300ms));
}

TEST_CASE("a daemon at its job limit refuses a new job and keeps the ones it has",
          "[integration][security]") {
  Daemon daemon({"--max_jobs", "2"});
  std::vector<std::unique_ptr<RawPeer>> nodes;
  for (const std::string run_id : {"a", "b", "c"}) {
    nodes.push_back(std::make_unique<RawPeer>(daemon.port));
    REQUIRE(nodes.back()->greet());
    nodes.back()->send_json(join_body(run_id, "n-" + run_id));
  }
  auto refused = nodes[2]->read_frame(10s);
  REQUIRE(refused);
  CHECK((*refused)["type"] == "refused");
  CHECK(contains((*refused)["message"], "holds 2 jobs, its limit"));
  CHECK(contains((*refused)["message"], "--max_jobs"));
  // The jobs it holds still hear about their rounds.
  auto waiting = nodes[0]->read_frame(10s);
  REQUIRE(waiting);
  CHECK((*waiting)["type"] == "waiting");
}

TEST_CASE("a daemon stopped for longer than the keep-alive window loses no node",
          "[integration][security]") {
  Daemon daemon;
  TempDir dir;
  const std::string gate = dir.path() + "/gate";
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);
  // keep-alive 0.2 s x 3: a 3 s stop is five windows.
  auto nodes = start_two_nodes(endpoint, {"--nnodes", "2"},
                               {"print=started", "wait_lines=" + gate + ":1", "print=finished"});
  for (auto& node : nodes) REQUIRE(node->wait_for_output("started", kJobLimit));
  daemon.process->send(SIGSTOP);
  std::this_thread::sleep_for(3s);
  daemon.process->send(SIGCONT);
  // Longer than a window after the daemon resumed: a loss would have been declared by now.
  std::this_thread::sleep_for(1500ms);
  std::ofstream(gate) << "go\n";
  for (auto& node : nodes) {
    const auto r = node->wait(kJobLimit);
    INFO(r.out << r.err << daemon.process->err_so_far());
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "finished"));
    CHECK_FALSE(contains(r.err, "was lost"));
    CHECK_FALSE(contains(r.out + r.err, "TORCHELASTIC_RESTART_COUNT=1"));
  }
  CHECK(contains(daemon.process->err_so_far(), "did not run for"));
  CHECK_FALSE(contains(daemon.process->err_so_far(), "was lost"));
}

TEST_CASE("with a shared secret a job trains through the daemon and strangers get nothing",
          "[integration][security]") {
  TempDir dir;
  const std::string secret = secret_file(dir, "secret", "s3cret-0123456789abcdef");
  const std::string wrong = secret_file(dir, "wrong", "not-the-secret-0123456789");
  Daemon daemon({"--secret_file", secret});
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);
  CHECK(contains(daemon.process->err_so_far(), "shared secret required"));
  CHECK_FALSE(contains(daemon.process->err_so_far(), "anyone who can reach"));

  // A raw peer without the secret is challenged, and nothing else is answered.
  RawPeer stranger(daemon.port);
  stranger.send_json(ddprun::rdzv::make_hello("status"));
  stranger.send_json(
      ddprun::rdzv::to_json(ddprun::rdzv::AgentMessage{ddprun::rdzv::StatusQuery{}}));
  auto challenge = stranger.read_frame(10s);
  REQUIRE(challenge);
  CHECK((*challenge)["type"] == "refused");
  CHECK((*challenge)["kind"] == "unauthorized");
  CHECK(stranger.closed_by_server(10s));

  auto none = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint});
  CHECK(none.exit_code == 69);
  CHECK(
      contains(none.err, "authentication failed: the rendezvous server requires a shared secret"));
  auto bad =
      run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint, "--secret_file", wrong});
  CHECK(bad.exit_code == 69);
  CHECK(contains(bad.err, "authentication failed: wrong secret"));
  CHECK(contains(daemon.process->err_so_far(), "authentication failed: wrong secret"));

  auto nodes =
      start_two_nodes(endpoint, {"--nnodes", "2"}, {"print=started", "sleep=500", "env=RANK"},
                      ",secret_file=" + secret);
  // While they train, ddprun status with the secret (from the environment) sees the job.
  REQUIRE(nodes[0]->wait_for_output("started", kJobLimit));
  auto ok = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint},
                        {{"DDPRUN_RDZV_SECRET_FILE", secret}});
  CHECK(ok.exit_code == 0);
  CHECK(contains(ok.out, "job job"));
  for (auto& node : nodes) {
    const auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
  }
  // A node with the wrong secret is refused with exit 69 and joins nothing.
  auto intruder = run_command(
      ddprun_fake({"--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                   "--rdzv_id", "job2", "--rdzv_conf", "connect_timeout=5,secret_file=" + wrong},
                  {"print=should-not-run"}),
      {}, kJobLimit);
  INFO(intruder.out << intruder.err);
  CHECK(intruder.exit_code == 69);
  CHECK(contains(intruder.err, "authentication failed: wrong secret"));
  CHECK_FALSE(contains(intruder.out, "should-not-run"));
}

TEST_CASE("an agent hosting the rendezvous with a secret trains and refuses strangers",
          "[integration][security]") {
  TempDir dir;
  const std::string secret = secret_file(dir, "secret", "s3cret-0123456789abcdef");
  HostingAgent agent({}, {{"DDPRUN_RDZV_SECRET_FILE", secret}});
  auto none = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", agent.endpoint});
  CHECK(none.exit_code == 69);
  CHECK(contains(none.err, "authentication failed"));
  auto ok = run_command(
      {DDPRUN_BIN, "status", "--rdzv_endpoint", agent.endpoint, "--secret_file", secret});
  CHECK(ok.exit_code == 0);
  agent.finish();
}

TEST_CASE("a secret file readable by others is refused before anything starts",
          "[integration][security]") {
  TempDir dir;
  const std::string open = dir.path() + "/open";
  std::ofstream(open) << "s3cret-0123456789abcdef\n";
  ::chmod(open.c_str(), 0644);
  auto daemon =
      run_command({RDZVD_BIN, "--port", std::to_string(free_port()), "--secret_file", open});
  CHECK(daemon.exit_code == 64);
  CHECK(contains(daemon.err, "secret file " + open +
                                 " is readable by group or others (mode 644): "
                                 "run chmod 600 " +
                                 open));
  auto agent =
      run_command(ddprun_fake({"--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                               "127.0.0.1:1", "--rdzv_conf", "secret_file=" + open},
                              {"print=x"}));
  CHECK(agent.exit_code == 64);
  CHECK(contains(agent.err, "run chmod 600 " + open));
}

namespace {

// Fills a daemon with `jobs` empty jobs, reads them all back with `ddprun status --json` and
// checks that one more job is refused at the cap.
void check_status_reads_back(int jobs) {
  Daemon daemon({"--max_jobs", std::to_string(jobs)});
  constexpr int kBatch = 250;
  // Each job: one connection that greets, joins (a 2-node job that never completes, with a
  // day-long join timeout) and waits for the server's Waiting before it closes, so the job
  // stays, empty, until its join timeout.
  for (int first = 0; first < jobs; first += kBatch) {
    std::vector<std::unique_ptr<RawPeer>> batch;
    for (int i = first; i < std::min(jobs, first + kBatch); ++i) {
      batch.push_back(std::make_unique<RawPeer>(daemon.port));
      json join = join_body("job-" + std::to_string(i), "n" + std::to_string(i));
      join["settings"]["join_timeout_ms"] = 86'400'000;
      REQUIRE(batch.back()->send_json(ddprun::rdzv::make_hello("agent")));
      REQUIRE(batch.back()->send_json(join));
    }
    for (auto& peer : batch) {
      REQUIRE(peer->read_frame(30s));  // the server's hello
      auto waiting = peer->read_frame(30s);
      REQUIRE(waiting);
      REQUIRE((*waiting)["type"] == "waiting");
      peer->reset_on_close();
    }
  }
  const std::string endpoint = "127.0.0.1:" + std::to_string(daemon.port);
  auto r =
      run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint, "--json", "--timeout", "120"},
                  {}, std::chrono::seconds(180));
  REQUIRE(r.exit_code == 0);
  const json listed = json::parse(r.out);
  CHECK(listed.size() == static_cast<std::size_t>(jobs));
  std::set<std::string> ids;
  for (const json& job : listed) ids.insert(job["run_id"].get<std::string>());
  CHECK(ids.size() == static_cast<std::size_t>(jobs));
  CHECK(ids.count("job-0") == 1);
  CHECK(ids.count("job-" + std::to_string(jobs - 1)) == 1);
  // One more job is over the cap.
  RawPeer extra(daemon.port);
  extra.send_json(ddprun::rdzv::make_hello("agent"));
  extra.send_json(join_body("one-too-many", "x"));
  extra.read_frame(30s);
  auto refused = extra.read_frame(30s);
  REQUIRE(refused);
  CHECK(contains((*refused)["message"], "holds " + std::to_string(jobs) + " jobs, its limit"));
}

}  // namespace

// Several 64 KiB pages: this one also runs in the sanitizer build.
TEST_CASE("ddprun status reads back three thousand jobs in pages", "[integration][security]") {
  check_status_reads_back(3'000);
}

// The issue's figure. Tagged [plain-only]: left out of the sanitizer build, where 100,000
// connections take about two minutes (ten seconds in the plain build).
TEST_CASE("ddprun status reads back a hundred thousand jobs in pages",
          "[integration][security][plain-only]") {
  check_status_reads_back(100'000);
}

TEST_CASE("a stranger can neither read node ids nor take group rank 0 nor spend the budget",
          "[integration][security]") {
  // Against the daemon, and against the rendezvous one of the two agents hosts.
  const bool hosted = GENERATE(false, true);
  INFO((hosted ? "agent-hosted rendezvous" : "daemon"));
  std::optional<Daemon> daemon;
  if (!hosted) daemon.emplace();
  const int port = hosted ? free_port() : daemon->port;
  TempDir dir;
  const std::string gate = dir.path() + "/gate";
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto nodes = start_two_nodes(endpoint, {"--nnodes", "2:3", "--max_restarts", "2"},
                               {"env=MASTER_ADDR,TORCHELASTIC_RESTART_COUNT",
                                "wait_lines=" + gate + ":1", "print=finished"});
  for (auto& node : nodes) REQUIRE(node->wait_for_output("MASTER_ADDR=", kJobLimit));
  auto status = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint", endpoint, "--json"});
  REQUIRE(status.exit_code == 0);
  CHECK_FALSE(contains(status.out, "node_id"));
  CHECK_FALSE(contains(status.out, ":" + std::to_string(nodes[0]->pid()) + ":"));

  // A stranger claims node_rank 0 of the running elastic job: refused, nothing restarts.
  RawPeer stranger(port);
  REQUIRE(stranger.greet());
  json join = join_body("job", "stranger");
  join["settings"] = {{"min_nodes", 2},
                      {"max_nodes", 3},
                      {"nproc_per_node", 1},
                      {"max_restarts", 2},
                      {"join_timeout_ms", 60000},
                      {"last_call_timeout_ms", 1000},
                      {"close_timeout_ms", 30000},
                      {"keep_alive_interval_ms", 200},
                      {"keep_alive_max_attempt", 3}};
  join["node_rank"] = 0;
  stranger.send_json(join);
  auto refused = stranger.read_frame(10s);
  REQUIRE(refused);
  CHECK((*refused)["type"] == "refused");
  CHECK(contains((*refused)["message"], "holds group rank 0"));

  // Another claims an impossible restart count: refused too.
  RawPeer liar(port);
  REQUIRE(liar.greet());
  join["node_rank"] = nullptr;
  join["node_id"] = "liar:1:x";
  join["restart_count"] = 2147483647;
  liar.send_json(join);
  auto refused_liar = liar.read_frame(10s);
  REQUIRE(refused_liar);
  CHECK(contains((*refused_liar)["message"], "impossible with --max_restarts 2"));

  // A third re-registers a made-up round with restarts to spend: it alone is told to stop.
  RawPeer claimer(port);
  REQUIRE(claimer.greet());
  json claim_join = join;
  claim_join["node_id"] = "claimer:1:x";
  claim_join["restart_count"] = 2;
  claim_join["resume"] = {
      {"round", 9},         {"group_rank", 0},           {"group_world_size", 2},
      {"restart_count", 2}, {"master_addr", "10.9.9.9"}, {"master_port", 1},
      {"succeeded", false}};
  claimer.send_json(claim_join);
  auto told = claimer.read_frame(10s);
  REQUIRE(told);
  CHECK((*told)["type"] == "restart");
  CHECK(contains((*told)["reason"], "without it"));

  std::ofstream(gate) << "go\n";
  for (auto& node : nodes) {
    const auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "finished"));
    CHECK(count_of(r.out, "MASTER_ADDR=") == 1);  // one round: nobody restarted
    // Group rank 0 stayed with one of the two real nodes.
    const bool real_master = contains(r.out, "MASTER_ADDR=" + loopback_node_addr(0)) ||
                             contains(r.out, "MASTER_ADDR=" + loopback_node_addr(1));
    CHECK(real_master);
  }
}

TEST_CASE(
    "an agent hosting the rendezvous stopped for longer than the keep-alive window loses "
    "no node",
    "[integration][security]") {
  TempDir dir;
  const std::string gate = dir.path() + "/gate";
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  // The first node hosts the rendezvous (the endpoint is this machine, the port free); the
  // second joins as a client.
  Subprocess host(ddprun_fake({"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                               "--rdzv_endpoint", endpoint, "--rdzv_id", "job", "--local_addr",
                               loopback_node_addr(0), "--rdzv_conf", kFastRdzvConf},
                              {"print=started", "wait_lines=" + gate + ":1", "print=finished"}));
  REQUIRE(
      wait_until([&] { return contains(host.err_so_far(), "hosting the rendezvous"); }, kJobLimit));
  Subprocess client(
      ddprun_fake({"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                   "--rdzv_endpoint", endpoint, "--rdzv_id", "job", "--local_addr",
                   loopback_node_addr(1), "--rdzv_conf", kFastRdzvConf + ",is_host=0"},
                  {"print=started", "wait_lines=" + gate + ":1", "print=finished"}));
  REQUIRE(host.wait_for_output("started", kJobLimit));
  REQUIRE(client.wait_for_output("started", kJobLimit));
  // The hosting agent (not its worker) stops for five keep-alive windows.
  host.send(SIGSTOP);
  std::this_thread::sleep_for(3s);
  host.send(SIGCONT);
  std::this_thread::sleep_for(1500ms);
  std::ofstream(gate) << "go\n";
  for (Subprocess* node : {&host, &client}) {
    const auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "finished"));
    CHECK_FALSE(contains(r.err, "was lost"));
  }
  CHECK(contains(host.err_so_far(), "did not run for"));
}

// [plain-only]: under the sanitizers, their runtime fails for want of a descriptor too.
TEST_CASE(
    "idle strangers beyond a quarter of the descriptors close the oldest, and status is served",
    "[integration][security][plain-only]") {
  const int port = free_port();
  // 64 descriptors in all (soft and hard, so the daemon cannot raise them): 16 for
  // connections that have not said hello; 80 idle peers are far more.
  Subprocess daemon({"/bin/bash", "-c",
                     std::string("ulimit -n 64 && exec ") + RDZVD_BIN + " --port " +
                         std::to_string(port) + " --host 127.0.0.1"});
  REQUIRE(wait_until([&] { return contains(daemon.err_so_far(), "listening on"); }, 10s));
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (int i = 0; i < 80; ++i) idle.push_back(std::make_unique<RawPeer>(port));
  // The oldest are closed as newer ones come: the first peer is long gone, the last is not.
  CHECK(idle.front()->closed_by_server(10s));
  CHECK(wait_until([&] { return contains(daemon.err_so_far(), "had not said hello"); }, 10s));
  // ddprun status greets at once and is served while the idle peers stay connected.
  CHECK(status_answers(port));
  CHECK_FALSE(contains(daemon.err_so_far(), "accepting rendezvous connections fails"));
  CHECK(process_alive(daemon.pid()));
  daemon.send(SIGTERM);
  daemon.wait(10s);
}

// [plain-only]: as above, the sanitizers' runtime needs descriptors of its own.
TEST_CASE(
    "ddprun status and an agent get through a sustained flood of connections that never "
    "greet",
    "[integration][security][plain-only]") {
  TempDir dir;
  const std::string secret = secret_file(dir, "secret", "s3cret-0123456789abcdef");
  const int port = free_port();
  Subprocess daemon({"/bin/bash", "-c",
                     std::string("ulimit -n 256 && exec ") + RDZVD_BIN + " --port " +
                         std::to_string(port) + " --host 127.0.0.1 --secret_file " + secret});
  REQUIRE(wait_until([&] { return contains(daemon.err_so_far(), "listening on"); }, 10s));
  // The flood: 400 connections held open, each replaced by a new one once the server closes
  // it, for as long as the checks below run (at most 60 s). Raw non-blocking sockets: no
  // assertion runs on this thread.
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    auto open_one = [&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<std::uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      linger no_linger{1, 0};  // reset on close: no TIME_WAIT left behind
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_linger, sizeof no_linger);
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);  // EINPROGRESS
      return fd;
    };
    std::vector<int> peers;
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (!stop && std::chrono::steady_clock::now() < until) {
      if (peers.size() < 400) {
        peers.push_back(open_one());
        continue;
      }
      for (int& fd : peers) {
        char byte;
        const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          ::close(fd);  // closed (or refused) by the server: the flood replaces it
          fd = open_one();
        }
      }
      std::this_thread::sleep_for(5ms);
    }
    for (int fd : peers) ::close(fd);
  });
  std::this_thread::sleep_for(1s);
  for (int i = 0; i < 5; ++i) {
    auto r = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint",
                          "127.0.0.1:" + std::to_string(port), "--secret_file", secret},
                         {}, 20s);
    INFO("status call " << i << ": " << r.out << r.err);
    CHECK((r.exit_code == 0 || r.exit_code == 1));
  }
  auto nodes = start_two_nodes("127.0.0.1:" + std::to_string(port), {"--nnodes", "2"},
                               {"print=trained"}, ",secret_file=" + secret);
  for (auto& node : nodes) {
    const auto r = node->wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "trained"));
  }
  stop = true;
  flood.join();
  CHECK(process_alive(daemon.pid()));
  daemon.send(SIGTERM);
  daemon.wait(10s);
}

TEST_CASE("ddprun status asks again, three times in all, when the server closes before a word",
          "[integration][security]") {
  // A listener that closes every connection at once without a byte, as a daemon flooded with
  // connections that never greet closes the oldest of those still silent.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 16) == 0);
  socklen_t length = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  const int port = ntohs(addr.sin_port);
  std::atomic<int> accepted{0};
  std::atomic<bool> stop{false};
  std::thread closer([&] {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!stop && std::chrono::steady_clock::now() < until) {
      pollfd ready{listener, POLLIN, 0};
      if (::poll(&ready, 1, 50) != 1) continue;
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++accepted;
      ::close(fd);
    }
  });
  const auto r = run_command({DDPRUN_BIN, "status", "--rdzv_endpoint",
                              "127.0.0.1:" + std::to_string(port), "--timeout", "10"},
                             {}, 20s);
  stop = true;
  closer.join();
  ::close(listener);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 69);
  CHECK(contains(r.err, "the server closed the connection without a hello"));
  CHECK(accepted == 3);
}

TEST_CASE("a daemon told to stop ends its connections and exits 0 at once, peers or not",
          "[integration][security]") {
  Daemon daemon;
  RawPeer greeted(daemon.port);
  REQUIRE(greeted.greet());
  RawPeer silent(daemon.port);  // no hello, never reads
  const auto sent = std::chrono::steady_clock::now();
  daemon.process->send(SIGTERM);
  const auto r = daemon.process->wait(10s);
  INFO(r.err);
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  // Shutdown is cancellation with a deadline (2 s), never a hang on a connected peer.
  CHECK(std::chrono::steady_clock::now() - sent < 5s);
  CHECK(greeted.closed_by_server(5s));
  CHECK(silent.closed_by_server(5s));
}

TEST_CASE("a join with settings no job can run with is refused in the user's words",
          "[integration][security]") {
  Daemon daemon;
  RawPeer peer(daemon.port);
  REQUIRE(peer.greet());
  json join = join_body("bad", "n1");
  join["settings"]["min_nodes"] = 5;
  join["settings"]["max_nodes"] = 3;
  peer.send_json(join);
  auto refused = peer.read_frame(10s);
  REQUIRE(refused);
  CHECK((*refused)["type"] == "refused");
  CHECK((*refused)["message"] ==
        "node n1 was started with --nnodes 5:3: the minimum (5) is larger than the maximum (3)");
  CHECK(peer.closed_by_server(10s));
  // The refused first join left no job behind.
  RawPeer asker(daemon.port);
  REQUIRE(asker.greet());
  asker.send_json(ddprun::rdzv::to_json(ddprun::rdzv::AgentMessage{ddprun::rdzv::StatusQuery{}}));
  auto reply = asker.read_frame(10s);
  REQUIRE(reply);
  CHECK((*reply)["jobs"].empty());
}
