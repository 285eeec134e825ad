#pragma once
// Writing a whole buffer to a descriptor, for the console and log files.
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string_view>

namespace ddprun::common {

/// Writes all of `data` to `fd`, retrying short writes and EINTR; returns the errno of a failed
/// write (0: all written) and sets `lost` to the bytes not written.
inline int write_all(int fd, std::string_view data, size_t* lost = nullptr) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (lost != nullptr) *lost = left;
      return errno;  // console gone (EPIPE), disk full (ENOSPC), file too large (EFBIG)
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace ddprun::common
