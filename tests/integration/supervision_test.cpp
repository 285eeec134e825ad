// The agent's supervision rules with real processes: exit codes, the failure report, restarts,
// the shutdown timeout and error files.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/integration/ddprun_runs.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

TEST_CASE("a group whose workers all exit 0 makes ddprun exit 0", "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2"}, {"print=hello"}));
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:hello"));
  CHECK(contains(r.out, "[default1]:hello"));
  CHECK_FALSE(contains(r.err, "FAILED"));
}

TEST_CASE("the --role name is the prefix of each worker's output lines", "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2", "--role", "trainer"}, {"print=hi"}));
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[trainer0]:hi"));
  CHECK(contains(r.out, "[trainer1]:hi"));
  CHECK_FALSE(contains(r.out, "[default"));
}

TEST_CASE("one failing worker stops the whole group and its exit code becomes ddprun's",
          "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  // Rank 1 fails only once rank 0 has recorded its pid, so the hanging rank 0 is really running.
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "2"}, {"pidfile=" + pidfile, "wait_lines=" + pidfile + ":2",
                                              "exit_if_rank=1:7", "hang"}),
      {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 7);
  CHECK(contains(r.err, "FAILED"));
  CHECK(contains(r.err, "Root Cause"));
  CHECK(contains(r.err, "rank      : 1 (local_rank: 1)"));
  CHECK(contains(r.err, "exitcode  : 7"));
  // The group was stopped by the agent: rank 0 is no failure of its own.
  CHECK(contains(r.err, "<NO_OTHER_FAILURES>"));
  const auto pids = read_pids(pidfile);
  REQUIRE(pids.count("0") == 1);
  CHECK(wait_gone(pids.at("0")));
}

TEST_CASE("the failing worker's last output comes before the failure report",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({}, {"eprint=last words", "partial=no newline", "exit=4"}), {},
                       kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 4);
  CHECK(contains(r.out, "[default0]:no newline"));
  const auto words = r.err.find("[default0]:last words");
  const auto report = r.err.find("FAILED");
  REQUIRE(words != std::string::npos);
  REQUIRE(report != std::string::npos);
  CHECK(words < report);
}

TEST_CASE("a worker killed by a signal makes ddprun exit 128 plus the signal number",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2"}, {"signal_if_rank=0:11", "hang"}), {},
                       kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 128 + 11);
  CHECK(contains(r.err, "rank      : 0 (local_rank: 0)"));
  CHECK(contains(r.err, "exitcode  : -11"));
  CHECK(contains(r.err, "signal    : SIGSEGV (11)"));
}

TEST_CASE("a worker that fails only on the first attempt succeeds after a restart",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "2", "--max_restarts", "2"},
                                   {"env=TORCHELASTIC_RESTART_COUNT,TORCHELASTIC_MAX_RESTARTS",
                                    "exit_if_restart=0:1", "print=done"}),
                       {}, kJobLimit);
  INFO(r.out);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:TORCHELASTIC_RESTART_COUNT=1"));
  CHECK(contains(r.out, "[default1]:TORCHELASTIC_RESTART_COUNT=1"));
  CHECK(contains(r.out, "[default0]:TORCHELASTIC_MAX_RESTARTS=2"));
  CHECK(contains(r.out, "[default0]:done"));
  CHECK(contains(r.out, "[default1]:done"));
  CHECK_FALSE(contains(r.out, "TORCHELASTIC_RESTART_COUNT=2"));
  CHECK(contains(r.err, "restart 1 of 2"));
  CHECK_FALSE(contains(r.err, "FAILED"));
}

TEST_CASE("a group restarted once after a failure is not restarted again when it succeeds",
          "[agent][integration]") {
  // A late SIGCHLD of the failed group used to arrive while the restart's rendezvous ran and
  // trigger a second restart, failing the job with 75 and an empty report about 1 run in 4.
  constexpr int kRuns = 20;
  for (int run = 0; run < kRuns; ++run) {
    auto r = run_command(ddprun_fake({"--nproc_per_node", "2", "--max_restarts", "1"},
                                     {"exit_if_restart=0:1", "print=done"}),
                         {}, kJobLimit);
    INFO("run " << run << "\n" << r.err);
    REQUIRE(r.exit_code == 0);
    REQUIRE(count_of(r.err, "restarting workers") == 1);
    REQUIRE(count_of(r.out, ":done") == 2);
  }
}

