// The agent's lifecycle, one transition per case, driven like the rendezvous state tests: a
// made-up clock, events in, effects out. No processes, no sockets, no sleeps.
#include "agent/agent_state.h"

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <optional>
#include <set>
#include <string_view>

#include "common/exit_codes.h"
#include "tests/support/in_child.h"

using namespace ddprun::agent;
using namespace std::chrono_literals;
namespace rdzv = ddprun::rdzv;

namespace {

/// One agent's lifecycle under test: feeds events, keeps the last step's effects.
struct Agent {
  AgentState state;
  AgentSpec spec;
  TimePoint now{std::chrono::seconds(1000)};
  std::vector<AgentEffect> last;
  pid_t next_pid = 100;

  Agent(int workers = 2, int max_restarts = 0) {
    spec.local_world_size = workers;
    spec.max_restarts = max_restarts;
    spec.shutdown_timeout = 5s;
    spec.host = "node-a";
  }

  const std::vector<AgentEffect>& on(const AgentEvent& event) {
    last = agent_step(state, event, now, spec);
    return last;
  }

  template <typename T>
  std::vector<T> effects() const {
    std::vector<T> found;
    for (const auto& e : last)
      if (const auto* t = std::get_if<T>(&e)) found.push_back(*t);
    return found;
  }
  template <typename T>
  bool has() const {
    return !effects<T>().empty();
  }
  bool emitted(const std::string& name) const {
    for (const auto& e : effects<EmitEvent>())
      if (event_name(e.name) == name) return true;
    return false;
  }
  nlohmann::json event(const std::string& name) const {
    for (const auto& e : effects<EmitEvent>())
      if (event_name(e.name) == name) return e.fields;
    return nullptr;
  }
  bool logged(const std::string& text) const {
    for (const auto& e : effects<Log>())
      if (e.text.find(text) != std::string::npos) return true;
    return false;
  }

  /// Started, joined, and the round of `restart_count` completed: Launching.
  void round(int restart_count = 0) {
    if (state.phase == AgentPhase::Rendezvous && last.empty()) on(AgentStarted{});
    rdzv::RendezvousInfo info;
    info.group_world_size = 1;
    info.restart_count = restart_count;
    info.round = restart_count;
    on(RoundReady{info});
  }

  /// The event loop turned after YieldTurn: the LaunchWorker it allows, if any.
  std::optional<LaunchWorker> turn() {
    if (!has<YieldTurn>()) return std::nullopt;
    on(LaunchTurn{});
    if (!has<LaunchWorker>()) return std::nullopt;
    return effects<LaunchWorker>().front();
  }

  /// Carries out every launch as a successful start, until launching ends.
  std::vector<pid_t> launch_all(std::map<int, pid_t> handed = {}) {
    std::vector<pid_t> pids;
    on(GroupPrepared{true, handed});
    for (int i = 0; i < 1000; ++i) {
      auto launch = turn();
      if (!launch) break;
      const pid_t pid = next_pid++;
      pids.push_back(pid);
      on(WorkerLaunched{launch->index, pid});
    }
    return pids;
  }

  /// Answers the last step's InspectHung as the executor would: each silent worker's process
  /// is in `proc_state` ('S' asleep, 'T' stopped...).
  void inspected(char proc_state) {
    REQUIRE(has<InspectHung>());
    HungInspected seen;
    const std::vector<pid_t> silent = effects<InspectHung>().front().pids;
    for (pid_t pid : silent) seen.workers.push_back({pid, proc_state});
    on(seen);
  }

  /// A running group of spec.local_world_size workers.
  std::vector<pid_t> running_group(int restart_count = 0) {
    round(restart_count);
    return launch_all();
  }
  /// A group whose every worker exited 0, its output read: the node reported its success.
  void succeeded_group() {
    for (pid_t pid : running_group()) on(WorkerExited{pid, {0, 0}, false});
    on(OutputDrained{});
    REQUIRE(has<ReportSuccess>());
  }
};

}  // namespace

// ---- outcome mapping ------------------------------------------------------------------------

TEST_CASE("a group keeps running while no worker has failed", "[agent][unit]") {
  CHECK(decide({2, 0, 0}) == Action::Monitor);
  CHECK(decide({1, 1, 0}) == Action::Monitor);
  CHECK(group_state({1, 1, 0}) == WorkerState::Healthy);
}

TEST_CASE("one failed worker stops the whole group", "[agent][unit]") {
  CHECK(decide({3, 0, 1}) == Action::StopGroup);
  CHECK(decide({0, 3, 1}) == Action::StopGroup);
  CHECK(group_state({3, 0, 1}) == WorkerState::Failed);
}

TEST_CASE("the group succeeds when every worker exited 0", "[agent][unit]") {
  CHECK(decide({0, 4, 0}) == Action::Succeed);
  CHECK(group_state({0, 4, 0}) == WorkerState::Succeeded);
}

TEST_CASE("the exit status maps each ending to its documented code", "[agent][unit]") {
  using namespace ddprun::common;
  CHECK(job_exit_code(JobOutcome::of(JobEnd::Succeeded)) == 0);
  CHECK(job_exit_code(JobOutcome::workers_failed({3, 0}, 0)) == 3);
  CHECK(job_exit_code(JobOutcome::workers_failed({0, 9}, 0)) == 137);
  CHECK(job_exit_code(JobOutcome::workers_failed({3, 0}, 2)) == kExitRestartsExhausted);
  CHECK(job_exit_code(JobOutcome::signalled(15)) == 143);
  CHECK(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)) == kExitRendezvous);
  CHECK(job_exit_code(JobOutcome::of(JobEnd::Internal)) == kExitInternal);
}

TEST_CASE("wait statuses decode to codes and signals", "[agent][unit]") {
  CHECK(ExitStatus::from_wait_status(3 << 8).code == 3);
  CHECK(ExitStatus::from_wait_status(9).signal == 9);
  CHECK(ExitStatus{0, 11}.shell_code() == 139);
  CHECK(ExitStatus{0, 0}.ok());
}

// ---- Rendezvous -----------------------------------------------------------------------------

TEST_CASE("agent: start joins the first round", "[agent][unit]") {
  Agent a;
  a.on(AgentStarted{});
  CHECK(a.state.phase == AgentPhase::Rendezvous);
  CHECK(a.has<JoinRound>());
  CHECK(a.event("rendezvous_start")["restart_count"] == 0);
}

TEST_CASE("agent: Rendezvous -> Launching places one worker per local rank", "[agent][unit]") {
  Agent a(3);
  a.round();
  CHECK(a.state.phase == AgentPhase::Launching);
  CHECK(a.has<PrepareGroup>());
  CHECK(a.emitted("rendezvous_complete"));
  REQUIRE(a.state.workers.size() == 3);
  CHECK(a.state.workers[2].placement.local_rank == 2);
  CHECK(a.state.workers[2].placement.global_rank == 2);
}

TEST_CASE("agent: Rendezvous -> Finished when the round fails", "[agent][unit]") {
  Agent a;
  a.on(AgentStarted{});
  a.on(RoundFailed{rdzv::RendezvousError{rdzv::RendezvousErrorKind::Timeout, "no quorum"}});
  CHECK(a.state.phase == AgentPhase::Finished);
  REQUIRE(a.has<Finish>());
  CHECK(a.effects<Finish>()[0].code == ddprun::common::kExitRendezvous);
  CHECK(a.logged("rendezvous failed: no quorum"));
}

TEST_CASE("agent: Rendezvous -> AwaitingZygote -> Launching once the zygote settles",
          "[agent][unit]") {
  Agent a;
  a.on(AgentStarted{true});
  a.round();
  CHECK(a.state.phase == AgentPhase::AwaitingZygote);
  CHECK_FALSE(a.has<PrepareGroup>());
  a.on(ZygoteSettled{true});
  CHECK(a.state.phase == AgentPhase::Launching);
  CHECK(a.state.zygote == ZygotePhase::Ready);
  CHECK(a.has<PrepareGroup>());
}

TEST_CASE("agent: a signal while the group awaits the zygote leaves at once", "[agent][unit]") {
  Agent a;
  a.on(AgentStarted{true});
  a.round();
  a.on(SignalReceived{SIGTERM});
  CHECK(a.has<Leave>());
  CHECK(a.effects<Finish>().at(0).code == 128 + SIGTERM);
  a.on(ZygoteSettled{false});
  CHECK(a.last.empty());  // Finished: nothing starts
}

