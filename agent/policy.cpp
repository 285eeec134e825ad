#include "agent/policy.h"

#include <sys/wait.h>

#include "common/exit_codes.h"

namespace ddprun::agent {

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    s.code = WEXITSTATUS(status);
  }
  return s;
}

WorkerState group_state(const GroupObservation& obs) {
  if (obs.failed > 0) return WorkerState::Failed;
  if (obs.running > 0) return WorkerState::Healthy;
  if (obs.succeeded > 0) return WorkerState::Succeeded;
  return WorkerState::Init;
}

Action decide(const GroupObservation& obs) {
  switch (group_state(obs)) {
    case WorkerState::Failed:
      // Healthy -> Failed: one worker failing makes the whole group stop.
      return Action::StopGroup;
    case WorkerState::Succeeded:
      // Healthy -> Succeeded: the last worker exited 0 and none failed.
      return Action::Succeed;
    default:
      return Action::Monitor;
  }
}

int job_exit_code(const JobOutcome& outcome) {
  switch (outcome.end) {
    case JobEnd::Succeeded:
      return common::kExitSuccess;
    case JobEnd::WorkersFailed:
      if (outcome.max_restarts > 0) return common::kExitRestartsExhausted;
      // A worker that exits non-zero has a non-zero shell code; keep it distinct from success.
      return outcome.root_cause.shell_code() != 0 ? outcome.root_cause.shell_code() : 1;
    case JobEnd::Signalled:
      return 128 + outcome.signal;
    case JobEnd::RendezvousFailed:
      return common::kExitRendezvous;
    case JobEnd::Internal:
      return common::kExitInternal;
  }
  return common::kExitInternal;
}

}  // namespace ddprun::agent
