// Python standbys (--standby_workers): a rank handed to a standby that has imported torch must
// be indistinguishable, to an unmodified script, from a rank started afresh. Each test restarts
// a job once, with and without standbys, and compares what the restarted ranks observe.
#include <dlfcn.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/compat/compat_support.h"
#include "tests/support/polling.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

const std::string kScripts = std::string(DDPRUN_SOURCE_DIR) + "/tests/compat/scripts";
const std::string kProbe = kScripts + "/standby_probe.py";
constexpr std::chrono::seconds kLimit{240};

/// ddprun, 2 workers, one restart allowed; the script's rank 1 fails on the first attempt
/// (once the standbys wait, when there are standbys: env_for).
std::vector<std::string> ddprun_probe(bool standbys, const std::string& events,
                                      const std::vector<std::string>& script_and_args) {
  std::vector<std::string> argv{
      DDPRUN_BIN,    "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
      "--event_log", events};
  // Standbys are on by default for a script that imports torch (auto): off said explicitly.
  argv.push_back(standbys ? "--standby_workers" : "--standby_workers=off");
  argv.insert(argv.end(), script_and_args.begin(), script_and_args.end());
  return argv;
}

/// The interpreter with torch; OMP_NUM_THREADS other than ddprun's default of 1, so the standby
/// must apply it; WAIT_STANDBYS=1 makes the scripts fail only once the standbys wait.
std::map<std::string, std::string> env_for(bool standbys) {
  std::map<std::string, std::string> env{{"PYTHON_EXEC", "/usr/bin/python3"},
                                         {"OMP_NUM_THREADS", "3"},
                                         {"TORCH_DISTRIBUTED_DEBUG", "INFO"},
                                         {"NCCL_DEBUG", "WARN"}};
  if (standbys) env["WAIT_STANDBYS"] = "1";
  return env;
}

/// The "PROBE <name> <json>" lines one rank printed.
std::map<std::string, nlohmann::json> probes_of(const std::string& out, int rank) {
  const std::string prefix = "[default" + std::to_string(rank) + "]:PROBE ";
  std::map<std::string, nlohmann::json> probes;
  for (const std::string& line : lines_of(out)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const std::string rest = line.substr(prefix.size());
    const auto space = rest.find(' ');
    probes[rest.substr(0, space)] = nlohmann::json::parse(rest.substr(space + 1), nullptr, false);
  }
  return probes;
}

/// The values that differ between any two jobs (ports, run ids, temporary paths) replaced by
/// whether they are set.
nlohmann::json job_independent(nlohmann::json env) {
  for (const char* name :
       {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "DDPRUN_AGENT_SOCKET"})
    if (env.contains(name)) env[name] = "<set>";
  env.erase("WAIT_STANDBYS");
  return env;
}

/// How many workers of each group came from standbys, from the event log.
std::vector<int> from_standby(const std::string& events) {
  std::vector<int> out;
  for (const std::string& line : lines_of(read_file(events)))
    if (auto e = nlohmann::json::parse(line, nullptr, false);
        e.is_object() && e["event"] == "workers_started")
      out.push_back(e["from_standby"].get<int>());
  return out;
}

/// Every probe of each rank of `standby` equals the fresh run's, the environment up to the
/// values that differ between any two jobs.
void check_same_probes(const CommandResult& fresh, const CommandResult& standby) {
  for (int rank = 0; rank < 2; ++rank) {
    auto a = probes_of(fresh.out, rank);
    auto b = probes_of(standby.out, rank);
    INFO("rank " << rank);
    REQUIRE(a.count("env") == 1);
    REQUIRE(b.count("env") == 1);
    for (const char* env : {"env", "proc_environ"}) {
      REQUIRE(a.count(env) == 1);
      REQUIRE(b.count(env) == 1);
      a[env] = job_independent(a[env]);
      b[env] = job_independent(b[env]);
    }
    // What ps showed while the standbys waited (rank 1 of the run with standbys).
    b.erase("waiting");
    // Random numbers differ between any two interpreters: compared between ranks instead.
    REQUIRE(a.erase("random") == 1);
    REQUIRE(b.erase("random") == 1);
    // With torch 2.x the zygote preloads torch._dynamo (a script's first optimizer imports it),
    // and with it torch's RemoteModule template directory, at the end of sys.path: a fresh
    // rank makes its own there at its first optimizer, a forked rank has its own from the start
    // (check_own_template_dirs). The one difference at the script's first line
    // (docs/design.md#standby-workers); compared without it.
    if (a["template_dir"].is_null() && b["template_dir"].is_string()) {
      auto& path = b["path"];
      REQUIRE(!path.empty());
      CHECK(path.back() == b["template_dir"]);
      path.erase(path.size() - 1);
      b["template_dir"] = nullptr;
      b["template_dir_exists"] = false;
    }
    CHECK(a.size() == b.size());
    for (const auto& [name, value] : a) {
      INFO(name);
      CHECK(b[name].dump() == value.dump());
    }
  }
}

/// Where the ranks have torch's RemoteModule template directory, each has its own, and it exists.
void check_own_template_dirs(const CommandResult& run) {
  const auto dir0 = probes_of(run.out, 0)["template_dir"];
  const auto dir1 = probes_of(run.out, 1)["template_dir"];
  if (dir0.is_null() && dir1.is_null()) return;
  CHECK(dir0 != dir1);
  CHECK(probes_of(run.out, 0)["template_dir_exists"] == true);
  CHECK(probes_of(run.out, 1)["template_dir_exists"] == true);
}

/// For each of ranks 0 and 1, the JSON of its first output line "<tag> <json>" (null when
/// none).
std::vector<nlohmann::json> tagged_json(const std::string& out, const std::string& tag) {
  std::vector<nlohmann::json> found(2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[default" + std::to_string(rank) + "]:" + tag + " ";
    for (const std::string& line : lines_of(out))
      if (line.rfind(prefix, 0) == 0 && found[static_cast<std::size_t>(rank)].is_null())
        found[static_cast<std::size_t>(rank)] =
            nlohmann::json::parse(line.substr(prefix.size()), nullptr, false);
  }
  return found;
}

