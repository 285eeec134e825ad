#include "agent/worker_env.h"

#include <cstring>

#include "common/strings.h"

namespace ddprun::agent {

std::vector<WorkerPlacement> place_workers(const rdzv::RendezvousInfo& info, int local_world_size) {
  std::vector<WorkerPlacement> placements;
  const int world = info.group_world_size * local_world_size;
  for (int local = 0; local < local_world_size; ++local) {
    WorkerPlacement p;
    p.local_rank = local;
    p.global_rank = info.group_rank * local_world_size + local;
    // A single role per job: role ranks equal global ranks.
    p.role_rank = p.global_rank;
    p.world_size = world;
    p.role_world_size = world;
    placements.push_back(p);
  }
  return placements;
}

std::optional<common::Error> virtual_local_rank_problem(const EnvMap& agent_env,
                                                        int local_world_size) {
  auto it = agent_env.find("CUDA_VISIBLE_DEVICES");
  if (it == agent_env.end()) return std::nullopt;
  const size_t gpus = common::split(it->second, ',').size();
  if (static_cast<int>(gpus) >= local_world_size) return std::nullopt;
  return common::Error{"--virtual_local_rank with " + std::to_string(local_world_size) +
                       " workers per node: CUDA_VISIBLE_DEVICES=" + it->second + " names only " +
                       std::to_string(gpus) + " GPU(s); run as many workers as GPUs or widen it"};
}

bool will_default_omp_threads(const EnvMap& agent_env, int local_world_size) {
  return local_world_size > 1 && agent_env.find("OMP_NUM_THREADS") == agent_env.end();
}

EnvMap build_standby_env(const EnvMap& agent_env, const WorkerSpec& spec, int local_rank,
                         const std::string& run_id) {
  EnvMap env = agent_env;
  env["LOCAL_RANK"] = std::to_string(local_rank);
  if (spec.virtual_local_rank) {
    // Each worker sees its own GPU as cuda:0: the local rank's entry of the agent's
    // CUDA_VISIBLE_DEVICES (checked long enough by virtual_local_rank_problem), else the
    // local rank itself, as torchrun 2.x does.
    env["LOCAL_RANK"] = "0";
    std::string visible = std::to_string(local_rank);
    if (auto it = agent_env.find("CUDA_VISIBLE_DEVICES"); it != agent_env.end()) {
      const std::vector<std::string> gpus = common::split(it->second, ',');
      if (local_rank < static_cast<int>(gpus.size()))
        visible = common::trim(gpus[static_cast<size_t>(local_rank)]);
    }
    env["CUDA_VISIBLE_DEVICES"] = visible;
  }
  env["ROLE_NAME"] = spec.role;
  env["LOCAL_WORLD_SIZE"] = std::to_string(spec.local_world_size);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(spec.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = run_id;
  // torchrun 2.x puts its --signals_to_handle in its own environment; workers inherit it.
  if (!spec.signals_to_handle.empty())
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = spec.signals_to_handle;
  // NCCL's async error handling on by default; torch 1.x reads the unprefixed name.
  env.try_emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  env.try_emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (will_default_omp_threads(agent_env, spec.local_world_size)) env["OMP_NUM_THREADS"] = "1";
  return env;
}

EnvMap build_worker_env(const EnvMap& agent_env, const WorkerEnvInputs& in) {
  const rdzv::RendezvousInfo& round = *in.round;
  const WorkerPlacement& p = in.placement;
  EnvMap env = build_standby_env(agent_env, *in.spec, p.local_rank, in.run_id);
  env["RANK"] = std::to_string(p.global_rank);
  env["GROUP_RANK"] = std::to_string(round.group_rank);
  env["ROLE_RANK"] = std::to_string(p.role_rank);
  env["WORLD_SIZE"] = std::to_string(p.world_size);
  env["GROUP_WORLD_SIZE"] = std::to_string(round.group_world_size);
  env["ROLE_WORLD_SIZE"] = std::to_string(p.role_world_size);
  env["MASTER_ADDR"] = round.master_addr;
  env["MASTER_PORT"] = std::to_string(round.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(round.restart_count);
  // Python's str(bool), as torchrun writes it.
  env["TORCHELASTIC_USE_AGENT_STORE"] = in.use_agent_store ? "True" : "False";
  env["TORCHELASTIC_ERROR_FILE"] = in.error_file;
  if (!in.agent_socket.empty()) env["DDPRUN_AGENT_SOCKET"] = in.agent_socket;
  if (in.checkpoint_requested) env["DDPRUN_CHECKPOINT_REQUESTED"] = "1";
  return env;
}

std::vector<std::string> to_envp(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace ddprun::agent
