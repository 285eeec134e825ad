#include "launcher/launch.h"

#include <sched.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <spdlog/sinks/stdout_sinks.h>
#include "agent/agent_metrics.h"
#include "agent/group_cleanup.h"
#include "agent/local_agent.h"
#include "agent/numa_binding.h"
#include "agent/standby_pool.h"
#include "agent/worker_command.h"
#include "agent/worker_env.h"
#include "agent/worker_limits.h"
#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/open_files.h"
#include "common/signals.h"
#include "common/strings.h"
#include "etcd/etcd_rendezvous.h"
#include "launcher/agent_store.h"
#include "launcher/rdzv_plan.h"
#include "launcher/slurm.h"
#include "launcher/torch_libuv.h"
#include "metrics/exposition.h"
#include "metrics/http_server.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/local_host.h"
#include "rendezvous/local_rendezvous.h"
#include "rendezvous/network_rendezvous.h"
#include "rendezvous/server.h"
#include "store/server.h"

namespace ddprun::launcher {
namespace {

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

void setup_logging(const agent::EnvMap& env) {
  auto logger = spdlog::stderr_logger_st("ddprun");
  logger->set_pattern("[ddprun] %^%l%$: %v");
  spdlog::level::level_enum level = spdlog::level::info;
  if (auto it = env.find("LOGLEVEL"); it != env.end()) {
    const std::string v = common::to_lower(common::trim(it->second));
    if (v == "debug" || v == "notset")
      level = spdlog::level::debug;
    else if (v == "warning" || v == "warn")
      level = spdlog::level::warn;
    else if (v == "error")
      level = spdlog::level::err;
    else if (v == "critical" || v == "fatal")
      level = spdlog::level::critical;
  }
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

std::string env_or(const agent::EnvMap& env, const std::string& key, const std::string& fallback) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

/// Catches a mistyped script before any worker starts (torchrun would start them all and let
/// each one fail).
std::optional<std::string> check_script(const LaunchConfig& config, const agent::EnvMap& env) {
  if (config.module) return std::nullopt;
  if (config.no_python) {
    if (!agent::resolve_executable(config.script, agent::search_path(env)).empty())
      return std::nullopt;
    return "--no_python " + config.script + ": no executable file by that name (PATH searched); " +
           "check the path, or chmod +x it";
  }
  std::error_code ec;
  if (std::filesystem::exists(config.script, ec)) return std::nullopt;
  return config.script + ": no such file (working directory " +
         std::filesystem::current_path(ec).string() +
         "); check the script path, or use -m for a module";
}

/// --standby_workers: which standbys the agent keeps. A Python script's run ddprun's bootstrap
/// (found next to this executable), forked from one zygote per node; any other program is its
/// own standby (the C++ SDK waits). auto, the default, keeps them for Python scripts that
/// import torch on a node with the memory for them, and says why not only when it was asked.
void configure_standbys(const LaunchConfig& config, const agent::CommandRequest& req,
                        agent::AgentOptions& opt) {
  opt.standby_preload = config.standby_preload;
  if (config.standby_workers == StandbyMode::Off) return;
  const bool automatic = config.standby_workers == StandbyMode::Auto;
  // auto by default: a reason to stay off is news only to a user who asked for standbys.
  auto off_because = [&](const std::string& why) {
    if (!automatic)
      spdlog::warn("--standby_workers: no standbys: {}", why);
    else if (config.standby_workers_given)
      spdlog::info("--standby_workers=auto: no standbys: {}", why);
    else
      spdlog::debug("--standby_workers=auto (the default): no standbys: {}", why);
  };
  if (!config.numa_binding.empty())
    return off_because(
        "--numa_binding binds each worker to its CPUs as it starts; a standby started before "
        "would not be bound");
  if (!agent::runs_under_python(req, agent::is_executable_file)) {
    if (automatic)
      return off_because(
          "they are automatic for Python scripts (.py, -m) only; a program on the C++ worker "
          "SDK gets them with --standby_workers=on");
    opt.standby_workers = true;
    return;
  }
  std::error_code ec;
  if (automatic && !agent::source_imports_torch(
                       agent::python_source_of(req, std::filesystem::current_path(ec).string())))
    return off_because(config.script +
                       " does not import torch at its top level (--standby_workers=on makes "
                       "standbys for it anyway)");
  std::ifstream meminfo_file("/proc/meminfo");
  std::ostringstream meminfo;
  meminfo << meminfo_file.rdbuf();
  if (std::string short_of =
          agent::standby_memory_shortfall(meminfo.str(), opt.spec.local_world_size);
      !short_of.empty())
    return off_because(short_of);
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string bootstrap = ec ? "" : agent::find_python_bootstrap(self.string());
  if (bootstrap.empty())
    return off_because("ddprun's Python bootstrap is not at " + self.parent_path().string() +
                       "/../share/ddprun/ddprun_standby.py; reinstall ddprun (cmake --install)");
  opt.standby_workers = true;
  opt.python_bootstrap = bootstrap;
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

/// --numa_binding node: each local rank's CPUs, from the topology under DDPRUN_SYSFS_ROOT (a
/// test's fake tree) or /sys.
common::Result<std::vector<std::vector<int>>> numa_cpus(const agent::EnvMap& env, int nproc) {
  const std::string root = env_or(env, "DDPRUN_SYSFS_ROOT", "/sys");
  auto topology = agent::read_numa_topology(root);
  if (!topology)
    return common::Error{"--numa_binding node: " + topology.error().message +
                         "; drop --numa_binding"};
  std::optional<std::string> visible;
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) visible = it->second;
  auto cpus = agent::cpus_per_local_rank(*topology, nproc, visible);
  if (cpus)
    for (size_t local = 0; local < cpus->size(); ++local)
      spdlog::debug("--numa_binding node: local rank {} on {} CPUs", local, (*cpus)[local].size());
  return cpus;
}

int launch(const LaunchConfig& given, const agent::EnvMap& env) {
  // A preemption notice (SIGUSR1/SIGUSR2) that comes while ddprun starts (SLURM look-ups, the
  // rendezvous plan) waits, blocked, until the agent's handler is in place and unblocks it;
  // its default action would end ddprun.
  sigset_t notices;
  sigemptyset(&notices);
  sigaddset(&notices, SIGUSR1);
  sigaddset(&notices, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &notices, nullptr);
  setup_logging(env);
  LaunchConfig config = given;
  if (!config.slurm.values.empty() || !config.slurm.endpoint_node.empty()) {
    // Under srun: the endpoint host is the first node of the job, by name when DNS knows it,
    // else by the NodeAddr SLURM has for it.
    std::vector<std::string> derived = config.slurm.values;
    if (!config.slurm.endpoint_node.empty()) {
      auto found =
          resolve_node_address(config.slurm.endpoint_node, host_resolves, scontrol_node_addr);
      if (!found) {
        spdlog::error("{}", found.error().message);
        return common::kExitRendezvous;
      }
      const auto& address = *found;
      config.rdzv_endpoint = format_endpoint(address.host, rdzv::kDefaultPort);
      derived.push_back("--rdzv_endpoint " + config.rdzv_endpoint + " (" +
                        config.slurm.endpoint_node + ", first of the node list, by " + address.how +
                        ")");
    }
    spdlog::info("SLURM job {} step {}: {}", config.slurm.job_id, config.slurm.step_id,
                 common::join(derived, ", "));
  }
  auto nproc = resolve_nproc(config, detect_node_resources(env));
  if (!nproc) {
    spdlog::error("{}", nproc.error().message);
    return common::kExitUsage;
  }
  auto planned = plan_rendezvous(config, *nproc, rdzv::local_host_name(), rdzv::is_local_host);
  if (!planned) {
    spdlog::error("{}", planned.error().message);
    return common::kExitUsage;
  }
  RendezvousPlan plan = *std::move(planned);
  const bool on_etcd = !plan.etcd_members.empty();
  if (!plan.single_node && !on_etcd) {
    // The shared secret of the rendezvous: --rdzv_conf secret_file, else the environment.
    std::string secret_file = env_or(env, rdzv::kSecretFileVariable, "");
    if (auto it = config.rdzv_conf.find("secret_file"); it != config.rdzv_conf.end())
      secret_file = it->second;
    if (!secret_file.empty()) {
      auto read = rdzv::read_secret_file(secret_file);
      if (!read) {
        spdlog::error("{}", read.error().message);
        return common::kExitUsage;
      }
      plan.client.secret = *std::move(read);
    }
  }
  // TLS: --rdzv_conf tls_ca (the client's side), tls_cert and tls_key (shown to the server
  // when it asks, and the certificate of the server this node may host).
  rdzv::TlsContext hosted_tls;
  if (!plan.single_node) {
    rdzv::TlsFiles tls;
    auto conf = [&config](const char* key) {
      auto it = config.rdzv_conf.find(key);
      return it == config.rdzv_conf.end() ? std::string() : it->second;
    };
    tls.ca = conf("tls_ca");
    tls.cert = conf("tls_cert");
    tls.key = conf("tls_key");
    if (tls.any()) {
      auto client = rdzv::make_client_tls(tls, "--rdzv_conf tls_");
      if (!client) {
        spdlog::error("{}", client.error().message);
        return common::kExitUsage;
      }
      plan.client.tls = *std::move(client);
      if (tls.cert.empty() && plan.hosting == Hosting::Always) {
        spdlog::error(
            "this node hosts the rendezvous (is_host=1): over TLS it needs --rdzv_conf "
            "tls_cert=FILE,tls_key=FILE, its certificate as a server");
        return common::kExitUsage;
      }
      if (!tls.cert.empty() && plan.hosting != Hosting::Never) {
        auto server_side = rdzv::make_server_tls(tls, "--rdzv_conf tls_");
        if (!server_side) {
          spdlog::error("{}", server_side.error().message);
          return common::kExitUsage;
        }
        hosted_tls = *std::move(server_side);
      }
    }
  }

  // etcd's authentication: --rdzv_conf etcd_user and etcd_password_file (checked together by
  // the command line).
  std::optional<etcd::Credentials> etcd_credentials;
  if (auto user = config.rdzv_conf.find("etcd_user"); on_etcd && user != config.rdzv_conf.end()) {
    auto read = etcd::read_credentials(user->second, config.rdzv_conf.at("etcd_password_file"));
    if (!read) {
      spdlog::error("{}", read.error().message);
      return common::kExitUsage;
    }
    etcd_credentials = *std::move(read);
  }

  if (auto why = check_script(config, env)) {
    spdlog::error("{}", *why);
    return common::kExitUsage;
  }
  // A count the kernel's limits cannot hold is refused here, before any worker starts, rather
  // than failing rank by rank (docs/design.md, "Process hygiene").
  agent::WorkerNeeds needs;
  needs.log_files = config.redirects.any() || config.tee.any();
  needs.standbys = config.standby_workers != StandbyMode::Off;
  if (auto why = agent::check_worker_limits(*nproc, needs, agent::current_process_limits())) {
    spdlog::error("{}", *why);
    return common::kExitUsage;
  }
  // Before any thread or process starts: the cgroup watcher is forked here.
  auto started_cleanup = agent::GroupCleanup::start(config.cleanup);
  if (auto* why = std::get_if<std::string>(&started_cleanup)) {
    spdlog::error("{}", *why);
    return common::kExitUsage;
  }
  auto cleanup = std::get<std::unique_ptr<agent::GroupCleanup>>(std::move(started_cleanup));
  spdlog::debug("process cleanup: {}", cleanup->describe());

  if (agent::will_default_omp_threads(env, *nproc))
    spdlog::info(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the system; set it "
        "yourself to tune it");
  agent::AgentOptions opt;
  opt.spec.role = config.role;
  opt.spec.local_world_size = *nproc;
  opt.spec.max_restarts = config.max_restarts;
  opt.spec.shutdown_timeout =
      std::chrono::milliseconds(static_cast<long long>(config.shutdown_timeout * 1000.0));
  agent::CommandRequest req{config.script,
                            config.script_args,
                            config.module,
                            config.no_python,
                            env_or(env, "PYTHON_EXEC", "python3"),
                            config.run_path,
                            config.local_rank_arg};
  opt.spec.argv = agent::build_worker_command(req, agent::is_executable_file);
  if (!config.no_python) {
    const std::string found =
        agent::resolve_executable(opt.spec.argv.front(), agent::search_path(env));
    opt.interpreter = found.empty() ? opt.spec.argv.front() : found;
    opt.interpreter_origin =
        env.count("PYTHON_EXEC") > 0 ? "PYTHON_EXEC" : "the first python3 on PATH";
    spdlog::debug("workers run the Python interpreter {} ({})", opt.interpreter,
                  opt.interpreter_origin);
  }
  opt.spec.virtual_local_rank = config.virtual_local_rank;
  for (int sig : config.signals_to_handle)
    opt.spec.signals_to_handle +=
        (opt.spec.signals_to_handle.empty() ? "" : ",") + common::signal_name(sig);
  if (config.virtual_local_rank) {
    if (auto why = agent::virtual_local_rank_problem(env, *nproc)) {
      spdlog::error("{}", *why);
      return common::kExitUsage;
    }
  }
  if (!config.numa_binding.empty()) {
    auto cpus = numa_cpus(env, *nproc);
    if (!cpus) {
      spdlog::error("{}", cpus.error().message);
      return common::kExitUsage;
    }
    opt.cpus_by_local_rank = std::move(*cpus);
  }
  opt.output.duplicate_stdout_filters = config.duplicate_stdout_filters;
  opt.output.duplicate_stderr_filters = config.duplicate_stderr_filters;
  opt.script = config.script;
  opt.log_dir = config.log_dir;
  opt.output.redirects = config.redirects;
  opt.output.tee = config.tee;
  opt.output.console_ranks = config.local_ranks_filter;
  opt.output.dedup_window =
      std::chrono::milliseconds(static_cast<long long>(config.dedup_output * 1000.0));
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
  opt.node_name = config.local_addr.empty() ? rdzv::local_host_name() : config.local_addr;
  auto ms = [](double seconds) {
    return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
  };
  opt.watchdog_timeout = ms(config.watchdog_timeout);
  opt.restart_backoff = ms(config.restart_backoff);
  opt.restart_backoff_max = ms(config.restart_backoff_max);
  opt.restart_backoff_reset = ms(config.restart_backoff_reset);
  opt.progress_file = config.progress_file;
  opt.health_gate = config.health_check != "off";
  opt.health_check_command = config.health_check == "builtin" ? "" : config.health_check;
  opt.health_check_timeout = ms(config.health_check_timeout);
  opt.health_check_interval = ms(config.health_check_interval);
  configure_standbys(config, req, opt);
  opt.cleanup = cleanup.get();
  // Once per node, before the store is planned: a torch that asks for libuv and lacks it
  // (Debian 13's 2.6) cannot make the agent store's clients, nor rank 0's store unless
  // USE_LIBUV=0 (launcher/torch_libuv.h). Python workers only: a script that imports torch
  // or whose source was not found (a -m module on PYTHONPATH), or a --no_python command that
  // runs a Python interpreter.
  std::string workers_python;
  if (!opt.interpreter_origin.empty()) {
    std::error_code cwd_error;
    const std::string source =
        agent::python_source_of(req, std::filesystem::current_path(cwd_error).string());
    if (source.empty() || agent::source_imports_torch(source)) workers_python = opt.interpreter;
  } else if (names_python_interpreter(opt.spec.argv.front())) {
    workers_python = opt.spec.argv.front();
  }
  if (!workers_python.empty() && (config.agent_store || env_or(env, "USE_LIBUV", "1") != "0")) {
    const TorchLibuv probed =
        probe_torch_libuv(workers_python, opt.agent_env, std::chrono::seconds(30));
    const LibuvAdaptation adapted = adapt_to_libuv(probed, config.agent_store, opt.agent_env);
    if (adapted.agent_store_off) config.agent_store = false;
    if (adapted.set_use_libuv_0) opt.agent_env["USE_LIBUV"] = "0";
    if (!adapted.info.empty()) spdlog::info("{}", adapted.info);
  }

  // The store of a large job's workers and an embedded rendezvous server hold a connection
  // per worker and per node: more than the usual soft limit of 1024 descriptors. Workers get
  // the limit ddprun was started with (agent/process_launcher.cpp).
  const common::OpenFileLimit open_files = common::raise_open_file_limit();
  boost::asio::io_context io;
  common::SteadyClock clock;
  // The workers' store, bound before the rendezvous publishes its port and before any worker
  // starts: no port race, and it lives across restarts of the group (--agent_store).
  const AgentStorePlan store_plan = plan_agent_store(config, plan);
  store::StoreServer agent_store(io);
  std::optional<int> master_port = config.master_port;
  if (store_plan.host) {
    if (auto why = agent_store.listen(store_plan.listen_host, store_plan.listen_port)) {
      spdlog::error(
          "cannot host the workers' store: {}; free the port, pick another --master_port, or "
          "pass --agent_store off",
          why->message);
      return common::kExitRendezvous;
    }
    spdlog::debug("hosting the workers' store on port {}", agent_store.port());
    master_port = agent_store.port();
    if (!plan.single_node && plan.client.backend != "static") plan.client.master_port = master_port;
  }
  opt.spec.use_agent_store = store_plan.use_agent_store;
  std::unique_ptr<rdzv::RendezvousServer> server;
  std::unique_ptr<rdzv::RendezvousHandler> rdzv;
  rdzv::NetworkRendezvous* network = nullptr;    ///< rdzv, when it is the networked one
  etcd::EtcdRendezvous* on_etcd_rdzv = nullptr;  ///< rdzv, when it is held in etcd
  if (on_etcd) {
    etcd::EtcdRendezvousOptions e;
    e.run_id = plan.client.run_id;
    e.client.members = plan.etcd_members;
    e.client.credentials = etcd_credentials;
    e.client.tls = plan.client.tls;
    e.name = plan.client.name;
    e.local_addr = plan.client.local_addr;
    e.node_rank = plan.client.node_rank;
    e.master_port = plan.client.master_port;
    e.settings = plan.client.settings;
    e.connect_timeout = plan.client.connect_timeout;
    e.status_interval = plan.client.status_interval;
    auto handler = std::make_unique<etcd::EtcdRendezvous>(io, clock, std::move(e));
    on_etcd_rdzv = handler.get();
    rdzv = std::move(handler);
  } else if (plan.single_node) {
    const std::string master_addr =
        config.local_addr.empty() ? config.master_addr : config.local_addr;
    rdzv = std::make_unique<rdzv::LocalRendezvous>(
        config.standalone ? "c10d" : config.rdzv_backend, config.rdzv_id, master_addr, master_port,
        plan.client.settings,
        [&io](std::function<void()> fn) { boost::asio::post(io, std::move(fn)); });
  } else {
    // The embedded server: hosted here when the endpoint names this machine (or is_host=1),
    // and taken over by a surviving node on this machine if the host node dies.
    auto try_host = [&io, &clock, &server, &plan, hosted_tls]() -> std::optional<common::Error> {
      if (server || plan.hosting == Hosting::Never) return std::nullopt;
      // TLS without a certificate of its own: this node cannot serve it, another must host.
      if (plan.client.tls && !hosted_tls) return std::nullopt;
      auto candidate = std::make_unique<rdzv::RendezvousServer>(io, clock, rdzv::ServerLimits{},
                                                                plan.client.secret, hosted_tls);
      bool in_use = false;
      if (auto why = candidate->listen("", plan.listen_port, &in_use)) {
        if (plan.hosting == Hosting::Auto && in_use) return std::nullopt;  // someone else hosts
        return why;
      }
      spdlog::info("hosting the rendezvous for job '{}' on port {}", plan.client.run_id,
                   candidate->port());
      server = std::move(candidate);
      return std::nullopt;
    };
    if (auto why = try_host()) {
      spdlog::error(
          "cannot host the rendezvous: {}; free the port or pick another "
          "--rdzv_endpoint port",
          why->message);
      return common::kExitRendezvous;
    }
    // A node that greeted the standalone daemon waits for it to come back (a service manager
    // restarts it on its port) instead of taking the port itself.
    plan.client.before_connect = [try_host, &network] {
      if (network != nullptr && network->served_by_daemon()) return;
      if (auto why = try_host()) spdlog::debug("not hosting the rendezvous: {}", why->message);
    };
    auto client = std::make_unique<rdzv::NetworkRendezvous>(io, clock, plan.client);
    network = client.get();
    rdzv = std::move(client);
  }
  // Shutdown is cancellation: the last messages (a "closed" for the other nodes, this node's
  // "leave") go out, the embedded server and the client say when they have drained, and the
  // event loop stops then, or after kLinger whatever is left.
  constexpr std::chrono::milliseconds kLinger{2'000};
  boost::asio::steady_timer linger(io);
  int draining = 0;
  const auto drained = [&io, &linger, &draining] {
    if (--draining > 0) return;
    linger.cancel();
    io.stop();
  };
  // --metrics_port: the agent's metrics, served on the agent's own io_context (one thread: a
  // scrape runs between the agent's handlers) until the job ends.
  agent::AgentMetrics agent_metrics;
  metrics::HttpServer metrics_http(io, metrics::metrics_handler(agent_metrics.registry()));
  if (config.metrics_port != 0) {
    if (auto why = metrics_http.listen(config.metrics_host, config.metrics_port)) {
      spdlog::error("{}; pick another --metrics_port", why->message);
      return common::kExitUsage;
    }
    spdlog::info("serving metrics on http://{}/metrics",
                 rdzv::format_endpoint(config.metrics_host, metrics_http.port()));
    opt.metrics = &agent_metrics;
  }
  opt.on_finish = [&] {
    metrics_http.shutdown();
    agent_store.shutdown();
    if (plan.single_node) return;
    draining = (server ? 1 : 0) + (network ? 1 : 0) + (on_etcd_rdzv ? 1 : 0);
    if (draining == 0) return io.stop();
    linger.expires_after(kLinger);
    linger.async_wait([&io](const boost::system::error_code& ec) {
      if (!ec) io.stop();
    });
    if (server) server->shutdown(kLinger, drained);
    if (network) network->when_flushed(drained);
    if (on_etcd_rdzv) on_etcd_rdzv->when_flushed(drained);
  };
  agent::PosixProcessLauncher launcher;
  // Each join of a round clears the store: the next group finds none of the last one's keys.
  // Each round sizes the store for its workers, and the node that serves them says when its
  // open-file limit is too small for them.
  RoundObserver observed(
      *rdzv, [&agent_store] { agent_store.clear(); },
      [&agent_store, &open_files, hosts = store_plan.host,
       nproc = *nproc](const rdzv::RendezvousInfo& round) {
        if (!hosts) return;
        agent_store.expect_workers(
            static_cast<std::size_t>(round.group_world_size) * static_cast<std::size_t>(nproc),
            round.group_rank == 0 ? open_files.soft : 0);
      });
  agent::LocalAgent agent(io, std::move(opt), observed, launcher);
  return agent.run();
}

int exec_under_srun(const SlurmFanOut& fan_out) {
  std::fprintf(stderr, "[ddprun] info: %s\n", fan_out.notice.c_str());
  std::fflush(stderr);
  // This very binary, wherever it was found, so every node runs the same ddprun.
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) self = "ddprun";
  std::vector<std::string> argv = fan_out.srun_args;
  argv.push_back(self);
  argv.insert(argv.end(), fan_out.args.begin(), fan_out.args.end());
  std::vector<char*> raw;
  for (std::string& arg : argv) raw.push_back(arg.data());
  raw.push_back(nullptr);
  ::execvp(raw[0], raw.data());
  std::fprintf(stderr,
               "[ddprun] error: cannot start srun (%s); run one ddprun per node yourself, or pass "
               "--no_slurm_fanout\n",
               std::strerror(errno));
  return common::kExitInternal;
}

}  // namespace ddprun::launcher