/// The user's site-packages of /usr/bin/python3 with HOME=`home`, created: a place where a test
/// installs a module as `pip install --user` would, which the zygote counts as installed.
std::string user_site_packages(const std::string& home) {
  auto site =
      run_command({"/usr/bin/python3", "-c", "import site; print(site.getusersitepackages())"},
                  {{"HOME", home}});
  REQUIRE(site.exit_code == 0);
  const std::string path = lines_of(site.out).at(0);
  std::filesystem::create_directories(path);
  return path;
}

}  // namespace

TEST_CASE("a rank handed to a Python standby sees what a freshly started rank sees",
          "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  auto fresh = run_command_diagnosed(ddprun_probe(false, dir.path() + "/fresh.jsonl", {kProbe}),
                                     env_for(false), kLimit);
  INFO("fresh:\n" << fresh.out << fresh.err);
  REQUIRE(fresh.exit_code == 0);
  auto standby = run_command_diagnosed(ddprun_probe(true, dir.path() + "/standby.jsonl", {kProbe}),
                                       env_for(true), kLimit);
  INFO("standby:\n" << standby.out << standby.err);
  REQUIRE(standby.exit_code == 0);
  CHECK(from_standby(dir.path() + "/fresh.jsonl") == std::vector<int>{0, 0});
  // Both groups came from standbys forked by the zygote (the restarted one is what the
  // probes compare), or this test compares nothing.
  REQUIRE(from_standby(dir.path() + "/standby.jsonl") == std::vector<int>{2, 2});
  check_same_probes(fresh, standby);
  check_own_template_dirs(standby);
  // Forked from one zygote, the ranks still draw different numbers, as fresh ones do (random
  // reseeds itself after a fork; the bootstrap reseeds numpy's global generator and torch's
  // default one): random, numpy, torch.initial_seed() and a torch.rand draw.
  for (const auto* out : {&fresh.out, &standby.out}) {
    const auto draws0 = probes_of(*out, 0)["random"];
    const auto draws1 = probes_of(*out, 1)["random"];
    REQUIRE(draws0.size() == 4);
    REQUIRE(draws1.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(draws0[i] != draws1[i]);
  }

  // What ps showed of the agent's children while the standbys waited: the first group's ranks
  // (forked from the zygote) as fresh workers, the zygote and the standbys by what they are.
  const std::string fresh_command = "/usr/bin/python3 -u " + kProbe;
  const auto waiting = probes_of(standby.out, 1)["waiting"];
  INFO("waiting: " << waiting.dump());
  auto shown = [&](const std::string& command) {
    return std::count(waiting.begin(), waiting.end(), command);
  };
  CHECK(shown(fresh_command) == 2);
  CHECK(shown("ddprun zygote: " + fresh_command) == 1);
  CHECK(shown("ddprun standby: " + fresh_command) == 2);

  for (int rank = 0; rank < 2; ++rank) {
    auto p = probes_of(standby.out, rank);
    const std::string r = std::to_string(rank);
    // The torchrun contract, the script as __main__ from its own directory, both views of the
    // environment agreeing, OMP_NUM_THREADS applied, SIGUSR1 as ddprun leaves it for workers.
    CHECK(p["env"]["RANK"] == r);
    CHECK(p["env"]["LOCAL_RANK"] == r);
    CHECK(p["env"]["WORLD_SIZE"] == "2");
    CHECK(p["env"]["TORCHELASTIC_RESTART_COUNT"] == "1");
    CHECK_FALSE(p["env"].contains("DDPRUN_STANDBY_FD"));
    CHECK(p["c_env_agrees"] == true);
    CHECK(p["name"] == "__main__");
    CHECK(p["main_module_is_us"] == true);
    CHECK(p["file"] == kProbe);
    CHECK(p["argv"] == nlohmann::json::array({kProbe}));
    // Tools outside the process see the rank as a fresh start: its command and environment.
    CHECK(p["cmdline"] == nlohmann::json::array({"/usr/bin/python3", "-u", kProbe}));
    CHECK(p["orig_argv"] == p["cmdline"]);
    CHECK(p["proc_environ"] == p["env"]);
    CHECK(p["path"][0] == kScripts);
    CHECK(p["helper"] == "helper from the script's directory");
    CHECK(p["threads"] == 3);
    // ddprun starts workers with the preemption notices ignored (agent/process_launcher.cpp).
    CHECK(p["signals"]["SIGUSR1"] == "SIG_IGN");
    CHECK(p["signals"]["SIGUSR2"] == "SIG_IGN");
    CHECK(p["signals"]["SIGTERM"] == "SIG_DFL");
    // A session of its own (and so its process group), as torchrun 2.6 starts a worker.
    CHECK(p["leads"] == nlohmann::json::array({true, true}));
    // ddprun exports PYTHONFAULTHANDLER=1 (hang forensics): fresh and forked alike.
    CHECK(p["faulthandler"] == true);
    CHECK(p["cuda_initialized"] == false);
    CHECK(p["debug_level"] == "DebugLevel.INFO");
    CHECK(p["env"]["NCCL_DEBUG"] == "WARN");
    CHECK(contains(standby.out, "[default" + r + "]:atexit ran on rank " + r));
  }
}

TEST_CASE("a Python standby runs a -m module as python -m would",
          "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  auto in_scripts = [&](bool standbys, const std::string& events) {
    std::vector<std::string> argv{"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", kScripts};
    for (const std::string& a : ddprun_probe(standbys, events, {"-m", "standby_probe"}))
      argv.push_back(a);
    return run_command_diagnosed(argv, env_for(standbys), kLimit);
  };
  auto fresh = in_scripts(false, dir.path() + "/fresh.jsonl");
  INFO("fresh:\n" << fresh.out << fresh.err);
  REQUIRE(fresh.exit_code == 0);
  auto standby = in_scripts(true, dir.path() + "/standby.jsonl");
  INFO("standby:\n" << standby.out << standby.err);
  REQUIRE(standby.exit_code == 0);
  REQUIRE(from_standby(dir.path() + "/standby.jsonl") == std::vector<int>{2, 2});
  check_same_probes(fresh, standby);
  check_own_template_dirs(standby);
  auto p = probes_of(standby.out, 1);
  CHECK(p["name"] == "__main__");
  CHECK(p["argv"][0] == kProbe);
  CHECK(p["path"][0] == kScripts);
}

