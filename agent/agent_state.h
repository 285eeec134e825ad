#pragma once
// The agent's lifecycle as a pure state machine, the twin of rendezvous/rdzv_state.h:
//
//   agent_step(state, event, now, spec) -> effects
//
// No processes, sockets, files or clock reads: LocalAgent (local_agent.cpp) turns what happens
// (a round completes, a worker exits, a signal, a timer) into an AgentEvent, calls agent_step,
// and applies the AgentEffects it returns (launch, signal, report, arm a timer...). Tests build a
// state, feed events with a made-up time and read the effects (tests/unit/agent/
// agent_state_test.cpp). docs/design.md ("The agent's lifecycle") draws the phases.
#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/event_names.h"
#include "agent/worker.h"
#include "common/clock.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::agent {

using common::Duration;
using common::TimePoint;

// ---- outcome mapping -----------------------------------------------------------------------

/// Counts of the current worker group's members by what the agent has observed.
struct GroupObservation {
  int running = 0;
  int succeeded = 0;
  int failed = 0;
};

/// The group's state as torchelastic names it.
WorkerState group_state(const GroupObservation& obs);

/// What the agent does after each observed worker exit while a group runs.
enum class Action {
  Monitor,    ///< keep watching
  Succeed,    ///< every worker exited 0
  StopGroup,  ///< a worker failed: stop every other worker
};
Action decide(const GroupObservation& obs);

/// How a whole ddprun run ended.
enum class JobEnd { Succeeded, WorkersFailed, Signalled, RendezvousFailed, Internal };

/// Inputs of the exit-status mapping.
struct JobOutcome {
  JobEnd end = JobEnd::Succeeded;
  ExitStatus root_cause;  ///< the first failed worker, for WorkersFailed
  int signal = 0;         ///< the signal received, for Signalled
  int max_restarts = 0;
  /// WorkersFailed: the rendezvous said a requeue would meet the same failure (a crash loop, a
  /// fatal exit code): kExitDoNotRequeue.
  bool do_not_requeue = false;

  static JobOutcome of(JobEnd end) {
    JobOutcome o;
    o.end = end;
    return o;
  }
  static JobOutcome signalled(int sig) {
    JobOutcome o = of(JobEnd::Signalled);
    o.signal = sig;
    return o;
  }
  static JobOutcome workers_failed(ExitStatus root_cause, int max_restarts) {
    JobOutcome o = of(JobEnd::WorkersFailed);
    o.root_cause = root_cause;
    o.max_restarts = max_restarts;
    return o;
  }
};

/// ddprun's exit status (common/exit_codes.h; docs/design.md#exit-codes).
int job_exit_code(const JobOutcome& outcome);

// ---- state ----------------------------------------------------------------------------------

/// Where the agent is in its lifecycle (docs/design.md, "The agent's lifecycle").
enum class AgentPhase {
  HealthCheck,     ///< checking itself (--health_check) before it joins; out of the rendezvous
  Rendezvous,      ///< waiting for a round to complete
  AwaitingZygote,  ///< a round completed; its workers fork from the zygote once it is ready
  Launching,       ///< starting the group's workers one by one
  Running,         ///< the group runs; exits are judged as they come
  Stopping,        ///< the group was told to stop; waiting for every worker to exit
  Draining,        ///< no worker runs; leftovers are killed and the output read to its end
  BetweenRounds,   ///< nothing runs; waiting for the rendezvous to say what comes next
  Finished,        ///< the job is over for this node (Finish was the last effect)
};

/// Why the current group is being stopped.
enum class StopReason { None, WorkerFailed, Signalled, Requested };

/// The Python zygote as the lifecycle needs it (agent/python_zygote.h has the rest).
enum class ZygotePhase { None, Starting, Ready, Gone };

/// One worker of the current group.
struct WorkerSlot {
  WorkerPlacement placement;
  pid_t pid = -1;  ///< -1 until started
  bool running = false;
  bool launch_failed = false;  ///< the process could not be started
  ExitStatus status;           ///< once it has exited
  bool hung = false;           ///< killed by the watchdog
  /// Hung: its last progress when it was judged so (what it prints as it dies comes later).
  TimePoint silent_since{};
  /// The watchdog found it stopped (SIGSTOP, a debugger) or stuck in the kernel: it hung by
  /// itself. A hung worker that is merely asleep may be waiting in a collective for a peer
  /// that hung, so its failure blames no node (docs/design.md, "Who hung").
  bool hung_alone = false;
  bool inspecting = false;                 ///< InspectHung is out for it
  std::optional<TimePoint> last_progress;  ///< the last report it sent
  /// It reported a training step (the SDK's per-step heartbeat or first_step): the group made
  /// progress, so its failure is no crash loop (--crash_loop_stop).
  bool stepped = false;
  std::string exception;  ///< the exception type its error file names, once it failed
};

