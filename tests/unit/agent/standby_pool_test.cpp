#include "agent/standby_pool.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <utility>

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

using Received = std::variant<sdk::EnvMap, sdk::StandbyReleased, std::string>;

/// Plays the standby of `pid` on another thread exactly as the worker SDK does: reads the
/// hand-over to end of file and acknowledges it. The descriptor becomes the thread's.
std::future<Received> answer_as_sdk(FakeProcessLauncher& launcher, pid_t pid) {
  const int fd = std::exchange(launcher.inherited.at(pid), -1);
  return std::async(std::launch::async, [fd] { return sdk::receive_standby_handover(fd); });
}

/// A standby that reads its hand-over to end of file and closes without acknowledging it.
std::future<std::string> read_and_close(FakeProcessLauncher& launcher, pid_t pid) {
  const int fd = std::exchange(launcher.inherited.at(pid), -1);
  return std::async(std::launch::async, [fd] {
    std::string all;
    char chunk[4096];
    ssize_t n;
    while ((n = ::read(fd, chunk, sizeof chunk)) > 0) all.append(chunk, static_cast<size_t>(n));
    ::close(fd);
    return all;
  });
}

bool mentions(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& line : lines)
    if (line.find(text) != std::string::npos) return true;
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

TEST_CASE("a hand-over gives the standby the worker's whole environment and waits for its ack",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(1, standby_spec()).empty());
  const pid_t pid = launcher.specs.empty() ? -1 : launcher.next_pid - 1;
  const agent::EnvMap env{{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"MASTER_PORT", "29500"},
                          {"ODD", "a \"quoted\" = value\n"}};
  auto standby = answer_as_sdk(launcher, pid);
  std::vector<std::string> warnings;
  auto workers = pool.hand_over({{1, env}}, warnings, std::chrono::seconds(60));
  REQUIRE(workers.count(1) == 1);
  CHECK(workers.at(1).pid == pid);
  CHECK(warnings.empty());
  CHECK(launcher.signals.empty());
  CHECK_FALSE(pool.has(1));
  // What the SDK read up to end of file is exactly the worker's environment.
  Received received = standby.get();
  REQUIRE(std::holds_alternative<sdk::EnvMap>(received));
  CHECK(std::get<sdk::EnvMap>(received) == env);
  // No standby for that rank any more: the next restart starts a process.
  CHECK(pool.hand_over({{1, env}}, warnings).empty());
  CHECK(warnings.empty());
}

TEST_CASE("a standby that does not acknowledge in time is killed and its rank starts afresh",
          "[agent][standby][unit]") {
  // Rank 0's standby answers; rank 1's is still loading its program and never reads.
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(0, standby_spec()).empty());
  REQUIRE(pool.start(1, standby_spec()).empty());
  const pid_t answers = launcher.next_pid - 2;
  const pid_t silent = launcher.next_pid - 1;
  auto standby = answer_as_sdk(launcher, answers);
  std::vector<std::string> warnings;
  auto workers = pool.hand_over({{0, {{"RANK", "0"}}}, {1, {{"RANK", "1"}}}}, warnings,
                                std::chrono::milliseconds(300));
  CHECK(std::holds_alternative<sdk::EnvMap>(standby.get()));
  REQUIRE(workers.size() == 1);
  CHECK(workers.at(0).pid == answers);
  REQUIRE(warnings.size() == 1);
  CHECK(mentions(warnings, "the standby for local rank 1 (pid " + std::to_string(silent) +
                               ") did not acknowledge its hand-over within 300 ms"));
  CHECK(launcher.signals == std::vector<std::pair<pid_t, int>>{{silent, SIGKILL}});
  // Its reaping is expected: no "ended on its own" warning, the pool stays on.
  CHECK(pool.on_exit(silent, agent::ExitStatus{0, SIGKILL}));
  CHECK(pool.enabled());
  CHECK_FALSE(pool.has(1));
}

TEST_CASE("a standby that closes its socket without acknowledging is discarded at once",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(0, standby_spec()).empty());
  const pid_t pid = launcher.next_pid - 1;
  auto standby = read_and_close(launcher, pid);
  std::vector<std::string> warnings;
  const auto started = std::chrono::steady_clock::now();
  auto workers = pool.hand_over({{0, {{"RANK", "0"}}}}, warnings, std::chrono::seconds(60));
  // Well before the (long) deadline: end of file is an answer.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
  CHECK(workers.empty());
  CHECK(mentions(warnings, "ended without taking its hand-over: starting the rank afresh"));
  CHECK(launcher.signals == std::vector<std::pair<pid_t, int>>{{pid, SIGKILL}});
  CHECK(standby.get() == agent::encode_standby_handover({{"RANK", "0"}}));
}