TEST_CASE("a Python standby's exit code and uncaught exception are the script's",
          "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  SECTION("sys.exit") {
    auto r = run_command_diagnosed(
        ddprun_probe(true, dir.path() + "/events.jsonl", {kProbe, "--exit", "7"}), env_for(true),
        kLimit);
    INFO(r.out << r.err);
    REQUIRE(from_standby(dir.path() + "/events.jsonl") == std::vector<int>{2, 2});
    CHECK(r.exit_code == 75);  // the restart budget is spent
    CHECK(contains(r.err, "rank      : 1 (local_rank: 1)"));
    CHECK(contains(r.err, "exitcode  : 7"));
    CHECK(contains(r.out, "[default1]:atexit ran on rank 1"));
  }
  SECTION("an uncaught exception") {
    auto r =
        run_command_diagnosed(ddprun_probe(true, dir.path() + "/events.jsonl", {kProbe, "--raise"}),
                              env_for(true), kLimit);
    INFO(r.out << r.err);
    REQUIRE(from_standby(dir.path() + "/events.jsonl") == std::vector<int>{2, 2});
    CHECK(contains(r.err, "exitcode  : 1"));
    // The interpreter's report, starting at the script: no frame of ddprun's bootstrap.
    CHECK(contains(r.err, "[default1]:Traceback (most recent call last):\n[default1]:  File \"" +
                              kProbe + "\""));
    CHECK(contains(r.err, "[default1]:RuntimeError: raised by the probe on rank 1"));
    CHECK_FALSE(contains(r.err, "ddprun_standby.py"));
    CHECK(contains(r.out, "[default1]:atexit ran on rank 1"));
  }
  SECTION("a KeyboardInterrupt") {
    auto r = run_command_diagnosed(
        ddprun_probe(true, dir.path() + "/events.jsonl", {kProbe, "--interrupt"}), env_for(true),
        kLimit);
    INFO(r.out << r.err);
    REQUIRE(from_standby(dir.path() + "/events.jsonl") == std::vector<int>{2, 2});
    // As a fresh interpreter: the report from the script on, atexit, then death by SIGINT.
    CHECK(contains(r.err, "[default1]:Traceback (most recent call last):\n[default1]:  File \"" +
                              kProbe + "\""));
    CHECK(contains(r.err, "[default1]:KeyboardInterrupt"));
    CHECK_FALSE(contains(r.err, "ddprun_standby.py"));
    CHECK(contains(r.out, "[default1]:atexit ran on rank 1"));
    CHECK(contains(r.err, "exitcode  : -2"));
  }
  SECTION("a syntax error") {
    // As the interpreter shows one: where it is, and no traceback (no frame ran).
    const std::string script = dir.path() + "/broken.py";
    std::ofstream(script) << "import torch\ndef (:\n";
    auto r = run_command_diagnosed(
        {DDPRUN_BIN, "--standalone", "--nproc_per_node", "1", "--standby_workers", "--event_log",
         dir.path() + "/events.jsonl", script},
        env_for(false), kLimit);
    INFO(r.out << r.err);
    REQUIRE(from_standby(dir.path() + "/events.jsonl") == std::vector<int>{1});
    CHECK(r.exit_code == 1);
    CHECK(contains(r.err, "[default0]:  File \"" + script + "\", line 2"));
    CHECK(contains(r.err, "[default0]:SyntaxError: invalid syntax"));
    CHECK_FALSE(contains(r.err, "Traceback"));
    CHECK_FALSE(contains(r.err, "ddprun_standby.py"));
  }
}

TEST_CASE(
    "a DDP script killed with SIGKILL resumes from its snapshot in standbys to the same "
    "parameters",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  auto train = [&](bool standbys) {
    const std::string tag = standbys ? "standby" : "fresh";
    std::vector<std::string> argv{DDPRUN_BIN,         "--standalone",
                                  "--nproc_per_node", "2",
                                  "--max_restarts",   "1",
                                  "--event_log",      dir.path() + "/" + tag + ".jsonl"};
    argv.push_back(standbys ? "--standby_workers" : "--standby_workers=off");
    for (const std::string& a :
         {kScripts + "/ddp_resume.py", std::string("4"), dir.path() + "/" + tag + ".pt",
          dir.path() + "/" + tag + ".params", std::string("--kill_epoch"), std::string("2")})
      argv.push_back(a);
    return run_command_diagnosed(argv, env_for(standbys), kLimit);
  };
  auto fresh = train(false);
  INFO("fresh:\n" << fresh.out << fresh.err);
  REQUIRE(fresh.exit_code == 0);
  auto standby = train(true);
  INFO("standby:\n" << standby.out << standby.err);
  REQUIRE(standby.exit_code == 0);
  REQUIRE(from_standby(dir.path() + "/standby.jsonl") == std::vector<int>{2, 2});
  for (const auto* r : {&fresh, &standby}) {
    CHECK(contains(r->err, "restarting workers: restart 1 of 1"));
    CHECK(contains(r->out, "[default0]:rank 0: resuming from the snapshot at epoch 2"));
    CHECK(contains(r->out, "[default1]:rank 1: resuming from the snapshot at epoch 2"));
  }
  const std::string params = read_file(dir.path() + "/fresh.params");
  CHECK(params.size() == 17 * 4 * 2);  // 16 weights and a bias, float32, in hex
  CHECK(read_file(dir.path() + "/standby.params") == params);
}