TEST_CASE("a group that keeps failing exhausts the restart budget and ddprun exits 75",
          "[agent][integration]") {
  auto r = run_command(
      ddprun_fake({"--max_restarts", "1"}, {"env=TORCHELASTIC_RESTART_COUNT", "exit=3"}), {},
      kJobLimit);
  INFO(r.out);
  INFO(r.err);
  CHECK(r.exit_code == 75);
  CHECK(contains(r.err, "FAILED"));
  CHECK(contains(r.err, "Restarts  : 1 of 1 used"));
  CHECK(contains(r.err, "exitcode  : 3"));
  // Exactly two attempts ran: the first one and one restart.
  CHECK(contains(r.out, "[default0]:TORCHELASTIC_RESTART_COUNT=0"));
  CHECK(contains(r.out, "[default0]:TORCHELASTIC_RESTART_COUNT=1"));
  CHECK_FALSE(contains(r.out, "TORCHELASTIC_RESTART_COUNT=2"));
}

TEST_CASE("a worker that ignores SIGTERM is killed with SIGKILL after --shutdown_timeout",
          "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  Subprocess job(ddprun_fake({"--nproc_per_node", "2", "--shutdown_timeout", "1"},
                             {"ignore=15", "pidfile=" + pidfile, "wait_lines=" + pidfile + ":2",
                              "exit_if_rank=1:1", "hang"}),
                 {{"LOGLEVEL", "debug"}});
  // Rank 0 hangs for 10 minutes and ignores SIGTERM: only the SIGKILL ends it (and the job) in
  // time; a broken escalation would run into this limit.
  auto r = job.wait(std::chrono::seconds(30));
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "sending SIGKILL"));
  const auto pids = read_pids(pidfile);
  REQUIRE(pids.count("0") == 1);
  CHECK(contains(
      r.err, "local rank 0 (pid " + std::to_string(pids.at("0")) + ") ended: signal SIGKILL (9)"));
  CHECK(wait_gone(pids.at("0")));
}

TEST_CASE("an obedient hanging worker is stopped by SIGTERM, with no SIGKILL needed",
          "[agent][integration]") {
  TempDir dir;
  const std::string pidfile = dir.path() + "/pids";
  WorkerSweeper sweeper(pidfile);
  // The default --shutdown_timeout (30 s): the worker must go on SIGTERM alone.
  auto r = run_command(
      ddprun_fake({"--nproc_per_node", "2"}, {"pidfile=" + pidfile, "wait_lines=" + pidfile + ":2",
                                              "exit_if_rank=1:1", "hang"}),
      {{"LOGLEVEL", "debug"}}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  const auto pids = read_pids(pidfile);
  REQUIRE(pids.count("0") == 1);
  CHECK(contains(
      r.err, "local rank 0 (pid " + std::to_string(pids.at("0")) + ") ended: signal SIGTERM (15)"));
  CHECK_FALSE(contains(r.err, "sending SIGKILL"));
  CHECK_FALSE(process_alive(pids.at("0")));
}

TEST_CASE("the failure report shows the message and traceback of the worker's error file",
          "[agent][integration]") {
  TempDir logs;
  auto r = run_command(ddprun_fake({"--log_dir", logs.path(), "--rdzv_id", "myrun"},
                                   {"error_file=ValueError: bad batch 17", "exit=1"}),
                       {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  // <log_dir>/myrun_<random>/attempt_0/0/error.json, named in the report.
  std::smatch named;
  const std::regex error_file_re("error_file: (" + logs.path() +
                                 "/myrun_[A-Za-z0-9]{6}/attempt_0/0/error\\.json)");
  REQUIRE(std::regex_search(r.err, named, error_file_re));
  const std::string error_file = named[1];
  CHECK(contains(r.err, "ValueError: bad batch 17"));
  CHECK(contains(r.err, "Traceback (most recent call last):"));
  CHECK(contains(r.err, "fake_worker.cpp"));
  CHECK(contains(read_file(error_file), "bad batch 17"));
}

TEST_CASE("an error file left by an earlier run with the same id is not blamed on this one",
          "[agent][integration]") {
  TempDir logs;
  const std::vector<std::string> flags{"--log_dir", logs.path(), "--rdzv_id", "myrun"};
  auto first =
      run_command(ddprun_fake(flags, {"error_file=stale failure", "exit=1"}), {}, kJobLimit);
  REQUIRE(first.exit_code == 1);
  REQUIRE(contains(first.err, "stale failure"));
  auto second = run_command(ddprun_fake(flags, {"exit=2"}), {}, kJobLimit);
  INFO(second.err);
  CHECK(second.exit_code == 2);
  CHECK_FALSE(contains(second.err, "stale failure"));
  CHECK(contains(second.err, "error_file: <N/A>"));
}

TEST_CASE("a --no_python program that cannot be executed fails the job and is named",
          "[agent][integration]") {
  // It exists and is executable, so ddprun starts it; execve refuses it (no ELF, no #!).
  TempDir dir;
  const std::string program = dir.path() + "/not-a-program";
  std::ofstream(program) << "this is not a program\n";
  std::filesystem::permissions(program, std::filesystem::perms::owner_all);
  auto r =
      run_command({DDPRUN_BIN, "--nproc_per_node", "2", "--no_python", program}, {}, kJobLimit);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 127);
  CHECK(contains(r.err, "exec " + program));
  CHECK(contains(r.err, program + " FAILED"));
  CHECK(contains(r.err, "(never started)"));
}

TEST_CASE("PET_NPROC_PER_NODE sets the number of workers", "[agent][integration]") {
  auto r = run_command(ddprun_fake({}, {"print=up"}), {{"PET_NPROC_PER_NODE", "3"}}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.out, "[default0]:up"));
  CHECK(contains(r.out, "[default1]:up"));
  CHECK(contains(r.out, "[default2]:up"));
  CHECK(count_of(r.out, ":up") == 3);
}

TEST_CASE("a --nproc_per_node flag wins over PET_NPROC_PER_NODE", "[agent][integration]") {
  auto r = run_command(ddprun_fake({"--nproc_per_node", "1"}, {"print=up"}),
                       {{"PET_NPROC_PER_NODE", "3"}}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.out, ":up") == 1);
}

