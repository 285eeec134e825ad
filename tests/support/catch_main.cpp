// The one translation unit that compiles Catch2's runner.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

// Each test process writes its temporary files (its own and those of the agents and workers it
// starts, which inherit TMPDIR) under a directory of its own, removed when the process exits:
// a run of the suite leaves nothing behind in /tmp. The directory is world-writable and sticky
// like /tmp, since some tests run ddprun as another user. Only the process that made it removes
// it, so a forked child that exits does not take it from its parent.
class TestTempRoot {
 public:
  TestTempRoot() {
    const char* parent = std::getenv("TMPDIR");
    std::string pattern = std::string(parent != nullptr && *parent != '\0' ? parent : "/tmp") +
                          "/ddprun-tests-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "tests: cannot create a temporary directory from %s: %s; using %s\n",
                   pattern.c_str(), std::strerror(errno), parent != nullptr ? parent : "/tmp");
      return;
    }
    std::error_code error;
    std::filesystem::permissions(
        pattern, std::filesystem::perms::all | std::filesystem::perms::sticky_bit, error);
    dir_ = pattern;
    owner_ = ::getpid();
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  ~TestTempRoot() {
    if (dir_.empty() || ::getpid() != owner_) {
      return;
    }
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }
  TestTempRoot(const TestTempRoot&) = delete;
  TestTempRoot& operator=(const TestTempRoot&) = delete;

 private:
  std::string dir_;
  pid_t owner_ = 0;
};

const TestTempRoot test_temp_root;

}  // namespace
