#pragma once
// What the agent prepares before a group's workers start: the attempt's directory under the
// log root (one per restart, so a stale error file is never blamed on a new attempt), each
// worker's error file and environment, and the resolved worker executable.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "agent/worker.h"
#include "agent/worker_env.h"
#include "common/result.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

struct AttemptInputs {
  std::filesystem::path log_root;
  const WorkerSpec* spec = nullptr;
  const EnvMap* agent_env = nullptr;
  const rdzv::RendezvousInfo* round = nullptr;
  std::vector<WorkerPlacement> placements;
  std::string run_id;
  std::string report_socket;  ///< DDPRUN_AGENT_SOCKET ("" none)
  bool checkpoint_requested = false;
};

struct AttemptPlan {
  std::filesystem::path dir;    ///< <log root>/attempt_<restart count>, emptied and recreated
  std::string executable;       ///< the worker command's program, "" when it was not found
  std::string missing_command;  ///< why, when `executable` is ""
  std::map<int, EnvMap> envs;   ///< by local rank
  std::map<int, std::string> error_files;  ///< by local rank
  /// The directory a rank's output files go to.
  std::filesystem::path rank_dir(int local_rank) const { return dir / std::to_string(local_rank); }
};

/// Creates the attempt's directories and builds every worker's environment. The error names
/// the directory that could not be created and why.
common::Result<AttemptPlan> plan_attempt(const AttemptInputs& in);

}  // namespace ddprun::agent