/// Timers the lifecycle arms (the executor keeps one per kind).
enum class AgentTimer {
  StopDeadline,  ///< --shutdown_timeout after the stop signal: SIGKILL what still runs
  Watchdog,      ///< the next look for workers that stopped reporting progress
  /// --traceback_grace after SIGABRT to hung Python workers: SIGKILL what still runs.
  TracebackDeadline,
  /// --restart_backoff: the pause before rejoining after repeated failures is over.
  Backoff,
  /// --health_check_interval after a failed health check: check again.
  HealthRetry,
  /// kHealthCheckNotice after a health check began: if it still runs, say so.
  HealthSlow,
};
/// How many AgentTimer values there are (the executor keeps one timer each).
inline constexpr size_t kAgentTimers = 6;

/// A health check still running this long is said in the log: a node that neither joins nor
/// says why looks hung.
inline constexpr std::chrono::seconds kHealthCheckNotice{5};

/// A stop signal repeated within this is the same one delivered twice (a terminal's Ctrl-C and
/// a wrapper's forwarded copy), not a second signal that kills at once: no person presses
/// Ctrl-C twice so fast.
inline constexpr std::chrono::milliseconds kSameSignalWindow{100};

struct AgentState {
  AgentPhase phase = AgentPhase::Rendezvous;
  /// The round the group runs in (valid from Launching on).
  rdzv::RendezvousInfo round;
  int restart_count = 0;
  /// A completed round whose group waits for the zygote (AwaitingZygote).
  std::optional<rdzv::RendezvousInfo> waiting_round;
  ZygotePhase zygote = ZygotePhase::None;
  std::vector<WorkerSlot> workers;
  /// Slots (indices into workers) that failed on their own, in the order observed: the first
  /// is the root cause.
  std::vector<size_t> failures;
  StopReason stop_reason = StopReason::None;
  /// The signal the stop sends (SIGTERM, the received one, SIGKILL after a second).
  int stop_signal = 0;
  TimePoint stop_started;
  /// Launching: PrepareGroup is out and GroupPrepared has not come (standbys are being handed
  /// over). A stop meanwhile waits for it: the standbys that take over are workers to stop.
  bool preparing = false;
  /// Draining: whether the group succeeded (report success after) or was stopped.
  bool drain_after_success = false;
  /// The next slot to start (Launching).
  size_t next_launch = 0;
  /// How many of the group's workers are handed-over standbys.
  int from_standby = 0;
  /// A stop signal received (SIGTERM...); the job ends once the group is down.
  int pending_signal = 0;
  TimePoint signal_at;  ///< when pending_signal came
  /// SIGUSR1 arrived: workers started from now on get DDPRUN_CHECKPOINT_REQUESTED=1.
  bool checkpoint_requested = false;
  /// Hung Python workers sent SIGABRT (their tracebacks), SIGKILLed at TracebackDeadline.
  std::vector<pid_t> aborted;
  /// What the rendezvous said between rounds, acted on once nothing runs.
  std::optional<rdzv::Restart> restart;
  std::optional<rdzv::Closed> closed;
  std::optional<rdzv::RendezvousError> lost;
  /// When the current group's workers had all started (Running), for --restart_backoff_reset.
  std::optional<TimePoint> group_started;
  /// Counted restarts in a row, each after a group that ran shorter than restart_backoff_reset.
  int failures_in_a_row = 0;
  /// BetweenRounds: a restart waits for the Backoff timer (backing_off), or has waited
  /// (backoff_over) and joins now.
  bool backing_off = false;
  bool backoff_over = false;
  /// HealthCheck: a check runs (checking), or the last one failed and HealthRetry is armed.
  bool checking = false;
  /// --progress_file changed while the current group ran: it made progress.
  bool file_progress = false;
  int health_failures = 0;  ///< failed checks in a row before the current join
  /// A round has placed this node (RoundReady) since it started: a check from then on may run
  /// while the next round waits for it, and a slow one does not give up its place.
  bool placed_before = false;
  /// Its first check, still running after kHealthCheckNotice, had it listed as kept out.
  bool first_check_listed = false;
  int exit_code = 0;  ///< valid once Finished
};

