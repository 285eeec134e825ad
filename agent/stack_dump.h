#pragma once
// Hang forensics: before the agent SIGKILLs a worker it judged hung (the watchdog) or that
// ignored its stop signal (--shutdown_timeout), it records where the worker's threads are.
#include <sys/types.h>

#include <chrono>
#include <string>

namespace ddprun::agent {

/// Every thread's native stack of `pid`, as `eu-stack -p` (elfutils) prints it, or
/// `gdb -batch` when eu-stack is missing. Bounded: the tool is killed after `timeout`, and at
/// most `max_bytes` of its output are kept. On failure, a line saying why (tool missing, no
/// permission to trace).
std::string native_stacks(pid_t pid, std::chrono::milliseconds timeout,
                          size_t max_bytes = 256 * 1024);

}  // namespace ddprun::agent
