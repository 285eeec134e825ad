#include "agent/agent_state.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>

#include <fmt/format.h>

#include "agent/failure_report.h"
#include "agent/worker_env.h"
#include "common/check.h"
#include "common/exit_codes.h"
#include "common/signals.h"
#include "common/strings.h"

namespace ddprun::agent {

// ---- outcome mapping ------------------------------------------------------------------------

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    s.code = WEXITSTATUS(status);
  }
  return s;
}

WorkerState group_state(const GroupObservation& obs) {
  if (obs.failed > 0) return WorkerState::Failed;
  if (obs.running > 0) return WorkerState::Healthy;
  if (obs.succeeded > 0) return WorkerState::Succeeded;
  return WorkerState::Init;
}

Action decide(const GroupObservation& obs) {
  switch (group_state(obs)) {
    case WorkerState::Failed:
      // Healthy -> Failed: one worker failing makes the whole group stop.
      return Action::StopGroup;
    case WorkerState::Succeeded:
      // Healthy -> Succeeded: the last worker exited 0 and none failed.
      return Action::Succeed;
    default:
      return Action::Monitor;
  }
}

int job_exit_code(const JobOutcome& outcome) {
  switch (outcome.end) {
    case JobEnd::Succeeded:
      return common::kExitSuccess;
    case JobEnd::WorkersFailed:
      if (outcome.do_not_requeue) return common::kExitDoNotRequeue;
      if (outcome.max_restarts > 0) return common::kExitRestartsExhausted;
      // A worker that exits non-zero has a non-zero shell code; keep it distinct from success.
      return outcome.root_cause.shell_code() != 0 ? outcome.root_cause.shell_code() : 1;
    case JobEnd::Signalled:
      return 128 + outcome.signal;
    case JobEnd::RendezvousFailed:
      return common::kExitRendezvous;
    case JobEnd::Internal:
      return common::kExitInternal;
  }
  return common::kExitInternal;
}

// ---- queries --------------------------------------------------------------------------------

std::vector<pid_t> running_pids(const AgentState& state) {
  std::vector<pid_t> pids;
  for (const auto& w : state.workers)
    if (w.running) pids.push_back(w.pid);
  return pids;
}

GroupObservation observe(const AgentState& state) {
  GroupObservation obs;
  for (const auto& w : state.workers) {
    if (w.running)
      ++obs.running;
    else if (w.status.ok() && !w.launch_failed)
      ++obs.succeeded;
    else
      ++obs.failed;
  }
  return obs;
}

std::optional<size_t> slot_of_report(const AgentState& state, std::optional<pid_t> pid,
                                     int local_rank) {
  for (size_t i = 0; i < state.workers.size(); ++i) {
    const WorkerSlot& w = state.workers[i];
    if (pid ? w.pid == *pid : w.placement.local_rank == local_rank && w.running) return i;
  }
  return std::nullopt;
}

const char* phase_name(AgentPhase phase) {
  switch (phase) {
    case AgentPhase::HealthCheck:
      return "health_check";
    case AgentPhase::Rendezvous:
      return "rendezvous";
    case AgentPhase::AwaitingZygote:
      return "awaiting_zygote";
    case AgentPhase::Launching:
      return "launching";
    case AgentPhase::Running:
      return "running";
    case AgentPhase::Stopping:
      return "stopping";
    case AgentPhase::Draining:
      return "draining";
    case AgentPhase::BetweenRounds:
      return "between_rounds";
    case AgentPhase::Finished:
      return "finished";
  }
  return "unknown";
}

// ---- transitions ----------------------------------------------------------------------------

namespace {

using Effects = std::vector<AgentEffect>;

double ms_between(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

/// What the rendezvous lists for a node kept out by its health check: the check's last line of
/// output first (what a person looks for), then why it failed. Valid UTF-8 without control
/// characters (a check prints anything; its kept output may start inside a character), and at
/// most kMaxKeptOutBytes: the join carries it and the server keeps it per node.
std::string kept_out_reason(const std::string& why, const std::string& output) {
  constexpr std::size_t kMaxKeptOutBytes = 512;
  std::string last_line;
  for (const std::string& line : common::split(output, '\n'))
    if (std::string trimmed = common::trim(line); !trimmed.empty()) last_line = std::move(trimmed);
  std::string reason = last_line.empty() ? why : last_line + " (" + why + ")";
  // nlohmann's replacing dump turns each invalid sequence into U+FFFD; read back, it is valid.
  reason = nlohmann::json::parse(nlohmann::json(reason).dump(
                                     -1, ' ', false, nlohmann::json::error_handler_t::replace))
               .get<std::string>();
  reason = common::printable(common::tabs_as_spaces(reason));
  common::cut_utf8(reason, kMaxKeptOutBytes);
  return reason;
}

/// Nothing runs or drains: the phases in which what the rendezvous said is acted on.
bool idle(AgentPhase phase) {
  return phase == AgentPhase::HealthCheck || phase == AgentPhase::Rendezvous ||
         phase == AgentPhase::AwaitingZygote || phase == AgentPhase::BetweenRounds;
}

/// One step's context: the state, the time, the settings and the effects so far.
class Stepper {
 public:
  Stepper(AgentState& s, TimePoint now, const AgentSpec& spec) : s_(s), now_(now), spec_(spec) {}

  Effects take() { return std::move(out_); }

  void on(const AgentStarted& e) {
    if (e.zygote_starting) s_.zygote = ZygotePhase::Starting;
    join_round();
  }

  void on(const RoundReady& e) {
    if (s_.phase != AgentPhase::Rendezvous) return;
    if (s_.pending_signal != 0) return advance();
    s_.placed_before = true;
    out_.push_back(EmitEvent{EventName::RendezvousComplete,
                             {{"round", e.info.round},
                              {"group_rank", e.info.group_rank},
                              {"group_world_size", e.info.group_world_size},
                              {"restart_count", e.info.restart_count},
                              {"master_addr", e.info.master_addr},
                              {"master_port", e.info.master_port}}});
    if (s_.zygote == ZygotePhase::Starting) {
      // Rendezvous -> AwaitingZygote: the zygote still imports torch; the group forks from it
      // once it is ready or gone. Signals and notices are acted on meanwhile.
      s_.waiting_round = e.info;
      s_.phase = AgentPhase::AwaitingZygote;
      return;
    }
    begin_group(e.info);
  }

  void on(const RoundFailed& e) {
    if (s_.phase != AgentPhase::Rendezvous) return;
    if (e.error.kind == rdzv::RendezvousErrorKind::Rejoin) {
      // Rendezvous -> HealthCheck/Rendezvous: the quarantine is over; the node checks itself
      // and joins again (the quarantine was its pause: no back-off is owed)
      out_.push_back(EmitEvent{EventName::QuarantineOver, {{"message", e.error.message}}});
      log(LogLevel::Info, e.error.message);
      s_.failures_in_a_row = 0;
      return join_round();
    }
    // Rendezvous -> Finished: no round, no job.
    out_.push_back(EmitEvent{EventName::RendezvousFailed, {{"message", e.error.message}}});
    log(LogLevel::Error, "rendezvous failed: " + e.error.message);
    finish(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)));
  }

