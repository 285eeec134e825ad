// The sbatch scripts of examples/slurm/, submitted unchanged to a real SLURM
// (tests/slurm/slurm_cluster.h), training examples/ddp_train.py with Debian's python3-torch.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "tests/slurm/slurm_cluster.h"

using namespace ddprun::testing;

namespace {

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

/// The job's environment: `ddprun` on PATH is the one just built, workers run Debian's python3.
std::map<std::string, std::string> job_env() {
  const std::string bin = std::filesystem::path(DDPRUN_BIN).parent_path().string();
  const char* path = std::getenv("PATH");
  return {{"PATH", bin + ":" + (path != nullptr ? path : "/usr/bin:/bin")},
          {"PYTHON_EXEC", "/usr/bin/python3"}};
}

void require_torch() {
  auto probe = run_command({"/usr/bin/python3", "-c", "import torch.distributed"}, {},
                           std::chrono::seconds(60));
  INFO("Debian's python3-torch is needed: run scripts/install-deps.sh\n" << probe.err);
  REQUIRE(probe.exit_code == 0);
}

const std::string kExamples = std::string(DDPRUN_SOURCE_DIR) + "/examples/slurm/";

}  // namespace

TEST_CASE("the one-node example trains two processes on one node", "[slurm][python]") {
  require_torch();
  SlurmCluster cluster;
  auto r = cluster.sbatch_wait_file(kExamples + "one_node.sbatch", DDPRUN_SOURCE_DIR, job_env());
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.out, ": parameters identical to rank 0: True") == 2);
  CHECK(count_of(r.out, "GROUP_WORLD_SIZE") == 0);
}

TEST_CASE("the two-node example trains on both nodes with ranks from SLURM", "[slurm][python]") {
  require_torch();
  SlurmCluster cluster;
  auto r = cluster.sbatch_wait_file(kExamples + "two_nodes.sbatch", DDPRUN_SOURCE_DIR, job_env());
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 4; ++rank)
    CHECK(count_of(r.out,
                   "rank " + std::to_string(rank) + ": parameters identical to rank 0: True") == 1);
  CHECK(count_of(r.out, "--nnodes 2 (SLURM_STEP_NUM_NODES)") == 2);
  CHECK(count_of(r.out, "rendezvous round 0 complete: group rank 1 of 2 nodes") == 1);
}
