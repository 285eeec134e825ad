// No process outlives its job: workers die with a SIGKILLed agent, and what a worker forked into
// its process group is killed when the group ends.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

TEST_CASE("no worker survives a SIGKILL of the ddprun agent", "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  Subprocess job(ddprun_fake({"--nproc_per_node", "2"}, {"pidfile=" + pidfile, "hang"}));
  REQUIRE(wait_until([&] { return read_pids(pidfile).size() == 2; }, kJobLimit));
  const auto pids = read_pids(pidfile);
  for (const auto& [rank, pid] : pids) REQUIRE(process_alive(pid));
  job.send(SIGKILL);
  auto r = job.wait(kJobLimit);
  CHECK(r.exit_code == 128 + SIGKILL);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank << " pid " << pid);
    CHECK(wait_gone(pid));
  }
}

TEST_CASE("a SIGKILLed agent's temporary directories are removed by its watcher",
          "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  Subprocess job(ddprun_fake({"--nproc_per_node", "2"}, {"pidfile=" + pidfile, "hang"}));
  REQUIRE(wait_until([&] { return read_pids(pidfile).size() == 2; }, kJobLimit));
  // The agent's: its report socket's and its error files' (no --log_dir), named after it.
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(job.pid()) + ".";
  const auto agent_dirs = [&] {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(tmp)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("ddprun-sock-" + tag, 0) == 0 || name.rfind("ddprun-" + tag, 0) == 0)
        names.push_back(name);
    }
    return names;
  };
  REQUIRE(agent_dirs().size() == 2);
  job.send(SIGKILL);
  CHECK(job.wait(kJobLimit).exit_code == 128 + SIGKILL);
  CHECK(wait_until([&] { return agent_dirs().empty(); }, kJobLimit));
  INFO(agent_dirs().size());
}

TEST_CASE("a process a failed worker forked into its group is killed with the group",
          "[agent][integration]") {
  TempDir dir;
  const std::string children = dir.path() + "/children";
  WorkerSweeper sweeper(children);
  auto r = run_command(ddprun_fake({}, {"spawn_child=" + children, "exit=1"}), {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  const auto pids = read_pids(children);
  REQUIRE(pids.count("child0") == 1);
  CHECK(wait_gone(pids.at("child0")));
}

TEST_CASE("a process a hanging worker forked is killed when another worker fails",
          "[agent][integration]") {
  TempDir dir;
  const std::string children = dir.path() + "/children";
  WorkerSweeper sweeper(children);
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2"},
                                   {"spawn_child=" + children, "wait_lines=" + children + ":2",
                                    "exit_if_rank=1:1", "hang"}),
                       {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  const auto pids = read_pids(children);
  REQUIRE(pids.size() == 2);
  for (const auto& [child, pid] : pids) {
    INFO(child << " pid " << pid);
    CHECK(wait_gone(pid));
  }
}

TEST_CASE("a process a successful worker left behind does not outlive the job",
          "[agent][integration]") {
  TempDir dir;
  const std::string children = dir.path() + "/children";
  WorkerSweeper sweeper(children);
  auto r = run_command(ddprun_fake({}, {"spawn_child=" + children, "print=done"}), {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:done"));
  const auto pids = read_pids(children);
  REQUIRE(pids.count("child0") == 1);
  CHECK(wait_gone(pids.at("child0")));
}
