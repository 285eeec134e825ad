#pragma once
// The names of ddprun's events, typed: one table (event_names.cpp) gives each its name in the
// event log (--event_log) and in `ddprun events summarize`. The agent's state machine emits
// them, and the metrics (agent_metrics.h) and the recovery tracker (recovery_tracker.h) read
// them by kind, never by their text.
#include <string_view>

namespace ddprun::agent {

enum class EventName {
  // The agent's lifecycle (agent_step).
  RendezvousStart,
  RendezvousComplete,
  RendezvousFailed,
  WorkersStarted,
  FailureDetected,
  TeardownDone,
  Restart,
  RestartDelayed,
  Signal,
  JobClosed,
  HealthCheckPassed,
  HealthCheckFailed,
  Quarantined,
  QuarantineOver,
  // The agent's executor.
  JobEnd,
  StacksDumped,
  LogWriteFailed,
  StandbysStarted,
  ZygoteStarted,
  ZygoteReady,
  // Reported by the workers (the SDK) or written by the fault harness.
  WorkerMain,
  PgReady,
  SnapshotLoaded,
  FirstStep,
  FaultInjected,
  /// A name ddprun does not know (a worker's own report, another tool's line): written and
  /// read as it is, never interpreted.
  Other,
};

/// The event's name in the log ("failure_detected"); "other" for Other.
std::string_view event_name(EventName event);

/// The event a log's name stands for; Other when ddprun does not know it.
EventName event_named(std::string_view name);

}  // namespace ddprun::agent
