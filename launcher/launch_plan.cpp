#include "launcher/launch_plan.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <boost/asio/ip/address.hpp>

#include "agent/standby_pool.h"
#include "agent/worker_env.h"
#include "common/signals.h"
#include "common/strings.h"
#include "launcher/slurm.h"
#include "rendezvous/admission.h"
#include "rendezvous/auth.h"
#include "rendezvous/local_host.h"

namespace ddprun::launcher {
namespace {

using Level = LaunchNote::Level;

std::string env_or(const agent::EnvMap& env, const std::string& key, const std::string& fallback) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

/// Where plan_launch writes: the plan under construction and its notes.
struct Planner {
  const LaunchConfig& config;
  const agent::EnvMap& env;
  const LaunchProbes& probes;
  LaunchPlan plan;

  void note(Level level, std::string text) { plan.notes.push_back({level, std::move(text)}); }

  std::optional<common::Error> read_secret();
  std::optional<common::Error> read_tls();
  std::optional<common::Error> read_etcd_credentials();
  std::optional<common::Error> check_script() const;
  std::optional<common::Error> check_local_addr() const;
  std::optional<common::Error> bind_numa();
  void choose_python(agent::CommandRequest& req);
  void worker_command(const agent::CommandRequest& req);
  void agent_options();
  void standbys(const agent::CommandRequest& req);
  void standby_cuda();
  void rdzv_conf_keys();
  void adapt_to_torch(const agent::CommandRequest& req);
  /// A module of the job's own that the script imports imports torch.
  bool local_module_imports_torch(const agent::CommandRequest& req, const std::string& text);

