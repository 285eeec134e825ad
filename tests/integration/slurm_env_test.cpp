// ddprun with a SLURM job's variables but no SLURM: what they change on one node. The real
// SLURM tests (tests/slurm/) cover srun and sbatch.
#include <catch2/catch.hpp>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

TEST_CASE("inside a SLURM job --nproc_per_node gpu starts one worker per GPU SLURM allocated",
          "[integration][slurm_env]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "gpu"}, {"env=LOCAL_WORLD_SIZE"}),
                       {{"SLURM_JOB_ID", "9"},
                        {"SLURM_JOB_NUM_NODES", "1"},
                        {"SLURM_GPUS_ON_NODE", "3"},
                        {"CUDA_VISIBLE_DEVICES", "0,1,2"}},
                       kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.out, "LOCAL_WORLD_SIZE=3") == 3);
  CHECK(contains(r.out, "[default2]:LOCAL_WORLD_SIZE=3"));
}

TEST_CASE("a srun step with more ddprun tasks than nodes starts nothing and says why",
          "[integration][slurm_env]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "1"}, {"print=started"}),
                       {{"SLURM_JOB_ID", "9"},
                        {"SLURM_STEP_ID", "0"},
                        {"SLURM_NODEID", "0"},
                        {"SLURM_STEP_NUM_NODES", "1"},
                        {"SLURM_STEP_NUM_TASKS", "4"},
                        {"SLURM_STEP_NODELIST", "n1"}},
                       kJobLimit);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "srun started 4 copies of ddprun on 1 node(s)"));
  CHECK_FALSE(contains(r.out, "started"));
}