TEST_CASE(
    "standbys are on by default for a script that imports torch and its first workers "
    "are forked from the zygote",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  auto r = run_command_diagnosed({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2",
                                  "--event_log", events, kScripts + "/standby_first_start.py"},
                                 {{"PYTHON_EXEC", "/usr/bin/python3"}}, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(from_standby(events) == std::vector<int>{2});
  CHECK(contains(r.out, "[default0]:rank 0 of 2 joined"));
  CHECK(contains(r.out, "[default1]:rank 1 of 2 joined"));
  CHECK_FALSE(contains(r.err, "standby"));  // nothing to say
  // The zygote said it was ready before the workers started.
  bool ready = false;
  for (const std::string& line : lines_of(read_file(events)))
    if (auto e = nlohmann::json::parse(line, nullptr, false); e.is_object()) {
      if (e["event"] == "zygote_ready") ready = true;
      if (e["event"] == "workers_started") CHECK(ready);
    }
  CHECK(ready);
}

TEST_CASE(
    "with an interpreter that cannot import torch the default standbys say why and the "
    "job runs without them",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  // -S: without the site module Debian's dist-packages, and torch with it, are not on the path.
  const std::string python = dir.path() + "/python-without-torch";
  std::ofstream(python) << "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n";
  std::filesystem::permissions(python, std::filesystem::perms::owner_all);
  const std::string events = dir.path() + "/events.jsonl";
  auto r = run_command_diagnosed({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2",
                                  "--event_log", events, kScripts + "/standby_first_start.py"},
                                 {{"PYTHON_EXEC", python}}, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(from_standby(events) == std::vector<int>{0});
  CHECK(contains(r.err, "no standbys: the Python zygote (pid "));
  CHECK(contains(r.err, "exit code 3"));
  CHECK(contains(r.err, "cannot import torch"));
  CHECK(contains(r.err, "set PYTHON_EXEC to an interpreter that can"));
  CHECK(contains(r.out, "[default1]:rank 1 of 2 without torch"));
}

TEST_CASE("SIGTERM while the zygote imports torch ends ddprun with 143 and leaves no process",
          "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  Subprocess ddprun({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--event_log", events,
                     kScripts + "/standby_first_start.py"},
                    {{"PYTHON_EXEC", "/usr/bin/python3"}});
  // The pids of the zygote and of any standby it forked, from the event log.
  auto pids_in = [&](const char* event) {
    std::vector<pid_t> pids;
    for (const std::string& line : lines_of(read_file(events)))
      if (auto e = nlohmann::json::parse(line, nullptr, false);
          e.is_object() && e["event"] == event)
        for (const auto& p : e.contains("pids") ? e["pids"] : nlohmann::json::array({e["pid"]}))
          pids.push_back(p.get<pid_t>());
    return pids;
  };
  REQUIRE(wait_until([&] { return !pids_in("zygote_started").empty(); }, std::chrono::seconds(60)));
  // Sent while the zygote imports torch (about a second): the agent waits for it, idle.
  ddprun.send(SIGTERM);
  auto r = ddprun.wait(kLimit);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 143);
  std::vector<pid_t> ours = pids_in("zygote_started");
  for (pid_t pid : pids_in("standbys_started")) ours.push_back(pid);
  for (pid_t pid : pids_in("workers_started")) ours.push_back(pid);
  for (pid_t pid : ours) {
    INFO("pid " << pid);
    CHECK_FALSE(process_alive(pid));
  }
}

TEST_CASE(
    "a zygote with a thread of its own refuses to fork, naming it, and the job runs without "
    "standbys",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  // The user's usercustomize (the user's site-packages under a temporary HOME), which the
  // interpreter runs as it starts, starts a thread before the zygote imports anything. (A
  // module the script imports that starts one is left to the script: the next test.)
  const std::string home = dir.path() + "/home";
  std::ofstream(user_site_packages(home) + "/usercustomize.py")
      << "import threading, time\n"
         "threading.Thread(target=time.sleep, args=(60,), daemon=True, name='site-watcher')"
         ".start()\n";
  const std::string events = dir.path() + "/events.jsonl";
  auto r = run_command_diagnosed({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2",
                                  "--event_log", events, kScripts + "/standby_first_start.py"},
                                 {{"PYTHON_EXEC", "/usr/bin/python3"}, {"HOME", home}}, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(from_standby(events) == std::vector<int>{0});
  CHECK(contains(r.err, "no standbys: the Python zygote (pid "));
  CHECK(contains(r.err,
                 "2 threads run after the imports (Python threads: site-watcher), and a "
                 "fork would copy only one"));
  CHECK_FALSE(contains(r.err, "cannot import torch"));
  CHECK(contains(r.out, "[default1]:rank 1 of 2 joined"));
}

// What an installed module does at import, each forked rank sees as a fresh one does: its
// changes to the environment, its output, threads of its own; ids it drew are shared and named.
TEST_CASE("an installed module's import is seen by each forked rank as by a fresh one",
          "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string home = dir.path() + "/home";
  const std::string user_site = user_site_packages(home);
  // Preloaded, so forked ranks share its import: it changes the environment and prints.
  std::ofstream(user_site + "/sets_env.py")
      << "import os, sys, logging\n"
         "os.environ.setdefault('SET_BY_IMPORT', 'from-import')\n"
         "os.environ['TOKENIZERS_PARALLELISM'] = 'false'\n"
         "os.environ.pop('REMOVED_BY_IMPORT', None)\n"
         "print('printed at import')\n"
         "print('printed at import on stderr', file=sys.stderr)\n"
         "logging.warning('logged at import')\n"
         "PID = os.getpid()\n";
  // Shared, and named: an id and a token drawn from the OS. Left to each rank: a thread.
  std::ofstream(user_site + "/makes_ids.py")
      << "import os, uuid\nRUN_ID = str(uuid.uuid4())\nPID = os.getpid()\n";
  std::ofstream(user_site + "/makes_token.py")
      << "import os, secrets\nTOKEN = secrets.token_hex(8)\nPID = os.getpid()\n";
  std::ofstream(user_site + "/starts_a_thread.py")
      << "import os, threading, time\n"
         "threading.Thread(target=time.sleep, args=(60,), daemon=True, name='watcher').start()\n"
         "PID = os.getpid()\n";
  const std::string script = dir.path() + "/train.py";
  std::ofstream(script)
      << "import json, os, threading\nimport torch\n"
         "import sets_env, makes_ids, makes_token, starts_a_thread\n"
         "print('SEEN', json.dumps({'env': [os.environ.get('SET_BY_IMPORT'),\n"
         "    os.environ.get('TOKENIZERS_PARALLELISM'), os.environ.get('REMOVED_BY_IMPORT'),\n"
         "    os.getenv('SET_BY_IMPORT')],\n"
         "    'preloaded': [m.PID != os.getpid() for m in\n"
         "                  (sets_env, makes_ids, makes_token, starts_a_thread)],\n"
         "    'ids': [makes_ids.RUN_ID, makes_token.TOKEN],\n"
         "    'threads': sorted(t.name for t in threading.enumerate())}), flush=True)\n";
  const std::string events = dir.path() + "/events.jsonl";
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--event_log", events, script},
      {{"PYTHON_EXEC", "/usr/bin/python3"}, {"HOME", home}, {"REMOVED_BY_IMPORT", "x"}}, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // Forked from the zygote, or this test compares nothing.
  REQUIRE(from_standby(events) == std::vector<int>{2});
  const std::vector<nlohmann::json> seen = tagged_json(r.out, "SEEN");
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[default" + std::to_string(rank) + "]:";
    const nlohmann::json& s = seen[static_cast<std::size_t>(rank)];
    INFO("rank " << rank << ": " << s.dump());
    REQUIRE(s.is_object());
    CHECK(s["preloaded"] == nlohmann::json::array({true, true, true, false}));
    CHECK(s["env"] == nlohmann::json::array({"from-import", "false", nullptr, "from-import"}));
    CHECK(s["threads"] == nlohmann::json::array({"MainThread", "watcher"}));
    // What the shared import printed, each rank prints, as a fresh one does at its import.
    CHECK(contains(r.out, prefix + "printed at import\n"));
    CHECK(contains(r.err, prefix + "printed at import on stderr\n"));
    CHECK(contains(r.err, prefix + "WARNING:root:logged at import\n"));
  }
  // The same in every rank, as the agent says (a fresh interpreter per rank draws its own).
  CHECK(seen[0]["ids"] == seen[1]["ids"]);
  CHECK(contains(r.err,
                 "the standbys share what makes_ids, makes_token drew from the OS as "
                 "imported (an id or key: the same in every rank)"));
  CHECK_FALSE(contains(r.err, "sets_env drew"));
}