  /// The workers' Python source, read once for the standby decision and the libuv check.
  const std::string& python_source(const agent::CommandRequest& req) {
    if (!source) source = probes.python_source(req, probes.working_directory());
    return *source;
  }
  std::optional<std::string> source;
  std::string python_origin;  ///< where the workers' interpreter comes from, in words
};

/// A --local_addr that is an address must be one of this machine's where ddprun binds it: the
/// c10d rendezvous connection, and a single node's store. (With etcd it only names the node, as
/// a host name always does, as torchrun's: an address behind NAT is fine there.)
std::optional<common::Error> Planner::check_local_addr() const {
  if (plan.kind == RendezvousKind::Etcd) return std::nullopt;
  boost::system::error_code not_address;
  (void)boost::asio::ip::make_address(config.local_addr, not_address);
  if (config.local_addr.empty() || not_address || probes.is_local_host(config.local_addr))
    return std::nullopt;
  return common::Error{"--local_addr " + config.local_addr +
                       " is not an address of this machine (ip -brief address lists them): "
                       "give one of them, or this machine's host name"};
}

/// The shared secret of the rendezvous: --rdzv_conf secret_file, else the environment.
std::optional<common::Error> Planner::read_secret() {
  if (plan.kind != RendezvousKind::Network) return std::nullopt;
  std::string secret_file = env_or(env, rdzv::kSecretFileVariable, "");
  if (auto it = config.rdzv_conf.find("secret_file"); it != config.rdzv_conf.end())
    secret_file = it->second;
  if (secret_file.empty()) return std::nullopt;
  auto read = rdzv::read_secret_file(secret_file);
  if (!read) return read.error();
  plan.rendezvous.client.secret = *std::move(read);
  return std::nullopt;
}

/// TLS: --rdzv_conf tls_ca (the client's side), tls_cert and tls_key (shown to the server when
/// it asks, and the certificate of the server this node may host).
std::optional<common::Error> Planner::read_tls() {
  if (plan.kind == RendezvousKind::Local) return std::nullopt;
  auto conf = [this](const char* key) {
    auto it = config.rdzv_conf.find(key);
    return it == config.rdzv_conf.end() ? std::string() : it->second;
  };
  rdzv::TlsFiles tls;
  tls.ca = conf("tls_ca");
  tls.cert = conf("tls_cert");
  tls.key = conf("tls_key");
  if (!tls.any()) return std::nullopt;
  auto client = rdzv::make_client_tls(tls, "--rdzv_conf tls_");
  if (!client) return client.error();
  plan.rendezvous.client.tls = *std::move(client);
  const Hosting hosting = plan.rendezvous.hosting;
  if (tls.cert.empty() && hosting == Hosting::Always)
    return common::Error{
        "this node hosts the rendezvous (is_host=1): over TLS it needs --rdzv_conf "
        "tls_cert=FILE,tls_key=FILE, its certificate as a server"};
  if (tls.cert.empty() || hosting == Hosting::Never) return std::nullopt;
  auto server_side = rdzv::make_server_tls(tls, "--rdzv_conf tls_");
  if (!server_side) return server_side.error();
  plan.hosted_tls = *std::move(server_side);
  return std::nullopt;
}

/// etcd's authentication: --rdzv_conf etcd_user and etcd_password_file (checked together by
/// the command line).
std::optional<common::Error> Planner::read_etcd_credentials() {
  auto user = config.rdzv_conf.find("etcd_user");
  if (plan.kind != RendezvousKind::Etcd || user == config.rdzv_conf.end()) return std::nullopt;
  auto password_file = config.rdzv_conf.find("etcd_password_file");
  auto read = etcd::read_credentials(
      user->second, password_file == config.rdzv_conf.end() ? "" : password_file->second);
  if (!read) return read.error();
  plan.etcd_credentials = *std::move(read);
  return std::nullopt;
}

/// Catches a mistyped script before any worker starts (torchrun would start them all and let
/// each one fail).
std::optional<common::Error> Planner::check_script() const {
  if (config.module) return std::nullopt;
  if (config.no_python) {
    if (!probes.resolve_executable(config.script, agent::search_path(env)).empty())
      return std::nullopt;
    return common::Error{"--no_python " + config.script +
                         ": no executable file by that name (PATH searched); check the path, "
                         "or chmod +x it"};
  }
  if (probes.file_exists(config.script)) return std::nullopt;
  // `--standby_workers off`: the one flag whose value is optional takes it only after '='.
  if (config.standby_workers_given &&
      (config.script == "off" || config.script == "on" || config.script == "auto"))
    return common::Error{config.script +
                         ": no such file; --standby_workers takes its value only "
                         "after '=' (--standby_workers=" +
                         config.script + "), so '" + config.script + "' was read as the script"};
  return common::Error{config.script + ": no such file (working directory " +
                       probes.working_directory() +
                       "); check the script path, or use -m for a module"};
}

/// --numa_binding node: each local rank's CPUs, from the topology under DDPRUN_SYSFS_ROOT (a
/// test's fake tree) or /sys.
std::optional<common::Error> Planner::bind_numa() {
  if (config.numa_binding.empty()) return std::nullopt;
  auto topology = probes.numa_topology(env_or(env, "DDPRUN_SYSFS_ROOT", "/sys"));
  if (!topology)
    return common::Error{"--numa_binding node: " + topology.error().message +
                         "; drop --numa_binding"};
  std::optional<std::string> visible;
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) visible = it->second;
  auto cpus = agent::cpus_per_local_rank(*topology, plan.nproc, visible);
  if (!cpus) return cpus.error();
  for (size_t local = 0; local < cpus->size(); ++local)
    note(Level::Debug, "--numa_binding node: local rank " + std::to_string(local) + " on " +
                           std::to_string((*cpus)[local].size()) + " CPUs");
  plan.agent.cpus_by_local_rank = *std::move(cpus);
  return std::nullopt;
}

/// The interpreter of Python workers: PYTHON_EXEC, else, for an executable script not named
/// .py, the one its "#!" line names (ddprun used to run such a script as a program), else the
/// first python3 on PATH.
void Planner::choose_python(agent::CommandRequest& req) {
  if (env.count("PYTHON_EXEC") > 0) {
    req.python_exec = env.at("PYTHON_EXEC");
    python_origin = "PYTHON_EXEC";
    return;
  }
  req.python_exec = "python3";
  python_origin = "the first python3 on PATH";
  if (req.module || req.no_python || req.script.ends_with(".py")) return;
  if (auto named = agent::shebang_python(python_source(req))) {
    req.python_exec = *named;
    python_origin = "the script's #! line";
  }
}

/// The workers' command, and when it runs under Python (a .py script, -m, a file that is not
/// executable or is a Python script by its "#!" line) the interpreter that runs it.
void Planner::worker_command(const agent::CommandRequest& req) {
  agent::AgentOptions& opt = plan.agent;
  opt.spec.argv = agent::build_worker_command(req, probes.is_program_file);
  if (!agent::runs_under_python(req, probes.is_program_file)) return;
  const std::string found =
      probes.resolve_executable(opt.spec.argv.front(), agent::search_path(env));
  opt.interpreter = found.empty() ? opt.spec.argv.front() : found;
  opt.interpreter_origin = python_origin;
  note(Level::Debug, "workers run the Python interpreter " + opt.interpreter + " (" +
                         opt.interpreter_origin + ")");
}

/// The agent's options that are the configuration's values, as they are or in its units.
void Planner::agent_options() {
  agent::AgentOptions& opt = plan.agent;
  opt.spec.role = config.role;
  opt.spec.local_world_size = plan.nproc;
  opt.spec.max_restarts = config.max_restarts;
  opt.spec.shutdown_timeout = ms(config.shutdown_timeout);
  opt.spec.virtual_local_rank = config.virtual_local_rank;
  for (int sig : config.signals_to_handle)
    opt.spec.signals_to_handle +=
        (opt.spec.signals_to_handle.empty() ? "" : ",") + common::signal_name(sig);
  opt.output.duplicate_stdout_filters = config.duplicate_stdout_filters;
  opt.output.duplicate_stderr_filters = config.duplicate_stderr_filters;
  opt.script = config.script;
  opt.log_dir = config.log_dir;
  opt.output.redirects = config.redirects;
  opt.output.tee = config.tee;
  opt.output.console_ranks = config.local_ranks_filter;
  if (config.local_ranks_filter) {
    std::string absent;
    for (int rank : *config.local_ranks_filter)
      if (rank >= plan.nproc) absent += (absent.empty() ? "" : ",") + std::to_string(rank);
    if (!absent.empty()) {
      const bool one = absent.find(',') == std::string::npos;
      const std::string runs = plan.nproc == 1
                                   ? "only local rank 0"
                                   : "local ranks 0 to " + std::to_string(plan.nproc - 1);
      note(Level::Warn, std::string("--local_ranks_filter: local rank") + (one ? " " : "s ") +
                            absent + (one ? " is" : " are") + " not on this node, which runs " +
                            runs + " (--nproc_per_node " + std::to_string(plan.nproc) + ")");
    }
  }
  opt.output.dedup_window = ms(config.dedup_output);
  opt.output.role = config.role;
  if (auto tmpl = env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); tmpl != env.end())
    opt.output.prefix_template = tmpl->second;
  opt.signals_to_handle = config.signals_to_handle;
  opt.agent_env = env;
  // Python workers print every thread's traceback on a fatal signal, and on the SIGABRT the
  // agent sends a hung one before it kills it (docs/operations.md#hang-forensics). A value the
  // user set (even "") is kept.
  if (!opt.interpreter_origin.empty()) opt.agent_env.emplace("PYTHONFAULTHANDLER", "1");
  opt.event_log = config.event_log;
  opt.node_name = config.local_addr.empty() ? probes.host_name() : config.local_addr;
  opt.watchdog_timeout = ms(config.watchdog_timeout);
  opt.restart_backoff = ms(config.restart_backoff);
  opt.restart_backoff_max = ms(config.restart_backoff_max);
  opt.restart_backoff_reset = ms(config.restart_backoff_reset);
  opt.progress_file = config.progress_file;
  opt.health_gate = config.health_check != "off";
  opt.health_check_command =
      config.health_check == "builtin" || !opt.health_gate ? "" : config.health_check;
  opt.health_check_timeout = ms(config.health_check_timeout);
  opt.health_check_interval = ms(config.health_check_interval);
  // The join timeout covers the nodes' checks: a check allowed to run longer is a node the
  // round may form without, or a job that ends with exit 69 if every node's does.
  const rdzv::Millis join_timeout = plan.rendezvous.client.settings.join_timeout;
  if (!opt.health_check_command.empty() && opt.health_check_timeout > join_timeout)
    note(Level::Warn,
         "--health_check_timeout " + rdzv::seconds_text(opt.health_check_timeout) +
             " s is longer than the join timeout (" + rdzv::seconds_text(join_timeout) +
             " s): a node whose check runs that long is not waited for, and a job whose every "
             "node's check does ends with exit 69; raise --rdzv_conf join_timeout");
  // The crash-loop stop needs --crash_loop_stop failures; a smaller budget is spent first, and
  // a job that fails alike at every start ends with 75 (a requeue may help), not 78.
  if (config.crash_loop_stop > 0 && config.max_restarts > 0 && config.restart_window == 0 &&
      config.max_restarts + 1 < config.crash_loop_stop)
    note(Level::Info,
         "--max_restarts " + std::to_string(config.max_restarts) + " allows " +
             std::to_string(config.max_restarts + 1) + " starts, fewer than the " +
             std::to_string(config.crash_loop_stop) +
             " failures in a row --crash_loop_stop needs: a job that fails the same way at every "
             "start ends with exit 75 (a requeue may help) rather than 78 (do not requeue); "
             "--crash_loop_stop " +
             std::to_string(config.max_restarts + 1) + " makes it 78");
  // A node is quarantined at its --quarantine_after'th failure in a row; a crash loop of those
  // failures ends the job at the --crash_loop_stop'th, so the later of the two never comes.
  if (!plan.rendezvous.single_node && config.crash_loop_stop > 0 &&
      (config.max_restarts > config.crash_loop_stop || config.restart_window > 0) &&
      config.quarantine_after > config.crash_loop_stop)
    note(Level::Warn, "--quarantine_after " + std::to_string(config.quarantine_after) +
                          " is more than --crash_loop_stop " +
                          std::to_string(config.crash_loop_stop) +
                          ": a node whose workers fail the same way at every start ends the job "
                          "(exit 78) before it is quarantined, and no spare takes its place; "
                          "lower --quarantine_after or raise --crash_loop_stop");
}

