// No process left behind, whatever ends the job: a worker's setsid'd grandchildren (which leave
// its process group), and those in process groups of their own, are gone after a normal end, a
// SIGTERM and a SIGKILL of the agent; a stop signal is acted on while a large group starts; a
// worker count beyond the kernel's limits is refused before anything starts; a log file that cannot
// be written is reported, once. (docs/design.md, "Process hygiene")
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

/// Live (not zombie) processes whose command line mentions `text` (a test's temporary
/// directory, which every worker and grandchild of that test has in its arguments).
std::vector<pid_t> live_processes_mentioning(const std::string& text) {
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    std::string cmdline = read_file("/proc/" + name + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (contains(cmdline, text) && process_alive(pid)) found.push_back(pid);
  }
  return found;
}

/// True once no process mentioning `text` runs (bounded: 10 s).
bool none_left(const std::string& text) {
  return wait_until([&] { return live_processes_mentioning(text).empty(); },
                    std::chrono::seconds(10));
}

/// Two workers, each starting two setsid'd sleepers, then `then` (e.g. "hang").
std::vector<std::string> two_workers_with_grandchildren(const std::string& cleanup,
                                                        const std::string& pids,
                                                        const std::string& then) {
  return ddprun_fake({"--nproc_per_node", "2", "--cleanup", cleanup},
                     {"spawn_setsid=" + pids + ":2", "wait_lines=" + pids + ":4", then});
}

/// Whether --cleanup cgroup can work here (a cgroup v2 tree delegated to this user); when not,
/// the cgroup cases say so and pass, and "forcing --cleanup cgroup where it cannot work" covers
/// the refusal.
bool cgroup_usable() {
  auto r = run_command(ddprun_fake({"--cleanup", "cgroup"}, {"exit=0"}), {}, kJobLimit);
  if (r.exit_code == 64 && contains(r.err, "--cleanup cgroup:")) {
    WARN("--cleanup cgroup is not usable here: " << r.err);
    return false;
  }
  return true;
}

void check_grandchildren_gone_after_normal_end(const std::string& cleanup) {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  auto r = run_command(two_workers_with_grandchildren(cleanup, pids, "print=done"), {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(read_pids(pids).size() == 4);
  CHECK(none_left(dir.path()));
}

void check_grandchildren_gone_after_sigterm(const std::string& cleanup) {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  Subprocess job(two_workers_with_grandchildren(cleanup, pids, "hang"));
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 4; }, kJobLimit));
  job.send(SIGTERM);
  auto r = job.wait(kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 143);
  CHECK(none_left(dir.path()));
}

}  // namespace

TEST_CASE("setsid grandchildren are gone after a normal end with --cleanup subreaper",
          "[agent][integration]") {
  check_grandchildren_gone_after_normal_end("subreaper");
}

TEST_CASE("setsid grandchildren are gone after a normal end with --cleanup cgroup",
          "[agent][integration]") {
  if (cgroup_usable()) check_grandchildren_gone_after_normal_end("cgroup");
}

TEST_CASE("setsid grandchildren are gone after a SIGTERM with --cleanup subreaper",
          "[agent][integration]") {
  check_grandchildren_gone_after_sigterm("subreaper");
}

TEST_CASE("setsid grandchildren are gone after a SIGTERM with --cleanup cgroup",
          "[agent][integration]") {
  if (cgroup_usable()) check_grandchildren_gone_after_sigterm("cgroup");
}

TEST_CASE("setsid grandchildren of a failed group are gone before the restart",
          "[agent][integration]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  // Restart 0 leaves sleepers and fails; restart 1 checks they are gone, then succeeds.
  auto r =
      run_command(ddprun_fake({"--max_restarts", "1", "--cleanup", "subreaper"},
                              {"exit_if_restart=1:0", "spawn_setsid=" + pids + ":2", "exit=1"}),
                  {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  REQUIRE(read_pids(pids).size() == 2);
  for (const auto& [key, pid] : read_pids(pids)) CHECK_FALSE(process_alive(pid));
}

TEST_CASE("setsid grandchildren are gone after a SIGKILL of the agent (--cleanup cgroup)",
          "[agent][integration]") {
  if (!cgroup_usable()) return;
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  Subprocess job(two_workers_with_grandchildren("cgroup", pids, "hang"));
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 4; }, kJobLimit));
  job.send(SIGKILL);
  auto r = job.wait(kJobLimit);
  CHECK(r.exit_code == 128 + SIGKILL);
  // The watcher kills the cgroup; a zombie left for init to reap counts as gone.
  CHECK(none_left(dir.path()));
}