/// What agent_step needs besides the state: the job's fixed settings.
struct AgentSpec {
  int local_world_size = 1;
  int max_restarts = 0;
  Duration shutdown_timeout = std::chrono::seconds(30);
  Duration watchdog_timeout{0};  ///< 0: off
  Duration watchdog_tick = std::chrono::seconds(1);
  /// Python workers (PYTHONFAULTHANDLER=1): a hung one gets SIGABRT, which makes it print every
  /// thread's traceback, and SIGKILL only after traceback_grace.
  bool python_tracebacks = false;
  Duration traceback_grace = std::chrono::seconds(2);
  /// --restart_backoff BASE:MAX and --restart_backoff_reset: the pause between repeated
  /// failures and the next round (rdzv::restart_pause()), and how long a group must have run for
  /// its failure to start the schedule afresh. A zero base: no pause.
  Duration restart_backoff = std::chrono::seconds(1);
  Duration restart_backoff_max = std::chrono::seconds(30);
  Duration restart_backoff_reset = std::chrono::seconds(60);
  std::string host;  ///< this node, as failure descriptions name it
  /// --health_check: check before every join (RunHealthCheck), and after a failed check wait
  /// health_retry before the next.
  bool health_gate = false;
  Duration health_retry = std::chrono::seconds(30);
  Duration health_timeout = std::chrono::seconds(60);  ///< --health_check_timeout, for the log
};

// ---- events ---------------------------------------------------------------------------------

/// run() begins: join the first round. `zygote_starting`: a zygote imports torch meanwhile.
struct AgentStarted {
  bool zygote_starting = false;
};
struct RoundReady {
  rdzv::RendezvousInfo info;
};
struct RoundFailed {
  rdzv::RendezvousError error;
};
struct NoticeReceived {
  rdzv::Notice notice;
};
/// The executor prepared the group's directories and environments (PrepareGroup); `handed`
/// are the local ranks already running as handed-over standbys, with their pids.
struct GroupPrepared {
  bool ok = true;  ///< false: the attempt's directories could not be made
  std::map<int, pid_t> handed;
};
/// The event loop turned after YieldTurn: the next worker may start.
struct LaunchTurn {};
/// LaunchWorker{index} was carried out: the pid, or the process could not start.
struct WorkerLaunched {
  size_t index = 0;
  pid_t pid = -1;  ///< -1: it did not start
};
/// A child of the agent was reaped. `wrote_error_file`: its TORCHELASTIC_ERROR_FILE is not
/// empty (a worker that failed on its own, as opposed to one the stop signal ended);
/// `exception`: the exception type that file names (exception_type in error_file.h).
struct WorkerExited {
  pid_t pid = -1;
  ExitStatus status;
  bool wrote_error_file = false;
  std::string exception{};
  /// --progress_file changed since the group started (the executor compares its stamps).
  bool progress_file_changed = false;
  /// It had ended before the agent sent its process group any signal (the executor reaped it
  /// in the same pass as the failure that stopped the group, or earlier): a failure of its own,
  /// not the stop's doing, even without an error file.
  bool ended_unsignalled = false;
};
/// A worker's report (progress heartbeat or milestone) or, for the watchdog, a line of its
/// output arrived; slot found by the executor. `step`: the report says training advanced.
struct ProgressReported {
  size_t index = 0;
  bool step = false;
};
/// A signal the agent handles (SIGTERM, SIGINT, SIGHUP, SIGUSR1...).
struct SignalReceived {
  int sig = 0;
};
struct TimerFired {
  AgentTimer timer = AgentTimer::StopDeadline;
};
/// What InspectHung found of a silent worker: its process state from /proc ('S', 'T', 'D'...;
/// 0 when it could not be read).
struct InspectedWorker {
  pid_t pid = -1;
  char state = 0;
};
struct HungInspected {
  std::vector<InspectedWorker> workers;
};
/// Drain: every output pipe of the ended group closed, or the drain deadline passed.
struct OutputDrained {};
/// The zygote is ready (standbys fork from it) or gone (workers start afresh).
struct ZygoteSettled {
  bool ready = false;
};
/// RunHealthCheck was carried out: passed, or why not.
struct HealthChecked {
  bool ok = true;
  std::string why{};
  std::string output{};  ///< the check command's last output, for the event log
  long long ms = 0;      ///< how long the check took
};

using AgentEvent =
    std::variant<AgentStarted, RoundReady, RoundFailed, NoticeReceived, GroupPrepared, LaunchTurn,
                 WorkerLaunched, WorkerExited, ProgressReported, SignalReceived, TimerFired,
                 HungInspected, OutputDrained, ZygoteSettled, HealthChecked>;

// ---- effects --------------------------------------------------------------------------------

