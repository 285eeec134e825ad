#include "agent/attempt_plan.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

using namespace ddprun::agent;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path root = fs::temp_directory_path() / ("attempt_plan_test_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }
};

}  // namespace

TEST_CASE("an attempt gets a fresh directory per restart and an error file per rank",
          "[agent][unit]") {
  Scratch scratch;
  WorkerSpec spec;
  spec.local_world_size = 2;
  spec.argv = {"/bin/true"};
  const EnvMap agent_env{{"PATH", "/usr/bin:/bin"}};
  ddprun::rdzv::RendezvousInfo round{0, 1, "127.0.0.1", 29500, 3, 4};
  // A stale error file of an earlier run of the same attempt must be gone.
  fs::create_directories(scratch.root / "attempt_3" / "1");
  std::ofstream(scratch.root / "attempt_3" / "1" / "error.json") << "{}";
  auto plan = plan_attempt({scratch.root, &spec, &agent_env, &round, place_workers(round, 2), "job",
                            "/tmp/agent.sock", false});
  REQUIRE(plan);
  CHECK(plan->dir == scratch.root / "attempt_3");
  CHECK(plan->executable == "/bin/true");
  CHECK(plan->missing_command.empty());
  CHECK_FALSE(fs::exists(plan->dir / "1" / "error.json"));
  CHECK(fs::is_directory(plan->rank_dir(0)));
  CHECK(fs::is_directory(plan->rank_dir(1)));
  REQUIRE(plan->error_files.size() == 2);
  CHECK(plan->error_files.at(1) == (plan->dir / "1" / "error.json").string());
  CHECK(plan->envs.at(1).at("TORCHELASTIC_ERROR_FILE") == plan->error_files.at(1));
  CHECK(plan->envs.at(1).at("TORCHELASTIC_RESTART_COUNT") == "3");
  CHECK(plan->envs.at(0).at("DDPRUN_AGENT_SOCKET") == "/tmp/agent.sock");
}

TEST_CASE("an attempt names a worker program that is not on PATH and a directory it cannot make",
          "[agent][unit]") {
  Scratch scratch;
  WorkerSpec spec;
  spec.argv = {"no-such-trainer"};
  const EnvMap agent_env{{"PATH", "/nonexistent"}};
  ddprun::rdzv::RendezvousInfo round{};
  auto plan = plan_attempt(
      {scratch.root, &spec, &agent_env, &round, place_workers(round, 1), "job", "", false});
  REQUIRE(plan);
  CHECK(plan->executable.empty());
  CHECK(plan->missing_command ==
        "command not found: no-such-trainer (PATH=/nonexistent); check the script name or set "
        "PYTHON_EXEC");

  // The log root is a file: no directory can be made under it.
  std::ofstream(scratch.root / "file") << "x";
  auto blocked = plan_attempt({scratch.root / "file", &spec, &agent_env, &round,
                               place_workers(round, 1), "job", "", false});
  REQUIRE_FALSE(blocked);
  CHECK(blocked.error().message.find("cannot create " + (scratch.root / "file").string()) == 0);
}
