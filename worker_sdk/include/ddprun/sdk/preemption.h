#pragma once
// "Checkpoint requested": a preemption notice (SIGUSR1, e.g. from `#SBATCH --signal=B:USR1@120`,
// forwarded by ddprun to every worker) turned into a flag the training loop polls. No libtorch
// here; the collective agreement on the flag is any_rank_requested_checkpoint() in sdk.h.
// See docs/sdk.md#preemption.
#include <csignal>

#include "ddprun/sdk/context.h"

namespace ddprun::sdk {

/// The signal that requests a checkpoint.
inline constexpr int kCheckpointSignal = SIGUSR1;

/// The variable ddprun sets to 1 for workers it starts after it received SIGUSR1 (the notice
/// came between two worker groups or before the first one).
inline constexpr const char* kCheckpointRequestedEnv = "DDPRUN_CHECKPOINT_REQUESTED";

/// True when the environment says a checkpoint was requested before this process started
/// (DDPRUN_CHECKPOINT_REQUESTED is 1 or true).
bool checkpoint_requested_in_env(const EnvMap& env);

/// Installs the SIGUSR1 handler that sets the flag (nothing when it is installed already), and
/// sets the flag when DDPRUN_CHECKPOINT_REQUESTED says so. The handler found in place is kept
/// and called after the flag is set, so a program's own handler still runs; a program that
/// installs its handler later calls this again (or request_checkpoint() from its handler).
/// WorkerContext::from_env() calls this.
void install_checkpoint_handler();

/// True once SIGUSR1 arrived (after install_checkpoint_handler()) or request_checkpoint() ran.
/// Only this process's view: ranks see the signal at different steps, so agree with
/// any_rank_requested_checkpoint() before acting on it.
bool checkpoint_requested();

/// Sets the flag as SIGUSR1 does; async-signal-safe, for a program's own handler.
void request_checkpoint();

/// Clears the flag (a program that saved and trains on; tests).
void clear_checkpoint_request();

}  // namespace ddprun::sdk
