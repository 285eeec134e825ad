#include "launcher/launch_plan.h"
#include "launcher/cli.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include <map>
#include <set>

using namespace ddprun;
using namespace ddprun::launcher;

namespace {

/// A machine of the test's making: what plan_launch may ask of it, and how often it ran the
/// workers' Python to ask about libuv.
struct FakeMachine {
  NodeResources node{8, 0};
  std::set<std::string> files{"train.py", "plain.py", "/usr/bin/python3", "/opt/tool"};
  std::set<std::string> executables{"/usr/bin/python3", "/opt/tool"};
  std::map<std::string, std::string> sources{{"train.py", "import torch\nprint(1)\n"},
                                             {"plain.py", "print(1)\n"}};
  std::string meminfo = "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n";
  std::string ddprun = "/opt/ddprun/bin/ddprun";
  std::string bootstrap = "/opt/ddprun/share/ddprun/ddprun_standby.py";
  TorchLibuv libuv = TorchLibuv::NotAsked;
  agent::ProcessLimits limits{};
  int libuv_probes = 0;
  int source_reads = 0;

  LaunchProbes probes() {
    LaunchProbes p;
    p.node_resources = [this] { return node; };
    p.host_name = [] { return std::string("node7"); };
    p.is_local_host = [](const std::string& host) {
      return host == "node7" || host == "10.0.0.7";  // this machine's name and address
    };
    p.working_directory = [] { return std::string("/home/user/job"); };
    p.file_exists = [this](const std::string& path) { return files.count(path) > 0; };
    p.is_program_file = [this](const std::string& path) { return executables.count(path) > 0; };
    p.resolve_executable = [this](const std::string& name, const std::string&) {
      if (executables.count(name) > 0) return name;
      if (executables.count("/usr/bin/" + name) > 0) return "/usr/bin/" + name;
      return std::string();
    };
    p.python_source = [this](const agent::CommandRequest& req, const std::string&) {
      ++source_reads;
      auto it = sources.find(req.script);
      return it == sources.end() ? std::string() : it->second;
    };
    p.process_limits = [this] { return limits; };
    p.numa_topology = [](const std::string& root) -> common::Result<agent::NumaTopology> {
      return common::Error{"no NUMA topology under " + root};
    };
    p.meminfo = [this] { return meminfo; };
    p.ddprun_executable = [this] { return ddprun; };
    p.python_bootstrap = [this](const std::string&) { return bootstrap; };
    p.torch_libuv = [this](const std::string&, const agent::EnvMap&) {
      ++libuv_probes;
      return libuv;
    };
    return p;
  }
};

LaunchConfig standalone(int nproc, const std::string& script = "train.py") {
  LaunchConfig config = default_launch_config();
  config.standalone = true;
  config.nproc_per_node = nproc;
  config.script = script;
  return config;
}

LaunchPlan plan_of(const LaunchConfig& config, FakeMachine& machine,
                   const agent::EnvMap& env = {}) {
  auto planned = plan_launch(config, env, machine.probes());
  INFO((planned ? "" : planned.error().message));
  REQUIRE(planned.ok());
  return *std::move(planned);
}

std::string refusal_of(const LaunchConfig& config, FakeMachine& machine,
                       const agent::EnvMap& env = {}) {
  auto planned = plan_launch(config, env, machine.probes());
  REQUIRE_FALSE(planned.ok());
  return planned.error().message;
}

/// The notes at `level` that contain `part`.
std::size_t notes_with(const LaunchPlan& plan, LaunchNote::Level level, const std::string& part) {
  return static_cast<std::size_t>(
      std::count_if(plan.notes.begin(), plan.notes.end(), [&](const LaunchNote& note) {
        return note.level == level && note.text.find(part) != std::string::npos;
      }));
}

}  // namespace

