// Both endpoints scraped during a real job: a worker fails once, the job restarts, and the
// counters move; promtool accepts what they serve.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "rendezvous/protocol.h"
#include "tests/integration/rdzv_fixtures.h"
#include "tests/metrics/http_client.h"
#include "tests/support/raw_peer.h"

namespace ddprun::testing {
namespace {

using namespace std::chrono_literals;

const char* const kPromtool = "/usr/bin/promtool";

/// `promtool check metrics` on `text`: "" when it accepts it, else what it said.
std::string promtool_problems(const std::string& text, const TempDir& dir) {
  const std::string path = dir.path() + "/scrape.txt";
  std::ofstream(path) << text;
  auto r = run_command({"/bin/sh", "-c", std::string(kPromtool) + " check metrics < " + path});
  return r.exit_code == 0 ? "" : "exit " + std::to_string(r.exit_code) + ": " + r.out + r.err;
}

/// Polls the endpoint until `series` has at least `value` (bounded); the last scrape.
std::string scrape_until(int port, const std::string& series, double value) {
  std::string text;
  wait_until(
      [&] {
        text = http_get(port, "/metrics").body;
        return sample(text, series) >= value;
      },
      kJobLimit);
  return text;
}

}  // namespace

TEST_CASE("a restart moves the counters of the daemon and the agent and promtool accepts both",
          "[metrics][integration]") {
  TempDir dir;
  const int daemon_metrics = free_port();
  Daemon daemon({"--metrics_port", std::to_string(daemon_metrics)});
  REQUIRE(contains(daemon.process->err_so_far(), "serving metrics on http://127.0.0.1:"));
  const int agent_metrics = free_port();
  const std::string gate = dir.path() + "/gate";
  // One node, one worker: it fails in the first round, runs in the second until the gate opens.
  Subprocess agent(ddprun_fake(
      {"--nnodes", "1", "--nproc_per_node", "1", "--max_restarts", "1", "--rdzv_backend", "c10d",
       "--rdzv_endpoint", "127.0.0.1:" + std::to_string(daemon.port), "--rdzv_id", "job",
       "--rdzv_conf", kFastRdzvConf, "--metrics_port", std::to_string(agent_metrics)},
      {"exit_if_restart=0:3", "print=running", "wait_lines=" + gate + ":1"}));
  REQUIRE(agent.wait_for_output("running", kJobLimit));

  const std::string agent_text = scrape_until(agent_metrics, "ddprun_agent_workers", 1);
  INFO(agent_text);
  CHECK(sample(agent_text, "ddprun_agent_restarts_total") == 1);
  CHECK(sample(agent_text, "ddprun_agent_job_restarts") == 1);
  CHECK(sample(agent_text, "ddprun_agent_worker_failures_total{kind=\"exit\"}") == 1);
  CHECK(sample(agent_text, "ddprun_agent_rendezvous_round") == 1);
  CHECK(sample(agent_text, "ddprun_agent_recoveries_total") == 1);
  CHECK(sample(agent_text, "ddprun_agent_last_recovery_phase_seconds{phase=\"total\"}") > 0);

  const std::string daemon_text =
      scrape_until(daemon_metrics, "ddprun_rdzv_rounds_completed_total", 2);
  INFO(daemon_text);
  CHECK(sample(daemon_text, "ddprun_rdzv_rounds_completed_total") == 2);
  CHECK(sample(daemon_text, "ddprun_rdzv_restarts_total") == 1);
  CHECK(sample(daemon_text, "ddprun_rdzv_jobs{phase=\"running\"}") == 1);
  CHECK(sample(daemon_text, "ddprun_rdzv_job_nodes{job=\"job\"}") == 1);
  CHECK(sample(daemon_text, "ddprun_rdzv_round_latency_seconds_count") == 2);
  CHECK(sample(daemon_text, "ddprun_rdzv_connections") >= 1);
  CHECK(sample(daemon_text, "ddprun_rdzv_node_losses_total") == 0);

  if (::access(kPromtool, X_OK) != 0) {
    WARN("promtool is missing (Debian's prometheus package): the format check is skipped");
  } else {
    CHECK(promtool_problems(agent_text, dir) == "");
    CHECK(promtool_problems(daemon_text, dir) == "");
  }

  std::ofstream(gate) << "go\n";
  auto r = agent.wait(kJobLimit);
  CHECK(r.exit_code == 0);
  // The agent's endpoint goes away with the job.
  CHECK(http_get(agent_metrics, "/metrics", 2s).status == 0);
}

TEST_CASE("a node killed mid-round counts as a lost node on the daemon", "[metrics][integration]") {
  const int daemon_metrics = free_port();
  Daemon daemon({"--metrics_port", std::to_string(daemon_metrics)});
  auto nodes = start_two_nodes("127.0.0.1:" + std::to_string(daemon.port),
                               {"--nnodes", "2", "--max_restarts", "1"}, {"print=running", "hang"});
  for (auto& node : nodes) REQUIRE(node->wait_for_output("running", kJobLimit));
  nodes[1]->send(SIGKILL);
  const std::string text = scrape_until(daemon_metrics, "ddprun_rdzv_node_losses_total", 1);
  INFO(text);
  CHECK(sample(text, "ddprun_rdzv_node_losses_total") == 1);
  CHECK(sample(text, "ddprun_rdzv_restarts_total") == 1);
  nodes[0]->send(SIGTERM);
  nodes[0]->wait(kJobLimit);
}

TEST_CASE("refused strangers and the nodes of finished jobs leave no connection on the daemon",
          "[metrics][integration][security]") {
  TempDir dir;
  const std::string secret = secret_file(dir, "secret", "s3cret-0123456789abcdef");
  const int daemon_metrics = free_port();
  Daemon daemon({"--secret_file", secret, "--metrics_port", std::to_string(daemon_metrics)});
  // 300 strangers without the secret: each says hello, is refused, and the server closes.
  for (int i = 0; i < 300; ++i) {
    RawPeer stranger(daemon.port);
    stranger.reset_on_close();
    stranger.send_json(ddprun::rdzv::make_hello("agent"));
    auto refused = stranger.read_frame(10s);
    REQUIRE(refused);
    REQUIRE((*refused)["type"] == "refused");
    REQUIRE(stranger.closed_by_server(10s));
  }
  // Each refused connection's session is gone with its socket (they used to stay for good).
  std::string text;
  CHECK(wait_until(
      [&] {
        text = http_get(daemon_metrics, "/metrics").body;
        return sample(text, "ddprun_rdzv_connections") == 0;
      },
      10s));
  INFO(text);
  CHECK(sample(text, "ddprun_rdzv_authentication_failures_total") == 300);

  // Two jobs of two nodes each run to the end: none of their four connections stays.
  for (const std::string job : {"a", "b"}) {
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int i = 0; i < 2; ++i)
      nodes.push_back(std::make_unique<Subprocess>(ddprun_fake(
          {"--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
           "127.0.0.1:" + std::to_string(daemon.port), "--rdzv_id", job, "--local_addr",
           loopback_node_addr(i), "--rdzv_conf", kFastRdzvConf + ",secret_file=" + secret},
          {"exit=0"})));
    for (auto& node : nodes) {
      const auto r = node->wait(kJobLimit);
      INFO(r.out << r.err);
      CHECK(r.exit_code == 0);
    }
  }
  CHECK(wait_until(
      [&] {
        text = http_get(daemon_metrics, "/metrics").body;
        return sample(text, "ddprun_rdzv_connections") == 0;
      },
      10s));
  CHECK(sample(text, "ddprun_rdzv_connections") == 0);
  // The two jobs are held as closed for close_timeout (30 s): their nodes are not live.
  CHECK(sample(text, "ddprun_rdzv_jobs{phase=\"closed\"}") == 2);
  CHECK(sample(text, "ddprun_rdzv_nodes") == 0);
  CHECK(std::isnan(sample(text, "ddprun_rdzv_job_nodes{job=\"a\"}")));
  CHECK(sample(text, "ddprun_rdzv_nodes_by_state{state=\"succeeded\"}") == 0);
}