namespace {

/// Two workers (--cleanup subreaper) that each start two sleepers with `spawn`
/// ("spawn_setsid" or "spawn_setpgrp"), and ddprun SIGKILLed `after` they run: none is left.
/// The watcher knows each worker's session from before its exec, and notes the sessions of
/// the agent's descendants each second: one started less than that before the SIGKILL can be
/// missed (docs/design.md, "Process hygiene").
void check_sleepers_gone_after_sigkill(const std::string& spawn, std::chrono::milliseconds after) {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  Subprocess job(ddprun_fake({"--nproc_per_node", "2", "--cleanup", "subreaper"},
                             {spawn + "=" + pids + ":2", "wait_lines=" + pids + ":4", "hang"}));
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 4; }, kJobLimit));
  std::this_thread::sleep_for(after);
  job.send(SIGKILL);
  auto r = job.wait(kJobLimit);
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK(none_left(dir.path()));
}

}  // namespace

TEST_CASE("setsid grandchildren are gone after a SIGKILL of the agent (--cleanup subreaper)",
          "[agent][integration]") {
  check_sleepers_gone_after_sigkill("spawn_setsid", std::chrono::milliseconds(3500));
}

TEST_CASE(
    "children in process groups of their own are gone after a SIGKILL of the agent "
    "(--cleanup subreaper)",
    "[agent][integration]") {
  // setpgid(0, 0), still in the worker's session: one sleeper of each worker leads its group,
  // the other's leader has exited, leaving it an orphan of the agent.
  check_sleepers_gone_after_sigkill("spawn_setpgrp", std::chrono::milliseconds(3500));
}

TEST_CASE(
    "children in process groups of their own are gone after a SIGKILL of the agent as soon as "
    "they run (--cleanup subreaper)",
    "[agent][integration]") {
  // Before the watcher's first look: what keeps them is the worker's session, which the
  // watcher was told of before the worker's exec.
  check_sleepers_gone_after_sigkill("spawn_setpgrp", std::chrono::milliseconds(0));
}

TEST_CASE(
    "a worker's child cannot join a process group of ddprun's session, and those groups outlive "
    "a SIGKILL of the agent (--cleanup subreaper)",
    "[agent][integration]") {
  // Two groups of this test's session (ddprun's too) that are not the job's: one whose leader
  // lives, one whose leader has exited, leaving a member. A child of each worker tries to join
  // each (setpgid): a worker leads a session of its own, as under torchrun 2.x, so the kernel
  // refuses (EPERM), and the watcher must not take either group for the job's.
  auto sleeper = [] {
    for (int s = 0; s < 600; ++s) ::sleep(1);
    ::_exit(0);
  };
  const pid_t led = ::fork();
  if (led == 0) {
    ::setpgid(0, 0);
    sleeper();
  }
  ::setpgid(led, led);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t gone = ::fork();
  if (gone == 0) {
    ::setpgid(0, 0);
    const pid_t member = ::fork();
    if (member == 0) sleeper();
    if (::write(fds[1], &member, sizeof member) != sizeof member) ::_exit(1);
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t member = -1;
  const bool read_member = ::read(fds[0], &member, sizeof member) == sizeof member;
  ::close(fds[0]);
  ::waitpid(gone, nullptr, 0);
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  {
    Subprocess job(ddprun_fake(
        {"--nproc_per_node", "2", "--cleanup", "subreaper"},
        {"join_group=" + pids + ":" + std::to_string(led),
         "join_group=" + pids + ":" + std::to_string(gone), "wait_lines=" + pids + ":4", "hang"}));
    if (read_member && wait_until([&] { return read_pids(pids).size() == 4; }, kJobLimit)) {
      INFO(read_file(pids));
      for (const auto& [key, pid] : read_pids(pids)) CHECK(key.rfind("refused", 0) == 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // looked at, thrice
      job.send(SIGKILL);
      CHECK(job.wait(kJobLimit).exit_code == 128 + SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the watcher's kills
      CHECK(process_alive(led));
      CHECK(process_alive(member));
    } else {
      FAIL_CHECK("the workers' children did not try to join the groups");
    }
  }
  for (pid_t pid : {led, member})
    if (pid > 0) ::kill(pid, SIGKILL);
  ::waitpid(led, nullptr, 0);
}

TEST_CASE(
    "background children in a worker's process group are gone after a SIGKILL of the agent "
    "(--cleanup subreaper)",
    "[agent][integration]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  // Each worker forks a child that stays in its process group (`sleep 3011 &` in a shell).
  Subprocess job(ddprun_fake({"--nproc_per_node", "2", "--cleanup", "subreaper"},
                             {"spawn_child=" + pids, "wait_lines=" + pids + ":2", "hang"}));
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 2; }, kJobLimit));
  job.send(SIGKILL);
  auto r = job.wait(kJobLimit);
  CHECK(r.exit_code == 128 + SIGKILL);
  // The workers die with the agent (PR_SET_PDEATHSIG); their children, which nothing
  // signalled, are killed by the watcher (a zombie left for init to reap counts as gone).
  CHECK(none_left(dir.path()));
}

