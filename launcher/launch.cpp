#include "launcher/launch.h"

#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <memory>
#include <optional>

#include <spdlog/sinks/stdout_sinks.h>
#include "agent/agent_metrics.h"
#include "agent/group_cleanup.h"
#include "agent/local_agent.h"
#include "agent/worker_stdin.h"
#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/open_files.h"
#include "common/strings.h"
#include "etcd/etcd_rendezvous.h"
#include "launcher/agent_store.h"
#include "launcher/launch_plan.h"
#include "launcher/slurm.h"
#include "metrics/exposition.h"
#include "metrics/http_server.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/local_rendezvous.h"
#include "rendezvous/network_rendezvous.h"
#include "rendezvous/server.h"
#include "store/server.h"

namespace ddprun::launcher {
namespace {

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

void log_notes(const std::vector<LaunchNote>& notes) {
  for (const LaunchNote& note : notes) {
    switch (note.level) {
      case LaunchNote::Level::Debug:
        spdlog::debug("{}", note.text);
        break;
      case LaunchNote::Level::Info:
        spdlog::info("{}", note.text);
        break;
      case LaunchNote::Level::Warn:
        spdlog::warn("{}", note.text);
        break;
    }
  }
}

/// Under srun: the endpoint host is the first node of the job, by name when DNS knows it,
/// else by the NodeAddr SLURM has for it (a look-up, so not part of the plan).
common::Result<LaunchConfig> with_slurm_endpoint(LaunchConfig config) {
  for (const std::string& warning : config.slurm.warnings) spdlog::warn("{}", warning);
  if (config.slurm.values.empty() && config.slurm.endpoint_node.empty()) return config;
  std::vector<std::string> derived = config.slurm.values;
  if (!config.slurm.endpoint_node.empty()) {
    auto found =
        resolve_node_address(config.slurm.endpoint_node, host_resolves, scontrol_node_addr);
    if (!found) return found.error();
    config.rdzv_endpoint = format_endpoint(found->host, rdzv::kDefaultPort);
    derived.push_back("--rdzv_endpoint " + config.rdzv_endpoint + " (" +
                      config.slurm.endpoint_node + ", first of the node list, by " + found->how +
                      ")");
  }
  spdlog::info("SLURM job {} step {}: {}", config.slurm.job_id, config.slurm.step_id,
               common::join(derived, ", "));
  return config;
}

/// The rendezvous the plan chose: the handler the agent talks to and, on the network, the
/// embedded server this node hosts when the endpoint names it, or takes over from a host
/// node that died on this machine.
class NodeRendezvous {
 public:
  NodeRendezvous(boost::asio::io_context& io, common::Clock& clock, LaunchPlan& plan,
                 std::optional<int> master_port)
      : io_(io), clock_(clock), plan_(plan) {
    RendezvousPlan& rendezvous = plan.rendezvous;
    switch (plan.kind) {
      case RendezvousKind::Etcd: {
        etcd::EtcdRendezvousOptions e;
        e.run_id = rendezvous.client.run_id;
        e.client.members = rendezvous.etcd_members;
        e.client.credentials = plan.etcd_credentials;
        e.client.tls = rendezvous.client.tls;
        e.name = rendezvous.client.name;
        e.local_addr = rendezvous.client.local_addr;
        e.node_rank = rendezvous.client.node_rank;
        e.master_port = rendezvous.client.master_port;
        e.settings = rendezvous.client.settings;
        e.connect_timeout = rendezvous.client.connect_timeout;
        e.status_interval = rendezvous.client.status_interval;
        auto handler = std::make_unique<etcd::EtcdRendezvous>(io, clock, std::move(e));
        etcd_ = handler.get();
        handler_ = std::move(handler);
        break;
      }
      case RendezvousKind::Local: {
        const LaunchConfig& config = plan.config;
        handler_ = std::make_unique<rdzv::LocalRendezvous>(
            io, clock, config.standalone ? "c10d" : config.rdzv_backend, config.rdzv_id,
            config.local_addr.empty() ? config.master_addr : config.local_addr, master_port,
            rendezvous.client.settings);
        break;
      }
      case RendezvousKind::Network: {
        // A node that greeted the standalone daemon waits for it to come back (a service
        // manager restarts it on its port) instead of taking the port itself.
        rendezvous.client.before_connect = [this] {
          if (network_ != nullptr && network_->served_by_daemon()) return;
          if (auto why = try_host()) spdlog::debug("not hosting the rendezvous: {}", why->message);
        };
        auto client = std::make_unique<rdzv::NetworkRendezvous>(io, clock, rendezvous.client);
        network_ = client.get();
        handler_ = std::move(client);
        break;
      }
    }
  }