TEST_CASE("agent: a signal during the rendezvous leaves and ignores the late round",
          "[agent][unit]") {
  Agent a;
  a.on(AgentStarted{});
  a.on(SignalReceived{SIGINT});
  CHECK(a.effects<Leave>().at(0).reason == "received SIGINT");
  CHECK(a.state.phase == AgentPhase::Finished);
  a.round();
  CHECK(a.last.empty());
}

// ---- Launching ------------------------------------------------------------------------------

TEST_CASE("agent: Launching starts one worker per step and then runs", "[agent][unit]") {
  Agent a(3);
  a.spec.watchdog_timeout = 8s;
  a.round();
  a.on(GroupPrepared{true, {}});
  // Each launch waits for a turn of the event loop, and carries the worker's placement.
  REQUIRE(a.has<YieldTurn>());
  CHECK_FALSE(a.has<LaunchWorker>());
  auto launch = a.turn();
  REQUIRE(launch);
  CHECK(launch->index == 0);
  CHECK(launch->placement.local_rank == 0);
  a.on(WorkerLaunched{0, 100});
  launch = a.turn();
  REQUIRE(launch);
  CHECK(launch->index == 1);
  CHECK(launch->placement.global_rank == 1);
  CHECK(a.state.phase == AgentPhase::Launching);
  a.on(WorkerLaunched{1, 101});
  REQUIRE(a.turn());
  a.on(WorkerLaunched{2, 102});
  CHECK(a.state.phase == AgentPhase::Running);
  CHECK(a.event("workers_started")["pids"] == nlohmann::json({100, 101, 102}));
  CHECK(a.has<ScheduleStandbys>());
  // The watchdog looks every quarter of its timeout, at most once a second.
  REQUIRE(a.has<ArmTimer>());
  CHECK(a.effects<ArmTimer>()[0].timer == AgentTimer::Watchdog);
  CHECK(a.effects<ArmTimer>()[0].at == a.now + 1s);
}

TEST_CASE("agent: handed-over standbys run before any launch and are not launched",
          "[agent][unit]") {
  Agent a(3);
  a.round();
  a.on(GroupPrepared{true, {{0, 500}, {2, 502}}});
  auto launch = a.turn();
  REQUIRE(launch);
  CHECK(launch->index == 1);
  a.on(WorkerLaunched{1, 101});
  CHECK(a.state.phase == AgentPhase::Running);
  CHECK(a.event("workers_started")["from_standby"] == 2);
  CHECK(running_pids(a.state) == std::vector<pid_t>{500, 101, 502});
}

TEST_CASE("agent: Launching -> Finished when the attempt's directories cannot be made",
          "[agent][unit]") {
  Agent a;
  a.round();
  a.on(GroupPrepared{false, {}});
  CHECK(a.effects<Finish>().at(0).code == ddprun::common::kExitInternal);
}

TEST_CASE("agent: a worker that cannot start fails its group like a crash", "[agent][unit]") {
  Agent a(2);
  a.round();
  a.on(GroupPrepared{true, {}});
  a.on(WorkerLaunched{0, 100});
  a.on(WorkerLaunched{1, -1});
  CHECK(a.state.phase == AgentPhase::Stopping);
  CHECK(a.effects<RecordFailure>().at(0).placement.local_rank == 1);
  CHECK(a.effects<RecordFailure>().at(0).status.code == 127);
  CHECK(a.state.workers[1].status.code == 127);
  CHECK(a.event("failure_detected")["how"] == "launch");
  CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{100});
  // No pid to name (it was "pid -1, failed with exit code 127").
  CHECK(a.effects<ReportFailure>().at(0).failure.description ==
        "worker rank 1 (local rank 1) on node-a did not start");
}

TEST_CASE("agent: a stop while the group starts ends the launches", "[agent][unit]") {
  Agent a(4);
  a.round();
  a.on(GroupPrepared{true, {}});
  a.on(WorkerLaunched{0, 100});
  a.on(SignalReceived{SIGTERM});
  CHECK(a.state.phase == AgentPhase::Stopping);
  CHECK(a.logged("stopped starting workers: 1 of 4 started"));
  CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{100});
  CHECK(a.state.workers.size() == 1);
  // The turn the executor had already queued starts nothing, and a launch result for a slot
  // that is not next changes nothing.
  a.on(LaunchTurn{});
  CHECK(a.last.empty());
  a.on(WorkerLaunched{1, 101});
  CHECK(a.last.empty());
  a.on(WorkerExited{100, {0, SIGTERM}, false});
  CHECK(a.state.phase == AgentPhase::Draining);
}

TEST_CASE("agent: a stop before any worker started drains nothing and leaves", "[agent][unit]") {
  Agent a(2);
  a.round();
  a.on(GroupPrepared{true, {}});
  a.on(SignalReceived{SIGTERM});
  CHECK(a.state.phase == AgentPhase::Draining);
  CHECK(a.has<Drain>());
  a.on(OutputDrained{});
  CHECK(a.effects<Finish>().at(0).code == 128 + SIGTERM);
}

TEST_CASE("agent: a stop during the standbys' hand-over stops those that took it over",
          "[agent][unit]") {
  // The hand-over's acknowledgements arrive as the loop turns: a signal can come first.
  Agent a(3);
  a.round();
  REQUIRE(a.has<PrepareGroup>());
  a.on(SignalReceived{SIGTERM});
  CHECK(a.state.phase == AgentPhase::Launching);
  CHECK_FALSE(a.has<SignalWorkers>());  // no worker yet: the stop waits for the hand-over
  a.on(GroupPrepared{true, {{0, 500}, {2, 502}}});
  // Launching -> Stopping: the two that took over are stopped, rank 1 never starts.
  CHECK_FALSE(a.has<LaunchWorker>());
  REQUIRE(a.has<SignalWorkers>());
  CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{500, 502});
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGTERM);
  CHECK(a.has<ArmTimer>());
  CHECK(a.state.phase == AgentPhase::Stopping);
  a.on(WorkerExited{500, {0, SIGTERM}, false});
  a.on(WorkerExited{502, {0, SIGTERM}, false});
  CHECK(a.state.phase == AgentPhase::Draining);
  a.on(OutputDrained{});
  CHECK(a.effects<Finish>().at(0).code == 128 + SIGTERM);
}

TEST_CASE("agent: a restart notice or a second signal during the hand-over acts once it is over",
          "[agent][unit]") {
  SECTION("a restart notice stops the handed-over workers, then the node rejoins") {
    Agent a(2, 3);
    a.round();
    rdzv::Restart restart;
    restart.reason = "node b failed";
    restart.restart_count = 1;
    restart.counted = true;
    a.on(NoticeReceived{restart});
    CHECK_FALSE(a.has<SignalWorkers>());
    a.on(GroupPrepared{true, {{0, 500}}});
    CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{500});
    a.on(WorkerExited{500, {0, SIGTERM}, false});
    a.on(OutputDrained{});
    CHECK(a.has<JoinRound>());
  }
  SECTION("a second signal kills them") {
    Agent a(2);
    a.round();
    a.on(SignalReceived{SIGINT});
    a.now += 1s;  // a second Ctrl-C, not the same one delivered twice
    a.on(SignalReceived{SIGINT});
    a.on(GroupPrepared{true, {{0, 500}, {1, 501}}});
    REQUIRE(a.has<SignalWorkers>());
    CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{500, 501});
    CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
  }
}

TEST_CASE("agent: a GroupPrepared that nothing asked for changes nothing", "[agent][unit]") {
  Agent a(2);
  a.running_group();
  a.on(GroupPrepared{true, {{0, 900}}});
  CHECK(a.last.empty());
  CHECK(running_pids(a.state) == std::vector<pid_t>{100, 101});
}

TEST_CASE("agent: an exit during Launching is judged once launching ends", "[agent][unit]") {
  Agent a(2);
  a.round();
  a.on(GroupPrepared{true, {}});
  a.on(WorkerLaunched{0, 100});
  a.on(WorkerExited{100, {3, 0}, true});
  CHECK(a.has<RecordFailure>());
  CHECK_FALSE(a.has<ReportFailure>());
  a.on(WorkerLaunched{1, 101});
  CHECK(a.has<ReportFailure>());
  CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{101});
}

