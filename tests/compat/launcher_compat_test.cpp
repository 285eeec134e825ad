// What PyTorch's launcher tests check of torchrun, checked of ddprun with a script of our own
// (tests/compat/scripts/launcher_checks.py) and Debian's torch 1.13: one file per rank, the
// init methods, is_torchelastic_launched, -m and --no_python, two elastic agents, log capture
// with --redirects and --tee together, and @record failures.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/free_port.h"
#include "tests/compat/compat_support.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

const std::string kScripts = std::string(DDPRUN_SOURCE_DIR) + "/tests/compat/scripts";
const std::string kChecks = kScripts + "/launcher_checks.py";
constexpr std::chrono::seconds kLimit{180};

/// ddprun, then `launcher` flags, then the program and its arguments.
std::vector<std::string> ddprun_cmd(std::vector<std::string> launcher,
                                    const std::vector<std::string>& program) {
  launcher.insert(launcher.begin(), DDPRUN_BIN);
  launcher.insert(launcher.end(), program.begin(), program.end());
  return launcher;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// The ranks that left their file in `dir`.
bool touched(const std::string& dir, int ranks) {
  for (int rank = 0; rank < ranks; ++rank)
    if (!fs::exists(dir + "/" + std::to_string(rank))) return false;
  return true;
}

}  // namespace

