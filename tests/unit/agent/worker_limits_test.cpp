#include "agent/worker_limits.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;

namespace {

ProcessLimits limits(long long files, long long processes, bool processes_apply) {
  return ProcessLimits{files, files, processes, processes_apply};
}

}  // namespace

TEST_CASE("a worker count within the limits passes", "[agent][unit]") {
  CHECK_FALSE(check_worker_limits(8, {}, limits(1024, 100, true)));
  CHECK_FALSE(check_worker_limits(100000, {}, limits(-1, -1, true)));
}

TEST_CASE("too many workers for RLIMIT_NOFILE are refused with the value and the fix",
          "[agent][unit]") {
  auto why = check_worker_limits(5000, {}, limits(256, -1, false));
  REQUIRE(why);
  CHECK(why->message.find("--nproc_per_node 5000 needs about 10064 open files (2 per worker)") ==
        0);
  CHECK(why->message.find("RLIMIT_NOFILE allows (256)") != std::string::npos);
  CHECK(why->message.find("`ulimit -n 10064`") != std::string::npos);
}

TEST_CASE("log files and standbys count against RLIMIT_NOFILE", "[agent][unit]") {
  CHECK_FALSE(check_worker_limits(90, {}, limits(256, -1, false)));
  CHECK(check_worker_limits(90, {true, false}, limits(256, -1, false)));
  CHECK(check_worker_limits(90, {false, true}, limits(256, -1, false)));
}

TEST_CASE("RLIMIT_NPROC is checked only where it applies", "[agent][unit]") {
  auto why = check_worker_limits(200, {}, limits(-1, 100, true));
  REQUIRE(why);
  CHECK(why->message.find("RLIMIT_NPROC allows this user (100)") != std::string::npos);
  CHECK(why->message.find("ulimit -u") != std::string::npos);
  // Root: the kernel does not apply it.
  CHECK_FALSE(check_worker_limits(200, {}, limits(-1, 100, false)));
}
