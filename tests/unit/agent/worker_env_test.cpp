#include "agent/worker_env.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>

using namespace ddprun::agent;
using ddprun::rdzv::RendezvousInfo;

namespace {

EnvMap env_for(const EnvMap& agent_env, int local_world, int local_rank, RendezvousInfo round) {
  static WorkerSpec spec;
  spec.role = "trainer";
  spec.local_world_size = local_world;
  spec.max_restarts = 3;
  static RendezvousInfo stored;
  stored = round;
  auto placements = place_workers(stored, local_world);
  WorkerEnvInputs in{&spec,         &stored, placements.at(local_rank),     "job42", false,
                     "/tmp/e.json", "",      /*checkpoint_requested=*/false};
  return build_worker_env(agent_env, in);
}

}  // namespace

TEST_CASE("a worker gets torchrun's environment for its place in the job", "[agent][unit]") {
  RendezvousInfo round{1, 2, "10.0.0.1", 29500, 2};
  EnvMap env = env_for({{"PATH", "/usr/bin"}}, 4, 3, round);
  CHECK(env.at("LOCAL_RANK") == "3");
  CHECK(env.at("RANK") == "7");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("ROLE_RANK") == "7");
  CHECK(env.at("ROLE_NAME") == "trainer");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "4");
  CHECK(env.at("WORLD_SIZE") == "8");
  CHECK(env.at("GROUP_WORLD_SIZE") == "2");
  CHECK(env.at("ROLE_WORLD_SIZE") == "8");
  CHECK(env.at("MASTER_ADDR") == "10.0.0.1");
  CHECK(env.at("MASTER_PORT") == "29500");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job42");
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/tmp/e.json");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(env.at("PATH") == "/usr/bin");
}

TEST_CASE("OMP_NUM_THREADS defaults to 1 only when unset and several workers share the node",
          "[agent][unit]") {
  RendezvousInfo round{0, 1, "127.0.0.1", 1234, 0};
  CHECK(env_for({}, 2, 0, round).at("OMP_NUM_THREADS") == "1");
  CHECK(env_for({}, 1, 0, round).count("OMP_NUM_THREADS") == 0);
  CHECK(env_for({{"OMP_NUM_THREADS", "8"}}, 2, 1, round).at("OMP_NUM_THREADS") == "8");
  CHECK(will_default_omp_threads({}, 2));
  CHECK_FALSE(will_default_omp_threads({{"OMP_NUM_THREADS", "8"}}, 2));
}

TEST_CASE("workers started after a preemption notice are told so in their environment",
          "[agent][unit]") {
  WorkerSpec spec;
  spec.local_world_size = 1;
  const RendezvousInfo round{0, 1, "127.0.0.1", 29500, 0};
  auto placements = place_workers(round, 1);
  WorkerEnvInputs in{&spec, &round, placements.at(0), "job", false, "/tmp/e.json", "", false};
  CHECK(build_worker_env({}, in).count("DDPRUN_CHECKPOINT_REQUESTED") == 0);
  in.checkpoint_requested = true;
  CHECK(build_worker_env({}, in).at("DDPRUN_CHECKPOINT_REQUESTED") == "1");
}

TEST_CASE("a user's NCCL error-handling choice is kept", "[agent][unit]") {
  RendezvousInfo round{0, 1, "127.0.0.1", 1234, 0};
  CHECK(env_for({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}}, 1, 0, round)
            .at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
}

TEST_CASE("global ranks are contiguous per node", "[agent][unit]") {
  auto p = place_workers(RendezvousInfo{2, 3, "h", 1, 0}, 2);
  REQUIRE(p.size() == 2);
  CHECK(p[0].global_rank == 4);
  CHECK(p[1].global_rank == 5);
  CHECK(p[1].world_size == 6);
}

TEST_CASE("the environment becomes K=V strings for execve", "[agent][unit]") {
  CHECK(to_envp({{"A", "1"}, {"B", "x=y"}}) == std::vector<std::string>{"A=1", "B=x=y"});
}

