// LocalAgent, the executor of agent_step, run in-process: the single-node rendezvous, a fake
// process launcher whose made-up workers the test ends, and the event loop polled by the test.
// No processes, no sleeps, no real signal: an end() tells the agent through the launcher
// (notify_exits), which reaps the fake as SIGCHLD would have it; a stop signal is handed to
// on_signal(); with fake time the deadlines fire when the test moves the clock on.
#include "agent/local_agent.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/exit_codes.h"
#include "common/standby_protocol.h"
#include "rendezvous/local_rendezvous.h"
#include "tests/support/fake_clock.h"
#include "tests/support/fake_deadline_timers.h"
#include "tests/support/fake_process_launcher.h"
#include "tests/support/subprocess.h"

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
  /// With fake_time: the agent's clock and deadline timers, moved on by the test.
  ddprun::testing::FakeClock clock;
  /// The rendezvous's clock (its restart window is not under test here).
  ddprun::common::SteadyClock steady;
  std::unique_ptr<ddprun::testing::FakeDeadlineTimers> timers;
  std::unique_ptr<ddprun::rdzv::LocalRendezvous> rdzv;
  std::unique_ptr<LocalAgent> agent;

  explicit Job(int workers, int max_restarts = 0,
               const std::function<void(AgentOptions&)>& tweak = {}, bool fake_time = false) {
    launcher.ends_on = {SIGTERM, SIGKILL};
    rdzv = std::make_unique<ddprun::rdzv::LocalRendezvous>(
        io, steady, "c10d", "unit", "127.0.0.1", 29999, [&] {
          ddprun::rdzv::RdzvSettings settings;
          settings.max_restarts = max_restarts;
          settings.crash_loop_limit = 0;  // these tests count restarts, not crash loops
          return settings;
        }());
    AgentOptions opt;
    opt.spec.local_world_size = workers;
    opt.spec.max_restarts = max_restarts;
    opt.spec.argv = {"/bin/true"};
    opt.spec.shutdown_timeout = std::chrono::milliseconds(0);
    opt.signals_to_handle = {SIGTERM, SIGINT, SIGHUP};
    opt.script = "/bin/true";
    opt.agent_env = {{"PATH", "/usr/bin:/bin"}, {"OMP_NUM_THREADS", "1"}};
    if (fake_time) {
      timers = std::make_unique<ddprun::testing::FakeDeadlineTimers>(clock, io);
      opt.clock = &clock;
      opt.timers = timers.get();
    }
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

  /// Runs the loop, timers included, until `done` holds (at most 10 s of real time).
  template <typename Pred>
  bool run_until(Pred done) {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < limit) {
      if (io.stopped()) io.restart();
      io.run_one_for(std::chrono::milliseconds(10));
    }
    return done();
  }

  /// The made-up pids that run now, oldest first.
  std::vector<pid_t> running() const {
    return std::vector<pid_t>(launcher.running.begin(), launcher.running.end());
  }
  /// The made-up standbys launched so far (their environment names the hand-over descriptor).
  std::vector<pid_t> standbys() const {
    std::vector<pid_t> pids;
    const pid_t first = launcher.next_pid - static_cast<pid_t>(launcher.specs.size());
    for (size_t i = 0; i < launcher.specs.size(); ++i)
      if (!env_of(launcher.specs[i], "DDPRUN_STANDBY_FD").empty())
        pids.push_back(first + static_cast<pid_t>(i));
    return pids;
  }
  bool runs(size_t n) {
    return poll_until([&] { return launcher.running.size() == n; });
  }
  bool finished() {
    return poll_until([&] { return agent->finished(); });
  }
};

/// Whether the hand-over written to a made-up standby's descriptor has arrived whole (its end
/// of file seen); reads without blocking, appending to `got`.
bool handover_read(int fd, std::string& got) {
  char chunk[4096];
  while (true) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return false;
    got.append(chunk, static_cast<size_t>(n));
  }
}

/// --standby_workers: the first round forms in the first turns and its workers start afresh;
/// the standbys start a little after (the same delay also starts them early on an agent
/// without a round).
void with_standbys(AgentOptions& opt) {
  opt.standby_workers = true;
  opt.standby_delay = std::chrono::milliseconds(50);
}

}  // namespace