TEST_CASE("a program not on the SDK under --standby_workers warns once and starts workers afresh",
          "[agent][integration][standby]") {
  // A standby has no RANK: this program then exits 5 at once, as a script would that reads
  // RANK itself. Workers (with RANK) sleep long enough for the standbys to start and end.
  const std::vector<std::string> argv{DDPRUN_BIN,
                                      "--standalone",
                                      "--nproc_per_node",
                                      "2",
                                      "--standby_workers",
                                      "--no_python",
                                      "/bin/sh",
                                      "-c",
                                      "if [ -n \"$RANK\" ]; then sleep 3; else exit 5; fi"};
  auto r = run_command(argv, {}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.err,
                 "ended on its own (exit code 5) before it was needed: --standby_workers "
                 "needs a program that calls the ddprun worker SDK's "
                 "WorkerContext::from_env; starting workers afresh from now on") == 1);
}

TEST_CASE("a standby that never acknowledges its hand-over is killed and its rank starts afresh",
          "[agent][integration][standby]") {
  // The standbys record their pids and never read DDPRUN_STANDBY_FD, like one still loading its
  // program when the restart comes. Rank 1 fails once both exist; after the restart each rank
  // must run as a fresh process within the hand-over deadline, not hang in a standby.
  TempDir dir;
  const std::string pidfile = dir.path() + "/standbys";
  const std::string events = dir.path() + "/events.jsonl";
  // "$$$$": ddprun, as torchrun, turns "$$" in a worker's arguments into "$" (the shell's $$).
  const std::string script = "if [ -n \"$DDPRUN_STANDBY_FD\" ]; then echo $$$$ >> " + pidfile +
                             "; exec sleep 60; fi; "
                             "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
                             "  if [ \"$RANK\" = 1 ]; then "
                             "    i=0; while [ \"$(cat " +
                             pidfile +
                             " 2>/dev/null | wc -l)\" -lt 2 ] && [ $i -lt 400 ]; "
                             "    do sleep 0.1; i=$((i+1)); done; exit 3; "
                             "  fi; exec sleep 60; "
                             "fi; echo \"rank $RANK fresh\"";
  auto r = run_command(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
       "--standby_workers", "--event_log", events, "--no_python", "/bin/sh", "-c", script},
      {}, kJobLimit);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.err, "restarting workers: restart 1 of 1"));
  CHECK(count_of(r.out, "[default0]:rank 0 fresh") == 1);
  CHECK(count_of(r.out, "[default1]:rank 1 fresh") == 1);
  CHECK(count_of(r.err, "did not acknowledge its hand-over within 2000 ms") == 2);
  // No rank came from a standby, and no standby outlives the job.
  std::vector<int> from_standby;
  for (const auto& e : events_named(events, "workers_started"))
    from_standby.push_back(e["from_standby"].get<int>());
  CHECK(from_standby == std::vector<int>{0, 0});
  const auto pids = lines_of(read_file(pidfile));
  CHECK(pids.size() >= 2);  // the restarted group may have started its own before it ended
  for (const std::string& pid : pids) CHECK(wait_gone(static_cast<pid_t>(std::stol(pid))));
}

