#include "launcher/rdzv_plan.h"

#include <cmath>

#include "common/strings.h"
#include "rendezvous/endpoint.h"

namespace ddprun::launcher {

namespace {

std::optional<std::string> conf(const LaunchConfig& config, const std::string& key) {
  auto it = config.rdzv_conf.find(key);
  if (it == config.rdzv_conf.end()) return std::nullopt;
  return it->second;
}

/// Seconds from --rdzv_conf (validated by the command-line parser) as milliseconds.
rdzv::Millis seconds_conf(const LaunchConfig& config, const std::string& key,
                          rdzv::Millis fallback) {
  auto text = conf(config, key);
  if (!text) return fallback;
  auto seconds = common::parse_double(*text);
  if (!seconds) return fallback;
  return rdzv::Millis(static_cast<long long>(*seconds * 1000.0));
}

}  // namespace

common::Result<RendezvousPlan> plan_rendezvous(
    const LaunchConfig& config, int nproc_per_node, const std::string& host_name,
    const std::function<bool(const std::string&)>& is_local) {
  RendezvousPlan plan;
  // The restart budget and the failure policy hold for every backend, one node's too.
  rdzv::RdzvSettings& s = plan.client.settings;
  s.max_restarts = config.max_restarts;
  s.restart_window = std::chrono::milliseconds(std::llround(config.restart_window * 1000.0));
  s.crash_loop_limit = config.crash_loop_stop;
  s.fatal_exit_codes = config.fatal_exit_codes;
  s.quarantine_after = config.quarantine_after;
  s.quarantine_cooldown =
      std::chrono::milliseconds(std::llround(config.quarantine_cooldown * 1000.0));
  s.quarantine_cooldown_max =
      std::chrono::milliseconds(std::llround(config.quarantine_cooldown_max * 1000.0));
  s.restart_backoff = std::chrono::milliseconds(std::llround(config.restart_backoff * 1000.0));
  s.restart_backoff_max =
      std::chrono::milliseconds(std::llround(config.restart_backoff_max * 1000.0));
  // One node's too: a node kept out by its health check that long ends the job.
  s.join_timeout = seconds_conf(config, "join_timeout", s.join_timeout);
  const bool is_static = config.rdzv_backend == "static" && !config.standalone;
  if (config.standalone || (config.max_nodes == 1 && (is_static || config.rdzv_endpoint.empty()))) {
    plan.single_node = true;
    return plan;
  }

  rdzv::NetworkRendezvousOptions& c = plan.client;
  c.backend = is_static ? "static" : config.rdzv_backend;
  c.run_id = config.rdzv_id;
  c.local_addr = config.local_addr;
  c.name = config.local_addr.empty() ? host_name : config.local_addr;
  c.node_rank = config.node_rank;
  c.master_port = config.master_port;
  s.min_nodes = config.min_nodes;
  s.max_nodes = config.max_nodes;
  s.nproc_per_node = nproc_per_node;
  s.last_call_timeout = seconds_conf(config, "last_call_timeout", s.last_call_timeout);
  s.close_timeout = seconds_conf(config, "close_timeout", s.close_timeout);
  s.keep_alive_interval = seconds_conf(config, "keep_alive_interval", s.keep_alive_interval);
  if (auto attempts = conf(config, "keep_alive_max_attempt")) {
    if (auto n = common::parse_int(*attempts)) s.keep_alive_max_attempt = static_cast<int>(*n);
  }
  c.connect_timeout = seconds_conf(config, "connect_timeout", c.connect_timeout);
  std::optional<bool> is_host;
  if (auto text = conf(config, "is_host")) is_host = common::parse_bool(*text);

  if (is_static) {
    // torchrun's static form: --master_addr/--master_port name node 0; every node gives its
    // --node_rank. Workers get exactly that MASTER_ADDR:MASTER_PORT; the rendezvous itself
    // listens one port above unless --rdzv_endpoint says otherwise.
    if (config.min_nodes != config.max_nodes)
      return common::Error{"--rdzv_backend static needs a fixed --nnodes (got " +
                           std::to_string(config.min_nodes) + ":" +
                           std::to_string(config.max_nodes) +
                           "); use --rdzv_backend c10d for an elastic range"};
    if (!config.node_rank)
      return common::Error{
          "--rdzv_backend static with --nnodes " + std::to_string(config.max_nodes) +
          " needs --node_rank on every node (0.." + std::to_string(config.max_nodes - 1) + ")"};
    const int master_port = config.master_port.value_or(kDefaultMasterPort);
    c.master_addr = config.master_addr;
    c.master_port = master_port;
    if (config.rdzv_endpoint.empty()) {
      c.endpoint_host = config.master_addr;
      c.endpoint_port = master_port == 65535 ? master_port - 1 : master_port + 1;
    }
    plan.hosting = is_host.value_or(*config.node_rank == 0) ? Hosting::Always : Hosting::Never;
  }
  if (c.backend == "etcd-v3") {
    // The rendezvous lives in etcd: every member is listed, no node hosts anything.
    auto members = etcd::parse_members(config.rdzv_endpoint);
    if (!members)
      return common::Error{"--rdzv_endpoint " + config.rdzv_endpoint + ": " +
                           members.error().message};
    plan.etcd_members = *std::move(members);
    c.endpoint_host = config.rdzv_endpoint;
    if (config.node_rank && *config.node_rank >= config.max_nodes)
      return common::Error{"--node_rank " + std::to_string(*config.node_rank) +
                           " is out of range for --nnodes " + std::to_string(config.min_nodes) +
                           ":" + std::to_string(config.max_nodes) + " (0.." +
                           std::to_string(config.max_nodes - 1) + ")"};
    plan.hosting = Hosting::Never;
    return plan;
  }
  if (!config.rdzv_endpoint.empty()) {
    auto endpoint = rdzv::parse_endpoint(config.rdzv_endpoint, rdzv::kDefaultPort);
    if (!endpoint)
      return common::Error{"--rdzv_endpoint " + config.rdzv_endpoint +
                           ": expected host:port or [ipv6]:port"};
    c.endpoint_host = endpoint->first;
    c.endpoint_port = endpoint->second;
  }
  if (c.endpoint_host.empty())
    return common::Error{
        "--nnodes " + std::to_string(config.min_nodes) + ":" + std::to_string(config.max_nodes) +
        " needs --rdzv_endpoint host:port (the node or ddprun-rdzvd hosting the rendezvous)"};
  if (c.endpoint_port == 0)
    return common::Error{"--rdzv_endpoint " + config.rdzv_endpoint +
                         ": port 0 is only for --standalone; give the port every node connects to"};
  if (config.node_rank && *config.node_rank >= config.max_nodes)
    return common::Error{"--node_rank " + std::to_string(*config.node_rank) +
                         " is out of range for --nnodes " + std::to_string(config.min_nodes) + ":" +
                         std::to_string(config.max_nodes) + " (0.." +
                         std::to_string(config.max_nodes - 1) + ")"};
  if (!is_static) {
    if (is_host)
      plan.hosting = *is_host ? Hosting::Always : Hosting::Never;
    else
      plan.hosting = is_local(c.endpoint_host) ? Hosting::Auto : Hosting::Never;
  }
  plan.listen_port = c.endpoint_port;
  return plan;
}

}  // namespace ddprun::launcher