  void on(const ZygoteSettled& e) {
    s_.zygote = e.ready ? ZygotePhase::Ready : ZygotePhase::Gone;
    if (s_.phase != AgentPhase::AwaitingZygote || !s_.waiting_round) return;
    // AwaitingZygote -> Launching: the group forks from the zygote, or starts afresh.
    const rdzv::RendezvousInfo round = *s_.waiting_round;
    s_.waiting_round.reset();
    begin_group(round);
  }

  void on(const NoticeReceived& e) {
    s_.waiting_round.reset();  // that round is over for this node
    if (s_.phase == AgentPhase::AwaitingZygote) s_.phase = AgentPhase::BetweenRounds;
    const auto* restart = std::get_if<rdzv::Restart>(&e.notice);
    if (restart != nullptr && s_.pending_signal != 0) {
      // This node stops on a signal and leaves: the restart is the others' (when SLURM cancels
      // a job, every node's signal arrives with the others' leaving), not a restart of its own
      // to count in its events and metrics.
      log(LogLevel::Info, "the rendezvous restarts the group without this node, which stops on " +
                              common::signal_name(s_.pending_signal) + " (" +
                              restart->reason.get() + ")");
      s_.restart = *restart;
    } else if (restart != nullptr) {
      out_.push_back(EmitEvent{EventName::Restart,
                               {{"reason", restart->reason.get()},
                                {"counted", restart->counted},
                                {"restart_count", restart->restart_count}}});
      s_.restart_count = restart->restart_count;
      if (restart->counted) {
        // A failure: one more in a row when it repeats the last one (the rendezvous says so),
        // unless the group had run long enough to call it fresh. A lost node, or a failure
        // of another kind, starts the count afresh: no pause before its round.
        const bool ran_long =
            s_.group_started && now_ - *s_.group_started >= spec_.restart_backoff_reset;
        s_.failures_in_a_row = ran_long || !restart->repeat ? 1 : s_.failures_in_a_row + 1;
      }
      // The rendezvous's count, where it sends one: every node of the round pauses alike, as
      // long as the rendezvous waits before the join timeout (a count of this node's own can
      // be stale: it sat out rounds as a spare, or the server restarted).
      if (restart->failures_in_a_row) s_.failures_in_a_row = *restart->failures_in_a_row;
      if (restart->quarantine.count() > 0) {
        out_.push_back(EmitEvent{
            EventName::Quarantined,
            {{"reason", restart->reason.get()},
             {"cooldown_s", std::chrono::duration<double>(restart->quarantine).count()}}});
        log(LogLevel::Warn,
            "stopping workers: " + restart->reason.get() +
                "; this node waits out its quarantine, then checks itself and joins again");
      } else {
        log(LogLevel::Warn, restarting_text(*restart));
      }
      s_.restart = *restart;
    } else if (const auto* closed = std::get_if<rdzv::Closed>(&e.notice)) {
      out_.push_back(
          EmitEvent{EventName::JobClosed,
                    {{"message", closed->message}, {"do_not_requeue", closed->do_not_requeue}}});
      s_.closed = *closed;
    } else {
      s_.lost = std::get<rdzv::RendezvousError>(e.notice);
    }
    // Launching/Running -> Stopping: the rendezvous asks this node to stop its workers.
    if ((s_.phase == AgentPhase::Launching || s_.phase == AgentPhase::Running) &&
        s_.stop_reason == StopReason::None)
      stop_group(StopReason::Requested, SIGTERM);
    advance();
  }

  void on(const GroupPrepared& e) {
    if (s_.phase != AgentPhase::Launching || !s_.preparing) return;
    s_.preparing = false;
    if (!e.ok) return finish(job_exit_code(JobOutcome::of(JobEnd::Internal)));
    // The standbys handed over run already: they are workers before any launch.
    for (const auto& [local_rank, pid] : e.handed) {
      for (auto& w : s_.workers) {
        if (w.placement.local_rank != local_rank) continue;
        w.pid = pid;
        w.running = true;
      }
    }
    s_.from_standby = static_cast<int>(e.handed.size());
    // Launching -> Stopping: a stop came during the hand-over; it reaches the workers now.
    if (s_.stop_reason != StopReason::None) signal_stop();
    continue_launch();
  }

