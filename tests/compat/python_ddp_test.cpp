// An unmodified PyTorch DDP script (Gloo, Debian's python3-torch) under ddprun.
#include <catch2/catch.hpp>
#include <csignal>
#include <regex>

#include "tests/compat/compat_support.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

const std::string kScript = std::string(DDPRUN_SOURCE_DIR) + "/examples/ddp_train.py";

}  // namespace

TEST_CASE("a torchrun DDP script trains under ddprun and sees torchrun's environment",
          "[python][integration]") {
  require_torch();
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", kScript, "2", "1", "--print_env"},
      kPython, std::chrono::seconds(120));
  INFO((r.timed_out ? "ddprun did not finish in time and was killed\n" : "") << r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[default" + std::to_string(rank) + "]:";
    CHECK(r.out.find(p + "LOCAL_RANK=" + std::to_string(rank) + " RANK=" + std::to_string(rank) +
                     " GROUP_RANK=0 ROLE_RANK=" + std::to_string(rank) +
                     " ROLE_NAME=default LOCAL_WORLD_SIZE=2 WORLD_SIZE=2 GROUP_WORLD_SIZE=1 "
                     "ROLE_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=") != std::string::npos);
    CHECK(r.out.find(p + "[CPU" + std::to_string(rank) + "] Epoch 1 | Batchsize: 32 | Steps: 32") !=
          std::string::npos);
    CHECK(r.out.find(p + "rank " + std::to_string(rank) +
                     ": parameters identical to rank 0: True") != std::string::npos);
  }
  // Both ranks agree on one store address, one run id and the restart count.
  std::regex port(
      "MASTER_PORT=(\\d+) TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 "
      "TORCHELASTIC_RUN_ID=([0-9a-f-]+) TORCHELASTIC_USE_AGENT_STORE=" +
      default_agent_store());
  std::vector<std::string> seen;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), port);
       it != std::sregex_iterator(); ++it)
    seen.push_back((*it)[1].str() + "/" + (*it)[2].str());
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == seen[1]);
}

TEST_CASE("a Python worker's @record traceback appears in ddprun's failure report",
          "[python][integration]") {
  require_torch();
  auto r = run_command_diagnosed({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", kScript, "2",
                                  "1", "--fail_rank", "1", "--fail_epoch", "0"},
                                 kPython, std::chrono::seconds(120));
  INFO((r.timed_out ? "ddprun did not finish in time and was killed\n" : "") << r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("ddp_train.py FAILED") != std::string::npos);
  const auto root = r.err.find("Root Cause");
  REQUIRE(root != std::string::npos);
  const std::string cause = r.err.substr(root);
  CHECK(cause.find("rank      : 1 (local_rank: 1)") != std::string::npos);
  CHECK(cause.find("Traceback (most recent call last)") != std::string::npos);
  CHECK(cause.find("RuntimeError: injected failure on rank 1 at epoch 0") != std::string::npos);
  CHECK(cause.find("error.json") != std::string::npos);
}

TEST_CASE("a restarted DDP job resumes from its snapshot and finishes", "[python][integration]") {
  require_torch();
  TempDir dir;
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1", kScript, "3",
       "1", "--snapshot_path", dir.path() + "/snap.pt", "--fail_rank", "1", "--fail_epoch", "2"},
      kPython, std::chrono::seconds(180));
  INFO((r.timed_out ? "ddprun did not finish in time and was killed\n" : "") << r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("restarting workers: restart 1 of 1") != std::string::npos);
  CHECK(r.out.find("[default0]:Resuming training from snapshot at Epoch 2") != std::string::npos);
  CHECK(r.out.find("[default1]:rank 1: parameters identical to rank 0: True") != std::string::npos);
}

TEST_CASE("a hung Python worker prints where it is before the watchdog kills it",
          "[python][integration]") {
  require_torch();
  // Fresh interpreters and forks of the zygote alike: both must print.
  for (const char* standbys : {"--standby_workers=off", "--standby_workers=auto"}) {
    auto r = run_command_diagnosed(
        {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--watchdog_timeout", "1", standbys,
         std::string(DDPRUN_SOURCE_DIR) + "/tests/compat/scripts/hang_in_function.py"},
        {{"PYTHON_EXEC", "/usr/bin/python3"}}, std::chrono::seconds(120));
    INFO(standbys << "\n" << r.out << r.err);
    CHECK(r.exit_code == 128 + SIGABRT);
    CHECK(r.err.find("native stacks of worker rank ") != std::string::npos);
    // The first rank judged hung prints; the other may be stopped by the group's SIGTERM first.
    CHECK(std::regex_search(r.err, std::regex(R"(\[default[01]\]:Fatal Python error: Aborted)")));
    CHECK(r.err.find("/tests/compat/scripts/hang_in_function.py\", line 11 in "
                     "stuck_in_a_collective") != std::string::npos);
  }
}
