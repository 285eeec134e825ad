#pragma once
// Reading what a child process writes to a pipe, bounded in time and size: the stack dumper's
// gdb and the libuv probe's Python.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>

namespace ddprun::common {

/// Reads `fd` until end of file or `deadline`, keeping at most `max_bytes` in `out` (what comes
/// beyond is read and dropped, so the writer never blocks on a full pipe). Returns true when
/// the deadline passed first.
inline bool read_until_end(int fd, std::chrono::steady_clock::time_point deadline,
                           std::size_t max_bytes, std::string& out) {
  char chunk[16384];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return true;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return true;
    if (ready < 0) return false;
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (out.size() < max_bytes)
      out.append(chunk, std::min(static_cast<std::size_t>(n), max_bytes - out.size()));
  }
}

}  // namespace ddprun::common
