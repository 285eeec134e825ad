// Usage errors: ddprun refuses bad command lines up front, with exit status 64 and one line that
// names the value, and starts no worker.
#include <catch2/catch.hpp>
#include <filesystem>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

std::vector<std::string> non_empty_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (const std::string& line : lines_of(text))
    if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("a bad flag value exits 64 with one line naming it and starts no worker",
          "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  auto r = run_command(ddprun_fake({"--nnodes", "4:2"}, {"pidfile=" + pidfile}), {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 64);
  const auto lines = non_empty_lines(r.err);
  REQUIRE(lines.size() == 1);
  CHECK(contains(lines.front(), "--nnodes 4:2"));
  CHECK(r.out.empty());
  CHECK_FALSE(std::filesystem::exists(pidfile));
}

TEST_CASE("a bad PET_ variable exits 64 naming the variable", "[agent][integration]") {
  auto r = run_command(ddprun_fake({}, {"print=ran"}), {{"PET_MAX_RESTARTS", "-1"}}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 64);
  REQUIRE(non_empty_lines(r.err).size() == 1);
  CHECK(contains(r.err, "PET_MAX_RESTARTS=-1"));
  CHECK_FALSE(contains(r.out, "ran"));
}

TEST_CASE("a command line without a training script exits 64", "[agent][integration]") {
  auto r = run_command({DDPRUN_BIN, "--nproc_per_node", "2"}, {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 64);
  REQUIRE(non_empty_lines(r.err).size() == 1);
  CHECK(contains(r.err, "training script"));
}

TEST_CASE("a training script that does not exist exits 64 naming it", "[agent][integration]") {
  TempDir dir;
  const std::string missing = dir.path() + "/no_such_train.py";
  auto r = run_command({DDPRUN_BIN, "--nproc_per_node", "2", missing, "--lr", "1"}, {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, missing));
  CHECK(r.out.empty());
}

TEST_CASE("a --no_python command that does not exist exits 64 naming it", "[agent][integration]") {
  const std::string missing = "/nonexistent-ddprun-dir/no-such-trainer";
  auto r =
      run_command({DDPRUN_BIN, "--nproc_per_node", "2", "--no_python", missing}, {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, missing));
  CHECK(r.out.empty());
}