TEST_CASE(
    "modules a script imports see each rank's own environment, argv and random numbers in "
    "standbys forked from the zygote",
    "[python][integration][standby][security]") {
  require_torch();
  TempDir dir;
  // An installed module (the user's site-packages, under HOME) that reads LOCAL_RANK, RANK and
  // sys.argv at import, one that draws random numbers at import, one that reads nothing a worker
  // sees differently, and a module on PYTHONPATH that reads LOCAL_RANK.
  const std::string home = dir.path() + "/home";
  const std::string user_site = user_site_packages(home);
  std::filesystem::create_directories(dir.path() + "/path");
  std::ofstream(user_site + "/rank_reader.py")
      << "import os, sys\nRANKS = (os.environ.get('LOCAL_RANK'), os.getenv('RANK'))\n"
         "ARGV = list(sys.argv)\nPID = os.getpid()\n";
  std::ofstream(user_site + "/number_drawer.py")
      << "import random, numpy\nDRAWS = [random.random(), float(numpy.random.random())]\n";
  std::ofstream(user_site + "/torch_drawer.py")
      << "import torch\nDRAW = torch.rand(1).item()\nPID = __import__('os').getpid()\n";
  std::ofstream(user_site + "/innocent.py")
      << "import os\nHOME = os.environ.get('HOME')\nPID = os.getpid()\n";
  std::ofstream(dir.path() + "/path/path_reader.py")
      << "import os\nLOCAL = 'LOCAL_RANK' in os.environ and os.environ['LOCAL_RANK']\n";
  const std::string script = dir.path() + "/train.py";
  std::ofstream(script)
      << "import json, os, sys\nimport torch\n"
         "import rank_reader, number_drawer, torch_drawer, innocent, path_reader\n"
         "print('SEEN', json.dumps({'own': [os.environ['LOCAL_RANK'], os.environ['RANK']],\n"
         "    'module': list(rank_reader.RANKS),\n"
         "    'reader_preloaded': rank_reader.PID != os.getpid(), 'argv': rank_reader.ARGV,\n"
         "    'draws': number_drawer.DRAWS + [torch_drawer.DRAW, torch.rand(1).item(),\n"
         "                                    torch.initial_seed()],\n"
         "    'torch_drawer_preloaded': torch_drawer.PID != os.getpid(),\n"
         "    'path': path_reader.LOCAL,\n"
         "    'innocent_preloaded': innocent.PID != os.getpid()}),\n"
         "    flush=True)\n";
  const std::string events = dir.path() + "/events.jsonl";
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--event_log", events, script, "x"},
      {{"PYTHON_EXEC", "/usr/bin/python3"}, {"HOME", home}, {"PYTHONPATH", dir.path() + "/path"}},
      kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // Forked from the zygote, or this test compares nothing.
  REQUIRE(from_standby(events) == std::vector<int>{2});
  const std::vector<nlohmann::json> seen = tagged_json(r.out, "SEEN");
  for (int rank = 0; rank < 2; ++rank) {
    const nlohmann::json& s = seen[static_cast<std::size_t>(rank)];
    INFO("rank " << rank << ": " << s.dump());
    REQUIRE(s.is_object());
    CHECK(s["module"] == s["own"]);
    CHECK(s["path"] == std::to_string(rank));
    CHECK(s["argv"] == nlohmann::json::array({script, "x"}));
    // What is safe is still pre-imported (in the zygote, another process); what is not, is not.
    CHECK(s["innocent_preloaded"] == true);
    CHECK(s["reader_preloaded"] == false);
    // A module that draws from torch's generator at import is imported by each rank itself.
    CHECK(s["torch_drawer_preloaded"] == false);
  }
  // random and numpy at import, torch at import, torch.rand and torch.initial_seed() in the
  // script: each rank its own.
  REQUIRE(seen[0]["draws"].size() == 5);
  for (std::size_t i = 0; i < 5; ++i) CHECK(seen[0]["draws"][i] != seen[1]["draws"][i]);
}