// ---- Running --------------------------------------------------------------------------------

TEST_CASE("agent: Running -> Draining -> BetweenRounds when every worker exits 0",
          "[agent][unit]") {
  Agent a(2);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {0, 0}, false});
  CHECK(a.last.size() == 1);  // a debug line only: the other still runs
  a.on(WorkerExited{pids[1], {0, 0}, false});
  CHECK(a.state.phase == AgentPhase::Draining);
  CHECK(a.has<Drain>());
  CHECK_FALSE(a.has<ReportSuccess>());  // not before the output is read
  a.on(OutputDrained{});
  CHECK(a.state.phase == AgentPhase::BetweenRounds);
  CHECK(a.has<ReportSuccess>());
  a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Succeeded, "done", 0, 0}});
  CHECK(a.effects<Finish>().at(0).code == 0);
  CHECK(a.emitted("job_closed"));
}

TEST_CASE("agent: a rendezvous lost after this node's group succeeded ends the node with 0",
          "[agent][unit]") {
  Agent a(1);
  a.succeeded_group();
  // etcd (or the daemon) gone before the job's close was heard.
  a.on(NoticeReceived{rdzv::RendezvousError{rdzv::RendezvousErrorKind::Connection,
                                            "cannot reach the etcd cluster for 10 s"}});
  CHECK(a.effects<Finish>().at(0).code == 0);
  CHECK(
      a.logged("this node's workers all succeeded, and then the rendezvous was lost before the "
               "job's end was heard (cannot reach the etcd cluster for 10 s): exiting 0"));
}

TEST_CASE("agent: a rendezvous lost after success but with a restart owed is a failure",
          "[agent][unit]") {
  Agent a(1);
  a.succeeded_group();
  // Another node failed: the round restarts, this node included, after a pause.
  rdzv::Restart restart{1, "worker failed on node b", true, 1};
  restart.failures_in_a_row = 2;
  restart.pause = std::chrono::milliseconds(2000);
  a.on(NoticeReceived{restart});
  REQUIRE(a.state.backing_off);
  a.on(NoticeReceived{rdzv::RendezvousError{rdzv::RendezvousErrorKind::Connection,
                                            "cannot reach the etcd cluster for 10 s"}});
  CHECK(a.effects<Finish>().at(0).code == 69);
  CHECK_FALSE(a.logged("exiting 0"));
}

TEST_CASE("agent: Running -> Stopping on a failure reports it and stops the others",
          "[agent][unit]") {
  Agent a(3, 2);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[1], {7, 0}, true});
  CHECK(a.state.phase == AgentPhase::Stopping);
  CHECK(a.state.stop_reason == StopReason::WorkerFailed);
  const auto report = a.effects<ReportFailure>().at(0).failure;
  CHECK(report.exit_code == 7);
  CHECK(report.description == "worker rank 1 (local rank 1, pid " + std::to_string(pids[1]) +
                                  ") on node-a failed with exit code 7");
  const auto stop = a.effects<SignalWorkers>().at(0);
  CHECK(stop.pids == std::vector<pid_t>{pids[0], pids[2]});
  CHECK(stop.sig == SIGTERM);
  CHECK(stop.then_continue);
  CHECK(a.effects<ArmTimer>().at(0).at == a.now + 5s);
  CHECK(a.event("failure_detected")["how"] == "exit");
}

TEST_CASE("agent: a failure names the exception type the worker's error file gives",
          "[agent][unit]") {
  Agent a(2, 2);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[1], {1, 0}, true, "RuntimeError"});
  CHECK(a.effects<ReportFailure>().at(0).failure.description ==
        "worker rank 1 (local rank 1, pid " + std::to_string(pids[1]) +
            ") on node-a failed with exit code 1 (RuntimeError)");
}

TEST_CASE(
    "agent: a worker that ended before the stop's signal failed on its own, error file or not",
    "[agent][unit]") {
  Agent a(3, 2);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[1], {1, 0}, false});
  REQUIRE(a.state.stop_reason == StopReason::WorkerFailed);
  CHECK(a.effects<RecordFailure>().at(0).pid == pids[1]);
  // Ended before the stop was sent (reaped in the same pass): a failure too, as torchrun lists
  // every rank that failed together.
  WorkerExited together{pids[0], {1, 0}, false};
  together.ended_unsignalled = true;
  a.on(together);
  REQUIRE(a.effects<RecordFailure>().size() == 1);
  CHECK(a.effects<RecordFailure>().at(0).pid == pids[0]);
  // Ended after it: the stop's doing, not listed.
  a.on(WorkerExited{pids[2], {1, 0}, false});
  CHECK_FALSE(a.has<RecordFailure>());
}

TEST_CASE("agent: with --restart_window the restart names the window's count, not N of M",
          "[agent][unit]") {
  // The job's count may pass --max_restarts: the budget holds only the window's restarts.
  Agent a(2, 1);
  a.running_group();
  rdzv::Restart windowed{2, "worker failed", true, 7};
  windowed.window_restarts = 1;
  windowed.window = std::chrono::hours(1);
  a.on(NoticeReceived{windowed});
  CHECK(a.logged(
      "restarting workers: restart 7 (1 of --max_restarts 1 in the last 3600 s) (worker failed)"));
}

TEST_CASE("agent: Stopping -> Draining -> Rendezvous on a restart, timing the teardown",
          "[agent][unit]") {
  Agent a(2, 1);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, true});
  a.now += 40ms;
  a.on(NoticeReceived{rdzv::Restart{1, "worker failed", true, 1}});
  CHECK(a.state.phase == AgentPhase::Stopping);  // the notice waits for the group
  CHECK(a.logged("restarting workers: restart 1 of 1 (worker failed)"));
  a.on(WorkerExited{pids[1], {0, SIGTERM}, false});
  CHECK(a.state.phase == AgentPhase::Draining);
  CHECK(a.has<CancelTimer>());
  a.now += 10ms;
  a.on(OutputDrained{});
  CHECK(a.event("teardown_done")["teardown_ms"] == 50.0);
  CHECK(a.state.phase == AgentPhase::Rendezvous);
  CHECK(a.has<JoinRound>());
  CHECK(a.event("rendezvous_start")["restart_count"] == 1);
  CHECK(a.state.failures.size() == 1);  // only the one that failed on its own
}

TEST_CASE("agent: a late exit of the stopped group changes nothing in the next one",
          "[agent][unit]") {
  // The race that once needed the real binary run 20 times: SIGCHLD for the old group's worker
  // is reaped after the next group started.
  Agent a(1, 1);
  auto old = a.running_group();
  a.on(SignalReceived{SIGUSR2});  // notices do not stop anything
  a.on(NoticeReceived{rdzv::Restart{1, "scale up", false, 0}});
  a.on(WorkerExited{old[0], {0, SIGTERM}, false});
  a.on(OutputDrained{});
  auto fresh = a.running_group(0);
  a.on(WorkerExited{old[0], {0, SIGTERM}, false});
  CHECK(a.last.empty());
  CHECK(a.state.phase == AgentPhase::Running);
  CHECK(running_pids(a.state) == fresh);
}

TEST_CASE("agent: the stop deadline kills what still runs", "[agent][unit]") {
  Agent a(2);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, false});
  a.now += 5s;
  a.on(TimerFired{AgentTimer::StopDeadline});
  CHECK(a.logged("workers still running 5000 ms after the stop signal: sending SIGKILL"));
  const auto kill = a.effects<SignalWorkers>().at(0);
  CHECK(kill.pids == std::vector<pid_t>{pids[1]});
  CHECK(kill.sig == SIGKILL);
}

TEST_CASE("agent: a worker failing on its own during a stop is reported too", "[agent][unit]") {
  Agent a(3);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, true});
  a.on(WorkerExited{pids[1], {2, 0}, true});  // wrote an error file: its own failure
  CHECK(a.effects<RecordFailure>().at(0).pid == pids[1]);
  CHECK(a.effects<RecordFailure>().at(0).status.code == 2);
  a.on(WorkerExited{pids[2], {0, SIGTERM}, false});  // ended by the stop signal
  CHECK_FALSE(a.has<RecordFailure>());
  CHECK(a.state.failures == std::vector<size_t>{0, 1});
}