  /// Hosts the embedded server now when this node must or may; an error when it must and
  /// cannot.
  std::optional<common::Error> start() {
    return plan_.kind == RendezvousKind::Network ? try_host() : std::nullopt;
  }

  rdzv::RendezvousHandler& handler() { return *handler_; }

  /// The parts that drain at shutdown: the embedded server, the client, the etcd handler.
  int parts() const { return (server_ ? 1 : 0) + (network_ ? 1 : 0) + (etcd_ ? 1 : 0); }

  /// Sends the last messages (a "closed" for the other nodes, this node's "leave");
  /// `drained` runs once for each of parts() when it has drained.
  void drain(std::chrono::milliseconds deadline, const std::function<void()>& drained) {
    if (server_) server_->shutdown(deadline, drained);
    if (network_) network_->when_flushed(drained);
    if (etcd_) etcd_->when_flushed(drained);
  }

 private:
  std::optional<common::Error> try_host() {
    const RendezvousPlan& rendezvous = plan_.rendezvous;
    if (server_ || rendezvous.hosting == Hosting::Never) return std::nullopt;
    // TLS without a certificate of its own: this node cannot serve it, another must host.
    if (rendezvous.client.tls && !plan_.hosted_tls) return std::nullopt;
    auto candidate = std::make_unique<rdzv::RendezvousServer>(
        io_, clock_, rdzv::ServerLimits{}, rendezvous.client.secret, plan_.hosted_tls);
    bool in_use = false;
    if (auto why = candidate->listen("", rendezvous.listen_port, &in_use)) {
      if (rendezvous.hosting == Hosting::Auto && in_use) return std::nullopt;  // another hosts
      return why;
    }
    spdlog::info("hosting the rendezvous for job '{}' on port {}", rendezvous.client.run_id,
                 candidate->port());
    server_ = std::move(candidate);
    return std::nullopt;
  }

