#include "agent/group_cleanup.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

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

namespace {

/// A process as read_process_ids() shows it: in session `sid`, started at `start`.
ProcessIds in_session(pid_t sid, unsigned long long start) {
  ProcessIds id;
  id.parent = 1;
  id.group = sid;
  id.session = sid;
  id.start_time = start;
  return id;
}

}  // namespace

TEST_CASE("a noted session is the job's while its leader or a member seen in it is there",
          "[agent][unit]") {
  const pid_t sid = 40;
  // Seen at a look: member 41 (started at 1100), its leader 40 (at 1000) gone before the look.
  const NotedSession seen{1000, {{41, 1100}}};
  CHECK(still_noted({{40, in_session(sid, 1000)}, {41, in_session(sid, 1100)}}, sid, seen));
  CHECK(still_noted({{41, in_session(sid, 1100)}}, sid, seen));
  // pid 40 leads someone else's session now (another start time): not the job's, whatever is
  // in it.
  CHECK_FALSE(still_noted({{40, in_session(sid, 5000)}, {41, in_session(sid, 1100)}}, sid, seen));
  // The session emptied and its id was taken by a daemon whose leader exited: its member (pid
  // 42, or pid 41 taken again with another start time) is not one seen in the job's session.
  CHECK_FALSE(still_noted({{42, in_session(sid, 6000)}}, sid, seen));
  CHECK_FALSE(still_noted({{41, in_session(sid, 6000)}}, sid, seen));
  // A member seen there that moved to a session of its own is judged by that session.
  CHECK_FALSE(still_noted({{41, in_session(41, 1100)}}, sid, seen));
}

TEST_CASE("a worker's session is the job's while the worker or what it started may be there",
          "[agent][unit]") {
  const pid_t sid = 40;
  // The worker (40, started at 1000) in it at the last look, or told before its exec.
  const NotedSession worker{1000, {{40, 1000}}};
  CHECK(still_noted({{40, in_session(sid, 1000)}}, sid, worker));
  // The worker gone with the agent (PR_SET_PDEATHSIG): what it started since the last look
  // (43, in a process group of its own or not) is the job's.
  CHECK(still_noted({{43, in_session(sid, 1200)}}, sid, worker));
  // pid 40 is someone else's now.
  CHECK_FALSE(still_noted({{40, in_session(sid, 7000)}}, sid, worker));
  // Its leader gone when first seen (leader_start 0) and nothing seen in it still there.
  const NotedSession leaderless{0, {{41, 1100}}};
  CHECK_FALSE(still_noted({{43, in_session(sid, 1200)}}, sid, leaderless));
  CHECK_FALSE(still_noted({{40, in_session(sid, 1000)}}, sid, leaderless));
}

TEST_CASE("the watcher removes the agent's temporary directories, and nothing else",
          "[agent][unit]") {
  namespace fs = std::filesystem;
  // Under the tests' TMPDIR, a directory of this test process's own (catch_main.cpp).
  const fs::path tmp = fs::temp_directory_path() / "agent-temp-dirs";
  fs::create_directories(tmp);
  const std::string tag = ddprun::agent::temp_dir_tag();
  CHECK(tag.rfind(std::to_string(::getpid()) + ".", 0) == 0);
  CHECK(tag != std::to_string(::getpid()) + ".0");  // the start time was read
  const fs::path socket_dir = tmp / ("ddprun-sock-" + tag + "-a1b2c3");
  const fs::path error_dir = tmp / ("ddprun-" + tag + "-d4e5f6");
  const auto make_ours = [&] {
    fs::create_directories(socket_dir);
    fs::create_directories(error_dir / "attempt_0" / "0");
    std::ofstream(error_dir / "attempt_0" / "0" / "error.json") << "{}";
  };
  make_ours();
  // Not the agent's: another process's, the kept log directory, a link to another directory.
  fs::create_directories(tmp / "ddprun-1.2-x1y2z3");
  fs::create_directories(tmp / "ddprun-Ab12Cd");
  fs::create_directories(tmp / "target");
  fs::create_directory_symlink(tmp / "target", tmp / ("ddprun-" + tag + "-link00"));
  CHECK(ddprun::agent::remove_agent_temp_dirs(tmp.string(), tag, false) == 2);
  CHECK_FALSE(fs::exists(socket_dir));
  CHECK_FALSE(fs::exists(error_dir));
  CHECK(fs::exists(tmp / "ddprun-1.2-x1y2z3"));
  CHECK(fs::exists(tmp / "ddprun-Ab12Cd"));
  CHECK(fs::is_symlink(tmp / ("ddprun-" + tag + "-link00")));
  CHECK(fs::exists(tmp / "target"));
  CHECK(ddprun::agent::remove_agent_temp_dirs(tmp.string(), tag, false) == 0);
  // Error files a failure report named stay for the user; the socket's directory goes.
  make_ours();
  CHECK(ddprun::agent::remove_agent_temp_dirs(tmp.string(), tag, true) == 1);
  CHECK_FALSE(fs::exists(socket_dir));
  CHECK(fs::exists(error_dir / "attempt_0" / "0" / "error.json"));
  fs::remove_all(tmp);
}
