#pragma once
#include <string>
#include <variant>

#include "agent/worker_env.h"
#include "common/result.h"
#include "launcher/cli.h"
#include "launcher/launch_config.h"

namespace ddprun::launcher {

/// Prints the notice and replaces this process with `srun ... <this ddprun> args`; returns only
/// when srun cannot be started (kExitInternal, after saying why).
int exec_under_srun(const SlurmFanOut& fan_out);

/// Runs a validated configuration to its end; returns ddprun's exit status.
int launch(const LaunchConfig& config, const agent::EnvMap& env);

}  // namespace ddprun::launcher