  boost::asio::io_context& io_;
  common::Clock& clock_;
  LaunchPlan& plan_;
  std::unique_ptr<rdzv::RendezvousServer> server_;  ///< the embedded server, while hosted
  std::unique_ptr<rdzv::RendezvousHandler> handler_;
  rdzv::NetworkRendezvous* network_ = nullptr;  ///< handler_, when it is the networked one
  etcd::EtcdRendezvous* etcd_ = nullptr;        ///< handler_, when it is held in etcd
};

}  // namespace

int launch(const LaunchConfig& given, const agent::EnvMap& env) {
  // A preemption notice (SIGUSR1/SIGUSR2) that comes while ddprun starts (SLURM look-ups, the
  // plan) waits, blocked, until the agent's handler is in place and unblocks it; its default
  // action would end ddprun.
  sigset_t notices;
  sigemptyset(&notices);
  sigaddset(&notices, SIGUSR1);
  sigaddset(&notices, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &notices, nullptr);
  setup_logging(env);
  auto config = with_slurm_endpoint(given);
  if (!config) {
    spdlog::error("{}", config.error().message);
    return common::kExitRendezvous;
  }
  auto planned = plan_launch(*config, env, system_probes(env));
  if (!planned) {
    spdlog::error("{}", planned.error().message);
    return common::kExitUsage;
  }
  LaunchPlan plan = *std::move(planned);
  log_notes(plan.notes);
  // Before any thread or process starts: the cgroup watcher is forked here.
  auto started_cleanup = agent::GroupCleanup::start(plan.config.cleanup);
  if (!started_cleanup) {
    spdlog::error("{}", started_cleanup.error().message);
    return common::kExitUsage;
  }
  std::unique_ptr<agent::GroupCleanup> cleanup = *std::move(started_cleanup);
  spdlog::debug("process cleanup: {}", cleanup->describe());
  plan.agent.cleanup = cleanup.get();

  // The store of a large job's workers and an embedded rendezvous server hold a connection
  // per worker and per node: more than the usual soft limit of 1024 descriptors. Workers get
  // the limit ddprun was started with (agent/process_launcher.cpp).
  const common::OpenFileLimit open_files = common::raise_open_file_limit();
  boost::asio::io_context io;
  common::SteadyClock clock;
  // The workers' store, bound before the rendezvous publishes its port and before any worker
  // starts: no port race, and it lives across restarts of the group (--agent_store).
  store::StoreServer agent_store(io);
  std::optional<int> master_port = plan.config.master_port;
  if (plan.store.host) {
    if (auto why = agent_store.listen(plan.store.listen_host, plan.store.listen_port)) {
      spdlog::error(
          "cannot host the workers' store: {}; free the port, pick another --master_port, or "
          "pass --agent_store off",
          why->message);
      return common::kExitRendezvous;
    }
    spdlog::debug("hosting the workers' store on port {}", agent_store.port());
    master_port = agent_store.port();
    if (plan.kind != RendezvousKind::Local && plan.rendezvous.client.backend != "static")
      plan.rendezvous.client.master_port = master_port;
  }
  NodeRendezvous rendezvous(io, clock, plan, master_port);
  if (auto why = rendezvous.start()) {
    spdlog::error(
        "cannot host the rendezvous: {}; free the port or pick another --rdzv_endpoint port",
        why->message);
    return common::kExitRendezvous;
  }
  // --metrics_port: the agent's metrics, served on the agent's own io_context (one thread: a
  // scrape runs between the agent's handlers) until the job ends.
  agent::AgentMetrics agent_metrics;
  metrics::HttpServer metrics_http(io, metrics::metrics_handler(agent_metrics.registry()));
  if (plan.config.metrics_port != 0) {
    if (auto why = metrics_http.listen(plan.config.metrics_host, plan.config.metrics_port)) {
      spdlog::error("{}; pick another --metrics_port", why->message);
      return common::kExitUsage;
    }
    spdlog::info("serving metrics on http://{}/metrics",
                 rdzv::format_endpoint(plan.config.metrics_host, metrics_http.port()));
    plan.agent.metrics = &agent_metrics;
  }
  // Shutdown is cancellation: the last messages go out, the embedded server and the client
  // say when they have drained, and the event loop stops then, or after kLinger whatever is
  // left.
  constexpr std::chrono::milliseconds kLinger{2'000};
  boost::asio::steady_timer linger(io);
  int draining = 0;
  plan.agent.on_finish = [&] {
    metrics_http.shutdown();
    agent_store.shutdown();
    if (plan.kind == RendezvousKind::Local) return;
    draining = rendezvous.parts();
    if (draining == 0) return io.stop();
    linger.expires_after(kLinger);
    linger.async_wait([&io](const boost::system::error_code& ec) {
      if (!ec) io.stop();
    });
    rendezvous.drain(kLinger, [&io, &linger, &draining] {
      if (--draining > 0) return;
      linger.cancel();
      io.stop();
    });
  };
  agent::PosixProcessLauncher launcher;
  // The workers read ddprun's stdin, as torchrun's do; a terminal's lines through a relay
  // thread (started here, after the watcher's fork, which wants one thread).
  const std::unique_ptr<agent::WorkerStdin> worker_stdin = agent::WorkerStdin::open();
  plan.agent.worker_stdin = worker_stdin->fd();
  if (worker_stdin->relays())
    spdlog::debug("the workers' stdin: lines typed in ddprun's terminal, relayed");
  // Each join of a round clears the store: the next group finds none of the last one's keys.
  // Each round sizes the store for its workers, and the node that serves them says when its
  // open-file limit is too small for them.
  RoundObserver observed(
      rendezvous.handler(), [&agent_store] { agent_store.clear(); },
      [&agent_store, &open_files, hosts = plan.store.host,
       nproc = plan.nproc](const rdzv::RendezvousInfo& round) {
        if (!hosts) return;
        agent_store.expect_workers(
            static_cast<std::size_t>(round.group_world_size) * static_cast<std::size_t>(nproc),
            round.group_rank == 0 ? open_files.soft : 0);
      });
  agent::LocalAgent agent(io, std::move(plan.agent), observed, launcher);
  // Posted before the workers can read the line, so handled before what they print after it.
  worker_stdin->on_line([&io, &agent] { boost::asio::post(io, [&agent] { agent.line_typed(); }); });
  const int code = agent.run();
  worker_stdin->on_line(nullptr);
  return code;
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
