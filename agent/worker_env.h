#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker.h"
#include "common/env.h"
#include "common/result.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

using EnvMap = common::EnvMap;  // common/env.h
using common::current_environment;

/// Ranks of every local worker for a round: global rank = group_rank * local_world_size + local.
std::vector<WorkerPlacement> place_workers(const rdzv::RendezvousInfo& info, int local_world_size);

/// Inputs to one worker's environment besides the agent's own environment.
struct WorkerEnvInputs {
  const WorkerSpec* spec = nullptr;
  const rdzv::RendezvousInfo* round = nullptr;
  WorkerPlacement placement;
  std::string run_id;
  bool use_agent_store = false;
  std::string error_file;
  std::string agent_socket;  ///< DDPRUN_AGENT_SOCKET: where the worker reports progress ("" none)
  /// The agent received SIGUSR1 (a preemption notice) before starting this worker: it gets
  /// DDPRUN_CHECKPOINT_REQUESTED=1, which the SDK's checkpoint_requested() reads.
  bool checkpoint_requested = false;
};

/// The full environment of one worker: the agent's environment plus torchrun's variables
/// (LOCAL_RANK, RANK, ..., TORCHELASTIC_*). OMP_NUM_THREADS is set to 1 when unset and more
/// than one worker runs on the node.
EnvMap build_worker_env(const EnvMap& agent_env, const WorkerEnvInputs& in);

/// The part of a worker's environment that is the same in every round (LOCAL_RANK, the run
/// id, OMP_NUM_THREADS...), without RANK, WORLD_SIZE, MASTER_ADDR/PORT or the restart count:
/// what a standby process (--standby_workers) starts with.
EnvMap build_standby_env(const EnvMap& agent_env, const WorkerSpec& spec, int local_rank,
                         const std::string& run_id);

/// Why --virtual_local_rank cannot give each of local_world_size workers its own GPU: the
/// agent's CUDA_VISIBLE_DEVICES names fewer; nullopt when it can (or the variable is unset).
std::optional<common::Error> virtual_local_rank_problem(const EnvMap& agent_env,
                                                        int local_world_size);

/// True when build_worker_env will add OMP_NUM_THREADS=1 (the agent prints one notice).
bool will_default_omp_threads(const EnvMap& agent_env, int local_world_size);

/// "K=V" strings for execve.
std::vector<std::string> to_envp(const EnvMap& env);

}  // namespace ddprun::agent