TEST_CASE(
    "a session whose id was a worker's pid, taken by an unrelated daemon, outlives a SIGKILL of "
    "the agent (--cleanup subreaper)",
    "[agent][integration]") {
  // In a pid namespace of its own, so that the test can give the pid of a worker that ended
  // early to a daemon's session (ns_last_pid): the watcher must have dropped the worker's
  // session once it was empty, not kill whatever later has its id (docs/design.md, "Process
  // hygiene"). Needs root, for the namespace and ns_last_pid.
  if (::geteuid() != 0) {
    WARN("not root: a pid namespace of its own cannot be made here");
    return;
  }
  TempDir dir;
  auto r = run_command(
      {"/usr/bin/unshare", "--pid", "--fork", "--mount", "--mount-proc", "/usr/bin/python3",
       std::string(DDPRUN_SOURCE_DIR) + "/tests/integration/scripts/session_reuse.py", DDPRUN_BIN,
       dir.path()},
      {}, kJobLimit);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "daemon alive: True"));
}

TEST_CASE("forcing --cleanup cgroup where it cannot work exits 64 with the reason",
          "[agent][integration]") {
  if (::geteuid() != 0) {
    WARN("needs root, to run ddprun as nobody, whom the cgroup tree is not delegated to");
    return;
  }
  // nobody may not create a cgroup below root's: the cgroup path is unusable for it.
  const std::vector<std::string> as_nobody{"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                           "--clear-groups"};
  std::vector<std::string> forced = as_nobody;
  for (const auto& a : ddprun_fake({"--cleanup", "cgroup"}, {"print=ran"})) forced.push_back(a);
  auto r = run_command(forced, {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 64);
  CHECK(contains(r.err, "--cleanup cgroup: "));
  CHECK(contains(r.err, "--cleanup auto"));
  CHECK_FALSE(contains(r.out, "ran"));
  // auto falls back to the subreaper and runs the job.
  std::vector<std::string> automatic = as_nobody;
  for (const auto& a : ddprun_fake({"--cleanup", "auto"}, {"print=ran"})) automatic.push_back(a);
  auto fallback = run_command(automatic, {}, kJobLimit);
  INFO(fallback.err);
  CHECK(fallback.exit_code == 0);
  CHECK(contains(fallback.out, "[default0]:ran"));
}

TEST_CASE("a SIGTERM while 400 workers start stops them and leaves nothing",
          "[agent][integration]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  Subprocess job(ddprun_fake({"--nproc_per_node", "400"}, {"pidfile=" + pids, "hang"}));
  REQUIRE(wait_until([&] { return !read_pids(pids).empty(); }, kJobLimit));
  job.send(SIGTERM);
  // Generous: the stop is acted on between two launches (bench/README.md has the time).
  auto r = job.wait(kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 143);
  CHECK(none_left(dir.path()));
}

TEST_CASE("a worker count beyond RLIMIT_NOFILE is refused before anything starts",
          "[agent][integration]") {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  std::string command = "ulimit -n 256; exec";
  for (const auto& a : ddprun_fake({"--nproc_per_node", "5000"}, {"pidfile=" + pids, "hang"}))
    command += " '" + a + "'";
  auto r = run_command({"/bin/bash", "-c", command}, {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 64);
  CHECK(lines_of(r.err).size() <= 3);
  CHECK(contains(r.err, "RLIMIT_NOFILE allows (256)"));
  CHECK(contains(r.err, "ulimit -n"));
  CHECK(read_pids(pids).empty());
}

namespace {

/// Runs a worker that prints 100 KB into --log_dir under a 16 KiB RLIMIT_FSIZE, so writes to
/// its stdout.log fail (EFBIG) as on a full disk; then `last` (e.g. "exit=1").
CommandResult run_with_small_file_limit(const TempDir& dir, const std::string& last) {
  std::string command = "ulimit -f 16; exec";
  for (const auto& a : ddprun_fake({"--log_dir", dir.path() + "/logs", "--redirects", "3",
                                    "--event_log", dir.path() + "/events.jsonl"},
                                   {"spam=1000", "print=after", last}))
    command += " '" + a + "'";
  return run_command({"/bin/bash", "-c", command}, {}, kJobLimit);
}

}  // namespace

TEST_CASE("a failed write to a log file is reported once and the job goes on",
          "[agent][integration]") {
  TempDir dir;
  auto r = run_with_small_file_limit(dir, "exit=0");
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.err, "cannot write worker output to ") == 1);
  CHECK(contains(r.err, "stdout.log: File too large"));
  CHECK(contains(r.err, "bytes lost so far"));
  const std::string events = read_file(dir.path() + "/events.jsonl");
  CHECK(count_of(events, "\"event\":\"log_write_failed\"") == 1);
  CHECK(contains(events, "\"log_write_failures\":1"));
}

TEST_CASE("the failure report counts the output lost to failed log writes",
          "[agent][integration]") {
  TempDir dir;
  auto r = run_with_small_file_limit(dir, "exit=3");
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 3);
  CHECK(contains(r.err, "Log writes: failed for 1 file(s), "));
}

