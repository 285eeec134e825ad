// ddprun under a real SLURM (tests/slurm/slurm_cluster.h): sbatch scripts on two virtual nodes.
// Both nodes are 127.0.0.1, so both agents on a two-node job find the rendezvous endpoint on
// their own machine: the first to bind port 29400 hosts it, the other joins as a client.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/integration/ddprun_runs.h"
#include "tests/slurm/slurm_cluster.h"

using namespace ddprun::testing;

namespace {

/// The derived rendezvous listens on 29400 of the first node (here this machine); a stranger
/// holding it would make the test about something else, so say so.
void require_rendezvous_port_free() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(29400);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  INFO(
      "port 29400 on 127.0.0.1 is taken by another process; the SLURM tests need it for the "
      "rendezvous endpoint ddprun derives from the node list");
  REQUIRE(bound);
}

const std::map<int, int> kRanks0To3Once{{0, 1}, {1, 1}, {2, 1}, {3, 1}};

}  // namespace

TEST_CASE("srun ddprun on two nodes takes nodes, node rank and rendezvous from SLURM", "[slurm]") {
  require_rendezvous_port_free();
  SlurmCluster cluster;
  auto r = cluster.sbatch_wait(std::string("#!/bin/bash\n"
                                           "#SBATCH --nodes=2\n"
                                           "#SBATCH --ntasks-per-node=1\n"
                                           "srun --label ddprun --nproc_per_node 2 --no_python ") +
                                   FAKE_WORKER_BIN + " env=RANK,GROUP_RANK,WORLD_SIZE\n",
                               ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  CHECK(ranks_printed(r.out) == kRanks0To3Once);
  CHECK(count_of(r.out, "WORLD_SIZE=4") == 4);
  // Task N of srun is node N: SLURM_NODEID became the group rank.
  CHECK(count_of(r.out, "0: [default0]:GROUP_RANK=0") == 1);
  CHECK(count_of(r.out, "1: [default0]:GROUP_RANK=1") == 1);
  // One notice per node says what came from SLURM; n1 has no DNS name, so scontrol's NodeAddr.
  CHECK(count_of(r.out, "--nnodes 2 (SLURM_STEP_NUM_NODES), --node_rank") == 2);
  CHECK(count_of(r.out,
                 "--rdzv_endpoint 127.0.0.1:29400 (n1, first of the node list, by "
                 "NodeAddr from scontrol)") == 2);
}

TEST_CASE("explicit flags win over SLURM's values inside a job step", "[slurm]") {
  require_rendezvous_port_free();
  SlurmCluster cluster;
  // --rdzv_id and --nproc_per_node given; nnodes, node rank and endpoint still from SLURM.
  auto r = cluster.sbatch_wait(std::string("#!/bin/bash\n"
                                           "#SBATCH --nodes=2\n"
                                           "#SBATCH --ntasks-per-node=1\n"
                                           "srun ddprun --rdzv_id mine --nproc_per_node 1 "
                                           "--no_python ") +
                                   FAKE_WORKER_BIN + " env=RANK,WORLD_SIZE,TORCHELASTIC_RUN_ID\n",
                               ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  CHECK(ranks_printed(r.out) == std::map<int, int>{{0, 1}, {1, 1}});
  CHECK(count_of(r.out, "TORCHELASTIC_RUN_ID=mine") == 2);
  CHECK_FALSE(contains(r.out, "(SLURM_JOB_ID)"));
}

TEST_CASE("the broken tutorial script with a bare ddprun line is fanned out with srun", "[slurm]") {
  require_rendezvous_port_free();
  SlurmCluster cluster;
  // The tutorial's mistake: a two-node allocation, four tasks per node, and one launcher line.
  auto r = cluster.sbatch_wait(std::string("#!/bin/bash\n"
                                           "#SBATCH --nodes=2\n"
                                           "#SBATCH --ntasks-per-node=4\n"
                                           "ddprun --nnodes=2 --nproc_per_node 2 --no_python ") +
                                   FAKE_WORKER_BIN + " env=RANK,WORLD_SIZE\n",
                               ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 0);
  // Each virtual node has 4 CPUs: the one ddprun per node gets all of them.
  CHECK(count_of(r.out,
                 "starting one ddprun per node with: srun --nodes=2 --ntasks=2 "
                 "--ntasks-per-node=1 --cpus-per-task=4 ddprun --nnodes=2") == 1);
  // Exactly one ddprun per node, not four: four workers in all.
  CHECK(ranks_printed(r.out) == kRanks0To3Once);
  CHECK(count_of(r.out, "WORLD_SIZE=4") == 4);
}

TEST_CASE("with PET_NO_SLURM_FANOUT=1 the broken tutorial script stops with the srun line",
          "[slurm]") {
  SlurmCluster cluster;
  auto r = cluster.sbatch_wait(std::string("#!/bin/bash\n"
                                           "#SBATCH --nodes=2\n"
                                           "#SBATCH --ntasks-per-node=4\n"
                                           "export PET_NO_SLURM_FANOUT=1\n"
                                           "ddprun --nnodes=2 --nproc_per_node 2 --no_python ") +
                                   FAKE_WORKER_BIN + " env=RANK\n",
                               ddprun_on_path(DDPRUN_BIN));
  INFO("sbatch: " << r.err << "\njob output:\n" << r.out << cluster.logs());
  CHECK(r.exit_code == 64);
  CHECK(contains(r.out, "ddprun: error: ddprun runs outside srun on a 2-node allocation"));
  CHECK(contains(r.out,
                 "run one ddprun per node instead: srun --nodes=2 --ntasks=2 "
                 "--ntasks-per-node=1 --cpus-per-task=4 ddprun --nnodes=2 --nproc_per_node 2"));
  CHECK(ranks_printed(r.out).empty());
}

TEST_CASE("SIGUSR1 to the batch shell of an exec'd bare ddprun reaches every node's workers",
          "[slurm]") {
  require_rendezvous_port_free();
  SlurmCluster cluster;
  // `#SBATCH --signal=B:USR1@...` signals the batch shell alone, as `scancel --batch` does;
  // with exec, ddprun is that shell, and it fans out by replacing itself with srun.
  const std::string script = cluster.dir() + "/usr1.sbatch";
  std::ofstream(script) << "#!/bin/bash\n"
                           "#SBATCH --nodes=2\n"
                           "#SBATCH --ntasks-per-node=1\n"
                           "exec ddprun --nnodes=2 --nproc_per_node 2 --no_python "
                        << FAKE_WORKER_BIN << " wait_usr1 print=still-running\n";
  const std::string output = cluster.dir() + "/usr1.out";
  auto r = cluster.preempt_when(
      script, output, ddprun_on_path(DDPRUN_BIN),
      [](const std::string& out) { return count_of(out, "waiting for SIGUSR1") == 4; });
  const std::string out = read_file(output);
  INFO("sbatch: " << r.out << r.err << "\njob output:\n" << out << cluster.logs());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(contains(out, "starting one ddprun per node with: srun"));
  CHECK(count_of(out, "]:got SIGUSR1") == 4);
  CHECK(count_of(out, "]:still-running") == 4);
  // Each node's ddprun outlived the notice and passed it on.
  CHECK(count_of(out, "[ddprun] info: forwarding SIGUSR1 to the workers") == 2);
}