  void on(const LaunchTurn&) {
    // A stop meanwhile ended Launching (end_launch): nothing more starts.
    if (s_.phase != AgentPhase::Launching || s_.preparing || s_.stop_reason != StopReason::None ||
        s_.next_launch >= s_.workers.size())
      return;
    out_.push_back(LaunchWorker{s_.next_launch, s_.workers[s_.next_launch].placement});
  }

  void on(const WorkerLaunched& e) {
    if (s_.phase != AgentPhase::Launching || e.index != s_.next_launch ||
        e.index >= s_.workers.size())
      return;
    WorkerSlot& w = s_.workers[e.index];
    if (e.pid > 0) {
      w.pid = e.pid;
      w.running = true;
    } else {
      w.launch_failed = true;
    }
    s_.next_launch = e.index + 1;
    continue_launch();
  }

  void on(const WorkerExited& e) {
    if (s_.phase == AgentPhase::Finished) return;
    auto it = std::find_if(s_.workers.begin(), s_.workers.end(),
                           [&](const WorkerSlot& w) { return w.running && w.pid == e.pid; });
    // As a child subreaper the agent also reaps orphaned descendants of its workers: a pid that
    // is no running worker's was only reaped.
    if (it == s_.workers.end()) return;
    it->running = false;
    it->status = e.status;
    it->exception = e.exception;
    if (e.progress_file_changed) s_.file_progress = true;
    log(LogLevel::Debug, fmt::format("local rank {} (pid {}) ended: {}", it->placement.local_rank,
                                     it->pid, describe_exit(e.status)));
    const auto index = static_cast<size_t>(it - s_.workers.begin());
    if (!e.status.ok()) {
      // Healthy -> Failed for this worker, unless the agent itself was stopping the group. One
      // that failed too while the group was stopped for another's failure failed on its own
      // when it wrote an error file (the stop signal writes none) or had ended before the
      // stop's signal was sent: it is reported too, as torchrun reports every rank failing
      // together.
      if (s_.stop_reason == StopReason::None || (s_.stop_reason == StopReason::WorkerFailed &&
                                                 (e.wrote_error_file || e.ended_unsignalled)))
        record_failure(index);
    }
    evaluate();
  }

  void on(const ProgressReported& e) {
    if (e.index >= s_.workers.size()) return;
    s_.workers[e.index].last_progress = now_;
    if (e.step) s_.workers[e.index].stepped = true;
  }

  void on(const HungInspected& e) {
    for (const InspectedWorker& seen : e.workers) {
      auto it = std::find_if(s_.workers.begin(), s_.workers.end(), [&](const WorkerSlot& w) {
        return w.pid == seen.pid && w.inspecting;
      });
      if (it == s_.workers.end()) continue;
      WorkerSlot& w = *it;
      w.inspecting = false;
      if (!w.running || w.hung || s_.phase != AgentPhase::Running) continue;
      w.hung = true;
      w.silent_since = *w.last_progress;
      // Stopped or stuck in the kernel: nothing a peer does can hold it there. Asleep or
      // running, it may be waiting in a collective for a peer that hung.
      w.hung_alone = seen.state == 'T' || seen.state == 't' || seen.state == 'D';
      const long long silent_ms = static_cast<long long>(ms_between(w.silent_since, now_));
      log(LogLevel::Warn,
          fmt::format("worker rank {} (local rank {}, pid {}) made no progress for {} ms "
                      "(--watchdog_timeout), {}: killing it",
                      w.placement.global_rank, w.placement.local_rank, w.pid, silent_ms,
                      hung_state_text(seen.state)));
      kill_hung(
          {w.pid},
          fmt::format("made no progress for more than {} ms (--watchdog_timeout)",
                      std::chrono::duration_cast<std::chrono::milliseconds>(spec_.watchdog_timeout)
                          .count()));
    }
  }

