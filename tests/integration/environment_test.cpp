// The environment each worker starts with: torchrun's variables, with the values torchrun gives.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

const std::string kNames =
    "LOCAL_RANK,RANK,GROUP_RANK,ROLE_RANK,ROLE_NAME,LOCAL_WORLD_SIZE,WORLD_SIZE,GROUP_WORLD_SIZE,"
    "ROLE_WORLD_SIZE,MASTER_ADDR,MASTER_PORT,TORCHELASTIC_RESTART_COUNT,TORCHELASTIC_MAX_RESTARTS,"
    "TORCHELASTIC_RUN_ID,TORCHELASTIC_USE_AGENT_STORE,TORCHELASTIC_ERROR_FILE,"
    "TORCH_NCCL_ASYNC_ERROR_HANDLING,OMP_NUM_THREADS";

/// ddprun started through env(1), so variables the test's own environment may set are unset.
std::vector<std::string> without_inherited(std::vector<std::string> argv) {
  argv.insert(argv.begin(),
              {"/usr/bin/env", "-u", "OMP_NUM_THREADS", "-u", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
               "-u", "PET_NPROC_PER_NODE", "-u", "PET_MASTER_PORT", "-u", "LOGLEVEL"});
  return argv;
}

int port_of(const std::map<std::string, std::string>& env) {
  auto it = env.find("MASTER_PORT");
  return it == env.end() ? -1 : std::atoi(it->second.c_str());
}

}  // namespace

TEST_CASE("each worker gets torchrun's rank, world and rendezvous variables",
          "[agent][integration]") {
  auto r = run_command(without_inherited(ddprun_fake(
                           {"--nproc_per_node", "2", "--rdzv_id", "myrun"}, {"env=" + kNames})),
                       {}, kJobLimit);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto env0 = env_printed_by(r.out, "[default0]:");
  const auto env1 = env_printed_by(r.out, "[default1]:");
  for (int rank = 0; rank < 2; ++rank) {
    const auto& env = rank == 0 ? env0 : env1;
    const std::string me = std::to_string(rank);
    INFO("rank " << rank);
    CHECK(env.at("LOCAL_RANK") == me);
    CHECK(env.at("RANK") == me);
    CHECK(env.at("GROUP_RANK") == "0");
    CHECK(env.at("ROLE_RANK") == me);
    CHECK(env.at("ROLE_NAME") == "default");
    CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(env.at("WORLD_SIZE") == "2");
    CHECK(env.at("GROUP_WORLD_SIZE") == "1");
    CHECK(env.at("ROLE_WORLD_SIZE") == "2");
    CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(port_of(env) >= 1);
    CHECK(port_of(env) <= 65535);
    CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "0");
    CHECK(env.at("TORCHELASTIC_RUN_ID") == "myrun");
    CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
    CHECK(env.at("TORCHELASTIC_ERROR_FILE") != "<unset>");
    CHECK_FALSE(env.at("TORCHELASTIC_ERROR_FILE").empty());
    CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
    CHECK(env.at("OMP_NUM_THREADS") == "1");
  }
  CHECK(port_of(env0) == port_of(env1));
  CHECK(env0.at("TORCHELASTIC_ERROR_FILE") != env1.at("TORCHELASTIC_ERROR_FILE"));
  // One notice for the job, not one per worker.
  CHECK(count_of(r.err, "OMP_NUM_THREADS") == 1);
}

TEST_CASE("an OMP_NUM_THREADS the user set is passed on unchanged and without a notice",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2"}, {"env=OMP_NUM_THREADS"}),
                       {{"OMP_NUM_THREADS", "4"}}, kJobLimit);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:OMP_NUM_THREADS=4"));
  CHECK(contains(r.out, "[default1]:OMP_NUM_THREADS=4"));
  CHECK_FALSE(contains(r.err, "OMP_NUM_THREADS"));
}

TEST_CASE("the port given with --master_port is the MASTER_PORT every worker gets",
          "[agent][integration]") {
  auto r =
      run_command(without_inherited(ddprun_fake({"--nproc_per_node", "2", "--master_port", "29777"},
                                                {"env=MASTER_PORT"})),
                  {}, kJobLimit);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:MASTER_PORT=29777"));
  CHECK(contains(r.out, "[default1]:MASTER_PORT=29777"));
}