TEST_CASE("agent: a signal stops the group and leaves once it is down", "[agent][unit]") {
  Agent a(2);
  auto pids = a.running_group();
  a.on(SignalReceived{SIGTERM});
  CHECK(a.state.stop_reason == StopReason::Signalled);
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGTERM);
  CHECK(a.emitted("signal"));
  a.on(SignalReceived{SIGINT});
  CHECK(a.logged("received SIGINT again: killing the workers now"));
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
  a.on(WorkerExited{pids[0], {0, SIGKILL}, false});
  a.on(WorkerExited{pids[1], {0, SIGKILL}, false});
  CHECK_FALSE(a.has<RecordFailure>());
  a.on(OutputDrained{});
  CHECK(a.effects<Leave>().at(0).reason == "received SIGTERM");
  CHECK(a.effects<Finish>().at(0).code == 128 + SIGTERM);
}

TEST_CASE("agent: one signal delivered twice at once is taken as one, a later one kills",
          "[agent][unit]") {
  Agent a(1);
  a.running_group();
  a.on(SignalReceived{SIGINT});
  CHECK(a.logged("received SIGINT: stopping the workers (SIGKILL for what still runs after"));
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGINT);
  a.now += std::chrono::milliseconds(1);
  a.on(SignalReceived{SIGINT});  // the wrapper's copy
  CHECK(a.logged("received SIGINT twice at once (the terminal's and a wrapper's): taken as one"));
  CHECK_FALSE(a.has<SignalWorkers>());
  a.now += std::chrono::milliseconds(500);
  a.on(SignalReceived{SIGINT});  // a person's second Ctrl-C
  CHECK(a.logged("received SIGINT again: killing the workers now"));
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
}

TEST_CASE("agent: a restart the rendezvous sends a node stopping on a signal is not its own",
          "[agent][unit]") {
  Agent a(1);
  a.running_group();
  a.on(SignalReceived{SIGTERM});
  a.on(NoticeReceived{rdzv::Restart{1, "node b left (received SIGTERM)", true, 1}});
  CHECK_FALSE(a.emitted("restart"));
  CHECK(
      a.logged("the rendezvous restarts the group without this node, which stops on SIGTERM "
               "(node b left (received SIGTERM))"));
  CHECK_FALSE(a.logged("restarting workers"));
}

TEST_CASE("agent: a signal while the output drains leaves after the drain", "[agent][unit]") {
  Agent a(1);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {0, 0}, false});
  a.on(SignalReceived{SIGTERM});
  CHECK_FALSE(a.has<SignalWorkers>());
  CHECK(a.state.phase == AgentPhase::Draining);
  a.on(OutputDrained{});
  CHECK(a.has<Leave>());
  CHECK(a.effects<Finish>().at(0).code == 128 + SIGTERM);
}

TEST_CASE("agent: preemption notices are forwarded and remembered", "[agent][unit]") {
  Agent a(2);
  auto pids = a.running_group();
  a.on(SignalReceived{SIGUSR1});
  CHECK(a.effects<SignalWorkers>().at(0).pids == pids);
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGUSR1);
  CHECK(a.logged("forwarding SIGUSR1 to the workers"));
  CHECK(a.state.checkpoint_requested);
  CHECK(a.state.phase == AgentPhase::Running);
  CHECK_FALSE(a.has<ArmTimer>());  // nothing stops
}

TEST_CASE("agent: a restart notice while running stops the group as requested", "[agent][unit]") {
  Agent a(1, 3);
  auto pids = a.running_group();
  a.on(NoticeReceived{rdzv::Restart{1, "node b failed", true, 1}});
  CHECK(a.state.stop_reason == StopReason::Requested);
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGTERM);
  a.on(WorkerExited{pids[0], {0, SIGTERM}, false});
  CHECK_FALSE(a.has<RecordFailure>());
  a.on(OutputDrained{});
  CHECK(a.has<JoinRound>());
  CHECK(a.state.restart_count == 1);
}

TEST_CASE("agent: the watchdog kills a worker that stopped reporting", "[agent][unit]") {
  Agent a(2);
  a.spec.watchdog_timeout = 2s;
  auto pids = a.running_group();
  a.on(ProgressReported{0});
  a.now += 1s;
  a.on(ProgressReported{1});
  a.now += 1s;
  a.on(TimerFired{AgentTimer::Watchdog});
  CHECK(a.effects<ArmTimer>().at(0).at == a.now + 500ms);
  // Its process state is read before it is killed.
  CHECK(a.effects<InspectHung>().at(0).pids == std::vector<pid_t>{pids[0]});
  CHECK_FALSE(a.has<SignalWorkers>());
  SECTION("stopped: it hung by itself, and its node is blamed") {
    a.inspected('T');
    CHECK(a.logged("made no progress for 2000 ms (--watchdog_timeout), and it is stopped"));
    CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{pids[0]});
    a.on(WorkerExited{pids[0], {0, SIGKILL}, false});
    CHECK(a.state.workers[0].hung);
    CHECK(a.event("failure_detected")["how"] == "watchdog");
    CHECK(a.event("failure_detected")["culprit"] == true);
    CHECK(a.effects<ReportFailure>().at(0).failure.culprit);
  }
  SECTION("asleep: perhaps waiting for a peer that hung, so no node is blamed") {
    a.inspected('S');
    CHECK(a.logged("it is not stopped (state S): it may be waiting for a peer that hung"));
    CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{pids[0]});
    a.on(WorkerExited{pids[0], {0, SIGKILL}, false});
    CHECK(a.event("failure_detected")["culprit"] == false);
    CHECK_FALSE(a.effects<ReportFailure>().at(0).failure.culprit);
  }
  SECTION("stuck in the kernel: blamed") {
    a.inspected('D');
    a.on(WorkerExited{pids[0], {0, SIGKILL}, false});
    CHECK(a.effects<ReportFailure>().at(0).failure.culprit);
  }
  SECTION("it exited before the answer: nothing is killed") {
    a.on(WorkerExited{pids[0], {0, 0}, false});
    a.on(HungInspected{{{pids[0], 0}}});
    CHECK_FALSE(a.has<SignalWorkers>());
    CHECK_FALSE(a.state.workers[0].hung);
  }
  SECTION("a crash, not the watchdog, always blames its node") {
    a.on(WorkerExited{pids[1], {1, 0}, false});
    CHECK(a.effects<ReportFailure>().at(0).failure.culprit);
  }
}

TEST_CASE("agent: a worker that never reported is not judged by the watchdog", "[agent][unit]") {
  Agent a(1);
  a.spec.watchdog_timeout = 2s;
  a.running_group();
  a.now += 1h;
  a.on(TimerFired{AgentTimer::Watchdog});
  CHECK_FALSE(a.has<SignalWorkers>());
}

// ---- BetweenRounds --------------------------------------------------------------------------

TEST_CASE("agent: a failed job prints its report and exits as the rendezvous says",
          "[agent][unit]") {
  SECTION("restarts were allowed: the budget is spent") {
    Agent a(1, 2);
    auto pids = a.running_group();
    a.on(WorkerExited{pids[0], {3, 0}, true});
    a.on(OutputDrained{});
    a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Failed, "rank 0 failed", 3, 0}});
    CHECK(a.has<ReportJobFailure>());
    CHECK(a.effects<Finish>().at(0).code == ddprun::common::kExitRestartsExhausted);
    // Why, with the status (it came with no line of its own).
    CHECK(a.logged("the job ends (exit 75, a requeue may help): rank 0 failed"));
  }
  SECTION("no restarts: the worker's own code") {
    Agent a(1, 0);
    auto pids = a.running_group();
    a.on(WorkerExited{pids[0], {3, 0}, true});
    a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Failed, "rank 0 failed", 3, 0}});
    CHECK_FALSE(a.has<Finish>());  // the group is still draining
    a.on(OutputDrained{});
    CHECK(a.effects<Finish>().at(0).code == 3);
  }
  SECTION("a node was lost and no worker failed: never 0") {
    Agent a(1, 0);
    a.on(AgentStarted{});
    a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Failed, "node b lost", 0, 0}});
    CHECK(a.effects<Finish>().at(0).code == 1);
  }
}