TEST_CASE("a one-node Python job: workers, interpreter, agent store and standbys",
          "[launcher][unit]") {
  FakeMachine machine;
  const LaunchPlan plan = plan_of(standalone(2), machine);
  CHECK(plan.kind == RendezvousKind::Local);
  CHECK(plan.nproc == 2);
  CHECK(plan.agent.spec.local_world_size == 2);
  CHECK(plan.agent.spec.argv == std::vector<std::string>{"python3", "-u", "train.py"});
  CHECK(plan.agent.interpreter == "/usr/bin/python3");
  CHECK(plan.agent.interpreter_origin == "the first python3 on PATH");
  CHECK(plan.agent.agent_env.at("PYTHONFAULTHANDLER") == "1");
  CHECK(plan.agent.node_name == "node7");
  CHECK(plan.agent.standby_workers);
  CHECK(plan.agent.python_bootstrap == machine.bootstrap);
  CHECK(plan.store.host);
  CHECK(plan.store.use_agent_store);
  CHECK(plan.agent.spec.use_agent_store);
  CHECK(plan.store.listen_host == "127.0.0.1");
  CHECK(notes_with(plan, LaunchNote::Level::Info, "OMP_NUM_THREADS=1") == 1);
  CHECK(machine.libuv_probes == 1);
  CHECK(machine.source_reads == 1);  // the standby decision and the libuv check share it
}

TEST_CASE("the plan keeps what the user set in the workers' environment", "[launcher][unit]") {
  FakeMachine machine;
  const agent::EnvMap env{
      {"PYTHONFAULTHANDLER", ""}, {"OMP_NUM_THREADS", "4"}, {"PYTHON_EXEC", "/usr/bin/python3"}};
  const LaunchPlan plan = plan_of(standalone(2), machine, env);
  CHECK(plan.agent.agent_env.at("PYTHONFAULTHANDLER").empty());
  CHECK(plan.agent.interpreter_origin == "PYTHON_EXEC");
  CHECK(plan.agent.spec.argv.front() == "/usr/bin/python3");
  CHECK(notes_with(plan, LaunchNote::Level::Info, "OMP_NUM_THREADS") == 0);
}

TEST_CASE("the plan converts the configuration's seconds and signals for the agent",
          "[launcher][unit]") {
  FakeMachine machine;
  LaunchConfig config = standalone(1);
  config.shutdown_timeout = 2.5;
  config.watchdog_timeout = 0.25;
  config.signals_to_handle = {15, 1};
  config.health_check = "nvidia-smi -L";
  config.local_addr = "10.0.0.7";
  const LaunchPlan plan = plan_of(config, machine);
  CHECK(plan.agent.spec.shutdown_timeout == std::chrono::milliseconds(2'500));
  CHECK(plan.agent.watchdog_timeout == std::chrono::milliseconds(250));
  CHECK(plan.agent.spec.signals_to_handle == "SIGTERM,SIGHUP");
  CHECK(plan.agent.health_gate);
  CHECK(plan.agent.health_check_command == "nvidia-smi -L");
  CHECK(plan.agent.node_name == "10.0.0.7");
}

TEST_CASE("a --local_addr address must be this machine's; a host name only names the node",
          "[launcher][unit]") {
  FakeMachine machine;
  LaunchConfig config = standalone(1);
  config.local_addr = "10.9.9.9";
  CHECK(refusal_of(config, machine) ==
        "--local_addr 10.9.9.9 is not an address of this machine (ip -brief address lists "
        "them): give one of them, or this machine's host name");
  config.local_addr = "fe80::99";
  CHECK_THAT(refusal_of(config, machine), Catch::Contains("--local_addr fe80::99 is not"));
  config.local_addr = "trainer-3.example";  // as torchrun: the name the other nodes use
  CHECK(plan_of(config, machine).agent.node_name == "trainer-3.example");
}

TEST_CASE(
    "a script not named .py runs under the Python its #! line names, unless PYTHON_EXEC "
    "names one",
    "[launcher][unit]") {
  FakeMachine machine;
  machine.files.insert("train");
  machine.executables.insert("/opt/conda/bin/python");
  machine.sources["train"] = "#!/opt/conda/bin/python\nimport torch\n";
  const LaunchPlan plan = plan_of(standalone(1, "train"), machine);
  CHECK(plan.agent.spec.argv == std::vector<std::string>{"/opt/conda/bin/python", "-u", "train"});
  CHECK(plan.agent.interpreter_origin == "the script's #! line");
  const LaunchPlan chosen =
      plan_of(standalone(1, "train"), machine, {{"PYTHON_EXEC", "/usr/bin/python3"}});
  CHECK(chosen.agent.spec.argv == std::vector<std::string>{"/usr/bin/python3", "-u", "train"});
  CHECK(chosen.agent.interpreter_origin == "PYTHON_EXEC");
  // A .py script runs under python3 whatever its #! line says, as torchrun runs it.
  machine.sources["train.py"] = "#!/usr/bin/python2\nimport torch\n";
  CHECK(plan_of(standalone(1), machine).agent.spec.argv.front() == "python3");
}

TEST_CASE("a health check allowed to run longer than the join timeout is warned of",
          "[launcher][unit][health]") {
  FakeMachine machine;
  LaunchConfig config = standalone(1);
  config.health_check = "dcgmi diag -r 3";
  config.health_check_timeout = 60;
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--health_check_timeout") ==
        0);
  config.health_check_timeout = 1800;
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn,
                   "--health_check_timeout 1800 s is longer than the join timeout (600 s)") == 1);
  config.rdzv_conf = {{"join_timeout", "3600"}};
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--health_check_timeout") ==
        0);
  // The builtin check takes milliseconds, whatever the timeout; no check, no timeout.
  config.rdzv_conf.clear();
  for (const char* check : {"builtin", "off"}) {
    config.health_check = check;
    const LaunchPlan plan = plan_of(config, machine);
    CHECK(notes_with(plan, LaunchNote::Level::Warn, "--health_check_timeout") == 0);
    CHECK(plan.agent.health_check_command.empty());
  }
}