TEST_CASE("two jobs running at once on one host get different MASTER_PORTs",
          "[agent][integration]") {
  TempDir dir;
  const std::string pids_a = dir.path() + "/pids_a", pids_b = dir.path() + "/pids_b";
  WorkerSweeper sweeper{pids_a, pids_b};
  auto job = [](const std::string& pidfile) {
    return without_inherited(ddprun_fake({}, {"pidfile=" + pidfile, "env=MASTER_PORT", "hang"}));
  };
  Subprocess first(job(pids_a));
  Subprocess second(job(pids_b));
  REQUIRE(first.wait_for_output("[default0]:MASTER_PORT=", kJobLimit));
  REQUIRE(second.wait_for_output("[default0]:MASTER_PORT=", kJobLimit));
  // Both jobs run now; stop them before comparing.
  first.send(SIGTERM);
  second.send(SIGTERM);
  auto a = first.wait(kJobLimit);
  auto b = second.wait(kJobLimit);
  CHECK(a.exit_code == 143);
  CHECK(b.exit_code == 143);
  const int port_a = port_of(env_printed_by(a.out, "[default0]:"));
  const int port_b = port_of(env_printed_by(b.out, "[default0]:"));
  CHECK(port_a > 0);
  CHECK(port_b > 0);
  CHECK(port_a != port_b);
}

TEST_CASE("a --standalone job gets a fresh run id", "[agent][integration]") {
  const auto argv = ddprun_fake({"--standalone"}, {"env=TORCHELASTIC_RUN_ID"});
  auto a = run_command(argv, {}, kJobLimit);
  auto b = run_command(argv, {}, kJobLimit);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  const std::string id_a = env_printed_by(a.out, "[default0]:")["TORCHELASTIC_RUN_ID"];
  const std::string id_b = env_printed_by(b.out, "[default0]:")["TORCHELASTIC_RUN_ID"];
  CHECK_FALSE(id_a.empty());
  CHECK(id_a != "none");
  CHECK(id_a != id_b);
}

/// ddprun with LOGLEVEL set and OMP_NUM_THREADS unset (so the OMP notice is due).
std::vector<std::string> with_loglevel(const std::string& level) {
  std::vector<std::string> argv = {"/usr/bin/env", "-u", "OMP_NUM_THREADS", "LOGLEVEL=" + level};
  for (auto& a : ddprun_fake({"--nproc_per_node", "2"}, {"exit=0"})) argv.push_back(a);
  return argv;
}

TEST_CASE("LOGLEVEL sets how much the agent says", "[agent][integration]") {
  auto quiet = run_command(with_loglevel("ERROR"), {}, kJobLimit);
  INFO(quiet.err);
  CHECK(quiet.exit_code == 0);
  CHECK_FALSE(contains(quiet.err, "OMP_NUM_THREADS"));  // an info line, below ERROR
  auto chatty = run_command(with_loglevel("DEBUG"), {}, kJobLimit);
  INFO(chatty.err);
  CHECK(chatty.exit_code == 0);
  CHECK(contains(chatty.err, "[ddprun] debug: starting 2 workers"));
  CHECK(contains(chatty.err, "OMP_NUM_THREADS"));
}

TEST_CASE("with --virtual_local_rank each worker is local rank 0 with its own GPU visible",
          "[agent][integration]") {
  auto r =
      run_command(without_inherited(ddprun_fake({"--nproc_per_node", "2", "--virtual_local_rank"},
                                                {"env=LOCAL_RANK,CUDA_VISIBLE_DEVICES,RANK"})),
                  {{"CUDA_VISIBLE_DEVICES", "3,5"}}, kJobLimit);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto env = env_printed_by(r.out, "[default" + std::to_string(rank) + "]:");
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["LOCAL_RANK"] == "0");
    CHECK(env["CUDA_VISIBLE_DEVICES"] == (rank == 0 ? "3" : "5"));
  }
}

TEST_CASE("a job with --virtual_local_rank and fewer visible GPUs than workers stops at once",
          "[agent][integration]") {
  auto r =
      run_command(ddprun_fake({"--nproc_per_node", "3", "--virtual_local_rank"}, {"print=started"}),
                  {{"CUDA_VISIBLE_DEVICES", "0,1"}}, kJobLimit);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "CUDA_VISIBLE_DEVICES=0,1 names only 2 GPU(s)"));
  CHECK_FALSE(contains(r.out, "started"));
}

