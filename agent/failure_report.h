#pragma once
#include <string>
#include <vector>

#include "agent/worker.h"

namespace ddprun::agent {

/// "exit code 3" / "signal SIGKILL (9)": how a failure ended, for humans.
std::string describe_exit(const ExitStatus& status);

/// The failure summary in torchrun's shape: "<script> FAILED", every failure of the last
/// attempt, and the root cause (the first failure observed) with its error-file traceback.
/// `failures` is in observation order; failures[0] is the root cause.
std::string format_failure_report(const std::string& script, const std::string& host,
                                  const std::vector<ProcessFailure>& failures, int restarts_used,
                                  int max_restarts);

}  // namespace ddprun::agent
