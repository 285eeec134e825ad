#pragma once
#include "agent/worker.h"

namespace ddprun::agent {

/// Counts of the current worker group's members by what the agent has observed.
struct GroupObservation {
  int running = 0;
  int succeeded = 0;
  int failed = 0;
};

/// The group's state as torchelastic names it.
WorkerState group_state(const GroupObservation& obs);

/// What the agent does while a group runs.
enum class Action {
  Monitor,    ///< keep watching
  Succeed,    ///< every worker exited 0
  StopGroup,  ///< a worker failed: stop every other worker
};

/// Decides after each observed worker exit.
Action decide(const GroupObservation& obs);

/// How a whole ddprun run ended.
enum class JobEnd { Succeeded, WorkersFailed, Signalled, RendezvousFailed, Internal };

/// Inputs of the exit-status mapping.
struct JobOutcome {
  JobEnd end = JobEnd::Succeeded;
  ExitStatus root_cause;  ///< the first failed worker, for WorkersFailed
  int signal = 0;         ///< the signal received, for Signalled
  int max_restarts = 0;

  static JobOutcome of(JobEnd end) {
    JobOutcome o;
    o.end = end;
    return o;
  }
  static JobOutcome signalled(int sig) {
    JobOutcome o = of(JobEnd::Signalled);
    o.signal = sig;
    return o;
  }
  static JobOutcome workers_failed(ExitStatus root_cause, int max_restarts) {
    JobOutcome o = of(JobEnd::WorkersFailed);
    o.root_cause = root_cause;
    o.max_restarts = max_restarts;
    return o;
  }
};

/// ddprun's exit status (common/exit_codes.h; docs/design.md#exit-codes).
int job_exit_code(const JobOutcome& outcome);

}  // namespace ddprun::agent
