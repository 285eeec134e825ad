#include "agent/standby_pool.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "ddprun/sdk/context.h"
#include "tests/support/fake_process_launcher.h"

using namespace ddprun;
using ddprun::testing::FakeProcessLauncher;

namespace {

agent::ProcessSpec standby_spec() {
  return agent::ProcessSpec{"/bin/trainer", {"/bin/trainer", "--lr", "0.1"}, {"LOCAL_RANK=0"}};
}

bool has_env(const agent::ProcessSpec& spec, const std::string& prefix) {
  for (const auto& kv : spec.envp)
    if (kv.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("a standby is started with the descriptor it waits on named in its environment",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(0, standby_spec()).empty());
  REQUIRE(launcher.specs.size() == 1);
  const agent::ProcessSpec& spec = launcher.specs[0];
  CHECK(spec.inherit_fd >= 0);
  CHECK(has_env(spec, "DDPRUN_STANDBY_FD=" + std::to_string(spec.inherit_fd)));
  CHECK(pool.has(0));
  // A second start for the same local rank keeps the live one.
  REQUIRE(pool.start(0, standby_spec()).empty());
  CHECK(launcher.specs.size() == 1);
}

TEST_CASE("a hand-over gives the standby the worker's whole environment and ends the message",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(1, standby_spec()).empty());
  const pid_t pid = launcher.specs.empty() ? -1 : launcher.next_pid - 1;
  const agent::EnvMap env{{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"MASTER_PORT", "29500"},
                          {"ODD", "a \"quoted\" = value\n"}};
  auto process = pool.hand_over(1, env);
  REQUIRE(process);
  CHECK(process->pid == pid);
  CHECK_FALSE(pool.has(1));
  // What the SDK reads up to end of file is exactly the worker's environment.
  auto parsed = sdk::parse_standby_handover(launcher.read_inherited(pid));
  REQUIRE(std::holds_alternative<sdk::EnvMap>(parsed));
  CHECK(std::get<sdk::EnvMap>(parsed) == env);
  // No standby for that rank any more: the next restart starts a process.
  CHECK_FALSE(pool.hand_over(1, env));
}

TEST_CASE("a standby that ends on its own disables the pool and ends the others",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(0, standby_spec()).empty());
  REQUIRE(pool.start(1, standby_spec()).empty());
  const pid_t first = launcher.next_pid - 2;
  const pid_t second = launcher.next_pid - 1;
  CHECK_FALSE(pool.on_exit(second + 1, agent::ExitStatus{1, 0}));  // not a standby
  CHECK(pool.on_exit(first, agent::ExitStatus{1, 0}));
  CHECK_FALSE(pool.enabled());
  CHECK_FALSE(pool.has(0));
  CHECK_FALSE(pool.has(1));
  CHECK(launcher.signals ==
        std::vector<std::pair<pid_t, int>>{{first, SIGKILL}, {second, SIGKILL}});
  CHECK(pool.on_exit(second, agent::ExitStatus{0, SIGKILL}));  // expected: no second warning
  REQUIRE(pool.start(0, standby_spec()).empty());
  CHECK(launcher.specs.size() == 2);  // disabled: nothing started
  // Their ends of the hand-over sockets were closed: each would read end of file.
  CHECK(launcher.read_inherited(first).empty());
  CHECK(launcher.read_inherited(second).empty());
}

TEST_CASE("clearing the pool kills every standby's process group", "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(0, standby_spec()).empty());
  REQUIRE(pool.start(1, standby_spec()).empty());
  pool.clear();
  CHECK(launcher.signals == std::vector<std::pair<pid_t, int>>{{launcher.next_pid - 2, SIGKILL},
                                                               {launcher.next_pid - 1, SIGKILL}});
  CHECK_FALSE(pool.has(0));
  CHECK_FALSE(pool.has(1));
  CHECK(pool.enabled());
}

TEST_CASE("a standby that cannot take the hand-over is discarded, and its end is expected",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(0, standby_spec()).empty());
  const pid_t pid = launcher.next_pid - 1;
  ::close(launcher.inherited.at(pid));  // the standby ended: nobody reads the socket
  launcher.inherited.at(pid) = -1;
  CHECK_FALSE(pool.hand_over(0, {{"RANK", "0"}}));
  CHECK(launcher.signals == std::vector<std::pair<pid_t, int>>{{pid, SIGKILL}});
  // Reaped later: recognised as a standby, without a warning or disabling the pool.
  CHECK(pool.on_exit(pid, agent::ExitStatus{0, SIGKILL}));
  CHECK(pool.enabled());
}

TEST_CASE("a launch error is returned and leaves no standby", "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  launcher.fail_with = "exec /bin/trainer: No such file or directory";
  agent::StandbyPool pool(launcher);
  CHECK(pool.start(0, standby_spec()) == "exec /bin/trainer: No such file or directory");
  CHECK_FALSE(pool.has(0));
}

TEST_CASE("a malformed hand-over is refused with the reason", "[sdk][standby][unit]") {
  using sdk::parse_standby_handover;
  CHECK(std::get<std::string>(parse_standby_handover("not json")) ==
        "not an object with an \"env\" object");
  CHECK(std::get<std::string>(parse_standby_handover(R"({"env": {"A": 1}})")) ==
        "bad variable \"A\"");
  CHECK(std::get<std::string>(parse_standby_handover(R"({"env": {"A=B": "x"}})")) ==
        "bad variable \"A=B\"");
  CHECK(std::get<sdk::EnvMap>(parse_standby_handover(R"({"env": {}})")).empty());
}
