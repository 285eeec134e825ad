#pragma once
// What a recovery is, decided in one place: the agent's metrics (agent/agent_metrics.h) feed it
// events as they are written, `ddprun events summarize` (launcher/events.h) feeds it a whole
// log sorted by time, and both report the same recoveries with the same phases (but for a
// failure the job ended on, which the metrics counted as it began).
//
// A recovery begins with a failure this node detected (failure_detected) or a restart the
// rendezvous asked for (restart: another node's failure, a lost node), unless the node is in a
// recovery whose workers have not started again yet: the restart that follows a node's own
// failure, and the failures of other ranks in the same round, belong to it. Its phases end with
// the last event of each kind in its window, which closes at the next recovery, at a stop
// signal or at the job's end; a phase's end is when its last participant (node or rank) is
// done, because the job waits for the slowest. A failure the job ended on (no rendezvous
// followed it before job_end or a stop signal) is no recovery; it is counted as it begins
// (observe), in the agent's metrics too, and dropped from recoveries() at its end. A watchdog's
// failure (how "watchdog") began when the worker last made progress: its detect phase is the
// silence it was judged on (silent_ms).
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/event_names.h"

namespace ddprun::agent {

/// One recovery, cut into phases. Phases whose events are absent (a program without the SDK
/// reports no "pg_ready") are nullopt.
struct Recovery {
  long long restart_count = 0;  ///< of the restarted workers
  std::string cause;            ///< the failure (or the restart) as the log tells it
  /// fault_injected (or, for a hung worker, its last progress: silent_ms) -> failure_detected
  std::optional<double> detect_ms;
  std::optional<double> teardown_ms;  ///< the start -> last teardown_done
  /// -> the rendezvous_start after a restart_delayed: the pause of --restart_backoff.
  std::optional<double> backoff_ms;
  /// -> quarantine_over: the cooldown of a node the rendezvous quarantined (--quarantine_after).
  std::optional<double> quarantine_ms;
  std::optional<double> rendezvous_ms;     ///< -> last rendezvous_complete
  std::optional<double> spawn_ms;          ///< -> last workers_started
  std::optional<double> process_start_ms;  ///< -> last worker_main (exec, library loading)
  std::optional<double> pg_init_ms;        ///< -> last pg_ready (store and group connect)
  std::optional<double> snapshot_load_ms;  ///< -> last snapshot_loaded
  std::optional<double> first_step_ms;     ///< -> last first_step
  double total_ms = 0;  ///< from the fault (or the start) to the end of the last phase seen
};

/// Feeds on events in time order (times in seconds, any origin) and keeps every recovery.
class RecoveryTracker {
 public:
  /// Takes the next event; returns true when it began a recovery (counted then: a failure the
  /// job ends on is dropped from recoveries() only at job_end).
  bool observe(EventName event, const nlohmann::json& fields, double t);

  /// Every recovery so far, its phases as the events seen so far make them.
  std::vector<Recovery> recoveries() const;
  /// The last recovery's phases, if there was one.
  std::optional<Recovery> last() const;

 private:
  /// What a recovery's window has seen: when each phase's events last came.
  struct Window {
    double began = 0;
    std::string cause;
    std::optional<double> fault_at;
    std::map<EventName, double> last;          ///< phase event -> its last time in the window
    std::optional<double> delayed_at;          ///< the first restart_delayed
    std::optional<double> rejoined_at;         ///< the first rendezvous_start after it
    std::optional<double> quarantine_over_at;  ///< the quarantine_over of a quarantined node
    long long restart_count = 0;               ///< the restart's, then the last workers_started's
    bool resumed = false;                      ///< its workers started: a failure begins the next
    bool closed = false;                       ///< a stop signal or the job's end closed it
    bool rejoined = false;                     ///< a rendezvous_start came in it
    bool ended_job = false;  ///< the job's end or a stop closed it before any rendezvous
  };
  static Recovery phases_of(const Window& w);
  /// The windows that are recoveries (not a failure the job ended on).
  std::vector<const Window*> recovery_windows() const;

  std::vector<Window> windows_;
  std::optional<double> last_fault_;
};

/// A field of an event as an integer when it is one and fits, else `fallback`: a log is read
/// as it is, and a wrong-typed field (hand-edited, another tool's) must not abort anything.
long long event_int_field(const nlohmann::json& body, const char* key, long long fallback);
/// A string field of an event, made safe to print, or `fallback`.
std::string event_text_field(const nlohmann::json& body, const char* key,
                             const std::string& fallback);

}  // namespace ddprun::agent