TEST_CASE("agent: a job the rendezvous ends as not to be requeued exits 78", "[agent][unit]") {
  Agent a(1, 5);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {3, 0}, true, "ValueError"});
  a.on(OutputDrained{});
  rdzv::Closed closed{rdzv::JobOutcomeKind::Failed, "a crash loop", 3, 0, true};
  a.on(NoticeReceived{closed});
  CHECK(a.has<ReportJobFailure>());
  CHECK(a.effects<Finish>().at(0).code == ddprun::common::kExitDoNotRequeue);
  CHECK(a.logged("the job ends, not to be requeued (exit 78): a crash loop"));
  CHECK(job_exit_code([] {
          JobOutcome o = JobOutcome::workers_failed({3, 0}, 0);
          o.do_not_requeue = true;
          return o;
        }()) == ddprun::common::kExitDoNotRequeue);
}

TEST_CASE(
    "agent: a failure report says the rank, the exception type and whether there was "
    "progress",
    "[agent][unit][policy]") {
  SECTION("no step reported, a short run: no progress") {
    Agent a(2, 5);
    auto pids = a.running_group();
    a.on(ProgressReported{1, false});  // a line of output is no training step
    a.now += 2s;
    a.on(WorkerExited{pids[1], {1, 0}, true, "ValueError"});
    const auto report = a.effects<ReportFailure>().at(0).failure;
    CHECK(report.rank == 1);
    CHECK(report.exception == "ValueError");
    CHECK_FALSE(report.progress);
    CHECK(a.event("failure_detected")["exception"] == "ValueError");
    CHECK(a.event("failure_detected")["progress"] == false);
  }
  SECTION("a worker reported a training step") {
    Agent a(2, 5);
    auto pids = a.running_group();
    a.on(ProgressReported{0, true});
    a.on(WorkerExited{pids[1], {1, 0}, true, ""});
    CHECK(a.effects<ReportFailure>().at(0).failure.progress);
  }
  SECTION("the group ran as long as --restart_backoff_reset") {
    Agent a(2, 5);
    a.spec.restart_backoff_reset = 60s;
    auto pids = a.running_group();
    a.now += 60s;
    a.on(WorkerExited{pids[0], {0, SIGSEGV}, false, ""});
    const auto report = a.effects<ReportFailure>().at(0).failure;
    CHECK(report.progress);
    CHECK(report.signal == SIGSEGV);
  }
  SECTION("with --restart_backoff_reset 0 a run of any length is no progress") {
    Agent a(1, 5);
    a.spec.restart_backoff_reset = 0s;
    auto pids = a.running_group();
    a.now += 600s;
    a.on(WorkerExited{pids[0], {1, 0}, true, ""});
    CHECK_FALSE(a.effects<ReportFailure>().at(0).failure.progress);
  }
  SECTION("steps of the last group do not count for the next") {
    Agent a(1, 5);
    auto pids = a.running_group();
    a.on(ProgressReported{0, true});
    a.on(WorkerExited{pids[0], {1, 0}, true, ""});
    a.on(OutputDrained{});
    a.on(NoticeReceived{rdzv::Restart{1, "worker failed", true, 1}});
    pids = a.running_group(1);
    a.on(WorkerExited{pids[0], {1, 0}, true, ""});
    CHECK_FALSE(a.effects<ReportFailure>().at(0).failure.progress);
  }
}

TEST_CASE("agent: a timed-out job and a lost rendezvous exit 69", "[agent][unit]") {
  Agent a(1);
  a.on(AgentStarted{});
  a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::TimedOut, "round timed out", 0, 0}});
  CHECK(a.effects<Finish>().at(0).code == ddprun::common::kExitRendezvous);
  Agent b(1);
  auto pids = b.running_group();
  b.on(NoticeReceived{rdzv::RendezvousError{rdzv::RendezvousErrorKind::Connection, "gone"}});
  CHECK(b.state.stop_reason == StopReason::Requested);
  b.on(WorkerExited{pids[0], {0, SIGTERM}, false});
  b.on(OutputDrained{});
  CHECK(b.logged("gone"));
  CHECK(b.effects<Finish>().at(0).code == ddprun::common::kExitRendezvous);
}

TEST_CASE("agent: success reported and then another node fails restarts the node",
          "[agent][unit]") {
  Agent a(1, 1);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {0, 0}, false});
  a.on(OutputDrained{});
  CHECK(a.has<ReportSuccess>());
  a.on(NoticeReceived{rdzv::Restart{1, "node b failed", true, 1}});
  CHECK(a.has<JoinRound>());
  CHECK_FALSE(a.has<SignalWorkers>());
}

TEST_CASE("agent: SIGUSR1 with no workers is remembered for the next group", "[agent][unit]") {
  Agent a(1);
  a.on(AgentStarted{});
  a.on(SignalReceived{SIGUSR1});
  CHECK(a.logged("workers started from now on get DDPRUN_CHECKPOINT_REQUESTED=1"));
  CHECK(a.state.checkpoint_requested);
  CHECK(a.state.phase == AgentPhase::Rendezvous);
}

TEST_CASE("agent: nothing happens after Finished", "[agent][unit]") {
  Agent a(1);
  a.on(AgentStarted{});
  a.on(SignalReceived{SIGTERM});
  REQUIRE(a.state.phase == AgentPhase::Finished);
  for (const AgentEvent& e :
       std::vector<AgentEvent>{SignalReceived{SIGTERM}, OutputDrained{},
                               TimerFired{AgentTimer::StopDeadline}, WorkerExited{1, {}, false}}) {
    a.on(e);
    CHECK(a.last.empty());
  }
}

TEST_CASE("agent: reports find their worker by pid or by running local rank", "[agent][unit]") {
  Agent a(2);
  auto pids = a.running_group();
  CHECK(slot_of_report(a.state, pids[1], 0) == 1u);
  CHECK(slot_of_report(a.state, std::nullopt, 1) == 1u);
  CHECK_FALSE(slot_of_report(a.state, 99999, 0));
  a.on(WorkerExited{pids[1], {0, 0}, false});
  CHECK_FALSE(slot_of_report(a.state, std::nullopt, 1));
  CHECK(slot_of_report(a.state, pids[1], 1) == 1u);  // a last report read after the exit
}

TEST_CASE("agent: a hung worker's stacks are taken before it is killed", "[agent][unit]") {
  Agent a(2);
  a.spec.watchdog_timeout = 2s;
  auto pids = a.running_group();
  a.on(ProgressReported{1});
  a.now += 2s;
  a.on(TimerFired{AgentTimer::Watchdog});
  a.inspected('T');
  REQUIRE(a.last.size() >= 3);
  const auto dump = a.effects<DumpStacks>().at(0);
  REQUIRE(dump.workers.size() == 1);
  CHECK(dump.workers[0].pid == pids[1]);
  CHECK(dump.workers[0].local_rank == 1);
  CHECK(dump.why == "made no progress for more than 2000 ms (--watchdog_timeout)");
  // The dump comes before the SIGKILL.
  size_t dump_at = 0;
  size_t kill_at = 0;
  for (size_t i = 0; i < a.last.size(); ++i) {
    if (std::holds_alternative<DumpStacks>(a.last[i])) dump_at = i;
    if (std::holds_alternative<SignalWorkers>(a.last[i])) kill_at = i;
  }
  CHECK(dump_at < kill_at);
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
}

TEST_CASE("agent: workers still running at the stop deadline have their stacks taken",
          "[agent][unit]") {
  Agent a(2);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, false});
  a.on(TimerFired{AgentTimer::StopDeadline});
  CHECK(a.effects<DumpStacks>().at(0).workers.at(0).pid == pids[1]);
  CHECK(a.effects<DumpStacks>().at(0).why ==
        "still running 5000 ms after the stop signal (--shutdown_timeout)");
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
}

namespace {

/// Two Python workers watched with --watchdog_timeout 2: those of `silent` reported progress,
/// then none for 3 s, when the watchdog looks. Their pids.
std::vector<pid_t> silent_python_workers(Agent& a, const std::vector<size_t>& silent) {
  a.spec.python_tracebacks = true;
  a.spec.watchdog_timeout = 2s;
  auto pids = a.running_group();
  for (size_t index : silent) a.on(ProgressReported{index});
  a.now += 3s;
  a.on(TimerFired{AgentTimer::Watchdog});
  return pids;
}

}  // namespace