/// --rdzv_conf keys ddprun does not read: torchrun's own are named as unused; any other is
/// most likely a misspelling, which torchrun would ignore without a word.
void Planner::rdzv_conf_keys() {
  // clang-format off
  static const std::vector<std::string> kOurs = {
      "join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval",
      "keep_alive_max_attempt", "connect_timeout", "is_host", "secret_file", "tls_ca",
      "tls_cert", "tls_key", "etcd_user", "etcd_password_file"};
  // Those that would mislead ddprun refuses (protocol=https, cacert, cert and key with etcd-v3:
  // parse_rdzv_conf); what gets here is harmless.
  static const std::vector<std::string> kTorchruns = {
      "read_timeout", "timeout", "store_type", "rank", "etcd_prefix", "ssl_cert",
      "ssl_cert_key", "ca_cert", "use_libuv", "heartbeat", "local_addr", "protocol",
      "cacert", "cert", "key"};
  // clang-format on
  const auto among = [](const std::vector<std::string>& keys, const std::string& key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  std::vector<std::string> unknown;
  for (const auto& [key, value] : config.rdzv_conf) {
    if (among(kOurs, key)) continue;
    if (among(kTorchruns, key)) {
      note(Level::Info, "--rdzv_conf " + key +
                            ": a key of torchrun's that ddprun has no use for; it is ignored");
      continue;
    }
    unknown.push_back(common::printable(key));
  }
  if (!unknown.empty())
    note(Level::Warn, "--rdzv_conf " + common::join(unknown, ", ") + ": no such key" +
                          (unknown.size() > 1 ? "s" : "") +
                          ", so ignored (a misspelling?); ddprun reads " +
                          common::join(kOurs, ", "));
}

/// --standby_workers: which standbys the agent keeps. A Python script's run ddprun's bootstrap
/// (found next to this executable), forked from one zygote per node; any other program is its
/// own standby (the C++ SDK waits). auto, the default, keeps them for Python scripts that
/// import torch on a node with the memory for them, and says why not only when it was asked.
void Planner::standbys(const agent::CommandRequest& req) {
  agent::AgentOptions& opt = plan.agent;
  opt.python_standby = {config.standby_preload, config.standby_cuda};
  if (config.standby_workers == StandbyMode::Off) return;
  const bool automatic = config.standby_workers == StandbyMode::Auto;
  // auto by default: a reason to stay off is news only to a user who asked for standbys.
  auto off_because = [&](const std::string& why) {
    if (!automatic)
      note(Level::Warn, "--standby_workers: no standbys: " + why);
    else if (config.standby_workers_given)
      note(Level::Info, "--standby_workers=auto: no standbys: " + why);
    else
      note(Level::Debug, "--standby_workers=auto (the default): no standbys: " + why);
  };
  if (!config.numa_binding.empty())
    return off_because(
        "--numa_binding binds each worker to its CPUs as it starts; a standby started before "
        "would not be bound");
  if (!agent::runs_under_python(req, probes.is_program_file)) {
    if (automatic)
      return off_because(
          "they are automatic for Python scripts (.py, -m) only; a program on the C++ worker "
          "SDK gets them with --standby_workers=on");
    opt.standby_workers = true;
    return;
  }
  if (automatic && !agent::source_imports_torch(python_source(req)))
    return off_because(config.script +
                       " does not import torch at its top level (--standby_workers=on makes "
                       "standbys for it anyway)");
  if (std::string short_of = agent::standby_memory_shortfall(probes.meminfo(), plan.nproc);
      !short_of.empty())
    return off_because(short_of);
  const std::string self = probes.ddprun_executable();
  const std::string bootstrap = self.empty() ? "" : probes.python_bootstrap(self);
  if (bootstrap.empty())
    return off_because("ddprun's Python bootstrap is not at " +
                       std::filesystem::path(self).parent_path().string() +
                       "/../share/ddprun/ddprun_standby.py; reinstall ddprun (cmake --install)");
  opt.standby_workers = true;
  opt.python_bootstrap = bootstrap;
}

/// --standby_cuda works in a Python script's standbys: said when there are none.
void Planner::standby_cuda() {
  const agent::AgentOptions& opt = plan.agent;
  if (config.standby_cuda == agent::StandbyCuda::Off) return;
  if (!opt.standby_workers)
    note(Level::Warn,
         "--standby_cuda: no standbys to make a GPU ready in (see --standby_workers); it has no "
         "effect");
  else if (opt.python_bootstrap.empty())
    note(Level::Warn, "--standby_cuda: only a Python script's standbys make their GPU ready; " +
                          config.script +
                          "'s own standbys (a program on the C++ worker SDK) wait without");
}

/// Once per node, before the store is planned: a torch that asks for libuv and lacks it
/// (Debian 13's 2.6) cannot make the agent store's clients, nor rank 0's store unless
/// USE_LIBUV=0 (launcher/torch_libuv.h). Python workers only: a script that imports torch or
/// whose source was not found (a -m module on PYTHONPATH), or a --no_python command that runs
/// a Python interpreter.
bool Planner::local_module_imports_torch(const agent::CommandRequest& req,
                                         const std::string& text) {
  // Python looks for a script's imports in its directory first (for -m, in the working
  // directory): a module of the job's own found there that imports torch, anywhere in it,
  // has the script import torch too (`from proj.trainer import run`).
  const std::string cwd = probes.working_directory();
  std::string where = cwd;
  if (!req.module) {
    const std::filesystem::path script(req.script);
    where = (script.is_absolute() ? script : std::filesystem::path(cwd) / script)
                .parent_path()
                .string();
  }
  for (const std::string& name : agent::imported_modules(text)) {
    for (const std::string& module : {name, name + ".__init__"}) {
      agent::CommandRequest local;
      local.module = true;
      local.script = module;
      if (agent::source_imports_torch(probes.python_source(local, where))) return true;
    }
  }
  return false;
}

void Planner::adapt_to_torch(const agent::CommandRequest& req) {
  agent::AgentOptions& opt = plan.agent;
  std::string workers_python;
  if (!opt.interpreter_origin.empty()) {
    const std::string& text = python_source(req);
    if (text.empty() || agent::source_imports_torch(text) || local_module_imports_torch(req, text))
      workers_python = opt.interpreter;
  } else if (names_python_interpreter(opt.spec.argv.front())) {
    workers_python = opt.spec.argv.front();
  }
  if (workers_python.empty() || (!plan.config.agent_store && env_or(env, "USE_LIBUV", "1") == "0"))
    return;
  const LibuvAdaptation adapted = adapt_to_libuv(probes.torch_libuv(workers_python, opt.agent_env),
                                                 plan.config.agent_store, opt.agent_env);
  if (adapted.agent_store_off) plan.config.agent_store = false;
  if (adapted.set_use_libuv_0) opt.agent_env["USE_LIBUV"] = "0";
  if (!adapted.info.empty()) note(Level::Info, adapted.info);
}

int count_visible_gpus(const agent::EnvMap& env) {
  std::error_code ec;
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    ++found;
  }
  if (ec) return 0;
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) {
    const std::string v = common::trim(it->second);
    if (v.empty()) return 0;
    const int listed = static_cast<int>(common::split(v, ',').size());
    return std::min(found, listed);
  }
  return found;
}

}  // namespace