TEST_CASE("a worker inherits stdin, stdout and stderr only, whatever ddprun was given",
          "[agent][integration][security]") {
  // Descriptors 7 and 9 are left open by the shell that starts ddprun; each worker lists its
  // own.
  std::vector<std::string> argv{"/bin/sh", "-c", "exec 7</dev/null 9>/dev/null; exec \"$@\"", "sh"};
  for (const std::string& a : ddprun_fake({"--nproc_per_node", "2"}, {"fds"})) argv.push_back(a);
  auto r = run_command(argv);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(count_of(r.out, "fds=0,1,2\n") == 2);
  CHECK_FALSE(contains(r.out, "fds=0,1,2,"));
}

namespace {

/// A health check that starts a sleeper and waits for it, and ddprun SIGKILLed while it runs:
/// the sleeper goes too. (With a cgroup, the check ran in ddprun's own cgroup, which no
/// cgroup.kill reaches, and the sleeper outlived ddprun.)
void check_health_check_gone_after_sigkill(const std::string& cleanup) {
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  WorkerSweeper sweeper(pids);
  Subprocess job(ddprun_fake(
      {"--cleanup", cleanup, "--health_check", "sleep 600 & echo check $! >> " + pids + "; wait"},
      {"print=ran"}));
  REQUIRE(wait_until([&] { return read_pids(pids).size() == 1; }, kJobLimit));
  job.send(SIGKILL);
  auto r = job.wait(kJobLimit);
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK_FALSE(contains(r.out, "ran"));
  for (const auto& [key, pid] : read_pids(pids)) {
    INFO(key << " " << pid);
    CHECK(wait_gone(pid));
  }
}

}  // namespace

TEST_CASE("a health check that runs when ddprun is SIGKILLed goes with it (--cleanup subreaper)",
          "[agent][integration][health]") {
  check_health_check_gone_after_sigkill("subreaper");
}

TEST_CASE("a health check that runs when ddprun is SIGKILLed goes with it (--cleanup cgroup)",
          "[agent][integration][health]") {
  if (cgroup_usable()) check_health_check_gone_after_sigkill("cgroup");
}
