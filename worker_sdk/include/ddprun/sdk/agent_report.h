#pragma once
// Reports from a worker to the ddprun agent that started it (docs/usage.md#event-log-and-watchdog).
// No libtorch here: a program that does not use the rest of the SDK can report too.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::sdk {

/// Integer fields of a report, e.g. {"epoch", 3}.
using ReportFields = std::vector<std::pair<std::string, std::int64_t>>;

/// The datagram the agent reads: {"event":E,"local_rank":L,"pid":P,...fields} (event is
/// JSON-escaped). The pid lets the agent file a report that arrives after the worker's exit.
std::string format_report(const std::string& event, int local_rank, long pid,
                          const ReportFields& fields);

/// Sends one report to $DDPRUN_AGENT_SOCKET: a milestone ("pg_ready", "snapshot_loaded",
/// "first_step") for the agent's event log. Does nothing when the variable is unset (outside
/// ddprun, or without --event_log/--watchdog_timeout); never blocks and never throws, because
/// training must not depend on the agent reading.
void report_to_agent(const std::string& event, const ReportFields& fields = {});

/// Tells the agent's watchdog that this worker makes progress; sends at most one heartbeat
/// every 100 ms however often it is called (e.g. once per training step).
void report_progress();

}  // namespace ddprun::sdk