TEST_CASE("a --rdzv_conf key ddprun does not read is warned of; torchrun's own are named",
          "[launcher][unit]") {
  FakeMachine machine;
  LaunchConfig config = standalone(1);
  config.rdzv_conf = {{"join_timeout", "60"}, {"keep_alive_interval", "1"}};
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--rdzv_conf") == 0);
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Info, "--rdzv_conf") == 0);
  config.rdzv_conf["join_timout"] = "600";
  config.rdzv_conf["read_timeout"] = "60";
  const LaunchPlan plan = plan_of(config, machine);
  CHECK(notes_with(plan, LaunchNote::Level::Warn,
                   "--rdzv_conf join_timout: no such key, so ignored (a misspelling?); ddprun "
                   "reads join_timeout, last_call_timeout,") == 1);
  CHECK(notes_with(plan, LaunchNote::Level::Info,
                   "--rdzv_conf read_timeout: a key of torchrun's that ddprun has no use for") ==
        1);
}

TEST_CASE("a --quarantine_after the crash-loop stop comes before is warned of",
          "[launcher][unit][health]") {
  FakeMachine machine;
  LaunchConfig config = standalone(1);
  config.quarantine_after = 5;
  config.crash_loop_stop = 3;
  config.max_restarts = 10;
  // One node: no quarantine, nothing to warn of.
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--quarantine_after") == 0);
  config.standalone = false;
  config.min_nodes = config.max_nodes = 2;
  config.rdzv_backend = "c10d";
  config.rdzv_endpoint = "head:29400";
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn,
                   "--quarantine_after 5 is more than --crash_loop_stop 3") == 1);
  // A budget no larger than the stop ends first, unless --restart_window makes it a rate.
  config.max_restarts = 3;
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--quarantine_after") == 0);
  config.restart_window = 3600;
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--quarantine_after") == 1);
  config.restart_window = 0;
  config.max_restarts = 10;
  // Equal: the quarantine comes first. Either off: nothing to warn of.
  for (const auto& [after, stop] : {std::pair{3, 3}, std::pair{5, 0}, std::pair{0, 3}}) {
    config.quarantine_after = after;
    config.crash_loop_stop = stop;
    CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--quarantine_after") == 0);
  }
}

TEST_CASE("a --local_ranks_filter that names a local rank this node does not run is warned of",
          "[launcher][unit]") {
  FakeMachine machine;
  LaunchConfig config = standalone(2);
  config.local_ranks_filter = std::set<int>{1};
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn, "--local_ranks_filter") == 0);
  config.local_ranks_filter = std::set<int>{1, 5, 7};
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Warn,
                   "--local_ranks_filter: local ranks 5,7 are not on this node, which runs local "
                   "ranks 0 to 1 (--nproc_per_node 2)") == 1);
}