TEST_CASE(
    "the hand-over carries a rank's own script arguments only when they differ, and its "
    "command line",
    "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  REQUIRE(pool.start(1, standby_spec()).empty());
  auto standby = read_and_close(launcher, launcher.next_pid - 1);
  std::vector<std::string> warnings;
  pool.hand_over(
      {{1, {{"RANK", "1"}}}}, warnings, std::chrono::seconds(60),
      {{1, {{"t.py", "--local-rank=1"}, {"/usr/bin/python3", "-u", "t.py", "--local-rank=1"}}}});
  const auto message = nlohmann::json::parse(standby.get());
  CHECK(message["argv"] == nlohmann::json({"t.py", "--local-rank=1"}));
  CHECK(message["cmdline"] == nlohmann::json({"/usr/bin/python3", "-u", "t.py", "--local-rank=1"}));
  CHECK(message["env"]["RANK"] == "1");
  const auto plain = nlohmann::json::parse(agent::encode_standby_handover({{"RANK", "0"}}));
  CHECK_FALSE(plain.contains("argv"));
  CHECK_FALSE(plain.contains("cmdline"));
}

TEST_CASE("a standby started with another value of a start-only variable is never handed over",
          "[agent][standby][unit]") {
  FakeProcessLauncher launcher;
  agent::StandbyPool pool(launcher);
  agent::ProcessSpec spec = standby_spec();
  spec.envp.push_back("PYTHONHASHSEED=1");
  REQUIRE(pool.start(0, spec).empty());
  const pid_t pid = launcher.next_pid - 1;
  std::vector<std::string> warnings;
  auto workers =
      pool.hand_over({{0, {{"LOCAL_RANK", "0"}, {"PYTHONHASHSEED", "2"}, {"RANK", "0"}}}}, warnings,
                     std::chrono::seconds(60));
  CHECK(workers.empty());
  CHECK(mentions(warnings, "local rank 0 starts afresh instead of from its standby (pid " +
                               std::to_string(pid) + "): PYTHONHASHSEED differ(s)"));
  CHECK(launcher.signals == std::vector<std::pair<pid_t, int>>{{pid, SIGKILL}});
  CHECK(launcher.read_inherited(pid).empty());  // nothing was sent
}

TEST_CASE("start-only variables are the loader's and the Python interpreter's",
          "[agent][standby][unit]") {
  CHECK(agent::is_start_only_variable("PYTHONHASHSEED"));
  CHECK(agent::is_start_only_variable("PYTHONPATH"));
  CHECK(agent::is_start_only_variable("LD_PRELOAD"));
  CHECK(agent::is_start_only_variable("LD_LIBRARY_PATH"));
  CHECK_FALSE(agent::is_start_only_variable("RANK"));
  CHECK_FALSE(agent::is_start_only_variable("OMP_NUM_THREADS"));
  CHECK_FALSE(agent::is_start_only_variable("MY_PYTHONPATH"));
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
  std::vector<std::string> warnings;
  CHECK(pool.hand_over({{0, {{"RANK", "0"}}}}, warnings, std::chrono::seconds(60)).empty());
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

TEST_CASE("the SDK acknowledges a valid hand-over only, and an empty one releases it",
          "[sdk][standby][unit]") {
  auto exchange = [](const std::string& message, std::string& answer) {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    REQUIRE(::write(fds[1], message.data(), message.size()) ==
            static_cast<ssize_t>(message.size()));
    ::shutdown(fds[1], SHUT_WR);
    Received received = sdk::receive_standby_handover(fds[0]);  // closes fds[0]
    char chunk[16];
    ssize_t n;
    while ((n = ::read(fds[1], chunk, sizeof chunk)) > 0) answer.append(chunk, n);
    ::close(fds[1]);
    return received;
  };
  std::string answer;
  Received ok = exchange(agent::encode_standby_handover({{"RANK", "1"}}), answer);
  REQUIRE(std::holds_alternative<sdk::EnvMap>(ok));
  CHECK(std::get<sdk::EnvMap>(ok) == sdk::EnvMap{{"RANK", "1"}});
  CHECK(answer == std::string(1, common::kStandbyAck));

  answer.clear();
  Received bad = exchange("{\"env\": 3}", answer);
  REQUIRE(std::holds_alternative<std::string>(bad));
  CHECK(std::get<std::string>(bad) ==
        "bad standby hand-over from ddprun: not an object with an \"env\" object");
  CHECK(answer.empty());

  answer.clear();
  CHECK(std::holds_alternative<sdk::StandbyReleased>(exchange("", answer)));
  CHECK(answer.empty());
}

TEST_CASE("Python standbys are not started on a node short of memory", "[agent][standby][unit]") {
  const auto meminfo = [](long long mib) {
    return "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
           std::to_string(mib * 1024) + " kB\nBuffers:          100 kB\n";
  };
  // 1024 MiB for the zygote and 256 MiB per local rank.
  CHECK(agent::standby_memory_shortfall(meminfo(1024 + 8 * 256), 8).empty());
  CHECK(agent::standby_memory_shortfall(meminfo(1024 + 8 * 256 - 1), 8) ==
        "3071 MiB of memory available (MemAvailable), and Python standbys for 8 local rank(s) "
        "need 3072 MiB");
  CHECK_FALSE(agent::standby_memory_shortfall(meminfo(1000), 1).empty());
  // A kernel that does not say: no guess.
  CHECK(agent::standby_memory_shortfall("MemTotal: 1000 kB\n", 8).empty());
  CHECK(agent::standby_memory_shortfall("", 8).empty());
}