TEST_CASE("workers get TORCHELASTIC_SIGNALS_TO_HANDLE naming the signals ddprun handles",
          "[agent][integration]") {
  auto plain = run_command(ddprun_fake({}, {"env=TORCHELASTIC_SIGNALS_TO_HANDLE"}), {}, kJobLimit);
  INFO(plain.err);
  CHECK(env_printed_by(plain.out, "[default0]:")["TORCHELASTIC_SIGNALS_TO_HANDLE"] ==
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  auto chosen = run_command(
      ddprun_fake({"--signals_to_handle", "term,10"}, {"env=TORCHELASTIC_SIGNALS_TO_HANDLE"}), {},
      kJobLimit);
  INFO(chosen.err);
  CHECK(env_printed_by(chosen.out, "[default0]:")["TORCHELASTIC_SIGNALS_TO_HANDLE"] ==
        "SIGTERM,SIGUSR1");
}

TEST_CASE("abbreviated and torchrun 2.x flags reach a real run; an ambiguous one exits 64",
          "[agent][integration]") {
  auto r = run_command(
      ddprun_fake({"--nproc=2", "--max_restart=0", "--redirect=0"}, {"env=LOCAL_WORLD_SIZE"}), {},
      kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(env_printed_by(r.out, "[default1]:")["LOCAL_WORLD_SIZE"] == "2");
  auto ambiguous = run_command(ddprun_fake({"--no", "x"}, {"print=started"}), {}, kJobLimit);
  CHECK(ambiguous.exit_code == 64);
  CHECK(contains(ambiguous.err, "ambiguous option --no: could be"));
  auto numa = run_command(ddprun_fake({"--numa-binding=socket"}, {"print=started"}), {}, kJobLimit);
  CHECK(numa.exit_code == 64);
  CHECK(contains(numa.err, "only node is implemented by ddprun"));
  CHECK_FALSE(contains(numa.out, "started"));
}

TEST_CASE("with --numa_binding node each worker runs on the CPUs of its NUMA node",
          "[agent][integration]") {
  // Two NUMA nodes of one CPU each, laid out like sysfs; no GPU, so local ranks go round them.
  TempDir sysfs;
  for (int node = 0; node < 2; ++node) {
    const std::string dir = sysfs.path() + "/devices/system/node/node" + std::to_string(node);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/cpulist") << node << "\n";
  }
  std::vector<std::string> argv{DDPRUN_BIN,
                                "--nproc_per_node",
                                "2",
                                "--numa_binding",
                                "node",
                                "--no_python",
                                "/bin/grep",
                                "Cpus_allowed_list:",
                                "/proc/self/status"};
  auto r = run_command(argv, {{"DDPRUN_SYSFS_ROOT", sysfs.path()}}, kJobLimit);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:Cpus_allowed_list:\t0\n"));
  CHECK(contains(r.out, "[default1]:Cpus_allowed_list:\t1\n"));
  // A topology that cannot be read stops ddprun before any worker starts.
  TempDir empty;
  auto bad = run_command(argv, {{"DDPRUN_SYSFS_ROOT", empty.path()}}, kJobLimit);
  CHECK(bad.exit_code == 64);
  CHECK(contains(bad.err, "--numa_binding node: no NUMA node with CPUs in"));
}

TEST_CASE("a worker inherits no socket of the agent's store", "[agent][integration]") {
  // A store descriptor in a worker would keep MASTER_PORT bound after the agent is gone.
  auto r = run_command({DDPRUN_BIN, "--standalone", "--nproc_per_node", "1", "--no_python",
                        "/bin/sh", "-c", "ls -l /proc/self/fd"},
                       {}, kJobLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:"));
  CHECK_FALSE(contains(r.out, "socket:"));
}

TEST_CASE("a worker gets the open-file limit ddprun was started with, not the agent's raised one",
          "[agent][integration]") {
  // The agent raises its soft limit to the hard one for the connections it serves; a worker
  // gets the soft limit of 512 it would get under torchrun (select() breaks above 1023).
  auto r = run_command({"/usr/bin/prlimit", "--nofile=512:4096", DDPRUN_BIN, "--standalone",
                        "--nproc_per_node", "1", "--no_python", "/bin/sh", "-c",
                        "echo soft=$(ulimit -Sn) hard=$(ulimit -Hn); "
                        "grep 'Max open files' /proc/$PPID/limits"},
                       {}, kJobLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:soft=512 hard=4096"));
  // The agent (the worker's parent) runs at its hard limit.
  CHECK(contains(r.out, "Max open files            4096                 4096"));
}
