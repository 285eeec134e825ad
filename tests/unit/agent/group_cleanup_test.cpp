#include "agent/group_cleanup.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;

TEST_CASE("the cgroup v2 mount is found in mountinfo wherever it is", "[agent][unit]") {
  // Where v1 controllers own /sys/fs/cgroup and v2 sits at .../unified (this CI's machines).
  const std::string hybrid =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  CHECK(cgroup2_mount_point(hybrid) == "/sys/fs/cgroup/unified");
  // Optional fields before the separator do not shift the mount point.
  CHECK(cgroup2_mount_point("25 1 0:22 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n") ==
        "/sys/fs/cgroup");
  CHECK_FALSE(cgroup2_mount_point("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"));
}

TEST_CASE("the own cgroup v2 path is the 0:: line of /proc/self/cgroup", "[agent][unit]") {
  CHECK(cgroup2_own_path("4:memory:/x\n0::/user.slice/a.scope\n") == "/user.slice/a.scope");
  CHECK(cgroup2_own_path("0::/\n") == "/");
  CHECK_FALSE(cgroup2_own_path("4:memory:/x\n").has_value());
}

TEST_CASE("cleanup modes have one name each, in both directions", "[agent][unit]") {
  for (auto mode : {CleanupMode::Auto, CleanupMode::Cgroup, CleanupMode::Subreaper})
    CHECK(parse_cleanup_mode(cleanup_mode_name(mode)) == mode);
  CHECK_FALSE(parse_cleanup_mode("keeper").has_value());
}
