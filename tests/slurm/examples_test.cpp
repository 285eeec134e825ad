// The sbatch scripts of examples/slurm/ submitted to a real SLURM (tests/slurm/slurm_cluster.h)
// with their #SBATCH lines and ddprun flags as they are, and the training program swapped for
// fake_worker: these tests are about SLURM and ddprun, and examples/ddp_train.py under ddprun
// is covered by tests/compat/.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <string>

#include "tests/integration/ddprun_runs.h"
#include "tests/slurm/slurm_cluster.h"

using namespace ddprun::testing;

namespace {

/// The training command every example runs, and what the test runs instead.
const std::string kTraining = "examples/ddp_train.py 4 2 --batch_size 32";
const std::string kFake = std::string("--no_python ") + FAKE_WORKER_BIN + " env=RANK,WORLD_SIZE";

/// examples/slurm/<name> with its training command swapped (for `fake` worker actions),
/// written next to the cluster.
std::string example_with_fake_worker(const SlurmCluster& cluster, const std::string& name,
                                     const std::string& fake = kFake) {
  std::string script = read_file(std::string(DDPRUN_SOURCE_DIR) + "/examples/slurm/" + name);
  const size_t at = script.find(kTraining);
  INFO(name << " no longer runs `" << kTraining << "`: update this test with it");
  REQUIRE(at != std::string::npos);
  script.replace(at, kTraining.size(), fake);
  const std::string path = cluster.dir() + "/" + name;
  std::ofstream(path) << script;
  return path;
}

}  // namespace

TEST_CASE("the one-node example starts two workers on one node", "[slurm]") {
  SlurmCluster cluster;
  auto r = cluster.sbatch_wait_file(example_with_fake_worker(cluster, "one_node.sbatch"),
                                    DDPRUN_SOURCE_DIR, ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  CHECK(ranks_printed(r.out) == std::map<int, int>{{0, 1}, {1, 1}});
  CHECK(count_of(r.out, "WORLD_SIZE=2") == 2);
}

TEST_CASE("the two-node example starts one ddprun per node with ranks from SLURM", "[slurm]") {
  SlurmCluster cluster;
  auto r = cluster.sbatch_wait_file(example_with_fake_worker(cluster, "two_nodes.sbatch"),
                                    DDPRUN_SOURCE_DIR, ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  CHECK(ranks_printed(r.out) == std::map<int, int>{{0, 1}, {1, 1}, {2, 1}, {3, 1}});
  CHECK(count_of(r.out, "WORLD_SIZE=4") == 4);
  CHECK(count_of(r.out, "--nnodes 2 (SLURM_STEP_NUM_NODES)") == 2);
  CHECK(count_of(r.out, "rendezvous round 0 complete: group rank 1 of 2 nodes") == 1);
}

TEST_CASE("the requeue example does not requeue a job whose workers exit with a fatal code",
          "[slurm]") {
  SlurmCluster cluster;
  const std::string fatal = std::string("--no_python ") + FAKE_WORKER_BIN + " exit_if_rank=3:3";
  auto r = cluster.sbatch_wait_file(example_with_fake_worker(cluster, "requeue.sbatch", fatal),
                                    DDPRUN_SOURCE_DIR, ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 78);
  CHECK(count_of(r.out, "ddprun exit 78: the same failure would come back; not requeueing") == 1);
  CHECK(count_of(r.out, "is one of --fatal_exit_codes 3") >= 1);
  CHECK(count_of(r.out, "requeueing job") == 0);
}
