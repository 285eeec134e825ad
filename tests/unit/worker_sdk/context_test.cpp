#include "ddprun/sdk/context.h"

#include <catch2/catch.hpp>

using namespace ddprun::sdk;

namespace {

EnvMap torchrun_env() {
  return {{"RANK", "3"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"MASTER_ADDR", "10.0.0.7"},
          {"MASTER_PORT", "29411"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "5"},
          {"TORCHELASTIC_RUN_ID", "job-42"},
          {"TORCHELASTIC_USE_AGENT_STORE", "False"},
          {"TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"}};
}

std::string error_of(const EnvMap& env) {
  auto r = parse_worker_context(env);
  REQUIRE(std::holds_alternative<std::string>(r));
  return std::get<std::string>(r);
}

}  // namespace

TEST_CASE("a worker reads every torchrun variable into its context", "[sdk][unit]") {
  auto r = parse_worker_context(torchrun_env());
  REQUIRE(std::holds_alternative<WorkerContext>(r));
  const WorkerContext& c = std::get<WorkerContext>(r);
  CHECK(c.rank == 3);
  CHECK(c.local_rank == 1);
  CHECK(c.world_size == 4);
  CHECK(c.local_world_size == 2);
  CHECK(c.group_rank == 1);
  CHECK(c.master_addr == "10.0.0.7");
  CHECK(c.master_port == 29411);
  CHECK(c.restart_count == 2);
  CHECK(c.max_restarts == 5);
  CHECK(c.run_id == "job-42");
  CHECK_FALSE(c.use_agent_store);
  CHECK(c.error_file == "/tmp/x/error.json");
}

TEST_CASE("outside a launcher the error names the missing variable and what to do", "[sdk][unit]") {
  for (const char* name :
       {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    EnvMap env = torchrun_env();
    env.erase(name);
    CHECK(error_of(env) ==
          std::string(name) + " is not set: start this program with ddprun or torchrun");
  }
  CHECK(error_of({}) == "RANK is not set: start this program with ddprun or torchrun");
}

TEST_CASE("optional variables default as under a plain launch", "[sdk][unit]") {
  EnvMap env = torchrun_env();
  for (const char* name :
       {"GROUP_RANK", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"})
    env.erase(name);
  auto r = parse_worker_context(env);
  REQUIRE(std::holds_alternative<WorkerContext>(r));
  const WorkerContext& c = std::get<WorkerContext>(r);
  CHECK(c.group_rank == 0);
  CHECK(c.restart_count == 0);
  CHECK(c.run_id.empty());
  CHECK_FALSE(c.use_agent_store);
  CHECK(c.error_file.empty());
}

TEST_CASE("bad values are refused with the variable and the value", "[sdk][unit]") {
  EnvMap env = torchrun_env();
  env["WORLD_SIZE"] = "four";
  CHECK(error_of(env) ==
        "WORLD_SIZE=\"four\" is not an integer: start this program with ddprun or torchrun");
  env = torchrun_env();
  env["MASTER_PORT"] = "70000";
  CHECK(error_of(env) == "MASTER_PORT=70000 is out of range [1, 65535]");
  env = torchrun_env();
  env["RANK"] = "4";
  CHECK(error_of(env) == "RANK=4 is not below WORLD_SIZE=4");
  env = torchrun_env();
  env["LOCAL_RANK"] = "2";
  CHECK(error_of(env) == "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  env = torchrun_env();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  CHECK(error_of(env).find("TORCHELASTIC_USE_AGENT_STORE=\"maybe\"") == 0);
}

TEST_CASE("with the agent's store the worker uses this attempt's key prefix", "[sdk][unit]") {
  EnvMap env = torchrun_env();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  auto r = parse_worker_context(env);
  REQUIRE(std::holds_alternative<WorkerContext>(r));
  CHECK(std::get<WorkerContext>(r).use_agent_store);
  CHECK(agent_store_prefix(std::get<WorkerContext>(r).restart_count) == "/worker/attempt_2");
}
