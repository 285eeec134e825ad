#pragma once
#include <cstdio>
#include <cstdlib>

// Invariant checks that stay in every build (assert() vanishes under NDEBUG, which is the
// default Release and RelWithDebInfo build): a broken invariant is a bug, and running on with
// it corrupts a job's state silently, so the process aborts loudly instead.

namespace ddprun::common {

/// Prints "file:line: check failed: condition: message" to stderr and aborts. Not for expected
/// failures (a bad flag, a lost peer): those are values (common/result.h).
[[noreturn]] inline void check_failed(const char* file, int line, const char* condition,
                                      const char* message) noexcept {
  std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, condition, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace ddprun::common

/// Aborts with the file, the line, the condition and `msg` (a string literal) when `cond` is
/// false, in every build type.
#define DDPRUN_CHECK(cond, msg)                                                  \
  do {                                                                           \
    if (!(cond)) ::ddprun::common::check_failed(__FILE__, __LINE__, #cond, msg); \
  } while (false)