TEST_CASE(
    "random generators a shared module makes for itself are seeded afresh in each forked rank, "
    "but those made from a fixed seed",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  // An installed module, safe to share, that makes generators of its own at import: from the
  // OS (as a fresh interpreter seeds them, so different in each rank under torchrun) and from
  // fixed seeds (the same in each rank).
  const std::string home = dir.path() + "/home";
  std::ofstream(user_site_packages(home) + "/own_generators.py")
      << "import os, random, numpy, torch\n"
         "RNG = random.Random()\nNP_RNG = numpy.random.default_rng()\n"
         "NP_LEGACY = numpy.random.RandomState()\nNP_BITS = numpy.random.PCG64()\n"
         "TORCH_GEN = torch.Generator()\nTORCH_GEN.seed()\n"
         "class Holder:\n    rng = random.Random()\n"
         "FIXED = random.Random(1234)\nFIXED_NP = numpy.random.default_rng(7)\n"
         "FIXED_TORCH = torch.Generator()\nPID = os.getpid()\n";
  const std::string script = dir.path() + "/train.py";
  std::ofstream(script)
      << "import json, os\nimport torch\nimport own_generators as g\n"
         "print('GEN', json.dumps({'preloaded': g.PID != os.getpid(),\n"
         "    'os': [g.RNG.random(), g.NP_RNG.random(), g.NP_LEGACY.random(),\n"
         "           g.NP_BITS.random_raw(), g.TORCH_GEN.initial_seed(), g.Holder.rng.random()],\n"
         "    'fixed': [g.FIXED.random(), g.FIXED_NP.random(), g.FIXED_TORCH.initial_seed()]}),\n"
         "    flush=True)\n";
  const std::string events = dir.path() + "/events.jsonl";
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--event_log", events, script},
      {{"PYTHON_EXEC", "/usr/bin/python3"}, {"HOME", home}}, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(from_standby(events) == std::vector<int>{2});
  const std::vector<nlohmann::json> seen = tagged_json(r.out, "GEN");
  for (const nlohmann::json& s : seen) {
    REQUIRE(s.is_object());
    // Still shared: the zygote imported it, so the ranks compared are forked copies.
    CHECK(s["preloaded"] == true);
  }
  INFO(seen[0].dump() << "\n" << seen[1].dump());
  REQUIRE(seen[0]["os"].size() == 6);
  for (std::size_t i = 0; i < 6; ++i) CHECK(seen[0]["os"][i] != seen[1]["os"][i]);
  CHECK(seen[0]["fixed"] == seen[1]["fixed"]);
  // Seeding a generator from the OS is no id drawn: the standbys reseed it, and say nothing.
  CHECK_FALSE(contains(r.err, "drew from the OS"));
}

namespace {

/// One line of the fake driver library's log (tests/helpers/fake_libcuda.cpp).
struct DriverCall {
  std::string call;
  long pid = 0;
  std::string visible;  ///< CUDA_VISIBLE_DEVICES as the process had it, "-" when unset
  int device = -1;      ///< cuDevicePrimaryCtxRetain's device
};

std::vector<DriverCall> driver_calls(const std::string& log) {
  std::vector<DriverCall> calls;
  for (const std::string& line : lines_of(read_file(log))) {
    std::istringstream in(line);
    DriverCall c;
    in >> c.call;
    for (std::string field; in >> field;) {
      const auto eq = field.find('=');
      const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
      if (key == "pid") c.pid = std::stol(value);
      if (key == "visible") c.visible = value;
      if (key == "device") c.device = std::stoi(value);
    }
    calls.push_back(c);
  }
  return calls;
}

/// A script that says what each rank is (its pid, LOCAL_RANK, CUDA_VISIBLE_DEVICES) and
/// whether torch's CUDA state was touched; rank 1 of the first attempt fails once the standbys
/// wait, so the restart is handed to standbys that made their GPU ready while they waited.
std::string cuda_probe_script(const std::string& dir) {
  const std::string script = dir + "/cuda_probe.py";
  std::ofstream(script)
      << "import json, os, sys, time\nimport torch\n"
         "sys.path.insert(0, "
      << nlohmann::json(kScripts).dump()
      << ")\n"
         "from standby_probe_wait import standbys_waiting\n"
         "restart = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
         "print('CUDA ' + json.dumps({'pid': os.getpid(), 'restart': restart,\n"
         "    'local_rank': int(os.environ['LOCAL_RANK']),\n"
         "    'visible': os.environ.get('CUDA_VISIBLE_DEVICES', '-'),\n"
         "    'torch_initialized': torch.cuda.is_initialized(),\n"
         "    'threads': len(os.listdir('/proc/self/task')),\n"
         "    'names': [open(f'/proc/self/task/{t}/comm').read().strip()\n"
         "              for t in os.listdir('/proc/self/task')],\n"
         "    'shown': open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode()}),\n"
         "    flush=True)\n"
         "if restart == 0 and os.environ['RANK'] == '1':\n"
         "    deadline = time.monotonic() + 60\n"
         "    while not standbys_waiting() and time.monotonic() < deadline:\n"
         "        time.sleep(0.05)\n"
         "    sys.exit(1)\n";
  return script;
}

std::vector<nlohmann::json> cuda_probes(const std::string& out) {
  std::vector<nlohmann::json> probes;
  for (const std::string& line : lines_of(out))
    if (const auto at = line.find("]:CUDA "); at != std::string::npos)
      probes.push_back(nlohmann::json::parse(line.substr(at + 7), nullptr, false));
  return probes;
}

long zygote_of(const std::string& events) {
  for (const std::string& line : lines_of(read_file(events)))
    if (auto e = nlohmann::json::parse(line, nullptr, false);
        e.is_object() && e["event"] == "zygote_ready")
      return e["pid"].get<long>();
  return 0;
}

}  // namespace