TEST_CASE("a stop signal sent to every process of the job is not warned of as a standby's death",
          "[agent][integration][standby]") {
  // SLURM (and a terminal, or a container runtime) signals every process of a job: the
  // standbys get the SIGTERM with ddprun. Alone, a standby killed from outside is warned of,
  // a second later.
  TempDir dir;
  const std::string pidfile = dir.path() + "/standbys";
  const std::string script = "if [ -n \"$DDPRUN_STANDBY_FD\" ]; then echo $$$$ >> " + pidfile +
                             "; exec sleep 60; fi; exec sleep 60";
  auto standbys_up = [&] { return lines_of(read_file(pidfile)).size() >= 2; };
  const std::vector<std::string> argv{DDPRUN_BIN,
                                      "--standalone",
                                      "--nproc_per_node",
                                      "2",
                                      "--standby_workers",
                                      "--no_python",
                                      "/bin/sh",
                                      "-c",
                                      script};
  {
    Subprocess job(argv);
    REQUIRE(wait_until(standbys_up, kJobLimit));
    for (const std::string& pid : lines_of(read_file(pidfile)))
      ::kill(static_cast<pid_t>(std::stol(pid)), SIGTERM);
    job.send(SIGTERM);  // its own copy comes a moment after the standbys'
    auto r = job.wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 128 + SIGTERM);
    CHECK_FALSE(contains(r.err, "before it was needed"));
  }
  std::filesystem::remove(pidfile);
  {
    Subprocess job(argv);
    REQUIRE(wait_until(standbys_up, kJobLimit));
    ::kill(static_cast<pid_t>(std::stol(lines_of(read_file(pidfile)).front())), SIGTERM);
    CHECK(wait_until(
        [&] {
          return contains(job.err_so_far(),
                          "was killed by SIGTERM from outside ddprun before it "
                          "was needed; starting workers afresh from now on");
        },
        kJobLimit));
    job.send(SIGTERM);
    auto r = job.wait(kJobLimit);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 128 + SIGTERM);
  }
}