TEST_CASE("agent: a hung Python worker gets SIGABRT for its traceback and SIGKILL after the grace",
          "[agent][unit]") {
  Agent a(2);
  auto pids = silent_python_workers(a, {0});
  CHECK(a.effects<ArmTimer>().at(0).timer == AgentTimer::Watchdog);  // the next look
  a.inspected('S');
  CHECK(a.has<DumpStacks>());
  const auto abort = a.effects<SignalWorkers>().at(0);
  CHECK(abort.pids == std::vector<pid_t>{pids[0]});
  CHECK(abort.sig == SIGABRT);
  CHECK(abort.then_continue);  // a stopped worker must run to print
  CHECK(abort.no_core_dump);   // the traceback is wanted, not a core file of each process
  const auto grace = a.effects<ArmTimer>();
  REQUIRE(grace.size() == 1);
  CHECK(grace[0].timer == AgentTimer::TracebackDeadline);
  CHECK(grace[0].at == a.now + 2s);
  SECTION("it printed and died of the SIGABRT: nothing left to kill") {
    a.on(ProgressReported{0});  // its traceback's lines: no progress of the training
    a.now += 100ms;
    a.on(WorkerExited{pids[0], {0, SIGABRT}, false});
    // Lost since its last progress before it was judged hung (the summary's detect phase).
    CHECK(a.event("failure_detected")["silent_ms"] == 3100);
    a.on(TimerFired{AgentTimer::TracebackDeadline});
    CHECK_FALSE(a.has<SignalWorkers>());
  }
  SECTION("it is still running at the deadline: SIGKILL") {
    a.on(TimerFired{AgentTimer::TracebackDeadline});
    CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{pids[0]});
    CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
  }
}

TEST_CASE("agent: hung workers SIGABRT'd together keep printing when one's death stops the group",
          "[agent][unit]") {
  Agent a(2);
  auto pids = silent_python_workers(a, {0, 1});
  a.inspected('S');  // both silent: both get SIGABRT
  REQUIRE(a.effects<SignalWorkers>().size() == 2);
  // Rank 0 printed and died first; the group stops, but rank 1, still printing its traceback,
  // gets no SIGTERM (which would end it mid-print): the grace's SIGKILL is its end.
  a.on(WorkerExited{pids[0], {0, SIGABRT}, false});
  REQUIRE(a.state.phase == AgentPhase::Stopping);
  REQUIRE(a.effects<SignalWorkers>().size() == 1);  // the stop's SIGTERM, to none
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGTERM);
  CHECK(a.effects<SignalWorkers>().at(0).pids.empty());
  // Nor a second SIGABRT at the stop deadline (if it came before the grace's end).
  a.on(TimerFired{AgentTimer::StopDeadline});
  for (const auto& sent : a.effects<SignalWorkers>())
    CHECK(std::find(sent.pids.begin(), sent.pids.end(), pids[1]) == sent.pids.end());
  a.on(TimerFired{AgentTimer::TracebackDeadline});
  CHECK(a.effects<SignalWorkers>().at(0).pids == std::vector<pid_t>{pids[1]});
  CHECK(a.effects<SignalWorkers>().at(0).sig == SIGKILL);
}

// ---- --restart_backoff ----------------------------------------------------------------------

namespace {

/// A one-worker group that runs `ran` and fails; the rendezvous asks for restart `count`; the
/// group is drained. Leaves the agent between rounds (or rejoining), with that step's effects.
void fail_and_restart(Agent& a, int count, std::chrono::milliseconds ran, bool repeat = true) {
  auto pids = a.running_group(count - 1);
  a.now += ran;
  a.on(WorkerExited{pids[0], {1, 0}, true});
  rdzv::Restart restart{count, "worker failed", true, count};
  restart.repeat = repeat;
  a.on(NoticeReceived{restart});
  a.on(OutputDrained{});
}

}  // namespace

TEST_CASE("back-off: the pause doubles from the base up to the maximum", "[agent][unit]") {
  CHECK(rdzv::restart_pause(0, 1s, 30s) == 0s);
  CHECK(rdzv::restart_pause(1, 1s, 30s) == 0s);  // the first failure restarts at once
  CHECK(rdzv::restart_pause(2, 1s, 30s) == 1s);
  CHECK(rdzv::restart_pause(3, 1s, 30s) == 2s);
  CHECK(rdzv::restart_pause(4, 1s, 30s) == 4s);
  CHECK(rdzv::restart_pause(6, 1s, 30s) == 16s);
  CHECK(rdzv::restart_pause(7, 1s, 30s) == 30s);
  CHECK(rdzv::restart_pause(1000, 1s, 30s) == 30s);
  CHECK(rdzv::restart_pause(5, 0s, 30s) == 0s);  // 0: never
  CHECK(rdzv::restart_pause(3, 5s, 2s) == 5s);   // a maximum under the base is the base
}

TEST_CASE("back-off: the first failure rejoins at once, the second after the base pause",
          "[agent][unit]") {
  Agent a(1, 10);
  fail_and_restart(a, 1, 100ms);
  CHECK(a.has<JoinRound>());
  CHECK_FALSE(a.emitted("restart_delayed"));
  fail_and_restart(a, 2, 100ms);
  // BetweenRounds (backing off): no join yet, a timer for a second from now.
  CHECK_FALSE(a.has<JoinRound>());
  CHECK(a.state.phase == AgentPhase::BetweenRounds);
  CHECK(a.event("restart_delayed")["delay_ms"] == 1000);
  CHECK(a.event("restart_delayed")["failures_in_a_row"] == 2);
  CHECK(a.logged("waiting 1.0 s before the next round: 2 failures in a row"));
  const auto arm = a.effects<ArmTimer>();
  REQUIRE(arm.size() == 1);
  CHECK(arm[0].timer == AgentTimer::Backoff);
  CHECK(arm[0].at == a.now + 1s);
  a.now += 1s;
  a.on(TimerFired{AgentTimer::Backoff});
  CHECK(a.has<JoinRound>());
  CHECK(a.state.phase == AgentPhase::Rendezvous);
  // The third in a row waits twice as long.
  fail_and_restart(a, 3, 100ms);
  CHECK(a.event("restart_delayed")["delay_ms"] == 2000);
}

TEST_CASE("back-off: the rendezvous's count and pause win over the node's own", "[agent][unit]") {
  Agent a(1, 10);
  fail_and_restart(a, 1, 100ms);
  REQUIRE(a.has<JoinRound>());
  // A node that sat out the job's earlier failures (a spare): its own count is 1, the job's 4.
  auto pids = a.running_group(1);
  a.on(WorkerExited{pids[0], {1, 0}, true});
  rdzv::Restart restart{2, "worker failed", true, 2};
  restart.failures_in_a_row = 4;
  restart.pause = 8s;
  a.on(NoticeReceived{restart});
  a.on(OutputDrained{});
  CHECK(a.state.failures_in_a_row == 4);
  CHECK(a.event("restart_delayed")["delay_ms"] == 8000);
  CHECK(a.effects<ArmTimer>().at(0).at == a.now + 8s);
}

TEST_CASE("back-off: a group that ran past the reset period starts the schedule afresh",
          "[agent][unit]") {
  Agent a(1, 10);
  a.spec.restart_backoff_reset = 60s;
  fail_and_restart(a, 1, 100ms);
  fail_and_restart(a, 2, 100ms);
  a.now += 1s;
  a.on(TimerFired{AgentTimer::Backoff});
  REQUIRE(a.has<JoinRound>());
  fail_and_restart(a, 3, 61s);  // healthy for a minute: a fresh failure, no pause
  CHECK(a.has<JoinRound>());
  CHECK_FALSE(a.emitted("restart_delayed"));
  CHECK(a.state.failures_in_a_row == 1);
}

