#pragma once
#include <cstdint>

namespace ddprun::agent {

/// One record on the watcher's pipe (GroupCleanup): 'T' and a worker's session (its pid) to
/// kill if the agent dies, 'F': forget every session told so far (they were killed), or 'K':
/// keep the agent's error files once it is gone (a failure report names them for the user).
/// 'T' and 'F' only without a cgroup.
/// Smaller than PIPE_BUF, so written whole or not at all: by the agent, and by each worker for
/// its own session between fork and exec (ProcessSpec::watcher_fd), before it can start
/// anything.
struct WatcherRecord {
  char kind = 'F';
  std::int32_t session = 0;
};

}  // namespace ddprun::agent