TEST_CASE("the daemon's metrics port survives garbage and a silent client",
          "[metrics][integration]") {
  const int daemon_metrics = free_port();
  Daemon daemon({"--metrics_port", std::to_string(daemon_metrics)});
  HttpPeer silent(daemon_metrics);
  HttpPeer garbage(daemon_metrics);
  garbage.send_bytes(std::string(100'000, '\xff'));  // may be cut short: the server closes
  garbage.read_to_end(10s);
  const auto reply = http_get(daemon_metrics, "/metrics");
  CHECK(reply.status == 200);
  CHECK(sample(reply.body, "ddprun_rdzv_jobs{phase=\"running\"}") == 0);
  CHECK(daemon.alive());
  CHECK(status_answers(daemon.port));  // the rendezvous port too
}

TEST_CASE("the metrics port binds to loopback unless --metrics_host says otherwise",
          "[metrics][integration]") {
  const int daemon_metrics = free_port();
  Daemon daemon({"--metrics_port", std::to_string(daemon_metrics)});
  CHECK(contains(daemon.process->err_so_far(),
                 "serving metrics on http://127.0.0.1:" + std::to_string(daemon_metrics)));
  auto r = run_command({RDZVD_BIN, "--port", std::to_string(free_port()), "--metrics_port",
                        std::to_string(daemon_metrics)},
                       {}, 10s);
  CHECK(r.exit_code == 64);  // the port is taken: a usage error, named
  CHECK(contains(r.err, "pick another --metrics_port"));
}

TEST_CASE("ddprun refuses a bad --metrics_port or an empty --metrics_host before it starts",
          "[metrics][integration]") {
  auto r = run_command(ddprun_fake({"--metrics_port", "70000"}, {"exit=0"}), {}, 10s);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "--metrics_port 70000: expected a port 1..65535"));
  r = run_command(ddprun_fake({"--metrics_port", "9400", "--metrics_host", ""}, {"exit=0"}), {},
                  10s);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "needs a host name or address"));
  // Taken by another program: the job does not start.
  const int port = free_port();
  Daemon daemon({"--metrics_port", std::to_string(port)});
  r = run_command(ddprun_fake({"--metrics_port", std::to_string(port)}, {"print=ran"}), {}, 10s);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "pick another --metrics_port"));
  CHECK_FALSE(contains(r.out, "ran"));
}

}  // namespace ddprun::testing