TEST_CASE(
    "back-off: a failure that does not repeat the last one (another cause, a lost node) "
    "rejoins at once",
    "[agent][unit]") {
  Agent a(1, 10);
  fail_and_restart(a, 1, 100ms);
  fail_and_restart(a, 2, 100ms);
  a.now += 1s;
  a.on(TimerFired{AgentTimer::Backoff});
  REQUIRE(a.has<JoinRound>());
  fail_and_restart(a, 3, 100ms, /*repeat=*/false);
  CHECK(a.has<JoinRound>());
  CHECK_FALSE(a.emitted("restart_delayed"));
  CHECK(a.state.failures_in_a_row == 1);
  fail_and_restart(a, 4, 100ms);  // the same again: the schedule starts from its base
  CHECK(a.event("restart_delayed")["delay_ms"] == 1000);
}

TEST_CASE("back-off: a stop signal during the pause ends the job at once", "[agent][unit]") {
  Agent a(1, 10);
  fail_and_restart(a, 1, 100ms);
  fail_and_restart(a, 2, 100ms);
  REQUIRE(a.state.backing_off);
  a.on(SignalReceived{SIGTERM});
  CHECK(a.state.phase == AgentPhase::Finished);
  CHECK(a.state.exit_code == 143);
  CHECK(a.has<Leave>());
  const auto cancel = a.effects<CancelTimer>();
  REQUIRE(cancel.size() == 1);
  CHECK(cancel[0].timer == AgentTimer::Backoff);
  CHECK_FALSE(a.has<JoinRound>());
  // The timer, had it fired anyway, does nothing.
  a.on(TimerFired{AgentTimer::Backoff});
  CHECK(a.last.empty());
}

TEST_CASE("back-off: a base of 0 keeps restarts immediate", "[agent][unit]") {
  Agent a(1, 10);
  a.spec.restart_backoff = 0s;
  for (int count = 1; count <= 4; ++count) {
    fail_and_restart(a, count, 10ms);
    CHECK(a.has<JoinRound>());
    CHECK_FALSE(a.emitted("restart_delayed"));
  }
}

TEST_CASE("back-off: a restart for a new round (not counted) neither pauses nor counts",
          "[agent][unit]") {
  Agent a(1, 10);
  fail_and_restart(a, 1, 10ms);
  auto pids = a.running_group(1);
  a.on(NoticeReceived{rdzv::Restart{1, "scale up", false, 1}});
  a.on(WorkerExited{pids[0], {0, SIGTERM}, false});
  a.on(OutputDrained{});
  CHECK(a.has<JoinRound>());
  CHECK(a.state.failures_in_a_row == 1);
}

// ---- the health gate ------------------------------------------------------------------------

TEST_CASE("health gate: a node checks itself before its first join and joins once it passes",
          "[agent][unit][health]") {
  Agent a(1);
  a.spec.health_gate = true;
  a.spec.health_retry = 30s;
  a.on(AgentStarted{});
  CHECK(a.state.phase == AgentPhase::HealthCheck);
  CHECK(a.has<RunHealthCheck>());
  CHECK_FALSE(a.has<JoinRound>());
  a.on(HealthChecked{false, "/logs is not writable", "disk full", 12});
  CHECK(a.state.phase == AgentPhase::HealthCheck);  // out of the rendezvous
  CHECK_FALSE(a.has<JoinRound>());
  CHECK(a.effects<ArmTimer>().at(0).timer == AgentTimer::HealthRetry);
  CHECK(a.effects<ArmTimer>().at(0).at == a.now + 30s);
  CHECK(a.event("health_check_failed")["why"] == "/logs is not writable");
  CHECK(a.event("health_check_failed")["output"] == "disk full");
  CHECK(a.event("health_check_failed")["failures_in_a_row"] == 1);
  CHECK(a.logged("health check failed (1 in a row): /logs is not writable"));
  // The rendezvous hears that it is kept out, and why: the check's last line first.
  CHECK(a.effects<ReportKeptOut>().at(0).why == "disk full (/logs is not writable)");
  a.now += 30s;
  a.on(TimerFired{AgentTimer::HealthRetry});
  CHECK(a.has<RunHealthCheck>());
  a.on(HealthChecked{true, "", "", 5});
  CHECK(a.state.phase == AgentPhase::Rendezvous);
  CHECK(a.has<JoinRound>());
  CHECK(a.emitted("rendezvous_start"));
  CHECK(a.event("health_check_passed")["failures_before"] == 1);
  CHECK(a.logged("health check passed after 1 failed check(s)"));
}

TEST_CASE("health gate: a check still running after a few seconds is said, once",
          "[agent][unit][health]") {
  Agent a(1);
  a.spec.health_gate = true;
  a.spec.health_timeout = 60s;
  a.on(AgentStarted{});
  REQUIRE(a.has<RunHealthCheck>());
  REQUIRE(a.effects<ArmTimer>().size() == 1);
  CHECK(a.effects<ArmTimer>().at(0).timer == AgentTimer::HealthSlow);
  CHECK(a.effects<ArmTimer>().at(0).at == a.now + kHealthCheckNotice);
  a.now += kHealthCheckNotice;
  a.on(TimerFired{AgentTimer::HealthSlow});
  CHECK(
      a.logged("the health check is still running after 5 s: this node joins the job's round "
               "once it passes, and it fails at 60 s (--health_check_timeout)"));
  // Its first: the rendezvous lists it meanwhile.
  CHECK(a.effects<ReportKeptOut>().at(0).why == "first check still running after 5 s");
  // A job that ends meanwhile (all nodes' checks past the join timeout) says so.
  {
    Agent ended = a;
    ended.on(NoticeReceived{
        rdzv::Closed{rdzv::JobOutcomeKind::TimedOut, "join timeout: waited 600 s", 0, 0, false}});
    CHECK(
        ended.logged("the job ended while this node's first health check was still running: "
                     "join timeout: waited 600 s"));
    CHECK(ended.state.phase == AgentPhase::Finished);
  }
  CHECK(a.state.phase == AgentPhase::HealthCheck);
  a.on(HealthChecked{true, "", "", 6000});
  CHECK(a.effects<CancelTimer>().at(0).timer == AgentTimer::HealthSlow);
  CHECK(a.has<JoinRound>());
  // A late timer after the check ended says nothing.
  CHECK(a.on(TimerFired{AgentTimer::HealthSlow}).empty());
  // A timeout no longer than the notice arms nothing: the check ends (or fails) first.
  Agent b(1);
  b.spec.health_gate = true;
  b.spec.health_timeout = kHealthCheckNotice;
  b.on(AgentStarted{});
  CHECK(b.has<RunHealthCheck>());
  CHECK_FALSE(b.has<ArmTimer>());
}

TEST_CASE("health gate: every rejoin after a restart is checked too", "[agent][unit][health]") {
  Agent a(1, 3);
  a.spec.health_gate = true;
  a.on(AgentStarted{});
  a.on(HealthChecked{true, "", "", 1});
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, true, ""});
  a.on(NoticeReceived{rdzv::Restart{1, "worker failed", true, 1}});
  a.on(OutputDrained{});
  CHECK(a.state.phase == AgentPhase::HealthCheck);
  CHECK(a.has<RunHealthCheck>());
  CHECK_FALSE(a.has<JoinRound>());
  // Another restart notice while it checks: the check already leads to the next join.
  a.on(NoticeReceived{rdzv::Restart{2, "node b lost", true, 2}});
  CHECK_FALSE(a.has<RunHealthCheck>());
  CHECK_FALSE(a.has<JoinRound>());
  // A slow check is said, but a node placed before keeps its place: the next round waits for
  // it, and saying it is kept out would give the place away.
  a.now += kHealthCheckNotice;
  a.on(TimerFired{AgentTimer::HealthSlow});
  CHECK(a.logged("the health check is still running after 5 s"));
  CHECK_FALSE(a.has<ReportKeptOut>());
  a.on(HealthChecked{true, "", "", 1});
  CHECK(a.has<JoinRound>());
  CHECK(a.effects<JoinRound>().size() == 1);
}

TEST_CASE("health gate: a stop signal while a failed node waits ends the job at once",
          "[agent][unit][health]") {
  Agent a(1);
  a.spec.health_gate = true;
  a.on(AgentStarted{});
  a.on(HealthChecked{false, "GPU gone", "", 1});
  a.on(SignalReceived{SIGTERM});
  CHECK(a.state.phase == AgentPhase::Finished);
  CHECK(a.effects<Finish>().at(0).code == 128 + SIGTERM);
  CHECK(a.effects<CancelTimer>().at(0).timer == AgentTimer::HealthRetry);
  // A stale timer or check result changes nothing.
  CHECK(a.on(TimerFired{AgentTimer::HealthRetry}).empty());
  CHECK(a.on(HealthChecked{true, "", "", 1}).empty());
}

