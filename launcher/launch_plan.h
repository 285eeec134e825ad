#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/local_agent.h"
#include "agent/numa_binding.h"
#include "agent/worker_command.h"
#include "agent/worker_env.h"
#include "agent/worker_limits.h"
#include "common/result.h"
#include "etcd/client.h"
#include "launcher/agent_store.h"
#include "launcher/launch_config.h"
#include "launcher/rdzv_plan.h"
#include "launcher/torch_libuv.h"
#include "rendezvous/tls.h"

namespace ddprun::launcher {

/// Machine facts that resolve `--nproc_per_node cpu|gpu|auto`.
struct NodeResources {
  int cpus = 1;
  int gpus = 0;
};

/// Counts usable CPUs (affinity mask) and NVIDIA GPUs (honouring CUDA_VISIBLE_DEVICES).
NodeResources detect_node_resources(const agent::EnvMap& env);

/// The number of workers for this node, or a usage error naming the value and the fix.
common::Result<int> resolve_nproc(const LaunchConfig& config, const NodeResources& node);

/// What plan_launch asks of the machine it runs on. system_probes() reads the real one; a
/// test gives answers of its own.
struct LaunchProbes {
  std::function<NodeResources()> node_resources;
  std::function<std::string()> host_name;  ///< this machine's name (rdzv::local_host_name)
  std::function<bool(const std::string&)> is_local_host;
  std::function<std::string()> working_directory;
  std::function<bool(const std::string&)> file_exists;
  /// An executable run as a program without --no_python (agent::is_program_file).
  std::function<bool(const std::string&)> is_program_file;
  /// A program name searched through a PATH value ("" when nothing executable is found).
  std::function<std::string(const std::string&, const std::string&)> resolve_executable;
  /// The Python source of the workers' script or -m module under a working directory ("" when
  /// there is none; agent::python_source_of).
  std::function<std::string(const agent::CommandRequest&, const std::string&)> python_source;
  std::function<agent::ProcessLimits()> process_limits;
  /// The NUMA topology under a sysfs root (agent::read_numa_topology).
  std::function<common::Result<agent::NumaTopology>(const std::string&)> numa_topology;
  std::function<std::string()> meminfo;            ///< /proc/meminfo's text
  std::function<std::string()> ddprun_executable;  ///< this ddprun's path ("" when unknown)
  /// ddprun's Python bootstrap found next to an executable ("" when it is not there).
  std::function<std::string(const std::string&)> python_bootstrap;
  /// What the workers' torch does about libuv, run with their interpreter and environment.
  std::function<TorchLibuv(const std::string&, const agent::EnvMap&)> torch_libuv;
};

/// The probes of the machine ddprun runs on; `env` (ddprun's environment) must outlive them.
LaunchProbes system_probes(const agent::EnvMap& env);

/// How this node takes part in the rendezvous.
enum class RendezvousKind {
  Local,    ///< one node, no server (--standalone, or one node without an endpoint)
  Network,  ///< c10d or static over TCP: a client, and the embedded server when it hosts
  Etcd,     ///< --rdzv_backend etcd-v3: the round is held in etcd
};

/// A line plan_launch has for the log, at its level.
struct LaunchNote {
  enum class Level { Debug, Info, Warn };
  Level level = Level::Info;
  std::string text;
};

/// Every decision of one ddprun run, made before anything starts: launch() builds and runs
/// what it says.
struct LaunchPlan {
  /// The configuration as given, with what the plan changed (--agent_store off where the
  /// workers' torch cannot reach it).
  LaunchConfig config;
  int nproc = 1;  ///< workers on this node
  RendezvousKind kind = RendezvousKind::Local;
  /// The rendezvous, with the shared secret and the client's TLS read.
  RendezvousPlan rendezvous;
  /// The certificate of the rendezvous server this node may host (Network only).
  rdzv::TlsContext hosted_tls;
  std::optional<etcd::Credentials> etcd_credentials;  ///< Etcd with --rdzv_conf etcd_user
  AgentStorePlan store;
  /// The agent's options, all but those launch() wires to what it builds (cleanup, metrics,
  /// on_finish, clock).
  agent::AgentOptions agent;
  std::vector<LaunchNote> notes;  ///< in order
};

/// The plan, or a usage error naming the bad value and the fix (ddprun exits with
/// kExitUsage). `env` is ddprun's environment.
common::Result<LaunchPlan> plan_launch(const LaunchConfig& config, const agent::EnvMap& env,
                                       const LaunchProbes& probes);

}  // namespace ddprun::launcher
