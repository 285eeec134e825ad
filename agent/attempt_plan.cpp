#include "agent/attempt_plan.h"

#include "agent/worker_command.h"

namespace ddprun::agent {
namespace fs = std::filesystem;

common::Result<AttemptPlan> plan_attempt(const AttemptInputs& in) {
  AttemptPlan plan;
  plan.dir = in.log_root / ("attempt_" + std::to_string(in.round->restart_count));
  std::error_code ec;
  fs::remove_all(plan.dir, ec);  // a stale error.json must not be blamed on this attempt
  const std::string path_env = search_path(*in.agent_env);
  const std::string& program = in.spec->argv.front();
  plan.executable = resolve_executable(program, path_env);
  if (plan.executable.empty())
    plan.missing_command = "command not found: " + program + " (PATH=" + path_env +
                           "); check the script name or set PYTHON_EXEC";
  for (const WorkerPlacement& p : in.placements) {
    const fs::path dir = plan.rank_dir(p.local_rank);
    fs::create_directories(dir, ec);
    if (ec) return common::Error{"cannot create " + dir.string() + ": " + ec.message()};
    const std::string error_file = (dir / "error.json").string();
    plan.error_files[p.local_rank] = error_file;
    // The agent's store (launcher/agent_store.h), or worker rank 0's with --agent_store off.
    const WorkerEnvInputs env{in.spec,
                              in.round,
                              p,
                              in.run_id,
                              in.spec->use_agent_store,
                              error_file,
                              in.report_socket,
                              in.checkpoint_requested};
    plan.envs[p.local_rank] = build_worker_env(*in.agent_env, env);
  }
  return plan;
}

}  // namespace ddprun::agent
