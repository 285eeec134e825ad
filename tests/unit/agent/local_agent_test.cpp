// LocalAgent, the executor of agent_step, run in-process: the single-node rendezvous, a fake
// process launcher whose made-up workers the test ends, and the event loop polled by the test.
// No processes, no sleeps: an end() raises SIGCHLD in this process, which the agent's
// signal_set turns into a reap() of the fake, as the kernel's SIGCHLD would.
#include "agent/local_agent.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/exit_codes.h"
#include "rendezvous/local_rendezvous.h"
#include "tests/support/fake_clock.h"
#include "tests/support/fake_process_launcher.h"

using namespace ddprun::agent;
namespace fs = std::filesystem;
namespace asio = boost::asio;

namespace {

/// The value of `key` in a made-up process's environment ("" when absent).
std::string env_of(const ProcessSpec& spec, const std::string& key) {
  for (const auto& kv : spec.envp)
    if (kv.rfind(key + "=", 0) == 0) return kv.substr(key.size() + 1);
  return "";
}

struct Job {
  asio::io_context io;
  ddprun::testing::FakeProcessLauncher launcher;
  std::unique_ptr<ddprun::rdzv::LocalRendezvous> rdzv;
  std::unique_ptr<LocalAgent> agent;

  explicit Job(int workers, int max_restarts = 0,
               const std::function<void(AgentOptions&)>& tweak = {}) {
    launcher.ends_on = {SIGTERM, SIGKILL};
    rdzv = std::make_unique<ddprun::rdzv::LocalRendezvous>(
        "c10d", "unit", "127.0.0.1", 29999,
        [&] {
          ddprun::rdzv::RdzvSettings settings;
          settings.max_restarts = max_restarts;
          settings.crash_loop_limit = 0;  // these tests count restarts, not crash loops
          return settings;
        }(),
        [this](std::function<void()> fn) { asio::post(io, std::move(fn)); });
    AgentOptions opt;
    opt.spec.local_world_size = workers;
    opt.spec.max_restarts = max_restarts;
    opt.spec.argv = {"/bin/true"};
    opt.spec.shutdown_timeout = std::chrono::milliseconds(0);
    opt.signals_to_handle = {SIGTERM, SIGINT, SIGHUP};
    opt.script = "/bin/true";
    opt.agent_env = {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}};
    if (tweak) tweak(opt);
    agent = std::make_unique<LocalAgent>(io, std::move(opt), *rdzv, launcher);
  }

  /// Runs what is ready until `done` holds (bounded: no test waits on real time).
  template <typename Pred>
  bool poll_until(Pred done) {
    for (int i = 0; i < 10000 && !done(); ++i) {
      if (io.stopped()) io.restart();
      io.poll();
    }
    return done();
  }

  /// The made-up pids that run now, oldest first.
  std::vector<pid_t> running() const {
    return std::vector<pid_t>(launcher.running.begin(), launcher.running.end());
  }
  bool runs(size_t n) {
    return poll_until([&] { return launcher.running.size() == n; });
  }
  bool finished() {
    return poll_until([&] { return agent->finished(); });
  }
};

}  // namespace

TEST_CASE("local agent: a group whose workers exit 0 ends the job with 0", "[agent][unit]") {
  Job job(2);
  REQUIRE(job.agent->start());
  REQUIRE(job.runs(2));
  REQUIRE(job.launcher.specs.size() == 2);
  CHECK(env_of(job.launcher.specs[0], "RANK") == "0");
  CHECK(env_of(job.launcher.specs[1], "LOCAL_RANK") == "1");
  CHECK(env_of(job.launcher.specs[1], "WORLD_SIZE") == "2");
  CHECK(env_of(job.launcher.specs[0], "MASTER_PORT") == "29999");
  for (pid_t pid : job.running()) job.launcher.end(pid, {0, 0});
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 0);
  CHECK(job.launcher.signals.size() == 2);  // the drain's SIGKILL to each (empty) group
}

