#include "launcher/agent_store.h"
#include "launcher/cli.h"

#include <catch2/catch.hpp>

#include <vector>

using namespace ddprun::launcher;

namespace {

RendezvousPlan plan_of(const LaunchConfig& config) {
  auto planned = plan_rendezvous(config, 2, "worker7",
                                 [](const std::string& host) { return host == "127.0.0.1"; });
  INFO((planned ? "" : planned.error().message));
  REQUIRE(planned.ok());
  return *planned;
}

/// A rendezvous that completes each round with the next restart count.
class Rounds : public ddprun::rdzv::RendezvousHandler {
 public:
  void next_rendezvous(std::function<void(ddprun::rdzv::RendezvousResult)> done) override {
    ddprun::rdzv::RendezvousInfo info;
    info.restart_count = next_++;
    done(info);
  }
  void set_notice_handler(std::function<void(ddprun::rdzv::Notice)>) override {}
  void report_failure(const ddprun::rdzv::WorkersFailed&) override {}
  void report_success() override {}
  void keep_out(const std::string&) override {}
  void leave(const std::string&) override {}
  std::string backend() const override { return "c10d"; }
  std::string run_id() const override { return "job"; }

 private:
  int next_ = 0;
};

}  // namespace

TEST_CASE("one node binds its store on --master_addr and a free port", "[launcher][unit]") {
  LaunchConfig config = default_launch_config();
  config.standalone = true;
  const AgentStorePlan plan = plan_agent_store(config, plan_of(config));
  CHECK(plan.use_agent_store);
  CHECK(plan.host);
  CHECK(plan.listen_host == "127.0.0.1");
  CHECK(plan.listen_port == 0);
  config.master_addr = "trainer.example";
  config.master_port = 4000;
  const AgentStorePlan named = plan_agent_store(config, plan_of(config));
  CHECK(named.listen_host.empty());  // a host name: every address
  CHECK(named.listen_port == 4000);
}

TEST_CASE("only node rank 0 of the static backend hosts the store at --master_port",
          "[launcher][unit]") {
  LaunchConfig config = default_launch_config();
  config.min_nodes = config.max_nodes = 2;
  config.master_addr = "127.0.0.1";
  config.node_rank = 0;
  const AgentStorePlan zero = plan_agent_store(config, plan_of(config));
  CHECK(zero.host);
  CHECK(zero.listen_port == kDefaultMasterPort);
  config.node_rank = 1;
  const AgentStorePlan one = plan_agent_store(config, plan_of(config));
  CHECK_FALSE(one.host);
  CHECK(one.use_agent_store);
}

TEST_CASE("every c10d node hosts a store because any may become group rank 0", "[launcher][unit]") {
  LaunchConfig config = default_launch_config();
  config.min_nodes = 1;
  config.max_nodes = 3;
  config.rdzv_backend = "c10d";
  config.rdzv_endpoint = "127.0.0.1:29400";
  const AgentStorePlan plan = plan_agent_store(config, plan_of(config));
  CHECK(plan.host);
  CHECK(plan.listen_host.empty());
  CHECK(plan.listen_port == 0);
}

TEST_CASE("with --agent_store off the agent hosts nothing and workers host their own",
          "[launcher][unit]") {
  LaunchConfig config = default_launch_config();
  config.standalone = true;
  config.agent_store = false;
  const AgentStorePlan plan = plan_agent_store(config, plan_of(config));
  CHECK_FALSE(plan.use_agent_store);
  CHECK_FALSE(plan.host);
}

TEST_CASE("the store is cleared before each join of a round goes out", "[launcher][unit]") {
  Rounds rounds;
  std::vector<std::string> seen;
  RoundObserver observed(rounds, [&seen] { seen.push_back("clear"); });
  for (int i = 0; i < 2; ++i)
    observed.next_rendezvous([&seen](ddprun::rdzv::RendezvousResult r) {
      seen.push_back("round " +
                     std::to_string(std::get<ddprun::rdzv::RendezvousInfo>(r).restart_count));
    });
  CHECK(seen == std::vector<std::string>{"clear", "round 0", "clear", "round 1"});
}