  void on(const SignalReceived& e) {
    if (s_.phase == AgentPhase::Finished) return;
    const int sig = e.sig;
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      // A preemption notice: the workers decide what to do; the group keeps running. SIGUSR1
      // is remembered: workers started later learn of it from DDPRUN_CHECKPOINT_REQUESTED=1.
      auto pids = running_pids(s_);
      if (!pids.empty())
        log(LogLevel::Info, "forwarding " + common::signal_name(sig) + " to the workers");
      else if (sig == SIGUSR1)
        log(LogLevel::Info,
            "received SIGUSR1 while no workers run: workers started from now on get "
            "DDPRUN_CHECKPOINT_REQUESTED=1");
      else
        log(LogLevel::Info, "received SIGUSR2 while no workers run: nothing to forward");
      out_.push_back(SignalWorkers{std::move(pids), sig, false});
      if (sig == SIGUSR1) s_.checkpoint_requested = true;
      return;
    }
    if (s_.pending_signal != 0) {
      // One Ctrl-C can arrive twice within microseconds: from the terminal and from a wrapper
      // that forwards it (timeout, a shell script's trap). Only a later one is a second.
      if (sig == s_.pending_signal && now_ - s_.signal_at < kSameSignalWindow) {
        log(LogLevel::Info, "received " + common::signal_name(sig) +
                                " twice at once (the terminal's and a wrapper's): taken as one");
        return;
      }
      log(LogLevel::Warn,
          "received " + common::signal_name(sig) + " again: killing the workers now");
      kill_remaining();
      return;
    }
    s_.pending_signal = sig;
    s_.signal_at = now_;
    out_.push_back(EmitEvent{EventName::Signal, {{"signal", common::signal_name(sig)}}});
    // Between rounds (or in a rendezvous) nothing runs: it leaves the job at once.
    const long long grace =
        std::chrono::duration_cast<std::chrono::seconds>(spec_.shutdown_timeout).count();
    log(LogLevel::Warn, "received " + common::signal_name(sig) +
                            (idle(s_.phase) ? ": leaving the job"
                                            : ": stopping the workers (SIGKILL for what still "
                                              "runs after " +
                                                  std::to_string(grace) +
                                                  " s, --shutdown_timeout; a second signal "
                                                  "kills at once)"));
    // Between rounds (or in a rendezvous): leave now. Draining: the end of the drain leaves.
    if (idle(s_.phase)) return advance();
    if (s_.phase == AgentPhase::Draining) return;
    stop_group(StopReason::Signalled, sig);
  }

  void on(const TimerFired& e) {
    if (s_.phase == AgentPhase::Finished) return;
    switch (e.timer) {
      case AgentTimer::StopDeadline: {
        const long long ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(spec_.shutdown_timeout).count();
        // Not those already SIGABRT'd for their tracebacks: a second one would cut it off
        // (the fault handler is gone by then); their TracebackDeadline ends them.
        std::vector<pid_t> late;
        for (pid_t pid : running_pids(s_))
          if (!aborted(pid)) late.push_back(pid);
        if (!late.empty())
          log(LogLevel::Warn,
              fmt::format("workers still running {} ms after the stop signal: sending {}", ms,
                          spec_.python_tracebacks
                              ? "SIGABRT for their Python tracebacks, then SIGKILL"
                              : "SIGKILL"));
        kill_hung(
            std::move(late),
            fmt::format("still running {} ms after the stop signal (--shutdown_timeout)", ms));
        return;
      }
      case AgentTimer::TracebackDeadline: {
        std::vector<pid_t> still;
        for (pid_t pid : s_.aborted)
          for (const auto& w : s_.workers)
            if (w.running && w.pid == pid) still.push_back(pid);
        s_.aborted.clear();
        if (!still.empty()) out_.push_back(SignalWorkers{std::move(still), SIGKILL, false});
        return;
      }
      case AgentTimer::Watchdog:
        if (s_.phase != AgentPhase::Running) return;
        check_watchdog();
        arm_watchdog();
        return;
      case AgentTimer::HealthRetry:
        if (s_.phase != AgentPhase::HealthCheck || s_.checking) return;
        return run_health_check();
      case AgentTimer::HealthSlow:
        if (s_.phase != AgentPhase::HealthCheck || !s_.checking) return;
        log(LogLevel::Info,
            fmt::format("the health check is still running after {} s: this node joins the "
                        "job's round once it passes, and it fails at {:g} s "
                        "(--health_check_timeout)",
                        kHealthCheckNotice.count(),
                        std::chrono::duration<double>(spec_.health_timeout).count()));
        // A node that holds no place yet is listed by the rendezvous (ddprun status, a join
        // timeout's message) until its check ends, rather than missing without a word.
        if (!s_.placed_before && s_.health_failures == 0) {
          s_.first_check_listed = true;
          out_.push_back(ReportKeptOut{
              fmt::format("first check still running after {} s", kHealthCheckNotice.count())});
        }
        return;
      case AgentTimer::Backoff:
        if (!s_.backing_off) return;
        s_.backing_off = false;
        s_.backoff_over = true;
        return advance();
    }
  }

  void on(const HealthChecked& e) {
    if (s_.phase != AgentPhase::HealthCheck || !s_.checking) return;
    s_.checking = false;
    s_.first_check_listed = false;
    if (slow_check_noticed()) out_.push_back(CancelTimer{AgentTimer::HealthSlow});
    if (e.ok) {
      // Said only after failed checks: a healthy node's every join stays quiet.
      if (s_.health_failures > 0) {
        log(LogLevel::Info, fmt::format("health check passed after {} failed check(s): joining "
                                        "the rendezvous",
                                        s_.health_failures));
        out_.push_back(EmitEvent{EventName::HealthCheckPassed,
                                 {{"ms", e.ms}, {"failures_before", s_.health_failures}}});
      }
      s_.health_failures = 0;
      return join_now();
    }
    // HealthCheck -> HealthCheck: the node is kept out of rounds and checks again later.
    ++s_.health_failures;
    // As --health_check_interval was given: 0.2, not 0.
    const double retry_s = std::chrono::duration<double>(spec_.health_retry).count();
    out_.push_back(EmitEvent{EventName::HealthCheckFailed,
                             {{"why", e.why},
                              {"output", e.output},
                              {"ms", e.ms},
                              {"failures_in_a_row", s_.health_failures},
                              {"retry_s", retry_s}}});
    log(LogLevel::Warn,
        fmt::format("health check failed ({} in a row): {}; this node is kept out of the job's "
                    "rounds and checks again in {:g} s (--health_check_interval)",
                    s_.health_failures, e.why, retry_s));
    // The rendezvous lists it as kept out and tells it when the job ends (a Closed notice).
    out_.push_back(ReportKeptOut{kept_out_reason(e.why, e.output)});
    out_.push_back(ArmTimer{AgentTimer::HealthRetry, now_ + spec_.health_retry});
  }

  void on(const OutputDrained&) {
    if (s_.phase != AgentPhase::Draining) return;
    s_.phase = AgentPhase::BetweenRounds;
    if (s_.drain_after_success) {
      // Succeeded -> BetweenRounds: the job is done once the rendezvous says every node is.
      out_.push_back(ReportSuccess{});
    } else {
      out_.push_back(
          EmitEvent{EventName::TeardownDone, {{"teardown_ms", ms_between(s_.stop_started, now_)}}});
    }
    advance();
  }

 private:
  void log(LogLevel level, std::string text) { out_.push_back(Log{level, std::move(text)}); }

  void join_round() {
    if (spec_.health_gate) {
      // -> HealthCheck: the node checks itself before it joins (--health_check).
      s_.phase = AgentPhase::HealthCheck;
      return run_health_check();
    }
    join_now();
  }

  /// Whether a check is timed for the "still running" notice (HealthSlow): one that may run
  /// longer than kHealthCheckNotice (the builtin checks take milliseconds).
  bool slow_check_noticed() const { return spec_.health_timeout > kHealthCheckNotice; }

  void run_health_check() {
    s_.checking = true;
    out_.push_back(RunHealthCheck{});
    if (slow_check_noticed())
      out_.push_back(ArmTimer{AgentTimer::HealthSlow, now_ + kHealthCheckNotice});
  }

  void join_now() {
    DDPRUN_CHECK(idle(s_.phase), "a node joins a round only while nothing of it runs");
    // -> Rendezvous: join the next round.
    s_.phase = AgentPhase::Rendezvous;
    out_.push_back(EmitEvent{EventName::RendezvousStart, {{"restart_count", s_.restart_count}}});
    out_.push_back(JoinRound{});
  }

  void begin_group(const rdzv::RendezvousInfo& round) {
    DDPRUN_CHECK(s_.phase == AgentPhase::Rendezvous || s_.phase == AgentPhase::AwaitingZygote,
                 "a group begins from a completed round");
    // Rendezvous -> Launching: a fresh group for this round.
    s_.phase = AgentPhase::Launching;
    s_.round = round;
    s_.restart_count = round.restart_count;
    s_.workers.clear();
    for (const WorkerPlacement& p : place_workers(round, spec_.local_world_size)) {
      WorkerSlot slot;
      slot.placement = p;
      s_.workers.push_back(slot);
    }
    s_.failures.clear();
    s_.group_started.reset();
    s_.file_progress = false;
    s_.stop_reason = StopReason::None;
    s_.next_launch = 0;
    s_.from_standby = 0;
    s_.preparing = true;
    std::vector<WorkerPlacement> placements;
    for (const WorkerSlot& w : s_.workers) placements.push_back(w.placement);
    out_.push_back(PrepareGroup{round, std::move(placements), s_.checkpoint_requested});
  }

  /// The next worker to start, one per event-loop turn: a stop that comes while a large group
  /// starts is acted on between two launches, not after the last.
  void continue_launch() {
    while (s_.next_launch < s_.workers.size() && s_.workers[s_.next_launch].pid > 0)
      ++s_.next_launch;  // a handed-over standby's
    if (s_.next_launch < s_.workers.size() && s_.stop_reason == StopReason::None) {
      out_.push_back(YieldTurn{});  // LaunchTurn launches it
      return;
    }
    end_launch();
  }

  void end_launch() {
    DDPRUN_CHECK(s_.phase == AgentPhase::Launching && !s_.preparing,
                 "launching ends once the group was prepared");
    // Init -> Stopped for the workers not started: a stop came while the group started.
    const size_t planned = s_.workers.size();
    std::vector<WorkerSlot> kept;
    std::vector<size_t> new_index(planned, planned);
    for (size_t i = 0; i < planned; ++i) {
      const WorkerSlot& w = s_.workers[i];
      if (w.pid <= 0 && !w.launch_failed) continue;
      new_index[i] = kept.size();
      kept.push_back(w);
    }
    for (size_t& f : s_.failures) f = new_index[f];
    s_.workers = std::move(kept);
    if (s_.workers.size() < planned)
      log(LogLevel::Info,
          fmt::format("stopped starting workers: {} of {} started", s_.workers.size(), planned));
    s_.phase = s_.stop_reason == StopReason::None ? AgentPhase::Running : AgentPhase::Stopping;
    if (s_.workers.empty()) return group_stopped();  // Init -> Stopped: none had started
    for (size_t i = 0; i < s_.workers.size(); ++i) {
      WorkerSlot& w = s_.workers[i];
      if (!w.launch_failed) continue;
      // Init -> Failed: a worker that cannot start fails its group like a crash would.
      w.status.code = 127;
      record_failure(i);
    }
    nlohmann::json pids = nlohmann::json::array();
    for (const auto& w : s_.workers) pids.push_back(w.pid);
    out_.push_back(EmitEvent{EventName::WorkersStarted,
                             {{"count", s_.workers.size()},
                              {"pids", pids},
                              {"restart_count", s_.restart_count},
                              {"from_standby", s_.from_standby}}});
    s_.group_started = now_;
    arm_watchdog();
    out_.push_back(ScheduleStandbys{});
    evaluate();
  }

  void record_failure(size_t index) {
    s_.failures.push_back(index);
    const WorkerSlot& w = s_.workers[index];
    out_.push_back(RecordFailure{w.placement, w.pid, w.status, w.hung});
  }

  /// The pids of the group's workers that were started (their process groups).
  std::vector<pid_t> started_pids() const {
    std::vector<pid_t> pids;
    for (const WorkerSlot& w : s_.workers)
      if (w.pid > 0) pids.push_back(w.pid);
    return pids;
  }

  /// After every observed exit, once the whole group was launched.
  void evaluate() {
    if (s_.phase == AgentPhase::Stopping) {
      if (observe(s_).running == 0) group_stopped();
      return;
    }
    if (s_.phase != AgentPhase::Running) return;
    switch (decide(observe(s_))) {
      case Action::Monitor:
        return;
      case Action::Succeed:
        // Running -> Draining: every worker exited 0; report once the output is read.
        s_.phase = AgentPhase::Draining;
        s_.drain_after_success = true;
        out_.push_back(Drain{started_pids()});
        return;
      case Action::StopGroup: {
        // Running -> Stopping: report at once so that other nodes stop too, then stop ours.
        const WorkerSlot& root = s_.workers[s_.failures.front()];
        // One that never started (its launch failed, said above) has no pid to show.
        const std::string what =
            root.pid > 0
                ? fmt::format(
                      "worker rank {} (local rank {}, pid {}) on {} failed with {}{}{}",
                      root.placement.global_rank, root.placement.local_rank, root.pid, spec_.host,
                      describe_exit(root.status),
                      // The other nodes see only this line: a watchdog's SIGKILL is
                      // no crash and no OOM kill.
                      root.hung ? fmt::format(", killed by the watchdog: no progress for "
                                              "more than {} ms (--watchdog_timeout)",
                                              std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  spec_.watchdog_timeout)
                                                  .count())
                                : "",
                      root.exception.empty() ? "" : " (" + root.exception + ")")
                : fmt::format("worker rank {} (local rank {}) on {} did not start",
                              root.placement.global_rank, root.placement.local_rank, spec_.host);
        log(LogLevel::Warn, what + "; stopping the group");
        const bool progress = made_progress();
        // A watchdog kill of a worker that was not stopped blames no node (check_watchdog).
        const bool culprit = !root.hung || root.hung_alone;
        nlohmann::json detected = {{"rank", root.placement.global_rank},
                                   {"local_rank", root.placement.local_rank},
                                   {"pid", root.pid},
                                   {"exit_code", root.status.code},
                                   {"signal", root.status.signal},
                                   {"exception", root.exception},
                                   {"progress", progress},
                                   {"how", root.launch_failed ? "launch"
                                           : root.hung        ? "watchdog"
                                                              : "exit"},
                                   {"culprit", culprit}};
        // A hung worker's time lost began at its last progress, not at the watchdog's kill
        // (what it printed as it died, a traceback, counts as progress since).
        if (root.hung)
          detected["silent_ms"] = static_cast<long long>(ms_between(root.silent_since, now_));
        out_.push_back(EmitEvent{EventName::FailureDetected, std::move(detected)});
        out_.push_back(ReportFailure{
            rdzv::WorkersFailed{s_.round.round, what, root.status.code, root.status.signal,
                                root.placement.global_rank, root.exception, progress, culprit}});
        stop_group(StopReason::WorkerFailed, SIGTERM);
        return;
      }
    }
  }

  /// Whether the failing group got anywhere (--crash_loop_stop): a worker reported a training
  /// step, --progress_file changed, or the group ran as long as --restart_backoff_reset calls
  /// healthy (when it is not 0: a group that ran no time at all got nowhere).
  bool made_progress() const {
    if (s_.file_progress || std::any_of(s_.workers.begin(), s_.workers.end(),
                                        [](const WorkerSlot& w) { return w.stepped; }))
      return true;
    return spec_.restart_backoff_reset.count() > 0 && s_.group_started &&
           now_ - *s_.group_started >= spec_.restart_backoff_reset;
  }

  void stop_group(StopReason reason, int sig) {
    DDPRUN_CHECK(s_.phase == AgentPhase::Launching || s_.phase == AgentPhase::Running ||
                     s_.phase == AgentPhase::Stopping,
                 "only a group that starts or runs is stopped");
    if (s_.stop_reason == StopReason::None) s_.stop_started = now_;
    if (s_.stop_reason == StopReason::None || reason == StopReason::Signalled)
      s_.stop_reason = reason;
    s_.stop_signal = sig;
    // Launching, standbys being handed over: GroupPrepared stops the group (signal_stop).
    if (s_.phase == AgentPhase::Launching && s_.preparing) return;
    signal_stop();
    // Launching -> Stopping: the workers not started yet never start.
    if (s_.phase == AgentPhase::Launching) return end_launch();
    if (s_.phase == AgentPhase::Running) s_.phase = AgentPhase::Stopping;
    evaluate();
  }

  /// The stop signal to every running worker, and the deadline after which SIGKILL follows.
  /// Not to one SIGABRT'd for its traceback (kill_hung): a SIGTERM would end it before its
  /// fault handler has printed (a hung rank's traceback lost when a peer's abort stopped the
  /// group first); the TracebackDeadline SIGKILLs it.
  void signal_stop() {
    const int sig = s_.stop_signal;
    std::vector<pid_t> pids;
    for (pid_t pid : running_pids(s_))
      if (sig == SIGKILL || !aborted(pid)) pids.push_back(pid);
    // A stopped (SIGSTOP) worker acts on the stop signal only once continued.
    out_.push_back(SignalWorkers{std::move(pids), sig, sig != SIGKILL});
    out_.push_back(ArmTimer{AgentTimer::StopDeadline, now_ + spec_.shutdown_timeout});
  }

  void kill_remaining() {
    // During a hand-over: the standbys that take it over are killed as they become workers.
    if (s_.preparing) s_.stop_signal = SIGKILL;
    if (auto pids = running_pids(s_); !pids.empty())
      out_.push_back(SignalWorkers{std::move(pids), SIGKILL, false});
  }

  void group_stopped() {
    DDPRUN_CHECK(s_.phase == AgentPhase::Stopping || s_.phase == AgentPhase::Running,
                 "a group is down after it was stopped (or none of it started)");
    // Stopping -> Draining: every worker of the group has been reaped. A late SIGCHLD of the
    // old group finds no running slot and changes nothing.
    s_.phase = AgentPhase::Draining;
    s_.drain_after_success = false;
    out_.push_back(CancelTimer{AgentTimer::StopDeadline});
    out_.push_back(Drain{started_pids()});
  }

  void arm_watchdog() {
    if (spec_.watchdog_timeout.count() <= 0) return;
    out_.push_back(ArmTimer{AgentTimer::Watchdog,
                            now_ + std::min(spec_.watchdog_timeout / 4, spec_.watchdog_tick)});
  }

  /// A worker that reported progress once (a report, or a line of output) and then nothing for
  /// --watchdog_timeout is hung: its process state is read first (HungInspected), then
  /// kill_hung ends it and its group fails as if it had crashed.
  void check_watchdog() {
    std::vector<pid_t> silent;
    for (auto& w : s_.workers) {
      if (!w.running || w.hung || w.inspecting || !w.last_progress) continue;
      if (now_ - *w.last_progress < spec_.watchdog_timeout) continue;
      w.inspecting = true;
      silent.push_back(w.pid);
    }
    if (!silent.empty()) out_.push_back(InspectHung{std::move(silent)});
  }

  /// "restart 3 of 5", or with --restart_window, where the job's count may pass the budget,
  /// "restart 7 (2 of --max_restarts 5 in the last 3600 s)".
  std::string restarting_text(const rdzv::Restart& restart) const {
    if (!restart.counted) return "restarting workers for a new round: " + restart.reason.get();
    if (restart.window.count() <= 0)
      return fmt::format("restarting workers: restart {} of {} ({})", restart.restart_count,
                         spec_.max_restarts, restart.reason.get());
    return fmt::format(
        "restarting workers: restart {} ({} of --max_restarts {} in the last {} s) "
        "({})",
        restart.restart_count, restart.window_restarts, spec_.max_restarts,
        std::chrono::duration<double>(restart.window).count(), restart.reason.get());
  }

  static std::string hung_state_text(char state) {
    switch (state) {
      case 'T':
      case 't':
        return "and it is stopped (state T): it hung by itself";
      case 'D':
        return "and it is stuck in the kernel (state D): it hung by itself";
      case 0:
        return "and its state could not be read";
      default:
        return fmt::format(
            "and it is not stopped (state {}): it may be waiting for a peer that "
            "hung, so no node is blamed for it",
            state);
    }
  }

  /// Whether `pid` was sent SIGABRT for its traceback and its grace is not over.
  bool aborted(pid_t pid) const {
    return std::find(s_.aborted.begin(), s_.aborted.end(), pid) != s_.aborted.end();
  }

  /// Hung workers: their stacks first, then SIGKILL (a stopped or deadlocked process would
  /// ignore SIGTERM); Python workers get SIGABRT first, which prints their tracebacks
  /// (PYTHONFAULTHANDLER=1), with no core file, and SIGKILL once the grace has passed.
  void kill_hung(std::vector<pid_t> pids, std::string why) {
    if (pids.empty()) return;
    std::vector<WorkerRef> refs;
    for (const WorkerSlot& w : s_.workers)
      if (std::find(pids.begin(), pids.end(), w.pid) != pids.end())
        refs.push_back({w.pid, w.placement.global_rank, w.placement.local_rank});
    out_.push_back(DumpStacks{std::move(refs), std::move(why)});
    if (!spec_.python_tracebacks) {
      out_.push_back(SignalWorkers{std::move(pids), SIGKILL, false});
      return;
    }
    s_.aborted.insert(s_.aborted.end(), pids.begin(), pids.end());
    out_.push_back(SignalWorkers{std::move(pids), SIGABRT, true, true});
    out_.push_back(ArmTimer{AgentTimer::TracebackDeadline, now_ + spec_.traceback_grace});
  }

  /// Once nothing runs or drains: act on what is pending.
  void advance() {
    if (!idle(s_.phase)) return;
    if (s_.pending_signal != 0) {
      // -> Finished: a stop signal; leave the rendezvous.
      out_.push_back(Leave{"received " + common::signal_name(s_.pending_signal)});
      return finish(job_exit_code(JobOutcome::signalled(s_.pending_signal)));
    }
    if (s_.lost && s_.drain_after_success && s_.phase == AgentPhase::BetweenRounds && !s_.restart &&
        !s_.backing_off) {
      // This node's group succeeded and reported it; only the job's end was not heard. An exit
      // 69 would have a scheduler run a finished job again: 0, as torchrun's agent exits when
      // its exit barrier fails.
      log(LogLevel::Warn,
          "this node's workers all succeeded, and then the rendezvous was lost before the job's "
          "end was heard (" +
              s_.lost->message +
              "): exiting 0, as torchrun does when its exit barrier fails; each other node "
              "reports its own outcome");
      return finish(job_exit_code(JobOutcome::of(JobEnd::Succeeded)));
    }
    if (s_.lost) {
      log(LogLevel::Error, s_.lost->message);
      return finish(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)));
    }
    if (s_.closed) return conclude(*s_.closed);
    // A restart notice while the node checks itself: the check is already on the way to the
    // next join.
    if (s_.phase == AgentPhase::HealthCheck) return s_.restart.reset();
    if (s_.restart) {
      if (s_.backing_off) return;  // the Backoff timer rejoins
      const Duration pause = s_.backoff_over ? Duration{0}
                             : s_.restart->failures_in_a_row
                                 ? Duration{s_.restart->pause}
                                 : rdzv::restart_pause(s_.failures_in_a_row, spec_.restart_backoff,
                                                       spec_.restart_backoff_max);
      if (pause > Duration{0}) {
        // BetweenRounds (backing off): failures in a row; wait before the next round.
        s_.backing_off = true;
        const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(pause).count();
        out_.push_back(EmitEvent{EventName::RestartDelayed,
                                 {{"delay_ms", ms}, {"failures_in_a_row", s_.failures_in_a_row}}});
        log(LogLevel::Info,
            fmt::format(
                "waiting {:.1f} s before the next round: {} failures in a row, each "
                "within {} s of its start (--restart_backoff)",
                ms / 1000.0, s_.failures_in_a_row,
                std::chrono::duration_cast<std::chrono::seconds>(spec_.restart_backoff_reset)
                    .count()));
        out_.push_back(ArmTimer{AgentTimer::Backoff, now_ + pause});
        return;
      }
      // BetweenRounds -> Rendezvous: the rendezvous asked for a new round.
      s_.backoff_over = false;
      s_.restart.reset();
      return join_round();
    }
    // Otherwise the rendezvous has not answered this node's report yet.
  }

  /// The job is over: exit as the rendezvous says, the same on every node.
  void conclude(const rdzv::Closed& closed) {
    std::string kept_out;
    if (s_.phase == AgentPhase::HealthCheck && s_.health_failures > 0)
      kept_out = fmt::format(
          "the job ended while this node was kept out by its health check ({} failed check(s) "
          "in a row): ",
          s_.health_failures);
    else if (s_.phase == AgentPhase::HealthCheck && s_.first_check_listed)
      kept_out = "the job ended while this node's first health check was still running: ";
    // A join timeout says it once, as the error; any other end, as a warning before its own.
    if (!kept_out.empty() && closed.outcome != rdzv::JobOutcomeKind::TimedOut)
      log(LogLevel::Warn, kept_out + closed.message);
    switch (closed.outcome) {
      case rdzv::JobOutcomeKind::Succeeded:
        return finish(job_exit_code(JobOutcome::of(JobEnd::Succeeded)));
      case rdzv::JobOutcomeKind::TimedOut:
        log(LogLevel::Error,
            (kept_out.empty() ? std::string("rendezvous failed: ") : kept_out) + closed.message);
        return finish(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)));
      case rdzv::JobOutcomeKind::Failed:
        break;
    }
    // A job that failed without a worker failing (a node was lost) still must not exit 0.
    ExitStatus root{closed.exit_code, closed.signal};
    if (root.ok()) root.code = 1;
    JobOutcome outcome = JobOutcome::workers_failed(root, spec_.max_restarts);
    outcome.do_not_requeue = closed.do_not_requeue;
    const int code = job_exit_code(outcome);
    // Why no restart came, on every node, with the exit status it gives: a requeue would meet
    // the same failure (78), or the restart budget is used up (75).
    if (closed.do_not_requeue)
      log(LogLevel::Error,
          fmt::format("the job ends, not to be requeued (exit {}): {}", code, closed.message));
    else
      log(LogLevel::Error,
          fmt::format("the job ends (exit {}{}): {}", code,
                      spec_.max_restarts > 0 && code == common::kExitRestartsExhausted
                          ? ", a requeue may help"
                          : "",
                      closed.message));
    out_.push_back(ReportJobFailure{closed});
    finish(code);
  }

  void finish(int code) {
    // A stop signal, a closed job or a lost rendezvous during a pause: no round follows.
    if (s_.backing_off) out_.push_back(CancelTimer{AgentTimer::Backoff});
    s_.backing_off = false;
    // During a health check (or its wait): the check is stopped with the rest at Finish.
    if (s_.phase == AgentPhase::HealthCheck && !s_.checking)
      out_.push_back(CancelTimer{AgentTimer::HealthRetry});
    if (s_.phase == AgentPhase::HealthCheck && s_.checking && slow_check_noticed())
      out_.push_back(CancelTimer{AgentTimer::HealthSlow});
    s_.checking = false;
    s_.phase = AgentPhase::Finished;
    s_.exit_code = code;
    out_.push_back(Finish{code, running_pids(s_)});
  }

  AgentState& s_;
  TimePoint now_;
  const AgentSpec& spec_;
  Effects out_;
};

}  // namespace

void check_invariants(const AgentState& s) {
  DDPRUN_CHECK(!s.preparing || s.phase == AgentPhase::Launching,
               "a group is prepared only while it launches");
  DDPRUN_CHECK(s.next_launch <= s.workers.size() || s.phase != AgentPhase::Launching,
               "the next launch is a slot of the group");
  for (size_t f : s.failures)
    DDPRUN_CHECK(f < s.workers.size(), "a recorded failure is a slot of the group");
  DDPRUN_CHECK(s.phase != AgentPhase::Running || s.stop_reason == StopReason::None,
               "a group being stopped is Stopping, not Running");
  DDPRUN_CHECK(s.phase != AgentPhase::AwaitingZygote ||
                   (s.waiting_round.has_value() && s.zygote == ZygotePhase::Starting),
               "a group awaits the zygote with its round while the zygote starts");
}

std::vector<AgentEffect> agent_step(AgentState& state, const AgentEvent& event, TimePoint now,
                                    const AgentSpec& spec) {
  if (state.phase == AgentPhase::Finished) return {};
  Stepper stepper(state, now, spec);
  std::visit([&stepper](const auto& e) { stepper.on(e); }, event);
  check_invariants(state);
  return stepper.take();
}

}  // namespace ddprun::agent