TEST_CASE("usage errors are refused before anything starts, naming the value and the fix",
          "[launcher][unit]") {
  FakeMachine machine;
  SECTION("--nproc_per_node gpu on a node without a GPU") {
    LaunchConfig config = standalone(1);
    config.nproc_kind = NprocKind::Gpu;
    CHECK_THAT(refusal_of(config, machine),
               Catch::Contains("no NVIDIA GPU is visible") && Catch::Contains("use cpu"));
  }
  SECTION("a script that is not there") {
    CHECK_THAT(refusal_of(standalone(1, "trian.py"), machine),
               Catch::Contains("trian.py: no such file (working directory /home/user/job)") &&
                   Catch::Contains("-m for a module"));
  }
  SECTION("a --standby_workers value written after a space, read as the script") {
    LaunchConfig config = standalone(1, "off");
    config.standby_workers_given = true;
    CHECK(refusal_of(config, machine) ==
          "off: no such file; --standby_workers takes its value only after '=' "
          "(--standby_workers=off), so 'off' was read as the script");
  }
  SECTION("a --no_python program that is not executable") {
    LaunchConfig config = standalone(1, "/opt/missing");
    config.no_python = true;
    CHECK_THAT(refusal_of(config, machine),
               Catch::Contains("--no_python /opt/missing") && Catch::Contains("chmod +x"));
  }
  SECTION("more workers than the open-file limit holds") {
    machine.limits.open_files = 100;
    machine.limits.open_files_hard = 4096;
    CHECK_THAT(refusal_of(standalone(64), machine),
               Catch::Contains("RLIMIT_NOFILE") && Catch::Contains("ulimit -n"));
  }
  SECTION("--numa_binding on a machine without a NUMA topology") {
    LaunchConfig config = standalone(2);
    config.numa_binding = "node";
    CHECK_THAT(refusal_of(config, machine, {{"DDPRUN_SYSFS_ROOT", "/fake"}}),
               Catch::Contains("--numa_binding node: no NUMA topology under /fake") &&
                   Catch::Contains("drop --numa_binding"));
  }
  SECTION("a rendezvous secret file that cannot be read") {
    LaunchConfig config = standalone(1);
    config.standalone = false;
    config.min_nodes = config.max_nodes = 2;
    config.rdzv_backend = "c10d";
    config.rdzv_endpoint = "head:29400";
    config.rdzv_conf["secret_file"] = "/nonexistent/ddprun-secret";
    CHECK_THAT(refusal_of(config, machine), Catch::Contains("/nonexistent/ddprun-secret"));
  }
  CHECK(machine.libuv_probes == 0);
}

TEST_CASE("a job of several nodes plans a network rendezvous, not hosted by another machine",
          "[launcher][unit]") {
  FakeMachine machine;
  LaunchConfig config = standalone(2);
  config.standalone = false;
  config.min_nodes = config.max_nodes = 2;
  config.rdzv_backend = "c10d";
  config.rdzv_endpoint = "head:29400";
  const LaunchPlan plan = plan_of(config, machine);
  CHECK(plan.kind == RendezvousKind::Network);
  CHECK(plan.rendezvous.hosting == Hosting::Never);
  CHECK(plan.store.host);
  CHECK(plan.store.listen_host.empty());
  CHECK_FALSE(plan.hosted_tls);
}