TEST_CASE("local agent: 8 standbys are handed over while the event loop keeps turning",
          "[agent][unit][standby]") {
  // The acknowledgements come one per turn of the loop, from this thread: a hand-over that
  // waited for them inside a handler would stall the loop and then give every rank up.
  Job job(8, 1, with_standbys);
  REQUIRE(job.agent->start());
  // The group, then (at once, here) a standby per rank for its restart.
  REQUIRE(job.run_until([&] { return job.launcher.running.size() == 16; }));
  const std::vector<pid_t> standbys = job.standbys();
  REQUIRE(standbys.size() == 8);
  job.launcher.end(job.running().front(), {1, 0});  // a failure: the group restarts

  std::chrono::steady_clock::duration longest{0};
  auto turn = [&] {
    const auto began = std::chrono::steady_clock::now();
    if (job.io.stopped()) job.io.restart();
    job.io.poll_one();
    longest = std::max(longest, std::chrono::steady_clock::now() - began);
  };
  std::map<pid_t, std::string> received;
  size_t acked = 0;
  for (int i = 0; i < 20000 && acked < standbys.size(); ++i) {
    turn();
    const pid_t next = standbys[acked];
    if (!handover_read(job.launcher.inherited.at(next), received[next])) continue;
    // From here on the hand-over is out: the turns measured are those while it is.
    if (acked == 0) longest = {};
    const char ack = ddprun::common::kStandbyAck;
    REQUIRE(::send(job.launcher.inherited.at(next), &ack, 1, MSG_NOSIGNAL) == 1);
    ++acked;
    for (int t = 0; t < 3; ++t) turn();  // the loop turns between two acknowledgements
  }
  REQUIRE(acked == standbys.size());
  for (pid_t pid : standbys) CHECK(received[pid].find("\"RANK\"") != std::string::npos);
  // Every rank of the new group is a standby that took over: nothing started afresh (what
  // was launched since is the next restart's standbys).
  REQUIRE(job.poll_until([&] {
    return std::all_of(standbys.begin(), standbys.end(),
                       [&](pid_t pid) { return job.launcher.running.count(pid) > 0; });
  }));
  for (size_t i = 16; i < job.launcher.specs.size(); ++i)
    CHECK_FALSE(env_of(job.launcher.specs[i], "DDPRUN_STANDBY_FD").empty());
  // No turn ran long while the hand-over was out (0.14 ms measured on the 2-core machine, 0.4 ms
  // under ASan); one that polled for its acknowledgements would take its whole 2 s deadline.
  const auto longest_ms = std::chrono::duration<double, std::milli>(longest).count();
  INFO("the longest turn of the loop during the hand-over took " << longest_ms << " ms");
  CHECK(longest_ms < 250);  // room for a busy machine; the old wait took 2000
  for (pid_t pid : standbys) job.launcher.end(pid, {0, 0});
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 0);
}

TEST_CASE(
    "local agent: a standby that took over and ended during the hand-over is reaped as a "
    "worker",
    "[agent][unit][standby]") {
  Job job(2, 1, with_standbys);
  REQUIRE(job.agent->start());
  REQUIRE(job.run_until([&] { return job.launcher.running.size() == 4; }));
  REQUIRE(job.standbys().size() == 2);
  const pid_t quick = job.standbys()[0];  // local rank 0's
  const pid_t slow = job.standbys()[1];
  job.launcher.end(job.running().front(), {1, 0});
  std::string got;
  REQUIRE(job.poll_until([&] { return handover_read(job.launcher.inherited.at(quick), got); }));
  const char ack = ddprun::common::kStandbyAck;
  REQUIRE(::send(job.launcher.inherited.at(quick), &ack, 1, MSG_NOSIGNAL) == 1);
  // It fails at once, while rank 1's acknowledgement is still awaited.
  for (int t = 0; t < 5; ++t) job.io.poll();
  job.launcher.end(quick, {4, 0});
  for (int t = 0; t < 5; ++t) job.io.poll();
  std::string got_slow;
  REQUIRE(job.poll_until([&] { return handover_read(job.launcher.inherited.at(slow), got_slow); }));
  REQUIRE(::send(job.launcher.inherited.at(slow), &ack, 1, MSG_NOSIGNAL) == 1);
  // Its exit is judged once it is a worker: the group fails and the budget (1) is spent.
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == ddprun::common::kExitRestartsExhausted);
  CHECK(std::find(job.launcher.signals.begin(), job.launcher.signals.end(),
                  std::pair<pid_t, int>{slow, SIGTERM}) != job.launcher.signals.end());
}

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

