#pragma once
// Hang forensics: before the agent SIGKILLs a worker it judged hung (the watchdog) or that
// ignored its stop signal (--shutdown_timeout), it records where the worker's threads are.
#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddprun::agent {

/// Every thread's native stack of `pid`, as `eu-stack -p` (elfutils) prints it, or
/// `gdb -batch` when eu-stack is missing. Bounded: the tool is killed after `timeout`, and at
/// most `max_bytes` of its output are kept. On failure, a line saying why (tool missing, no
/// permission to trace).
std::string native_stacks(pid_t pid, std::chrono::milliseconds timeout,
                          size_t max_bytes = 256 * 1024);

/// A worker whose stacks are wanted.
struct StackTarget {
  pid_t pid = 0;
  int rank = 0;
  int local_rank = 0;
};

/// Each target's native stacks, logged as a warning saying `why`; at most `per_worker` each and
/// `budget` in all, since the agent's event loop waits meanwhile. One object per target for
/// the event log's `stacks_dumped` (rank, local_rank, pid, why, native).
std::vector<nlohmann::json> log_native_stacks(
    const std::vector<StackTarget>& targets, const std::string& why,
    std::chrono::milliseconds per_worker = std::chrono::milliseconds{5000},
    std::chrono::milliseconds budget = std::chrono::milliseconds{15000});

}  // namespace ddprun::agent
