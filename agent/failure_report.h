#pragma once
#include <string>
#include <vector>

#include "agent/worker.h"

namespace ddprun::agent {

/// "exit code 3" / "signal SIGKILL (9)": how a failure ended, for humans.
std::string describe_exit(const ExitStatus& status);

/// Worker output that could not be written to --log_dir files in the job.
struct LogLoss {
  int files = 0;        ///< log files a write to failed
  long long bytes = 0;  ///< bytes of output that never reached them
};

/// The failure summary in torchrun's shape: "<script> FAILED", every failure of the last
/// attempt, and the root cause (the first failure observed) with its error-file traceback.
/// `failures` is in observation order; failures[0] is the root cause.
std::string format_failure_report(const std::string& script, const std::string& host,
                                  const std::vector<ProcessFailure>& failures, int restarts_used,
                                  int max_restarts, LogLoss log_loss = {});

/// What the failure report says of one worker: its exit, its error file read now (or why it
/// could not be), or `launch_error` for a worker that never ran; `hung_reason` stands in for
/// an error file a hung worker did not write.
ProcessFailure collect_failure(const WorkerPlacement& placement, pid_t pid, ExitStatus status,
                               const std::string& error_file, const std::string& launch_error,
                               const std::string& hung_reason);

/// torchrun's @record for the launcher's parent: a launcher started with
/// TORCHELASTIC_ERROR_FILE (by a scheduler such as TorchX) leaves the root cause's error file
/// at `parent_file`, its exit code filled in (written to a temporary file, then renamed).
void copy_root_cause_for_parent(const ProcessFailure& root, const std::string& parent_file);

/// Said after the failure report of a Python job whose workers could not import torch or whose
/// interpreter could not run: which interpreter ran, where it came from, how to pick another.
std::string interpreter_hint(const std::string& interpreter, const std::string& origin,
                             bool missing_torch);

}  // namespace ddprun::agent
