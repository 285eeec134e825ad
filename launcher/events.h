#pragma once
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/cli.h"

namespace ddprun::launcher {

/// One recovery read from an event log: from the failure (or the injected fault) to the
/// first training step of the restarted workers, cut into phases. A phase ends when its last
/// participant (node or rank) is done, because the job waits for the slowest one. Phases whose
/// events are absent (a program without the SDK reports no "pg_ready") are nullopt.
struct Recovery {
  long long restart_count = 0;        ///< of the restarted workers
  std::string cause;                  ///< the failure as the log tells it
  std::optional<double> detect_ms;    ///< fault_injected -> failure_detected
  std::optional<double> teardown_ms;  ///< failure_detected -> last teardown_done
  /// -> the rendezvous_start after a restart_delayed: the pause of --restart_backoff.
  std::optional<double> backoff_ms;
  std::optional<double> rendezvous_ms;     ///< -> last rendezvous_complete
  std::optional<double> spawn_ms;          ///< -> last workers_started
  std::optional<double> process_start_ms;  ///< -> last worker_main (exec, library loading)
  std::optional<double> pg_init_ms;        ///< -> last pg_ready (store and group connect)
  std::optional<double> snapshot_load_ms;  ///< -> last snapshot_loaded
  std::optional<double> first_step_ms;     ///< -> last first_step
  double total_ms = 0;  ///< from the fault (or failure) to the end of the last phase seen
};

struct EventSummary {
  std::vector<Recovery> recoveries;
  /// How the job ended, when the log says: job_end's exit status, and the last job_closed's
  /// message (why the rendezvous ended it) and whether it said not to requeue.
  std::optional<long long> exit_code;
  std::string closed_message;
  bool do_not_requeue = false;
  int lines = 0;
  int malformed_lines = 0;
};

/// Reads an event log's text (JSON lines, any order; sorted by "t").
EventSummary summarize_events(const std::string& text);

/// The recoveries as tables, or one line saying there was none.
std::string format_summary(const EventSummary& summary);
nlohmann::json summary_json(const EventSummary& summary);

/// `ddprun events summarize PATH [--json]`: returns the exit status.
int run_events(const std::vector<std::string>& args);

}  // namespace ddprun::launcher
