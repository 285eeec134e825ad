#pragma once
#include <string>
#include <variant>

#include "common/result.h"
#include "etcd/client.h"
#include "launcher/launch_config.h"
#include "rendezvous/network_rendezvous.h"

namespace ddprun::launcher {

/// Whether this node runs the embedded rendezvous server.
enum class Hosting {
  Never,   ///< --rdzv_conf is_host=0, or the endpoint names another machine
  Auto,    ///< the endpoint names this machine: host unless the port is taken (then a client)
  Always,  ///< --rdzv_conf is_host=1, or node_rank 0 of the static backend
};

/// How this node takes part in the rendezvous, decided from the configuration alone.
struct RendezvousPlan {
  bool single_node = false;  ///< --standalone or one node without an endpoint: no server at all
  rdzv::NetworkRendezvousOptions client;  ///< everything but before_connect
  Hosting hosting = Hosting::Never;
  int listen_port = 0;
  /// --rdzv_backend etcd-v3: the etcd members (client.backend is "etcd-v3"); nobody hosts.
  std::vector<etcd::Member> etcd_members;
};

/// Default --master_port of the static backend (torchrun's).
constexpr int kDefaultMasterPort = 29500;

/// The plan, or an error naming the values and the fix. `is_local` tells whether a host names
/// this machine (rdzv::is_local_host in production). `host_name` names the node when it has no
/// --local_addr.
common::Result<RendezvousPlan> plan_rendezvous(
    const LaunchConfig& config, int nproc_per_node, const std::string& host_name,
    const std::function<bool(const std::string&)>& is_local);

}  // namespace ddprun::launcher
