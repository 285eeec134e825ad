#include "launcher/rdzv_plan.h"
#include "launcher/cli.h"

#include <catch2/catch.hpp>

using namespace ddprun::launcher;
using namespace std::chrono_literals;

namespace {

bool local_if_head(const std::string& host) { return host == "head" || host == "127.0.0.1"; }

LaunchConfig c10d(int min_nodes, int max_nodes, const std::string& endpoint) {
  LaunchConfig config = default_launch_config();
  config.min_nodes = min_nodes;
  config.max_nodes = max_nodes;
  config.rdzv_backend = "c10d";
  config.rdzv_endpoint = endpoint;
  config.rdzv_id = "job";
  return config;
}

RendezvousPlan plan_of(const LaunchConfig& config, int nproc = 2) {
  auto planned = plan_rendezvous(config, nproc, "worker7", local_if_head);
  INFO((planned ? "" : planned.error().message));
  REQUIRE(planned.ok());
  return *planned;
}

std::string error_of(const LaunchConfig& config) {
  auto planned = plan_rendezvous(config, 2, "worker7", local_if_head);
  REQUIRE_FALSE(planned.ok());
  return planned.error().message;
}

}  // namespace

TEST_CASE("one node without an endpoint needs no rendezvous server", "[launcher][unit]") {
  LaunchConfig standalone = default_launch_config();
  standalone.standalone = true;
  CHECK(plan_of(standalone).single_node);
  CHECK(plan_of(default_launch_config()).single_node);
}

TEST_CASE("a c10d job hosts the server on the endpoint's machine and joins it elsewhere",
          "[launcher][unit]") {
  auto head = plan_of(c10d(2, 4, "head:29603"));
  CHECK_FALSE(head.single_node);
  CHECK(head.hosting == Hosting::Auto);
  CHECK(head.listen_port == 29603);
  CHECK(head.client.endpoint_host == "head");
  CHECK(head.client.name == "worker7");
  CHECK(head.client.settings.min_nodes == 2);
  CHECK(head.client.settings.max_nodes == 4);
  CHECK(head.client.settings.nproc_per_node == 2);
  CHECK(plan_of(c10d(2, 4, "other:29603")).hosting == Hosting::Never);
  CHECK(plan_of(c10d(2, 2, "[::1]")).client.endpoint_port == 29400);
}

TEST_CASE("the --rdzv_conf settings set the timeouts and force hosting either way",
          "[launcher][unit]") {
  LaunchConfig config = c10d(2, 2, "other:1234");
  config.rdzv_conf = {{"join_timeout", "12.5"},       {"last_call_timeout", "2"},
                      {"keep_alive_interval", "0.5"}, {"keep_alive_max_attempt", "4"},
                      {"connect_timeout", "7"},       {"is_host", "1"}};
  config.local_addr = "10.0.0.7";
  auto plan = plan_of(config);
  CHECK(plan.hosting == Hosting::Always);
  CHECK(plan.client.settings.join_timeout == 12500ms);
  CHECK(plan.client.settings.last_call_timeout == 2s);
  CHECK(plan.client.settings.keep_alive_window() == 2s);
  CHECK(plan.client.connect_timeout == 7s);
  CHECK(plan.client.name == "10.0.0.7");
  config.rdzv_conf = {{"is_host", "false"}};
  config.rdzv_endpoint = "head:1234";
  CHECK(plan_of(config).hosting == Hosting::Never);
}

TEST_CASE("the restart back-off travels to the rendezvous, which waits out the pause",
          "[launcher][unit][policy]") {
  LaunchConfig config = c10d(2, 2, "head:1234");
  CHECK(plan_of(config).client.settings.restart_backoff == 1s);  // the flag's default, 1:30
  CHECK(plan_of(config).client.settings.restart_backoff_max == 30s);
  config.restart_backoff = 2.5;
  config.restart_backoff_max = 120;
  const auto plan = plan_of(config);
  CHECK(plan.client.settings.restart_backoff == 2500ms);
  CHECK(plan.client.settings.restart_backoff_max == 120s);
}

TEST_CASE("the static backend keeps --master_port for workers and meets one port above",
          "[launcher][unit]") {
  LaunchConfig config = default_launch_config();
  config.min_nodes = config.max_nodes = 2;
  config.master_addr = "head";
  config.master_port = 29500;
  config.node_rank = 0;
  auto node0 = plan_of(config);
  CHECK(node0.client.backend == "static");
  CHECK(node0.hosting == Hosting::Always);
  CHECK(node0.client.endpoint_host == "head");
  CHECK(node0.client.endpoint_port == 29501);
  CHECK(node0.client.master_port == 29500);
  CHECK(node0.client.master_addr == "head");
  config.node_rank = 1;
  CHECK(plan_of(config).hosting == Hosting::Never);
}

TEST_CASE("impossible rendezvous settings are refused naming the values", "[launcher][unit]") {
  LaunchConfig elastic_static = default_launch_config();
  elastic_static.min_nodes = 2;
  elastic_static.max_nodes = 3;
  elastic_static.node_rank = 0;
  CHECK(error_of(elastic_static).find("--nnodes (got 2:3)") != std::string::npos);
  LaunchConfig no_rank = default_launch_config();
  no_rank.min_nodes = no_rank.max_nodes = 2;
  CHECK(error_of(no_rank).find("needs --node_rank on every node (0..1)") != std::string::npos);
  LaunchConfig far = c10d(2, 2, "head:1");
  far.node_rank = 5;
  CHECK(error_of(far).find("--node_rank 5 is out of range for --nnodes 2:2") != std::string::npos);
  CHECK(error_of(c10d(2, 2, "head:0")).find("port 0") != std::string::npos);
}

TEST_CASE("an etcd-v3 job lists every member and hosts nothing", "[launcher][unit]") {
  LaunchConfig config = c10d(2, 3, "head:2379,10.0.0.2,[fd00::1]:2380");
  config.rdzv_backend = "etcd-v3";
  config.rdzv_conf["keep_alive_interval"] = "1";
  const RendezvousPlan plan = plan_of(config);
  CHECK_FALSE(plan.single_node);
  CHECK(plan.hosting == Hosting::Never);
  REQUIRE(plan.etcd_members.size() == 3);
  CHECK(plan.etcd_members[0].text() == "head:2379");
  CHECK(plan.etcd_members[1].port == 2379);
  CHECK(plan.etcd_members[2].port == 2380);
  CHECK(plan.client.backend == "etcd-v3");
  CHECK(plan.client.settings.keep_alive_interval == 1s);
  // One node of an etcd job still meets in etcd: its restarts are counted there.
  LaunchConfig one = c10d(1, 1, "head:2379");
  one.rdzv_backend = "etcd-v3";
  CHECK(plan_of(one).etcd_members.size() == 1);
  config.node_rank = 3;
  CHECK(error_of(config) == "--node_rank 3 is out of range for --nnodes 2:3 (0..2)");
}