TEST_CASE("without --log_dir the error file the failure report names is still there to read",
          "[agent][integration]") {
  auto r = run_command(ddprun_fake({}, {"error_file=ValueError: kept", "exit=1"}), {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  std::smatch named;
  REQUIRE(std::regex_search(r.err, named, std::regex("error_file: (/\\S+/error\\.json)")));
  const std::string error_file = named[1];
  // ddprun's watcher, which removes what a SIGKILLed ddprun leaves, leaves these: the report
  // named them.
  CHECK_FALSE(
      wait_until([&] { return !std::filesystem::exists(error_file); }, std::chrono::seconds(3)));
  CHECK(contains(read_file(error_file), "ValueError: kept"));
  // The kept directory is said, so the user can remove it.
  const std::string root = error_file.substr(0, error_file.find("/attempt_0/"));
  CHECK(contains(r.err, "kept in " + root));
  std::filesystem::remove_all(root);
}

TEST_CASE("two ranks failing together are both reported with their tracebacks",
          "[agent][integration]") {
  // Rank 0 fails after half a second; rank 1, which ignores the stop signal, fails on its own
  // with an error file a second later, while its group is being stopped.
  auto both = run_command(ddprun_fake({"--nproc_per_node", "2", "--shutdown_timeout", "20"},
                                      {"ignore=15", "error_file=ValueError: both", "sleep=500",
                                       "exit_if_rank=0:1", "sleep=1000", "exit=2"}),
                          {}, kJobLimit);
  INFO(both.err);
  CHECK(both.exit_code == 1);
  CHECK(contains(both.err, "rank      : 0 (local_rank: 0)"));
  CHECK(contains(both.err, "rank      : 1 (local_rank: 1)"));
  CHECK(contains(both.err, "exitcode  : 2"));
  size_t tracebacks = 0;
  for (size_t at = both.err.find("Traceback"); at != std::string::npos;
       at = both.err.find("Traceback", at + 1))
    ++tracebacks;
  CHECK(tracebacks == 2);
}

TEST_CASE("a launcher started with TORCHELASTIC_ERROR_FILE leaves the root cause's error there",
          "[agent][integration]") {
  TempDir dir;
  const std::string parent_file = dir.path() + "/launcher_error.json";
  auto r = run_command(ddprun_fake({}, {"error_file=ValueError: for the scheduler", "exit=3"}),
                       {{"TORCHELASTIC_ERROR_FILE", parent_file}}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 3);
  auto parent = nlohmann::json::parse(read_file(parent_file));
  CHECK(parent["message"]["message"] == "ValueError: for the scheduler");
  CHECK(parent["message"]["errorCode"] == 3);
  CHECK(contains(parent["message"]["extraInfo"]["py_callstack"].get<std::string>(),
                 "fake_worker.cpp"));
}

namespace {

/// Writes an executable shell script.
void write_script(const std::string& path, const std::string& body) {
  {
    std::ofstream out(path);
    out << "#!/bin/sh\n" << body;
  }
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
}

}  // namespace

TEST_CASE("a python3 on PATH without torch is named in the failure report with the way out",
          "[agent][integration]") {
  TempDir dir;
  // What a pyenv shim or an inactive venv's python3 does with a torch script.
  write_script(dir.path() + "/python3",
               "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
  write_script(dir.path() + "/train.py", "");
  auto r =
      run_command({"/usr/bin/env", "-u", "PYTHON_EXEC", "PATH=" + dir.path() + ":/usr/bin:/bin",
                   "LOGLEVEL=DEBUG", DDPRUN_BIN, "--standby_workers=off", dir.path() + "/train.py"},
                  {}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "workers run the Python interpreter " + dir.path() +
                            "/python3 (the first python3 on PATH)"));
  CHECK(contains(r.err, "The workers ran " + dir.path() +
                            "/python3 (the first python3 on PATH), which cannot import torch"));
  CHECK(contains(r.err, "set PYTHON_EXEC=/path/to/python, or activate its virtual environment"));
}

TEST_CASE("a PYTHON_EXEC that cannot run is named in the failure report", "[agent][integration]") {
  TempDir dir;
  write_script(dir.path() + "/train.py", "");
  auto r = run_command({DDPRUN_BIN, "--standby_workers=off", dir.path() + "/train.py"},
                       {{"PYTHON_EXEC", dir.path() + "/no-such-python"}}, kJobLimit);
  INFO(r.err);
  CHECK(r.exit_code != 0);
  CHECK(contains(r.err, "The workers ran " + dir.path() +
                            "/no-such-python (PYTHON_EXEC), which could not run"));
}

TEST_CASE("a job that fails for another reason gets no interpreter hint", "[agent][integration]") {
  auto r =
      run_command(ddprun_fake({}, {"eprint=No module named 'torch'", "exit=1"}), {}, kJobLimit);
  CHECK(r.exit_code == 1);
  CHECK_FALSE(contains(r.err, "The workers ran"));  // --no_python: ddprun chose no interpreter
}

TEST_CASE("a hung Python worker's SIGABRT, sent for its traceback, leaves no core file",
          "[agent][integration]") {
  rlimit own{};
  REQUIRE(::getrlimit(RLIMIT_CORE, &own) == 0);
  if (own.rlim_max == 0) {
    WARN("skipped: the hard core-file limit here is 0, so no core file could be written");
    return;
  }
  TempDir dir;
  // As under `ulimit -c unlimited`: the worker raises its own limit, and says what its limit
  // was when the SIGABRT came (its own handler replaces faulthandler's, and ends it).
  const std::string script = dir.path() + "/hang.py";
  std::ofstream(script)
      << "import os, resource, signal, time\n"
         "hard = resource.getrlimit(resource.RLIMIT_CORE)[1]\n"
         "resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))\n"
         "def on_abort(signum, frame):\n"
         "    print('CORE LIMIT AT SIGABRT', resource.getrlimit(resource.RLIMIT_CORE)[0],\n"
         "          flush=True)\n"
         "    os._exit(3)\n"
         "signal.signal(signal.SIGABRT, on_abort)\n"
         "print('RAISED TO', resource.getrlimit(resource.RLIMIT_CORE)[0], flush=True)\n"
         "time.sleep(60)\n";
  auto r = run_command({DDPRUN_BIN, "--standby_workers=off", "--watchdog_timeout", "1", script},
                       {{"PYTHON_EXEC", "/usr/bin/python3"}}, kJobLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);
  // Python's resource module writes RLIM_INFINITY as -1.
  CHECK(contains(r.out, "[default0]:RAISED TO " + (own.rlim_max == RLIM_INFINITY
                                                       ? std::string("-1")
                                                       : std::to_string(own.rlim_max))));
  CHECK(contains(r.out, "[default0]:CORE LIMIT AT SIGABRT 0"));
}
