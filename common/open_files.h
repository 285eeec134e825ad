#pragma once
// The open-file limit of a process that serves many connections: the rendezvous daemon, the
// agent that hosts the workers' store, and the benches' light clients.
#include <sys/resource.h>

namespace ddprun::common {

/// The soft and hard RLIMIT_NOFILE of this process (RLIM_INFINITY where unlimited).
struct OpenFileLimit {
  rlim_t soft = 0;
  rlim_t hard = 0;
};

/// The soft limit this process started with, once raise_open_file_limit raised it; 0 before.
inline rlim_t& inherited_open_file_soft_limit() {
  static rlim_t soft = 0;
  return soft;
}

/// Raises the soft open-file limit to the hard one (the usual soft limit of 1024 would stop a
/// server at about a thousand connections) and returns the limits now in force (soft below hard:
/// it could not be raised). Never lowers a limit. A process that starts programs gives
/// them back the limit it was given (restore_inherited_open_file_limit, in the forked child):
/// a program that uses select() breaks on descriptors above 1023.
inline OpenFileLimit raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return {};
  OpenFileLimit out{limit.rlim_cur, limit.rlim_max};
  if (limit.rlim_cur >= limit.rlim_max) return out;
  const rlim_t was = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.soft = limit.rlim_max;
    if (inherited_open_file_soft_limit() == 0) inherited_open_file_soft_limit() = was;
  }
  return out;
}

/// In a forked child before exec: the soft limit this process was started with, if
/// raise_open_file_limit raised it. Async-signal-safe (one getrlimit, one setrlimit).
inline void restore_inherited_open_file_limit() noexcept {
  const rlim_t soft = inherited_open_file_soft_limit();
  rlimit limit{};
  if (soft == 0 || ::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = soft;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace ddprun::common
