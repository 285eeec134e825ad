// examples/slurm/preemptible.sbatch on a real SLURM (tests/slurm/slurm_cluster.h), training the
// C++ ddp_train: SIGUSR1 sent to the batch shell, the path of `#SBATCH --signal=B:USR1@120`,
// must end the job with 0 and a snapshot. Built only with the worker SDK.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <regex>
#include <string>

#include "tests/integration/ddprun_runs.h"
#include "tests/slurm/slurm_cluster.h"

using namespace ddprun::testing;

namespace {

/// The trainer as the example names it, relative to the repository root.
const std::string kTrainer = "build/bin/ddp_train 1000 5";

}  // namespace

TEST_CASE("the preemptible example saves a snapshot and ends 0 when SLURM sends SIGUSR1",
          "[slurm][sdk]") {
  SlurmCluster cluster;
  std::string script =
      read_file(std::string(DDPRUN_SOURCE_DIR) + "/examples/slurm/preemptible.sbatch");
  {
    INFO("preemptible.sbatch no longer runs `" << kTrainer << "`: update this test with it");
    REQUIRE(script.find("#SBATCH --signal=B:USR1@") != std::string::npos);
    const size_t at = script.find(kTrainer);
    REQUIRE(at != std::string::npos);
    // The built trainer; the snapshots land in the job's working directory, the cluster's.
    script.replace(at, std::string("build/bin/ddp_train").size(), DDP_TRAIN_BIN);
  }
  const std::string path = cluster.dir() + "/preemptible.sbatch";
  std::ofstream(path) << script;
  const std::string output = cluster.dir() + "/preemptible.out";
  // Preempted once training is under way on both nodes: rank 0 finished its second epoch.
  auto r = cluster.preempt_when(
      path, output, ddprun_on_path(DDPRUN_BIN),
      [](const std::string& out) { return contains(out, "[CPU0] Epoch 1 | Batchsize"); });
  const std::string out = read_file(output);
  INFO("sbatch: " << r.out << r.err << "\njob output:\n" << out << cluster.logs());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  // Both agents lived through the notice; no group was restarted.
  CHECK(count_of(out, "[ddprun] info: forwarding SIGUSR1 to the workers") == 2);
  CHECK_FALSE(contains(out, "restarting workers"));
  // All four ranks stopped at the same step; rank 0 saved it.
  static const std::regex kSaved(
      R"(\[CPU0\] checkpoint requested: saved snapshot at epoch (\d+) step (\d+) \(step \d+ of the epoch\) to (\S+), exiting)");
  std::smatch m;
  REQUIRE(std::regex_search(out, m, kSaved));
  const std::string epoch = m[1], step = m[2], saved = m[3];
  // The trainer also saves every 5 epochs: on a loaded machine the notice may come after such
  // a save, so the requested snapshot is the newest of the series, not necessarily the first.
  CHECK(saved.rfind("snapshots/snapshot.pt.", 0) == 0);
  for (int rank = 1; rank < 4; ++rank)
    CHECK(count_of(out, "[CPU" + std::to_string(rank) +
                            "] checkpoint requested: stopped at epoch " + epoch + " step " + step +
                            ", exiting") == 1);
  auto tool =
      run_command({SNAPSHOT_TOOL_BIN, cluster.dir() + "/" + saved}, {}, std::chrono::seconds(60));
  INFO(tool.out << tool.err);
  CHECK(tool.exit_code == 0);
  CHECK(contains(tool.out, "  epoch      : " + epoch + "\n  step       : " + step + "\n"));
  CHECK(contains(tool.out, "  world_size : 4\n"));
}