TEST_CASE("standbys: when they are kept, and what is said when they are not", "[launcher][unit]") {
  FakeMachine machine;
  SECTION("--standby_workers off") {
    LaunchConfig config = standalone(2);
    config.standby_workers = StandbyMode::Off;
    const LaunchPlan plan = plan_of(config, machine);
    CHECK_FALSE(plan.agent.standby_workers);
    CHECK(notes_with(plan, LaunchNote::Level::Debug, "standbys") == 0);
  }
  SECTION("auto, by default, for a script that does not import torch: said at debug level") {
    const LaunchPlan plan = plan_of(standalone(2, "plain.py"), machine);
    CHECK_FALSE(plan.agent.standby_workers);
    CHECK(notes_with(plan, LaunchNote::Level::Debug,
                     "--standby_workers=auto (the default): no standbys: plain.py does not "
                     "import torch") == 1);
  }
  SECTION("auto, asked for, for a script that does not import torch: said at info level") {
    LaunchConfig config = standalone(2, "plain.py");
    config.standby_workers_given = true;
    const LaunchPlan plan = plan_of(config, machine);
    CHECK_FALSE(plan.agent.standby_workers);
    CHECK(notes_with(plan, LaunchNote::Level::Info, "--standby_workers=auto: no standbys") == 1);
  }
  SECTION("on, for a script that does not import torch: kept") {
    LaunchConfig config = standalone(2, "plain.py");
    config.standby_workers = StandbyMode::On;
    CHECK(plan_of(config, machine).agent.standby_workers);
  }
  SECTION("on, on a node short of memory: a warning naming what they need") {
    LaunchConfig config = standalone(2);
    config.standby_workers = StandbyMode::On;
    machine.meminfo = "MemAvailable: 102400 kB\n";
    const LaunchPlan plan = plan_of(config, machine);
    CHECK_FALSE(plan.agent.standby_workers);
    CHECK(notes_with(plan, LaunchNote::Level::Warn, "100 MiB of memory available") == 1);
  }
  SECTION("on, without ddprun's Python bootstrap: the warning names where it looked") {
    LaunchConfig config = standalone(2);
    config.standby_workers = StandbyMode::On;
    machine.bootstrap.clear();
    const LaunchPlan plan = plan_of(config, machine);
    CHECK_FALSE(plan.agent.standby_workers);
    CHECK(notes_with(plan, LaunchNote::Level::Warn,
                     "not at /opt/ddprun/bin/../share/ddprun/ddprun_standby.py") == 1);
  }
  SECTION("--numa_binding: none, since a standby could not be bound") {
    LaunchConfig config = standalone(2);
    config.numa_binding = "node";
    config.standby_workers = StandbyMode::On;
    LaunchProbes probes = machine.probes();
    probes.numa_topology = [](const std::string&) -> common::Result<agent::NumaTopology> {
      agent::NumaTopology topology;
      topology.node_cpus = {{0, {0, 1, 2, 3}}};
      return topology;
    };
    auto planned = plan_launch(config, {}, probes);
    REQUIRE(planned.ok());
    CHECK_FALSE(planned->agent.standby_workers);
    CHECK(planned->agent.cpus_by_local_rank.size() == 2);
    CHECK(notes_with(*planned, LaunchNote::Level::Warn, "--numa_binding binds each worker") == 1);
  }
  SECTION("a program that is not Python is its own standby when asked") {
    LaunchConfig config = standalone(2, "/opt/tool");
    config.standby_workers = StandbyMode::On;
    const LaunchPlan plan = plan_of(config, machine);
    CHECK(plan.agent.standby_workers);
    CHECK(plan.agent.python_bootstrap.empty());
  }
}

TEST_CASE(
    "the option --standby_cuda reaches a Python script's standbys, and is said to do nothing "
    "elsewhere",
    "[launcher][unit][standby]") {
  FakeMachine machine;
  SECTION("a Python script's standbys are told") {
    LaunchConfig config = standalone(2);
    config.standby_cuda = agent::StandbyCuda::Warm;
    config.standby_preload = {"numpy"};
    const LaunchPlan plan = plan_of(config, machine);
    CHECK(plan.agent.standby_workers);
    CHECK(plan.agent.python_standby.cuda == agent::StandbyCuda::Warm);
    CHECK(plan.agent.python_standby.preload == std::vector<std::string>{"numpy"});
    CHECK(notes_with(plan, LaunchNote::Level::Warn, "--standby_cuda") == 0);
  }
  SECTION("without standbys: a warning that it has no effect") {
    LaunchConfig config = standalone(2);
    config.standby_workers = StandbyMode::Off;
    config.standby_cuda = agent::StandbyCuda::Context;
    const LaunchPlan plan = plan_of(config, machine);
    CHECK(notes_with(plan, LaunchNote::Level::Warn,
                     "--standby_cuda: no standbys to make a GPU ready in") == 1);
  }
  SECTION("a program on the C++ SDK: its standbys wait without, said so") {
    LaunchConfig config = standalone(2, "/opt/tool");
    config.standby_workers = StandbyMode::On;
    config.standby_cuda = agent::StandbyCuda::Context;
    const LaunchPlan plan = plan_of(config, machine);
    CHECK(plan.agent.standby_workers);
    CHECK(notes_with(plan, LaunchNote::Level::Warn,
                     "only a Python script's standbys make their GPU ready") == 1);
  }
}