TEST_CASE("health gate: a closed job while a node checks itself ends it as the job ended",
          "[agent][unit][health]") {
  Agent a(1);
  a.spec.health_gate = true;
  a.on(AgentStarted{});
  a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::TimedOut, "join timeout", 0, 0, false}});
  CHECK(a.effects<Finish>().at(0).code == ddprun::common::kExitRendezvous);
}

TEST_CASE("health gate: the kept-out reason is one printable line of valid UTF-8, bounded",
          "[agent][unit][health]") {
  Agent a(1);
  a.spec.health_gate = true;
  a.on(AgentStarted{});
  // Output cut inside a character (\xa9 alone), a colour escape, a tab, a long last line.
  const std::string last(2000, 'x');
  a.on(HealthChecked{false, "the health check `check` failed with exit code 1",
                     "\xa9 first\n\x1b[31mgpu0\tbad\n" + last + "\n\n", 1});
  const std::string why = a.effects<ReportKeptOut>().at(0).why;
  CHECK(why.size() <= 512);
  CHECK(why.rfind("xxxx", 0) == 0);  // the last non-empty line comes first
  a.on(TimerFired{AgentTimer::HealthRetry});
  a.on(HealthChecked{false, "no GPU", "\xa9 \x1b[31mgpu0\tbad\n", 1});
  const std::string second = a.effects<ReportKeptOut>().at(0).why;
  // The lone \xa9 became U+FFFD, the escape \xNN text, the tab a space.
  CHECK(second == "\xef\xbf\xbd \\x1b[31mgpu0 bad (no GPU)");
}

TEST_CASE("agent: a spare ends with the job's exit status when the job fails without it",
          "[agent][unit][spares]") {
  Agent a(1);
  a.on(AgentStarted{});
  REQUIRE(a.state.phase == AgentPhase::Rendezvous);
  a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Failed, "a crash loop", 3, 0, true}});
  CHECK(a.state.phase == AgentPhase::Finished);
  CHECK(a.effects<Finish>().at(0).code == 78);  // kExitDoNotRequeue
  CHECK(a.logged("the job ends, not to be requeued (exit 78): a crash loop"));
  CHECK(a.has<ReportJobFailure>());
}

TEST_CASE("health gate: a job that ends while the node is kept out ends it as on every node",
          "[agent][unit][health]") {
  Agent a(1);
  a.spec.health_gate = true;
  a.on(AgentStarted{});
  a.on(HealthChecked{false, "GPU gone", "", 1});
  a.on(TimerFired{AgentTimer::HealthRetry});
  a.on(HealthChecked{false, "GPU gone", "", 1});
  CHECK(a.effects<ReportKeptOut>().size() == 1);
  a.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Succeeded, "all succeeded", 0, 0, false}});
  CHECK(a.state.phase == AgentPhase::Finished);
  CHECK(a.effects<Finish>().at(0).code == 0);
  CHECK(a.effects<CancelTimer>().at(0).timer == AgentTimer::HealthRetry);
  CHECK(
      a.logged("the job ended while this node was kept out by its health check (2 failed "
               "check(s) in a row): all succeeded"));
  // A job that failed ends it with the job's exit status, as on the nodes that ran it.
  Agent b(1);
  b.spec.health_gate = true;
  b.on(AgentStarted{});
  b.on(HealthChecked{false, "GPU gone", "", 1});
  b.on(NoticeReceived{rdzv::Closed{rdzv::JobOutcomeKind::Failed, "budget used up", 3, 0, false}});
  CHECK(b.effects<Finish>().at(0).code == 3);
  CHECK(b.logged("the job ended while this node was kept out"));
  // A lost rendezvous ends it too, with the rendezvous's exit status, instead of checking on.
  Agent c(1);
  c.spec.health_gate = true;
  c.on(AgentStarted{});
  c.on(HealthChecked{false, "GPU gone", "", 1});
  c.on(NoticeReceived{rdzv::RendezvousError{rdzv::RendezvousErrorKind::Connection, "gone"}});
  CHECK(c.effects<Finish>().at(0).code == ddprun::common::kExitRendezvous);
}

TEST_CASE("agent: a --progress_file that changed while the group ran is progress",
          "[agent][unit][policy]") {
  Agent a(2, 5);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, true, "", true});
  CHECK(a.effects<ReportFailure>().at(0).failure.progress);
  // The next group starts without it.
  a.on(WorkerExited{pids[1], {0, SIGTERM}, false, "", false});
  a.on(OutputDrained{});
  a.on(NoticeReceived{rdzv::Restart{1, "worker failed", true, 1}});
  pids = a.running_group(1);
  a.on(WorkerExited{pids[0], {1, 0}, true, "", false});
  CHECK_FALSE(a.effects<ReportFailure>().at(0).failure.progress);
}

// ---- quarantine -----------------------------------------------------------------------------

TEST_CASE(
    "quarantine: the node stops its workers, says why, and after it checks itself and "
    "joins again",
    "[agent][unit][spares]") {
  Agent a(1, 5);
  a.spec.health_gate = true;
  a.on(AgentStarted{});
  a.on(HealthChecked{true, "", "", 1});
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, true, ""});
  rdzv::Restart quarantined{2,
                            "node b is quarantined for 30 s: its workers caused 2 group "
                            "failures in a row",
                            true, 2, std::chrono::milliseconds(30'000)};
  a.on(NoticeReceived{quarantined});
  CHECK(a.event("quarantined")["cooldown_s"] == 30.0);
  CHECK(a.logged("this node waits out its quarantine, then checks itself and joins again"));
  a.on(OutputDrained{});
  a.now += 5s;  // any back-off
  a.on(TimerFired{AgentTimer::Backoff});
  if (a.state.phase == AgentPhase::HealthCheck) a.on(HealthChecked{true, "", "", 1});
  REQUIRE(a.state.phase == AgentPhase::Rendezvous);
  // The quarantine is over: no failure, a new check and join.
  a.on(RoundFailed{rdzv::RendezvousError{rdzv::RendezvousErrorKind::Rejoin,
                                         "node b may take part again: its quarantine is over"}});
  CHECK(a.state.phase == AgentPhase::HealthCheck);
  CHECK(a.has<RunHealthCheck>());
  CHECK_FALSE(a.has<Finish>());
  CHECK(a.emitted("quarantine_over"));
  CHECK(a.state.failures_in_a_row == 0);
  a.on(HealthChecked{true, "", "", 1});
  CHECK(a.has<JoinRound>());
}

// ---- invariants ---------------------------------------------------------------------------

TEST_CASE("agent: every step keeps the lifecycle's invariants, and a broken state aborts",
          "[agent][unit]") {
  // A whole life passes the checks agent_step makes after each step...
  Agent a(2, 1);
  auto pids = a.running_group();
  a.on(WorkerExited{pids[0], {1, 0}, true});
  a.on(WorkerExited{pids[1], {0, SIGTERM}, false});
  a.on(OutputDrained{});
  check_invariants(a.state);
  // ...and a state no transition makes is a bug, caught loudly rather than acted on.
  const auto [status, err] = ddprun::testing::in_child([] {
    AgentState broken;
    broken.phase = AgentPhase::Running;
    broken.stop_reason = StopReason::WorkerFailed;
    check_invariants(broken);
  });
  CHECK(WIFSIGNALED(status));
  CHECK(err.find("a group being stopped is Stopping, not Running") != std::string::npos);
}

TEST_CASE("every event has one name in the log, and the log's names read back as the same event",
          "[agent][unit]") {
  std::set<std::string_view> names;
  for (int i = 0; i <= static_cast<int>(EventName::Other); ++i) {
    const auto event = static_cast<EventName>(i);
    const std::string_view name = event_name(event);
    CHECK_FALSE(name.empty());
    CHECK(names.insert(name).second);
    if (event != EventName::Other) CHECK(event_named(name) == event);
  }
  CHECK(event_name(EventName::FailureDetected) == "failure_detected");
  CHECK(event_named("a_report_of_the_program's_own") == EventName::Other);
  CHECK(event_named("other") == EventName::Other);
}