namespace {

bool contains_text(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// What the agent wrote on stderr (its failure report) while `run` ran. Descriptor 2 is put
/// back however `run` ends (a failed REQUIRE throws).
std::string stderr_of(const std::function<void()>& run) {
  ddprun::testing::TempDir dir;
  const std::string path = dir.path() + "/stderr";
  std::fflush(stderr);
  struct Restore {
    int saved = ::dup(STDERR_FILENO);
    ~Restore() {
      std::fflush(stderr);
      ::dup2(saved, STDERR_FILENO);
      ::close(saved);
    }
  } restore;
  REQUIRE(restore.saved >= 0);
  const int file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  REQUIRE(file >= 0);
  ::dup2(file, STDERR_FILENO);
  ::close(file);
  run();
  std::fflush(stderr);
  return ddprun::testing::read_file(path);
}

}  // namespace

TEST_CASE("local agent: workers that failed together are all in the failure report",
          "[agent][unit]") {
  Job job(3, 0);
  const std::string report = stderr_of([&] {
    REQUIRE(job.agent->start());
    REQUIRE(job.runs(3));
    const auto pids = job.running();
    // Both end before the agent hears of either (one pass reaps them), without error files.
    job.launcher.end(pids[2], {1, 0});
    job.launcher.end(pids[0], {1, 0});
    REQUIRE(job.finished());
  });
  INFO(report);
  CHECK(job.agent->exit_code() == 1);
  CHECK_FALSE(contains_text(report, "<NO_OTHER_FAILURES>"));
  CHECK(contains_text(report, "local_rank: 0"));
  CHECK(contains_text(report, "local_rank: 2"));
  // The third was stopped by the agent: not a failure of its own.
  CHECK_FALSE(contains_text(report, "local_rank: 1"));
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
  job.agent->on_signal(SIGTERM);  // what the agent's signal set does with a kill from outside
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

TEST_CASE("local agent: redirected worker output reaches its log files as it was written",
          "[agent][unit]") {
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
  // Byte for byte, as torchrun's files are: no newline is added to the last line.
  CHECK(logs["stdout.log"] == "step 1\nstep 2\nno newline at the end");
  CHECK(logs["stderr.log"] == "Traceback: boom\n");
  fs::remove_all(dir);
}

TEST_CASE("local agent: the event log's times come from the injected clock", "[agent][unit]") {
  const fs::path log =
      fs::temp_directory_path() / ("ddprun-local-agent-events-" + std::to_string(::getpid()));
  fs::remove(log);
  ddprun::testing::FakeClock clock;
  /// The rendezvous's clock (its restart window is not under test here).
  ddprun::common::SteadyClock steady;
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

TEST_CASE(
    "local agent: a worker that ignores its stop signal is killed once --shutdown_timeout "
    "has passed on the agent's clock",
    "[agent][unit]") {
  Job job(
      2, 0, [](AgentOptions& opt) { opt.spec.shutdown_timeout = std::chrono::seconds(30); },
      /*fake_time=*/true);
  job.launcher.ends_on = {SIGKILL};  // SIGTERM is ignored
  REQUIRE(job.agent->start());
  REQUIRE(job.runs(2));
  const auto pids = job.running();
  auto sent = [&](pid_t pid, int sig) {
    return std::find(job.launcher.signals.begin(), job.launcher.signals.end(),
                     std::pair<pid_t, int>{pid, sig}) != job.launcher.signals.end();
  };
  job.launcher.end(pids[0], {1, 0});
  REQUIRE(job.poll_until([&] { return sent(pids[1], SIGTERM); }));
  auto settle = [&] { job.poll_until([] { return false; }); };  // run all that is ready
  settle();
  CHECK_FALSE(sent(pids[1], SIGKILL));
  CHECK(job.timers->armed() >= 1);
  job.timers->advance(std::chrono::seconds(29));
  settle();
  CHECK_FALSE(sent(pids[1], SIGKILL));
  job.timers->advance(std::chrono::seconds(1));
  REQUIRE(job.poll_until([&] { return sent(pids[1], SIGKILL); }));
  REQUIRE(job.finished());
  CHECK(job.agent->exit_code() == 1);
  CHECK(job.launcher.running.empty());
}
