#pragma once
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/result.h"

namespace ddprun::agent {

/// The recovery timeline (--event_log PATH): one JSON object per line, appended as things
/// happen, e.g.
///   {"t":12.503117,"time":1795000000.12,"node":"n1","event":"failure_detected","rank":3,...}
/// "t" is CLOCK_MONOTONIC in seconds (comparable between the processes of one machine), "time"
/// the wall clock. `ddprun events summarize` reads it back (docs/usage.md#event-log).
class EventLog {
 public:
  /// A log that writes nothing (no --event_log).
  EventLog() = default;
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  /// Opens `path` for appending; the error names the path and why not.
  std::optional<common::Error> open(const std::string& path, std::string node);

  bool enabled() const { return fd_ >= 0; }

  /// Appends one event at monotonic time `at`; `fields` (an object) are merged into the line.
  /// A failed write (a full disk) does not stop the job: the first is logged as a warning, and
  /// the destructor says how many events were lost.
  void write(std::string_view event, const nlohmann::json& fields, common::TimePoint at);

  /// Events that could not be written.
  std::size_t lost() const { return lost_; }

 private:
  int fd_ = -1;
  std::string node_;
  std::string path_;
  std::size_t lost_ = 0;
};

/// Monotonic seconds of a steady-clock time point, as written in "t".
double monotonic_seconds(common::TimePoint at);

}  // namespace ddprun::agent
