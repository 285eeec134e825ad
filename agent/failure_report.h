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

/// What the report at a failed job's end says besides the failures themselves.
struct FailureReportContext {
  std::string script;
  std::string host;
  int restarts_used = 0;
  int max_restarts = 0;
  LogLoss log_loss;
  std::string parent_error_file;  ///< TORCHELASTIC_ERROR_FILE given to ddprun ("" for none)
  std::string interpreter;        ///< a Python job's interpreter ("" otherwise)
  std::string interpreter_origin;
  bool missing_torch = false;  ///< a worker said "No module named 'torch'"
  bool cannot_run = false;     ///< a worker's process could not be started
};

/// The end of a failed job on the node whose workers failed: the report on stderr, the root
/// cause copied for the launcher's parent, and for a Python job whose workers could not import
/// torch or run, which interpreter ran and how to choose another.
void print_job_failure(const std::vector<ProcessFailure>& failures,
                       const FailureReportContext& context);

/// True when `path` is "", missing or empty: no error file was written there.
bool is_empty_file(const std::string& path);

/// Whether the report names an error file (then the directory holding it must be kept).
bool names_error_files(const std::vector<ProcessFailure>& failures);

/// Said after the failure report of a Python job whose workers could not import torch or whose
/// interpreter could not run: which interpreter ran, where it came from, how to pick another.
std::string interpreter_hint(const std::string& interpreter, const std::string& origin,
                             bool missing_torch);

}  // namespace ddprun::agent
