#pragma once
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/recovery_tracker.h"
#include "launcher/cli.h"

namespace ddprun::launcher {

/// One recovery read from an event log (agent/recovery_tracker.h says what a recovery is, for
/// the metrics as for the log).
using Recovery = agent::Recovery;

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
