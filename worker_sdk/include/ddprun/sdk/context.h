#pragma once
// The worker's view of its launch: what ddprun (or torchrun) put in the environment.
// Pure and free of libtorch, so it is unit-tested without it.
#include <map>
#include <string>
#include <variant>

namespace ddprun::sdk {

/// Rank, world and store address of this worker, read from torchrun's environment variables.
struct WorkerContext {
  int rank = 0;              ///< RANK: global rank
  int local_rank = 0;        ///< LOCAL_RANK: rank on this node (picks the GPU)
  int world_size = 1;        ///< WORLD_SIZE
  int local_world_size = 1;  ///< LOCAL_WORLD_SIZE
  int group_rank = 0;        ///< GROUP_RANK: this node's rank (0 when unset)
  int restart_count = 0;     ///< TORCHELASTIC_RESTART_COUNT (0 when unset)
  int max_restarts = 0;      ///< TORCHELASTIC_MAX_RESTARTS (0 when unset)
  std::string run_id;        ///< TORCHELASTIC_RUN_ID ("" when unset)
  std::string master_addr;   ///< MASTER_ADDR: host of the c10d store
  int master_port = 0;       ///< MASTER_PORT
  /// TORCHELASTIC_USE_AGENT_STORE == "True": the agent hosts the store and workers are clients
  /// under the prefix "/worker/attempt_<restart_count>".
  bool use_agent_store = false;
  std::string error_file;  ///< TORCHELASTIC_ERROR_FILE ("" when unset)

  /// Reads the process environment; throws std::runtime_error naming the first missing or bad
  /// variable ("WORLD_SIZE is not set: start this program with ddprun or torchrun").
  /// In a standby process (ddprun --standby_workers) the first call first waits for the
  /// agent to hand over the environment of the worker this process becomes.
  /// Also installs the SIGUSR1 handler behind checkpoint_requested() (sdk/preemption.h).
  static WorkerContext from_env();
};

/// Environment variables by name, as `environ` holds them: the same type as the agent's
/// common::EnvMap (common/env.h), spelled here so that the installed SDK headers stand alone.
using EnvMap = std::map<std::string, std::string>;

/// Builds a context from variables; the error names the variable and what to do.
std::variant<WorkerContext, std::string> parse_worker_context(const EnvMap& env);

/// The current process environment as a map (common::current_environment, common/env.h).
EnvMap current_environment();

/// The environment in a standby hand-over message ({"env": {...}}), or what is wrong with it.
std::variant<EnvMap, std::string> parse_standby_handover(const std::string& message);

/// End of file without a message: the agent no longer needs this standby.
struct StandbyReleased {};

/// A standby's side of the hand-over (ddprun --standby_workers): reads the agent's message on
/// `fd` up to end of file and closes `fd`. A valid hand-over is acknowledged on the same socket
/// first (common/standby_protocol.h), so the agent counts this process as the worker only from
/// then on. A bad message is not acknowledged: the agent starts that rank afresh.
std::variant<EnvMap, StandbyReleased, std::string> receive_standby_handover(int fd);

/// The c10d store key prefix workers use with the agent's store: "/worker/attempt_<n>".
std::string agent_store_prefix(int restart_count);

}  // namespace ddprun::sdk
