#include "agent/process_tree.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

using namespace ddprun::agent;

TEST_CASE("the parent is read after the last parenthesis of a stat line", "[agent][unit]") {
  CHECK(parent_from_stat("1234 (sleep) S 77 1234 1234 0 -1") == 77);
  CHECK(parent_from_stat("1234 (a) b) (c) Z 1 0 0") == 1);
  CHECK(parent_from_stat("1234 (my prog) R 0 1 1") == 0);
  CHECK_FALSE(parent_from_stat("garbage").has_value());
  CHECK_FALSE(parent_from_stat("12 (x) S").has_value());
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