NodeResources detect_node_resources(const agent::EnvMap& env) {
  NodeResources node;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    node.cpus = CPU_COUNT(&set);
  else
    node.cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  if (node.cpus < 1) node.cpus = 1;
  // Inside a SLURM job the allocation says how many GPUs this job may use on the node.
  auto slurm_gpus =
      slurm_gpus_on_node([&env](const std::string& name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  node.gpus = slurm_gpus ? *slurm_gpus : count_visible_gpus(env);
  return node;
}

common::Result<int> resolve_nproc(const LaunchConfig& config, const NodeResources& node) {
  switch (config.nproc_kind) {
    case NprocKind::Count:
      return config.nproc_per_node;
    case NprocKind::Cpu:
      return node.cpus;
    case NprocKind::Gpu:
      if (node.gpus == 0)
        return common::Error{
            "--nproc_per_node gpu: no NVIDIA GPU is visible on this node; give a number or "
            "use cpu"};
      return node.gpus;
    case NprocKind::Auto:
      return node.gpus > 0 ? node.gpus : node.cpus;
  }
  return config.nproc_per_node;
}

LaunchProbes system_probes(const agent::EnvMap& env) {
  LaunchProbes probes;
  probes.node_resources = [&env] { return detect_node_resources(env); };
  probes.host_name = [] { return rdzv::local_host_name(); };
  probes.is_local_host = [](const std::string& host) { return rdzv::is_local_host(host); };
  probes.working_directory = [] {
    std::error_code ec;
    return std::filesystem::current_path(ec).string();
  };
  probes.file_exists = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::exists(path, ec);
  };
  probes.is_program_file = agent::is_program_file;
  probes.resolve_executable = agent::resolve_executable;
  probes.python_source = agent::python_source_of;
  probes.process_limits = agent::current_process_limits;
  probes.numa_topology = agent::read_numa_topology;
  probes.meminfo = [] {
    std::ifstream file("/proc/meminfo");
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
  };
  probes.ddprun_executable = [] {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string() : self.string();
  };
  probes.python_bootstrap = agent::find_python_bootstrap;
  probes.torch_libuv = [](const std::string& interpreter, const agent::EnvMap& workers_env) {
    return probe_torch_libuv(interpreter, workers_env, std::chrono::seconds(30));
  };
  return probes;
}

common::Result<LaunchPlan> plan_launch(const LaunchConfig& config, const agent::EnvMap& env,
                                       const LaunchProbes& probes) {
  Planner planner{config, env, probes, LaunchPlan{}, std::nullopt, ""};
  LaunchPlan& plan = planner.plan;
  plan.config = config;
  auto nproc = resolve_nproc(config, probes.node_resources());
  if (!nproc) return nproc.error();
  plan.nproc = *nproc;
  auto rendezvous = plan_rendezvous(config, plan.nproc, probes.host_name(), probes.is_local_host);
  if (!rendezvous) return rendezvous.error();
  plan.rendezvous = *std::move(rendezvous);
  plan.kind = !plan.rendezvous.etcd_members.empty() ? RendezvousKind::Etcd
              : plan.rendezvous.single_node         ? RendezvousKind::Local
                                                    : RendezvousKind::Network;
  if (auto why = planner.check_local_addr()) return *why;
  if (auto why = planner.read_secret()) return *why;
  if (auto why = planner.read_tls()) return *why;
  if (auto why = planner.read_etcd_credentials()) return *why;
  if (auto why = planner.check_script()) return *why;
  // A count the kernel's limits cannot hold is refused here, before any worker starts, rather
  // than failing rank by rank (docs/design.md, "Process hygiene").
  agent::WorkerNeeds needs;
  needs.log_files = config.redirects.any() || config.tee.any();
  needs.standbys = config.standby_workers != StandbyMode::Off;
  if (auto why = agent::check_worker_limits(plan.nproc, needs, probes.process_limits()))
    return *why;
  if (config.virtual_local_rank)
    if (auto why = agent::virtual_local_rank_problem(env, plan.nproc)) return *why;
  if (auto why = planner.bind_numa()) return *why;

  if (agent::will_default_omp_threads(env, plan.nproc))
    planner.note(Level::Info,
                 "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the system; set "
                 "it yourself to tune it");
  agent::CommandRequest req{config.script,        config.script_args, config.module,
                            config.no_python,     "python3",          config.run_path,
                            config.local_rank_arg};
  planner.choose_python(req);
  planner.worker_command(req);
  planner.agent_options();
  planner.standbys(req);
  planner.standby_cuda();
  planner.rdzv_conf_keys();
  planner.adapt_to_torch(req);
  plan.store = plan_agent_store(plan.config, plan.rendezvous);
  plan.agent.spec.use_agent_store = plan.store.use_agent_store;
  return std::move(plan);
}

}  // namespace ddprun::launcher