TEST_CASE("every rank runs once through each init method and knows it was launched",
          "[python][integration]") {
  require_torch();
  for (const char* init : {"env://", "tcp://", "file://"}) {
    TempDir dir;
    auto r = run_command_diagnosed(
        ddprun_cmd({"--standalone", "--nproc_per_node", "2", "--standby_workers=off"},
                   {kChecks, "--touch_dir", dir.path(), "--init_method", init}),
        kPython, kLimit);
    INFO(init << "\n" << r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(count_of(r.out, "launched=True") == 2);
    CHECK(count_of(r.out, "sum=3") == 2);
    CHECK(touched(dir.path(), 2));
  }
}

TEST_CASE("the script runs as a module with -m and as a command with --no_python",
          "[python][integration]") {
  require_torch();
  TempDir module_dir;
  auto as_module = run_command_diagnosed(
      ddprun_cmd({"--standalone", "--nproc_per_node", "2", "-m"},
                 {"launcher_checks", "--touch_dir", module_dir.path()}),
      {{"PYTHON_EXEC", "/usr/bin/python3"}, {"PYTHONPATH", kScripts}}, kLimit);
  INFO(as_module.out << as_module.err);
  CHECK(as_module.exit_code == 0);
  CHECK(touched(module_dir.path(), 2));
  TempDir command_dir;
  auto as_command = run_command_diagnosed(
      ddprun_cmd({"--standalone", "--nproc_per_node", "2", "--no_python"},
                 {"/usr/bin/python3", kChecks, "--touch_dir", command_dir.path()}),
      kPython, kLimit);
  INFO(as_command.out << as_command.err);
  CHECK(as_command.exit_code == 0);
  CHECK(count_of(as_command.out, "launched=True") == 2);
  CHECK(touched(command_dir.path(), 2));
}

TEST_CASE(
    "a Python script without .py runs under python -u, as torchrun runs it, and a program in the "
    "working directory runs by its bare name",
    "[python][integration]") {
  TempDir dir;
  // Executable, named without .py, run by its "#!" line: torchrun runs it as python -u train.
  const std::string script = dir.path() + "/train";
  std::ofstream(script) << "#!/usr/bin/env python3\nimport sys\n"
                           "print('python', sys.executable, sys.stdout.write_through, sys.argv)\n";
  const std::string program = dir.path() + "/prog";
  std::ofstream(program) << "#!/bin/sh\necho program $0 $1\n";
  // Executable without a "#!" line, as every file is on some mounts: the kernel would refuse
  // it (ENOEXEC); torchrun runs it under Python.
  const std::string bare = dir.path() + "/bare.txt";
  std::ofstream(bare) << "import sys\nprint('bare', sys.argv)\n";
  fs::permissions(script, fs::perms::owner_all, fs::perm_options::add);
  fs::permissions(program, fs::perms::owner_all, fs::perm_options::add);
  fs::permissions(bare, fs::perms::owner_all, fs::perm_options::add);
  auto in_dir = [&](const std::string& name) {
    return std::vector<std::string>{"/bin/sh",  "-c",       "cd \"$0\" && exec \"$1\" \"$2\" x",
                                    dir.path(), DDPRUN_BIN, name};
  };
  auto python = run_command_diagnosed(in_dir("train"), kPython, kLimit);
  INFO(python.out << python.err);
  CHECK(python.exit_code == 0);
  CHECK(count_of(python.out, "[default0]:python /usr/bin/python3 True ['train', 'x']") == 1);
  auto direct = run_command_diagnosed(in_dir("prog"), kPython, kLimit);
  INFO(direct.out << direct.err);
  CHECK(direct.exit_code == 0);
  CHECK(count_of(direct.out, "[default0]:program ./prog x") == 1);
  auto text = run_command_diagnosed(in_dir("bare.txt"), kPython, kLimit);
  INFO(text.out << text.err);
  CHECK(text.exit_code == 0);
  CHECK(count_of(text.out, "[default0]:bare ['bare.txt', 'x']") == 1);
}

TEST_CASE("two elastic agents form one job of four ranks", "[python][integration]") {
  require_torch();
  TempDir dir;
  auto port = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(port.ok());
  const std::vector<std::string> flags = {
      "--nnodes",         "1:2",
      "--nproc_per_node", "2",
      "--rdzv_backend",   "c10d",
      "--rdzv_endpoint",  "127.0.0.1:" + std::to_string(*port),
      "--rdzv_id",        "compat-two-agents",
      "--rdzv_conf",      "last_call_timeout=30,join_timeout=120"};
  Subprocess first(ddprun_cmd(flags, {kChecks, "--touch_dir", dir.path()}), kPython);
  auto second = run_command_diagnosed(ddprun_cmd(flags, {kChecks, "--touch_dir", dir.path()}),
                                      kPython, kLimit);
  auto first_done = first.wait(kLimit);
  INFO(first_done.out << first_done.err << second.out << second.err);
  CHECK(first_done.exit_code == 0);
  CHECK(second.exit_code == 0);
  CHECK(count_of(first_done.out + second.out, "of 4: sum=10") == 4);
  CHECK(touched(dir.path(), 4));
}

TEST_CASE("with --redirects and --tee together the lines stay on the console and in the files",
          "[python][integration]") {
  require_torch();
  TempDir dir;
  TempDir logs;
  auto r = run_command_diagnosed(ddprun_cmd({"--standalone", "--nproc_per_node", "2", "--redirects",
                                             "3", "--tee", "3", "--log_dir", logs.path()},
                                            {kChecks, "--touch_dir", dir.path()}),
                                 kPython, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("[default1]:rank 1 of 2: sum=3") != std::string::npos);
  // --standalone gives the run a random id: the run's directory is the only one.
  std::vector<std::string> runs;
  for (const auto& entry : fs::directory_iterator(logs.path())) runs.push_back(entry.path());
  REQUIRE(runs.size() == 1);
  const std::string& run_dir = runs.front();
  CHECK(read_file(run_dir + "/attempt_0/1/stdout.log").find("rank 1 of 2: sum=3") !=
        std::string::npos);
}

TEST_CASE("a rank that fails under @record is named with its exception", "[python][integration]") {
  require_torch();
  TempDir dir;
  auto r = run_command_diagnosed(
      ddprun_cmd({"--standalone", "--nproc_per_node", "2", "--standby_workers=off"},
                 {kChecks, "--touch_dir", dir.path(), "--fail_rank", "1"}),
      kPython, kLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("launcher_checks.py FAILED") != std::string::npos);
  CHECK(r.err.find("rank      : 1 (local_rank: 1)") != std::string::npos);
  CHECK(r.err.find("RuntimeError: rank 1 fails on purpose") != std::string::npos);
  CHECK(fs::exists(dir.path() + "/0"));
  CHECK_FALSE(fs::exists(dir.path() + "/1"));
}

namespace {

const std::string kProbe = kScripts + "/argv_probe.py";

/// The probe's lines ("probe local_rank=..."), without console prefixes, in order.
std::vector<std::string> probe_lines(const std::string& out) {
  std::vector<std::string> lines;
  for (size_t at = out.find("probe "); at != std::string::npos; at = out.find("probe ", at + 1))
    lines.push_back(out.substr(at, out.find('\n', at) - at));
  std::sort(lines.begin(), lines.end());
  return lines;
}

/// torchrun (bench/torchrun_shim.py: Debian 12's 1.13, or Debian 13's 2.6) on one node with two
/// workers, on the static rendezvous at a free port. Not `--standalone`: torch 1.13 hosts that
/// rendezvous on the fixed localhost:29400, which the SLURM tests running beside these need,
/// and torch 2.6 built without libuv cannot host it at all (nor c10d's). The shim mends the
/// static rendezvous's store; the probe scripts open no store of their own.
CommandResult torchrun(const std::vector<std::string>& flags,
                       const std::vector<std::string>& program,
                       const std::map<std::string, std::string>& env = kPython) {
  const auto port = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(port.ok());
  std::vector<std::string> argv{
      "/usr/bin/python3", std::string(DDPRUN_SOURCE_DIR) + "/bench/torchrun_shim.py",
      "--nnodes",         "1",
      "--node_rank",      "0",
      "--rdzv_backend",   "static",
      "--master_addr",    "127.0.0.1",
      "--master_port",    std::to_string(*port),
      "--nproc_per_node", "2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), program.begin(), program.end());
  return run_command_diagnosed(argv, env, kLimit);
}

/// ddprun on one node with two workers: fresh interpreters or forks of the zygote.
CommandResult ddprun2(bool forked, std::vector<std::string> flags,
                      const std::vector<std::string>& program,
                      const std::map<std::string, std::string>& env = kPython) {
  std::vector<std::string> launcher{"--standalone", "--nproc_per_node", "2",
                                    forked ? "--standby_workers=on" : "--standby_workers=off"};
  launcher.insert(launcher.end(), flags.begin(), flags.end());
  return run_command_diagnosed(ddprun_cmd(launcher, program), env, kLimit);
}

}  // namespace

TEST_CASE(
    "${local_rank} in the script's arguments becomes each worker's local rank, as torchrun "
    "substitutes it",
    "[python][integration]") {
  require_torch();
  const std::vector<std::string> program{
      kProbe, "--out=ckpt/${local_rank}", "$local_rank", "cost$$5", "${rank}", "$"};
  auto theirs = torchrun({}, program);
  INFO("torchrun:\n" << theirs.out << theirs.err);
  REQUIRE(theirs.exit_code == 0);
  const auto expected = probe_lines(theirs.out);
  REQUIRE(expected.size() == 2);
  CHECK_THAT(expected[1], Catch::Contains("'--out=ckpt/1', '1', 'cost$5', '${rank}', '$'"));
  for (bool forked : {false, true}) {
    auto ours = ddprun2(forked, {}, program);
    INFO((forked ? "forked" : "fresh") << ":\n" << ours.out << ours.err);
    CHECK(ours.exit_code == 0);
    CHECK(probe_lines(ours.out) == expected);
  }
}

TEST_CASE(
    "the option --run_path runs the script with runpy.run_path in each worker, as torchrun does",
    "[python][integration]") {
  require_torch();
  auto theirs = torchrun({"--run_path"}, {kProbe, "--lr", "1"});
  INFO("torchrun:\n" << theirs.out << theirs.err);
  REQUIRE(theirs.exit_code == 0);
  const auto expected = probe_lines(theirs.out);
  REQUIRE(expected.size() == 2);
  CHECK_THAT(expected[0], Catch::Contains("name=__main__ file=" + kProbe));
  for (bool forked : {false, true}) {
    auto ours = ddprun2(forked, {"--run_path"}, {kProbe, "--lr", "1"});
    INFO((forked ? "forked" : "fresh") << ":\n" << ours.out << ours.err);
    CHECK(ours.exit_code == 0);
    CHECK(probe_lines(ours.out) == expected);
    // PyTorch's own check of --run_path: every rank ran the script (launcher_checks.py).
    TempDir dir;
    auto checks = ddprun2(forked, {"--run_path"}, {kChecks, "--touch_dir", dir.path()});
    INFO(checks.out << checks.err);
    CHECK(checks.exit_code == 0);
    CHECK(touched(dir.path(), 2));
  }
}

TEST_CASE(
    "a script written for torch.distributed.launch gets --local-rank=N from "
    "--local_rank_arg",
    "[python][integration]") {
  require_torch();
  auto env = kPython;
  env["PROBE_LOCAL_RANK_FLAG"] = "--local-rank";
  // torchrun never passes it: the script fails as under ddprun without the flag.
  auto theirs = torchrun({}, {kProbe}, env);
  CHECK(theirs.exit_code != 0);
  CHECK_THAT(theirs.out + theirs.err,
             Catch::Contains("the following arguments are required: --local-rank"));
  auto without = ddprun2(false, {}, {kProbe}, env);
  CHECK(without.exit_code == 2);
  CHECK_THAT(without.out + without.err,
             Catch::Contains("the following arguments are required: --local-rank"));
  for (bool forked : {false, true}) {
    auto ours = ddprun2(forked, {"--local_rank_arg", "local-rank"}, {kProbe, "--lr", "1"}, env);
    INFO((forked ? "forked" : "fresh") << ":\n" << ours.out << ours.err);
    CHECK(ours.exit_code == 0);
    const auto lines = probe_lines(ours.out);
    REQUIRE(lines.size() == 2);
    CHECK_THAT(lines[1], Catch::Contains("'--local-rank=1', '--lr', '1']"));
  }
  // A torch 1.x script reads --local_rank.
  env["PROBE_LOCAL_RANK_FLAG"] = "--local_rank";
  auto old = ddprun2(true, {"--local_rank_arg", "local_rank"}, {kProbe}, env);
  INFO(old.out << old.err);
  CHECK(old.exit_code == 0);
  CHECK(probe_lines(old.out).size() == 2);
}