TEST_CASE(
    "GPU-ready standbys (--standby_cuda=context): each rank's standby makes its own device's CUDA "
    "context before it becomes the rank, the zygote none",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  const std::string log = dir.path() + "/driver.log";
  std::vector<std::string> argv{
      DDPRUN_BIN, "--standalone",   "--nproc_per_node", "2",           "--max_restarts",
      "1",        "--standby_cuda", "context",          "--event_log", events};
  std::map<std::string, std::string> env{{"PYTHON_EXEC", "/usr/bin/python3"},
                                         {"LD_LIBRARY_PATH", FAKE_CUDA_DIR},
                                         {"FAKE_CUDA_LOG", log}};
  SECTION("cuda:LOCAL_RANK") {}
  SECTION("--virtual_local_rank: each rank sees its own GPU as cuda:0") {
    argv.push_back("--virtual_local_rank");
  }
  argv.push_back(cuda_probe_script(dir.path()));
  auto r = run_command_diagnosed(argv, env, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(from_standby(events) == std::vector<int>{2, 2});
  CHECK_FALSE(contains(r.out + r.err, "--standby_cuda"));  // nothing went wrong
  const std::vector<DriverCall> calls = driver_calls(log);
  const std::vector<nlohmann::json> ranks = cuda_probes(r.out);
  REQUIRE(ranks.size() == 4);  // two ranks, two attempts
  for (const nlohmann::json& rank : ranks) {
    INFO(rank.dump());
    // The process that became the rank retained the context of the device its script is meant
    // to use, under the CUDA_VISIBLE_DEVICES the rank has, and torch was left untouched.
    const auto retained = std::count_if(calls.begin(), calls.end(), [&](const DriverCall& c) {
      return c.call == "cuDevicePrimaryCtxRetain" && c.pid == rank["pid"].get<long>() &&
             c.device == rank["local_rank"].get<int>() &&
             c.visible == rank["visible"].get<std::string>();
    });
    CHECK(retained == 1);
    CHECK(rank["torch_initialized"] == false);
    // ps shows the rank's command line as a fresh start has it, though the driver's thread
    // runs beside the script.
    CHECK(rank["threads"].get<int>() >= 2);
    // The driver's thread has the name it would have had, started by the script: the main
    // thread's, not that of the standby's thread that made the context.
    CHECK(rank["names"] == nlohmann::json::array({"python3", "python3"}));
    CHECK(rank["shown"] == "/usr/bin/python3");
  }
  // The zygote never initialised CUDA: its forks could not have used it.
  const long zygote = zygote_of(events);
  REQUIRE(zygote > 0);
  CHECK(std::none_of(calls.begin(), calls.end(),
                     [&](const DriverCall& c) { return c.pid == zygote; }));
}

TEST_CASE(
    "GPU-ready standbys: a standby handed its rank while it makes its GPU ready acknowledges at "
    "once, and says so on its rank's output when the GPU takes long",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  const std::string log = dir.path() + "/driver.log";
  // The first group is handed to standbys just forked from the zygote, whose contexts here take
  // 3 s to make (longer than the 2 s ddprun waits for the acknowledgements), or 16 s (longer,
  // with room to spare on a loaded machine, than the 10 s after which a rank says its GPU is
  // not ready).
  std::string retain_ms = "3000";
  SECTION("3 s") {}
  SECTION("16 s") { retain_ms = "16000"; }
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--standby_cuda", "context",
       "--event_log", events, kScripts + "/standby_first_start.py"},
      {{"PYTHON_EXEC", "/usr/bin/python3"},
       {"LD_LIBRARY_PATH", FAKE_CUDA_DIR},
       {"FAKE_CUDA_LOG", log},
       {"FAKE_CUDA_RETAIN_MS", retain_ms}},
      kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(from_standby(events) == std::vector<int>{2});
  CHECK_FALSE(contains(r.err, "did not acknowledge"));
  CHECK(contains(r.out, "[default1]:rank 1 of 2 joined"));
  const std::string slow =
      "ddprun standby: --standby_cuda=context: this rank's GPU is not ready after 10 s (its "
      "CUDA call has not returned); its script starts once it is";
  for (const char* rank : {"[default0]:", "[default1]:"})
    CHECK(contains(r.out + r.err, rank + slow) == (retain_ms == "16000"));
  // Each worker made its context (standbys for a next restart, started a second after the
  // group, may have made theirs too).
  std::vector<long> workers;
  for (const std::string& line : lines_of(read_file(events)))
    if (auto e = nlohmann::json::parse(line, nullptr, false);
        e.is_object() && e["event"] == "workers_started")
      for (const auto& pid : e["pids"]) workers.push_back(pid.get<long>());
  REQUIRE(workers.size() == 2);
  const std::vector<DriverCall> calls = driver_calls(log);
  for (long pid : workers)
    CHECK(std::count_if(calls.begin(), calls.end(), [&](const DriverCall& c) {
            return c.call == "cuDevicePrimaryCtxRetain" && c.pid == pid;
          }) == 1);
}

TEST_CASE(
    "GPU-ready standbys: a standby that cannot make its GPU ready says why on its rank's output "
    "and still becomes the rank",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  std::map<std::string, std::string> env{{"PYTHON_EXEC", "/usr/bin/python3"},
                                         {"LD_LIBRARY_PATH", FAKE_CUDA_DIR},
                                         {"FAKE_CUDA_LOG", dir.path() + "/driver.log"}};
  std::string mode, why;
  SECTION("context, and the driver finds no device") {
    mode = "context";
    env["FAKE_CUDA_INIT_ERROR"] = "100";
    why = "cuInit failed with CUDA_ERROR_NO_DEVICE (100)";
  }
  SECTION("context, on a device in exclusive-process compute mode") {
    mode = "context";
    env["FAKE_CUDA_COMPUTE_MODE"] = "3";
    why = "device 0 is in compute mode 3, not the default (0)";
  }
  SECTION("context, without NVIDIA's driver library") {
    // Only where ddprun would find none of its own (no GPU: CI's machines), looked for as the
    // standby does, also through an LD_LIBRARY_PATH this test inherited.
    if (void* found = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); found != nullptr) {
      ::dlclose(found);
      WARN("NVIDIA's driver library (libcuda.so.1) can be loaded here: not tested here");
      return;
    }
    mode = "context";
    env.erase("LD_LIBRARY_PATH");
    why = "NVIDIA's driver library cannot be loaded (libcuda.so.1";
  }
  SECTION("warm, with a torch built without CUDA (Debian's)") {
    mode = "warm";
    why = "is built without CUDA";
  }
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1", "--standby_cuda",
       mode, "--event_log", events, cuda_probe_script(dir.path())},
      env, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(from_standby(events) == std::vector<int>{2, 2});
  CHECK(cuda_probes(r.out).size() == 4);
  for (const char* rank : {"[default0]:", "[default1]:"})
    CHECK(contains(r.out + r.err,
                   std::string(rank) + "ddprun standby: --standby_cuda=" + mode + ": "));
  CHECK(contains(r.out + r.err, why));
  CHECK(contains(r.out + r.err, "; this standby waits without its GPU ready"));
}