/// Join the next rendezvous round (RoundReady or RoundFailed follows).
struct JoinRound {};
/// Run the health gate's checks (HealthChecked follows).
struct RunHealthCheck {};
/// Make the attempt's directories and the workers' environments for the round's group of
/// `placements`, hand standbys over (GroupPrepared follows).
struct PrepareGroup {
  rdzv::RendezvousInfo round;
  std::vector<WorkerPlacement> placements;
  bool checkpoint_requested = false;  ///< the environments say DDPRUN_CHECKPOINT_REQUESTED=1
};
/// Let the event loop turn before the next launch (LaunchTurn follows on its next turn): a
/// stop that comes while a large group starts is acted on between two launches.
struct YieldTurn {};
/// Start the worker at `placement`, slot `index` (WorkerLaunched follows at once).
struct LaunchWorker {
  size_t index = 0;
  WorkerPlacement placement;
};
/// Send `sig` to each pid's process group (and SIGCONT after it, for a stopped worker).
struct SignalWorkers {
  std::vector<pid_t> pids;
  int sig = 0;
  bool then_continue = false;
  /// Lower the core-file limit of each process in those groups to 0 first: SIGABRT is sent
  /// for the Python tracebacks it prints, and would leave a core file of each process (GiBs
  /// for a GPU worker) where the limit allows one.
  bool no_core_dump = false;
};
/// Add this failed worker to the failure report (the executor reads its error file now).
struct RecordFailure {
  WorkerPlacement placement;
  pid_t pid = -1;
  ExitStatus status;
  bool hung = false;  ///< killed by the watchdog
};
struct ReportFailure {
  rdzv::WorkersFailed failure;
};
struct ReportSuccess {};
/// The health check failed (or the node's first one still runs after kHealthCheckNotice): the
/// rendezvous holds this node out of its rounds, lists it with `why` (the check's last line of
/// output and its failure, valid UTF-8, at most 512 bytes), and tells it the job's end
/// (RendezvousHandler::keep_out).
struct ReportKeptOut {
  std::string why;
};
struct Leave {
  std::string reason;
};
/// Kill what the ended group left behind (each of its workers' process groups, then every
/// other descendant but the standbys) and read its output to the end (OutputDrained follows).
struct Drain {
  std::vector<pid_t> groups;  ///< the group's workers, whose process groups are killed
};
struct ArmTimer {
  AgentTimer timer = AgentTimer::StopDeadline;
  TimePoint at;
};
struct CancelTimer {
  AgentTimer timer = AgentTimer::StopDeadline;
};
/// A line of the event log (and the metrics).
struct EmitEvent {
  EventName name = EventName::Other;
  nlohmann::json fields = nlohmann::json::object();
};
enum class LogLevel { Debug, Info, Warn, Error };
struct Log {
  LogLevel level = LogLevel::Info;
  std::string text;
};
/// The watchdog judges these workers silent: read their process states (HungInspected
/// follows at once) before they are killed.
struct InspectHung {
  std::vector<pid_t> pids;
};
/// A worker as a log line names it.
struct WorkerRef {
  pid_t pid = -1;
  int global_rank = 0;
  int local_rank = 0;
};
/// Record where each thread of these hung workers is (native stacks) before they are killed.
struct DumpStacks {
  std::vector<WorkerRef> workers;
  std::string why;  ///< "made no progress for more than 2000 ms (--watchdog_timeout)"
};
/// The group started: start standbys for the next restart a while from now.
struct ScheduleStandbys {};
/// The job failed: print the failure report of this node's recorded failures.
struct ReportJobFailure {
  rdzv::Closed closed;
};
/// The job is over for this node: SIGKILL the process groups of `kill` (workers still running)
/// and reap them, clean up, and return `code` from run().
struct Finish {
  int code = 0;
  std::vector<pid_t> kill{};
};

using AgentEffect =
    std::variant<JoinRound, RunHealthCheck, PrepareGroup, YieldTurn, LaunchWorker, SignalWorkers,
                 RecordFailure, ReportFailure, ReportSuccess, ReportKeptOut, Leave, Drain, ArmTimer,
                 CancelTimer, EmitEvent, Log, InspectHung, DumpStacks, ScheduleStandbys,
                 ReportJobFailure, Finish>;

/// Applies `event` at time `now` to `state` (in place: a group may have thousands of slots)
/// and returns what the executor must do, in order.
std::vector<AgentEffect> agent_step(AgentState& state, const AgentEvent& event, TimePoint now,
                                    const AgentSpec& spec);

/// Aborts (DDPRUN_CHECK) when `state` breaks an invariant of the lifecycle; agent_step checks
/// it after every step.
void check_invariants(const AgentState& state);

/// The running workers' pids.
std::vector<pid_t> running_pids(const AgentState& state);

/// Counts the group's workers by what has been observed of them.
GroupObservation observe(const AgentState& state);

/// The slot a worker report belongs to: by pid when the report carries one (a report sent
/// just before the worker exited may be read after its exit was reaped), else the running
/// worker of that local rank.
std::optional<size_t> slot_of_report(const AgentState& state, std::optional<pid_t> pid,
                                     int local_rank);

/// Phase names as the event log and the design doc write them.
const char* phase_name(AgentPhase phase);

}  // namespace ddprun::agent
