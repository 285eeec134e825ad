#include "agent/process_tree.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>

using namespace ddprun::agent;

TEST_CASE("the parent is read after the last parenthesis of a stat line", "[agent][unit]") {
  CHECK(parent_from_stat("1234 (sleep) S 77 1234 1234 0 -1") == 77);
  CHECK(parent_from_stat("1234 (a) b) (c) Z 1 0 0") == 1);
  CHECK(parent_from_stat("1234 (my prog) R 0 1 1") == 0);
  CHECK_FALSE(parent_from_stat("garbage").has_value());
  CHECK_FALSE(parent_from_stat("12 (x) S").has_value());
  // The process group and session follow the parent (the subreaper watcher kills by them).
  const auto ids = ids_from_stat("1234 (a) b) (c) S 77 900 800 0 -1");
  REQUIRE(ids);
  CHECK(ids->parent == 77);
  CHECK(ids->group == 900);
  CHECK(ids->session == 800);
  CHECK(ids->start_time == 0);  // not in that text
  // The start time, which tells a process from a later one with its pid.
  const auto full = ids_from_stat(
      "4321 (python3) S 10 4321 4321 0 -1 4194560 3000 0 0 0 12 3 0 0 20 0 5 0 987654 "
      "300000000 9000 18446744073709551615");
  REQUIRE(full);
  CHECK(full->session == 4321);
  CHECK(full->start_time == 987654);
  const auto own = read_process_ids().at(::getpid());
  CHECK(own.start_time > 0);
}

TEST_CASE("descendants are found at every depth and spared subtrees are left out",
          "[agent][unit]") {
  // 10 is the agent: workers 11 and 12; 11's grandchild 21 (setsid'd, still below 11); 30 an
  // orphan reparented to the agent; 40 a standby with its child 41; 99 someone else's.
  const std::map<pid_t, pid_t> parents{{10, 1},  {11, 10}, {12, 10}, {21, 11}, {22, 21},
                                       {30, 10}, {40, 10}, {41, 40}, {99, 1}};
  auto found = descendants_of(parents, 10, {40});
  std::sort(found.begin(), found.end());
  CHECK(found == std::vector<pid_t>{11, 12, 21, 22, 30});
  CHECK(descendants_of(parents, 99, {}).empty());
}

TEST_CASE("this process's descendants are read from /proc", "[agent][unit]") {
  const auto parents = read_process_parents();
  REQUIRE(parents.count(::getpid()) == 1);
  CHECK(parents.at(::getpid()) == ::getppid());
}

namespace {

/// Ended: gone, or a zombie waiting for its parent.
bool ended(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  return stat.substr(stat.rfind(')') + 2, 1) == "Z";
}

}  // namespace

TEST_CASE("every descendant is killed, a setsid'd grandchild too, and a spared one is not",
          "[agent][unit]") {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t worker = ::fork();
  if (worker == 0) {
    if (::fork() == 0) {
      ::setsid();
      const pid_t self = ::getpid();
      if (::write(ready[1], &self, sizeof(self)) < 0) ::_exit(1);
      ::pause();
      ::_exit(0);
    }
    ::pause();
    ::_exit(0);
  }
  const pid_t spared = ::fork();
  if (spared == 0) {
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  pid_t grandchild = -1;
  REQUIRE(::read(ready[0], &grandchild, sizeof(grandchild)) == sizeof(grandchild));
  ::close(ready[0]);

  CHECK(kill_descendants({spared}) >= 2);  // the worker and its grandchild
  int status = 0;
  REQUIRE(::waitpid(worker, &status, 0) == worker);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  // The grandchild is not ours to reap: it ends, re-parented, as a zombie or gone.
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = ended(grandchild);
    if (!gone) ::usleep(10 * 1000);
  }
  CHECK(gone);
  CHECK(::waitpid(spared, &status, WNOHANG) == 0);  // still running
  ::kill(spared, SIGKILL);
  ::waitpid(spared, &status, 0);
}

TEST_CASE("core files are forbidden to the processes of the groups named, and only to them",
          "[agent][unit]") {
  rlimit own{};
  REQUIRE(::getrlimit(RLIMIT_CORE, &own) == 0);
  if (own.rlim_max == 0) {
    WARN("skipped: the hard core-file limit here is 0, so there is nothing to lower");
    return;
  }
  // A group leader with a child in its group, and a process of another group: each raises its
  // soft limit to the hard one, as `ulimit -c unlimited` does, and waits.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  auto waiter = [&](bool own_group) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (own_group) ::setpgid(0, 0);
      rlimit raised{own.rlim_max, own.rlim_max};
      ::setrlimit(RLIMIT_CORE, &raised);
      if (own_group && ::fork() == 0) {  // the leader's child, in its group
        ::setrlimit(RLIMIT_CORE, &raised);
        if (::write(ready[1], "c", 1) < 0) ::_exit(1);
        ::pause();
        ::_exit(0);
      }
      if (::write(ready[1], "p", 1) < 0) ::_exit(1);
      ::pause();
      ::_exit(0);
    }
    return pid;
  };
  const pid_t leader = waiter(true);
  const pid_t other = waiter(false);
  // Whatever fails below, the waiters end.
  struct Ended {
    pid_t leader, other;
    ~Ended() {
      int status = 0;
      if (leader > 0) {
        ::kill(-leader, SIGKILL);  // the leader and its child
        ::kill(leader, SIGKILL);   // should the group not have been made
        ::waitpid(leader, &status, 0);
      }
      if (other > 0) {
        ::kill(other, SIGKILL);
        ::waitpid(other, &status, 0);
      }
    }
  } ended{leader, other};
  REQUIRE(leader > 0);
  REQUIRE(other > 0);
  ::close(ready[1]);
  for (int i = 0; i < 3; ++i) {  // the three say they are ready, within 10 s
    pollfd p{ready[0], POLLIN, 0};
    char c = 0;
    REQUIRE(::poll(&p, 1, 10'000) == 1);
    REQUIRE(::read(ready[0], &c, 1) == 1);
  }
  ::close(ready[0]);
  ::setpgid(leader, leader);  // also here, so that the group exists before the call

  CHECK(forbid_core_dumps({leader}) == 2);  // the leader and its child
  std::vector<pid_t> in_group;
  for (const auto& [pid, ids] : read_process_ids())
    if (ids.group == leader) in_group.push_back(pid);
  CHECK(in_group.size() == 2);
  for (pid_t pid : in_group) {
    rlimit limit{};
    REQUIRE(::prlimit(pid, RLIMIT_CORE, nullptr, &limit) == 0);
    CHECK(limit.rlim_cur == 0);
    CHECK(limit.rlim_max == own.rlim_max);  // the hard limit is kept
  }
  rlimit untouched{};
  REQUIRE(::prlimit(other, RLIMIT_CORE, nullptr, &untouched) == 0);
  CHECK(untouched.rlim_cur == own.rlim_max);
}