TEST_CASE("local agent: a failure stops the group and the restart starts a fresh one",
          "[agent][unit]") {
  Job job(2, 1);
  REQUIRE(job.agent->start());
  REQUIRE(job.runs(2));
  const auto first = job.running();
  job.launcher.end(first[0], {1, 0});
  // The other worker got SIGTERM (which ends it here), the group drained, a new round began.
  REQUIRE(job.poll_until(
      [&] { return job.launcher.specs.size() == 4 && job.launcher.running.size() == 2; }));
  CHECK(std::find(job.launcher.signals.begin(), job.launcher.signals.end(),
                  std::pair<pid_t, int>{first[1], SIGTERM}) != job.launcher.signals.end());
  CHECK(env_of(job.launcher.specs[2], "TORCHELASTIC_RESTART_COUNT") == "1");
  for (pid_t pid : job.running()) job.launcher.end(pid, {0, 0});
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 0);
}

TEST_CASE("local agent: a spent restart budget exits 75 and no worker is left", "[agent][unit]") {
  Job job(1, 1);
  REQUIRE(job.agent->start());
  for (int attempt = 0; attempt < 2; ++attempt) {
    REQUIRE(job.runs(1));
    job.launcher.end(job.running()[0], {3, 0});
  }
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == ddprun::common::kExitRestartsExhausted);
  CHECK(job.launcher.running.empty());
}

TEST_CASE("local agent: SIGTERM stops the workers and the job exits 143", "[agent][unit]") {
  Job job(3);
  REQUIRE(job.agent->start());
  REQUIRE(job.runs(3));
  ::raise(SIGTERM);  // caught by the agent's signal_set, as a kill from outside would be
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 128 + SIGTERM);
  CHECK(job.launcher.running.empty());
}

TEST_CASE("local agent: a worker that cannot start fails the job naming why", "[agent][unit]") {
  Job job(2);
  job.launcher.fail_with = "exec /bin/true: Permission denied";
  REQUIRE(job.agent->start());
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 127);
}

TEST_CASE("local agent: redirected worker output reaches its log files whole", "[agent][unit]") {
  const fs::path dir =
      fs::temp_directory_path() / ("ddprun-local-agent-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Job job(1, 0, [&](AgentOptions& opt) {
    opt.log_dir = dir.string();
    opt.output.redirects.all = StdStreams::All;
  });
  job.launcher.with_pipes = true;
  REQUIRE(job.agent->start());
  REQUIRE(job.runs(1));
  const pid_t pid = job.running()[0];
  job.launcher.write_output(pid, "step 1\nstep ");
  job.launcher.write_output(pid, "2\nno newline at the end");
  job.launcher.write_output(pid, "Traceback: boom\n", /*to_stderr=*/true);
  job.launcher.end(pid, {0, 0});
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 0);
  std::map<std::string, std::string> logs;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    logs[entry.path().filename().string()] = text.str();
  }
  CHECK(logs["stdout.log"] == "step 1\nstep 2\nno newline at the end\n");
  CHECK(logs["stderr.log"] == "Traceback: boom\n");
  fs::remove_all(dir);
}

TEST_CASE("local agent: the event log's times come from the injected clock", "[agent][unit]") {
  const fs::path log =
      fs::temp_directory_path() / ("ddprun-local-agent-events-" + std::to_string(::getpid()));
  fs::remove(log);
  ddprun::testing::FakeClock clock;
  Job job(2, 1, [&](AgentOptions& opt) {
    opt.event_log = log.string();
    opt.clock = &clock;
    opt.spec.shutdown_timeout = std::chrono::seconds(30);  // no SIGKILL within the test
  });
  job.launcher.ends_on = {SIGKILL};  // the second worker takes its time to stop
  REQUIRE(job.agent->start());
  REQUIRE(job.runs(2));
  const auto pids = job.running();
  job.launcher.end(pids[0], {1, 0});
  REQUIRE(job.poll_until([&] {
    return std::find(job.launcher.signals.begin(), job.launcher.signals.end(),
                     std::pair<pid_t, int>{pids[1], SIGTERM}) != job.launcher.signals.end();
  }));
  clock.advance(std::chrono::milliseconds(250));
  job.launcher.end(pids[1], {0, SIGTERM});
  REQUIRE(job.runs(2));  // the restarted group
  for (pid_t pid : job.running()) job.launcher.end(pid, {0, 0});
  REQUIRE(job.finished());
  std::ifstream in(log);
  std::string line;
  std::optional<double> teardown_ms;
  for (int i = 0; i < 1000 && std::getline(in, line); ++i) {
    auto event = nlohmann::json::parse(line);
    if (event["event"] == "teardown_done") teardown_ms = event["teardown_ms"].get<double>();
  }
  REQUIRE(teardown_ms);
  CHECK(*teardown_ms == 250.0);
  fs::remove(log);
}