namespace {

/// standby_bad_handover.py: a standby started as the agent does (--standby_cuda `mode`, or
/// "off"), with a stand-in driver whose context takes 120 s, sent a bad hand-over (`then`
/// "bad") or a good one and then a SIGINT ("sigint"); what it saw, as JSON.
nlohmann::json run_handover_helper(const std::string& mode, const std::string& log,
                                   const std::string& then) {
  auto r =
      run_command_diagnosed({"/usr/bin/python3", kScripts + "/standby_bad_handover.py",
                             std::string(DDPRUN_SOURCE_DIR) + "/agent/python/ddprun_standby.py",
                             mode, kScripts + "/standby_first_start.py", then},
                            {{"LD_LIBRARY_PATH", FAKE_CUDA_DIR},
                             {"FAKE_CUDA_LOG", log},
                             {"FAKE_CUDA_RETAIN_MS", "120000"}},
                            kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json got = nlohmann::json::parse(r.out, nullptr, false);
  INFO(r.out);
  REQUIRE(got.is_object());
  return got;
}

}  // namespace

TEST_CASE(
    "a Python standby sent a bad hand-over exits 4 with the reason without acknowledging it, also "
    "while its GPU is being made ready",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string log = dir.path() + "/driver.log";
  std::string mode = "off";
  SECTION("a plain standby") {}
  SECTION("--standby_cuda=context, its context still being made") { mode = "context"; }
  // The context takes longer than the test waits: the standby must leave without it, and
  // with _exit (the stand-in driver's teardown at exit() waits for the context being made).
  const nlohmann::json got = run_handover_helper(mode, log, "bad");
  INFO(got.dump());
  CHECK(got["code"] == 4);
  CHECK(contains(got["err"].get<std::string>(), "ddprun standby: bad hand-over from ddprun: "));
  CHECK(got["acknowledged"] == false);
  CHECK(got["context_made"] == false);
  if (mode == "context") CHECK(contains(read_file(log), "making-context"));
}

TEST_CASE(
    "a background child of a rank handed to a Python standby is gone after a SIGKILL of the "
    "agent (--cleanup subreaper)",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string pids = dir.path() + "/pids";
  const std::string events = dir.path() + "/events.jsonl";
  // The children's pids, from "child<local rank> <pid>" lines.
  auto children = [&] {
    std::vector<pid_t> found;
    std::istringstream in(read_file(pids));
    std::string key;
    long pid = 0;
    while (in >> key >> pid) found.push_back(static_cast<pid_t>(pid));
    return found;
  };
  // A failing test leaves no child behind (checked to be ours by its command line).
  struct Sweep {
    std::function<std::vector<pid_t>()> pids;
    std::string mark;
    ~Sweep() {
      for (pid_t pid : pids())
        if (process_alive(pid) &&
            contains(read_file("/proc/" + std::to_string(pid) + "/cmdline"), mark))
          ::kill(pid, SIGKILL);
    }
  } sweep{children, pids};
  // The first group is forked from the zygote and handed over; each rank starts a child in its
  // own process group, which nothing but the watcher kills once the agent is gone.
  Subprocess ddprun(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--standby_workers", "--cleanup",
       "subreaper", "--event_log", events, kScripts + "/standby_background_child.py", pids},
      {{"PYTHON_EXEC", "/usr/bin/python3"}});
  REQUIRE(wait_until([&] { return children().size() == 2; }, std::chrono::seconds(120)));
  // workers_started is logged once both acknowledgements are in, maybe after the children.
  REQUIRE(wait_until([&] { return from_standby(events) == std::vector<int>{2}; },
                     std::chrono::seconds(30)));
  ddprun.send(SIGKILL);
  auto r = ddprun.wait(kLimit);
  CHECK(r.exit_code == 128 + SIGKILL);
  for (pid_t pid : children()) {
    INFO("child pid " << pid);
    CHECK(wait_until([pid] { return !process_alive(pid); }, std::chrono::seconds(10)));
  }
}

TEST_CASE(
    "a Python standby that became its rank and waits for its GPU ends on a SIGINT as a fresh "
    "rank would, without waiting for the driver",
    "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  const std::string log = dir.path() + "/driver.log";
  // The context takes longer than the test waits; the stand-in driver's teardown at exit()
  // waits for it: only a death by the signal itself is prompt.
  const nlohmann::json got = run_handover_helper("context", log, "sigint");
  INFO(got.dump());
  CHECK(got["acknowledged"] == true);
  CHECK(got["code"] == -SIGINT);  // as subprocess reports a death by a signal
  CHECK(got["context_made"] == false);
}

TEST_CASE(
    "a trial import removes the RemoteModule template directory it made, never the one it "
    "inherited",
    "[python][integration][standby]") {
  // A stand-in for torch's instantiator: no torch needed.
  auto r =
      run_command_diagnosed({"/usr/bin/python3", kScripts + "/standby_template_dir.py",
                             std::string(DDPRUN_SOURCE_DIR) + "/agent/python/ddprun_standby.py"},
                            {}, kLimit);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto got = nlohmann::json::parse(r.out);
  CHECK(got["inherited_kept"] == true);
  CHECK(got["trial_own_removed"] == true);
}

TEST_CASE("a script named by a relative path has the __file__ a fresh interpreter gives it",
          "[python][integration][standby]") {
  require_torch();
  TempDir dir;
  // The working directory joined to the path as typed, not normalized: /d/sub/../show.py.
  std::filesystem::create_directories(dir.path() + "/sub");
  std::ofstream(dir.path() + "/show.py")
      << "import sys\nimport torch\nprint('FILE', __file__, sys.argv[0], flush=True)\n";
  for (const char* standbys : {"--standby_workers=off", "--standby_workers=auto"}) {
    const std::string events = dir.path() + "/events-" + std::string(standbys + 18) + ".jsonl";
    auto r = run_command_diagnosed(
        {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", dir.path() + "/sub", DDPRUN_BIN,
         "--nproc_per_node", "1", "--event_log", events, standbys, "../show.py"},
        {{"PYTHON_EXEC", "/usr/bin/python3"}}, kLimit);
    INFO(standbys << "\n" << r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.out, "[default0]:FILE " + dir.path() + "/sub/../show.py ../show.py"));
    CHECK(from_standby(events) ==
          std::vector<int>{std::string(standbys).ends_with("auto") ? 1 : 0});
  }
}