TEST_CASE("with --virtual_local_rank every worker is local rank 0 and sees only its own GPU",
          "[agent][unit]") {
  WorkerSpec spec;
  spec.local_world_size = 2;
  spec.virtual_local_rank = true;
  EnvMap unset = build_standby_env({}, spec, 1, "job");
  CHECK(unset.at("LOCAL_RANK") == "0");
  CHECK(unset.at("CUDA_VISIBLE_DEVICES") == "1");
  EnvMap mapped = build_standby_env({{"CUDA_VISIBLE_DEVICES", "4, 6"}}, spec, 1, "job");
  CHECK(mapped.at("LOCAL_RANK") == "0");
  CHECK(mapped.at("CUDA_VISIBLE_DEVICES") == "6");
  spec.virtual_local_rank = false;
  EnvMap plain = build_standby_env({{"CUDA_VISIBLE_DEVICES", "4,6"}}, spec, 1, "job");
  CHECK(plain.at("LOCAL_RANK") == "1");
  CHECK(plain.at("CUDA_VISIBLE_DEVICES") == "4,6");
}

TEST_CASE("the option --virtual_local_rank needs a GPU per worker in CUDA_VISIBLE_DEVICES",
          "[agent][unit]") {
  CHECK_FALSE(virtual_local_rank_problem({}, 8).has_value());
  CHECK_FALSE(virtual_local_rank_problem({{"CUDA_VISIBLE_DEVICES", "0,1"}}, 2).has_value());
  auto why = virtual_local_rank_problem({{"CUDA_VISIBLE_DEVICES", "0,1"}}, 3);
  REQUIRE(why.has_value());
  CHECK(why->message ==
        "--virtual_local_rank with 3 workers per node: CUDA_VISIBLE_DEVICES=0,1 names only 2 "
        "GPU(s); run as many workers as GPUs or widen it");
}

TEST_CASE("workers get TORCHELASTIC_SIGNALS_TO_HANDLE as torchrun 2.x exports it",
          "[agent][unit]") {
  WorkerSpec spec;
  spec.signals_to_handle = "SIGTERM,SIGUSR1";
  CHECK(build_standby_env({{"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGINT"}}, spec, 0, "job")
            .at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGTERM,SIGUSR1");
}

TEST_CASE("the Python zygote knows every variable in which a worker differs from its standby",
          "[agent][unit][standby]") {
  // agent/python/ddprun_standby.py pre-imports no module that reads one of its WORKER_VARIABLES:
  // each variable a worker gets beyond (or unlike) rank 0's standby must be in that list.
  std::ifstream file(std::string(DDPRUN_UNIT_SOURCE_DIR) + "/agent/python/ddprun_standby.py");
  const std::string source((std::istreambuf_iterator<char>(file)), {});
  const auto start = source.find("WORKER_VARIABLES = frozenset({");
  REQUIRE(start != std::string::npos);
  const std::string list = source.substr(start, source.find("})", start) - start);
  // With --virtual_local_rank CUDA_VISIBLE_DEVICES differs between ranks, without it LOCAL_RANK.
  for (const bool virtual_local_rank : {false, true}) {
    WorkerSpec spec;
    spec.local_world_size = 2;
    spec.virtual_local_rank = virtual_local_rank;
    const EnvMap agent_env{{"PATH", "/usr/bin"}, {"CUDA_VISIBLE_DEVICES", "0,1"}};
    const EnvMap standby = build_standby_env(agent_env, spec, 0, "job");
    RendezvousInfo round{1, 2, "10.0.0.1", 29500, 2};
    auto placements = place_workers(round, 2);
    for (int local = 0; local < 2; ++local) {
      WorkerEnvInputs in{&spec,         &round, placements.at(local),         "job", true,
                         "/tmp/e.json", "/s",   /*checkpoint_requested=*/true};
      for (const auto& [name, value] : build_worker_env(agent_env, in)) {
        auto it = standby.find(name);
        if (it != standby.end() && it->second == value) continue;
        INFO(name);
        CHECK(list.find("\"" + name + "\"") != std::string::npos);
      }
    }
  }
}