TEST_CASE("a budget too small for the crash-loop stop is said at start", "[launcher][unit]") {
  FakeMachine machine;
  LaunchConfig config = standalone(1);
  config.max_restarts = 1;
  config.crash_loop_stop = 3;
  const LaunchPlan plan = plan_of(config, machine);
  CHECK(notes_with(plan, LaunchNote::Level::Info,
                   "--max_restarts 1 allows 2 starts, fewer than the 3 failures in a row "
                   "--crash_loop_stop needs: a job that fails the same way at every start ends "
                   "with exit 75 (a requeue may help) rather than 78 (do not requeue); "
                   "--crash_loop_stop 2 makes it 78") == 1);
  config.max_restarts = 2;
  CHECK(notes_with(plan_of(config, machine), LaunchNote::Level::Info, "--max_restarts") == 0);
}

TEST_CASE("a torch built without libuv: the agent store off and USE_LIBUV=0 for the workers",
          "[launcher][unit]") {
  FakeMachine machine;
  machine.libuv = TorchLibuv::Missing;
  SECTION("by default") {
    const LaunchPlan plan = plan_of(standalone(2), machine);
    CHECK_FALSE(plan.config.agent_store);
    CHECK_FALSE(plan.store.use_agent_store);
    CHECK_FALSE(plan.store.host);
    CHECK_FALSE(plan.agent.spec.use_agent_store);
    CHECK(plan.agent.agent_env.at("USE_LIBUV") == "0");
    CHECK(notes_with(plan, LaunchNote::Level::Info, "built without libuv") == 1);
  }
  SECTION("--agent_store off and USE_LIBUV=0 already: torch is not asked") {
    LaunchConfig config = standalone(2);
    config.agent_store = false;
    const LaunchPlan plan = plan_of(config, machine, {{"USE_LIBUV", "0"}});
    CHECK(machine.libuv_probes == 0);
    CHECK(notes_with(plan, LaunchNote::Level::Info, "libuv") == 0);
  }
  SECTION("a script whose own module imports torch is adapted too") {
    // trial/indirect.py: `from proj.trainer import run`; proj/trainer.py imports torch in a
    // function.
    machine.files.insert("indirect.py");
    machine.sources["indirect.py"] = "from proj.trainer import run\nrun()\n";
    machine.sources["proj.trainer"] = "def run():\n    import torch.distributed as dist\n";
    const LaunchPlan plan = plan_of(standalone(2, "indirect.py"), machine);
    CHECK(machine.libuv_probes == 1);
    CHECK_FALSE(plan.config.agent_store);
    CHECK(plan.agent.agent_env.at("USE_LIBUV") == "0");
  }
  SECTION("a script that imports nothing of torch's, nor do its modules: torch is not asked") {
    machine.files.insert("indirect.py");
    machine.sources["indirect.py"] = "from proj.tools import run\nimport os\n";
    machine.sources["proj.tools"] = "import json\n";
    const LaunchPlan plan = plan_of(standalone(2, "indirect.py"), machine);
    CHECK(machine.libuv_probes == 0);
    CHECK(plan.config.agent_store);
  }
  SECTION("a program that is not Python: torch is not asked") {
    LaunchConfig config = standalone(2, "/opt/tool");
    const LaunchPlan plan = plan_of(config, machine);
    CHECK(machine.libuv_probes == 0);
    CHECK(plan.config.agent_store);
    CHECK(plan.agent.interpreter.empty());
    CHECK(plan.agent.agent_env.count("PYTHONFAULTHANDLER") == 0);
  }
}
