#pragma once
#include <string>
#include <variant>

#include "agent/worker_env.h"
#include "common/result.h"
#include "launcher/cli.h"
#include "launcher/launch_config.h"

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

/// Prints the notice and replaces this process with `srun ... <this ddprun> args`; returns only
/// when srun cannot be started (kExitInternal, after saying why).
int exec_under_srun(const SlurmFanOut& fan_out);

/// Runs a validated configuration to its end; returns ddprun's exit status.
int launch(const LaunchConfig& config, const agent::EnvMap& env);

}  // namespace ddprun::launcher
