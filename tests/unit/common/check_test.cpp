#include "common/check.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>

#include "common/enum_names.h"
#include "common/env.h"
#include "common/result.h"
#include "tests/support/in_child.h"

using ddprun::testing::in_child;

namespace {

enum class Colour { Red, Green };
constexpr std::array<ddprun::common::EnumName<Colour>, 2> kColours{{
    {Colour::Red, "red"},
    {Colour::Green, "green"},
}};
static_assert(ddprun::common::name_table_complete(kColours));
// A table with a name twice, or a value missing, is caught at compile time.
static_assert(!ddprun::common::name_table_complete(std::array<ddprun::common::EnumName<Colour>, 2>{
    {{Colour::Red, "red"}, {Colour::Red, "x"}}}));

ddprun::common::Result<int> half(int n) {
  if (n % 2 != 0) return ddprun::common::Error{std::to_string(n) + " is odd"};
  return n / 2;
}

}  // namespace

TEST_CASE("a failed DDPRUN_CHECK aborts naming the file, the line and the condition",
          "[common][unit]") {
  const auto [status, err] = in_child([] {
    const int workers = 0;
    DDPRUN_CHECK(workers > 0, "a group has at least one worker");
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK_THAT(err,
             Catch::Contains("check_test.cpp:") &&
                 Catch::Contains("check failed: workers > 0: a group has at least one worker"));
}

TEST_CASE("a DDPRUN_CHECK that holds does nothing", "[common][unit]") {
  const auto [status, err] = in_child([] { DDPRUN_CHECK(1 + 1 == 2, "arithmetic"); });
  CHECK(WIFEXITED(status));
  CHECK(err.empty());
}

TEST_CASE("a name table reads and writes the same names", "[common][unit]") {
  using ddprun::common::enum_from;
  using ddprun::common::name_of;
  CHECK(name_of(Colour::Green, kColours) == "green");
  CHECK(enum_from("red", kColours) == Colour::Red);
  CHECK_FALSE(enum_from("blue", kColours));
}

TEST_CASE("a Result holds a value or the error that prevented it", "[common][unit]") {
  const auto ok = half(4);
  REQUIRE(ok.ok());
  CHECK(*ok == 2);
  const auto bad = half(3);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message == "3 is odd");
}

TEST_CASE("the environment is read as a map", "[common][unit]") {
  ::setenv("DDPRUN_CHECK_TEST", "a=b", 1);
  const ddprun::common::EnvMap env = ddprun::common::current_environment();
  REQUIRE(env.count("DDPRUN_CHECK_TEST"));
  CHECK(env.at("DDPRUN_CHECK_TEST") == "a=b");
  ::unsetenv("DDPRUN_CHECK_TEST");
}
