#include "agent/recovery_tracker.h"

#include <climits>
#include <cstdint>
#include <iterator>
#include <sstream>
#include <utility>

#include "common/strings.h"

namespace ddprun::agent {

using nlohmann::json;

namespace {

/// The events that end a phase, in the order the phases follow one another (the back-off,
/// between teardown and rendezvous, is measured from restart_delayed and rendezvous_start).
constexpr EventName kTeardown = EventName::TeardownDone;
constexpr EventName kAfterBackoff[] = {EventName::RendezvousComplete, EventName::WorkersStarted,
                                       EventName::WorkerMain,         EventName::PgReady,
                                       EventName::SnapshotLoaded,     EventName::FirstStep};

/// How far back an injected fault (the fault harness's fault_injected) is the cause of a failure.
constexpr double kFaultWindowS = 60.0;

std::string describe_failure(const json& body) {
  std::ostringstream out;
  out << "rank " << event_int_field(body, "rank", -1);
  if (const long long signal = event_int_field(body, "signal", 0); signal != 0)
    out << " killed by signal " << signal;
  else
    out << " exited with " << event_int_field(body, "exit_code", 0);
  out << " (" << event_text_field(body, "how", "exit") << ")";
  if (std::string node = event_text_field(body, "node", ""); !node.empty()) out << " on " << node;
  return out.str();
}

}  // namespace

long long event_int_field(const json& body, const char* key, long long fallback) {
  if (!body.is_object()) return fallback;
  auto it = body.find(key);
  if (it == body.end()) return fallback;
  if (it->is_number_unsigned())
    return it->get<std::uint64_t>() <= static_cast<std::uint64_t>(LLONG_MAX)
               ? static_cast<long long>(it->get<std::uint64_t>())
               : fallback;
  return it->is_number_integer() ? it->get<long long>() : fallback;
}

std::string event_text_field(const json& body, const char* key, const std::string& fallback) {
  if (!body.is_object()) return fallback;
  auto it = body.find(key);
  return it != body.end() && it->is_string() ? common::printable(it->get<std::string>()) : fallback;
}

bool RecoveryTracker::observe(EventName event, const json& fields, double t) {
  if (event == EventName::FaultInjected) {
    last_fault_ = t;
    return false;
  }
  Window* current = windows_.empty() ? nullptr : &windows_.back();
  const bool open = current != nullptr && !current->closed;
  if (event == EventName::FailureDetected || event == EventName::Restart) {
    // Part of the recovery under way until its workers started again: the restart says its
    // count (a node that never starts its workers again, a quarantined one, shows it too).
    if (open && !current->resumed) {
      if (event == EventName::Restart)
        current->restart_count = event_int_field(fields, "restart_count", current->restart_count);
      return false;
    }
    if (current != nullptr) current->closed = true;
    Window w;
    w.began = t;
    w.cause = event == EventName::FailureDetected
                  ? describe_failure(fields)
                  : "restart: " + event_text_field(fields, "reason", "the rendezvous asked");
    if (last_fault_ && *last_fault_ >= t - kFaultWindowS && *last_fault_ <= t)
      w.fault_at = last_fault_;
    // A hung worker failed when it went silent, not when the watchdog killed it.
    if (const long long silent = event_int_field(fields, "silent_ms", -1);
        !w.fault_at && event == EventName::FailureDetected && silent >= 0 &&
        event_text_field(fields, "how", "") == "watchdog")
      w.fault_at = t - static_cast<double>(silent) / 1000.0;
    if (event == EventName::Restart) w.restart_count = event_int_field(fields, "restart_count", 0);
    windows_.push_back(std::move(w));
    return true;
  }
  if (!open) return false;
  // A job stopped by a signal (or ended) after the recovery tears down again: those lines
  // belong to the stop, not to the recovery.
  if (event == EventName::Signal || event == EventName::JobEnd) {
    current->closed = true;
    // Before any rendezvous after its failure: the job ended on it (a stop signal during the
    // teardown or the back-off ends it too), no recovery.
    current->ended_job = !current->rejoined && !current->resumed;
    return false;
  }
  if (event == EventName::RendezvousStart) current->rejoined = true;
  if (event == EventName::RestartDelayed && !current->delayed_at) current->delayed_at = t;
  if (event == EventName::QuarantineOver && !current->resumed && !current->quarantine_over_at)
    current->quarantine_over_at = t;
  if (event == EventName::RendezvousStart && current->delayed_at && !current->rejoined_at)
    current->rejoined_at = t;
  if (event == kTeardown) current->last[event] = t;
  for (const EventName phase : kAfterBackoff)
    if (event == phase) current->last[event] = t;
  if (event == EventName::WorkersStarted) {
    current->resumed = true;
    current->restart_count = event_int_field(fields, "restart_count", current->restart_count);
  }
  return false;
}

Recovery RecoveryTracker::phases_of(const Window& w) {
  Recovery r;
  r.cause = w.cause;
  r.restart_count = w.restart_count;
  if (w.fault_at) r.detect_ms = (w.began - *w.fault_at) * 1000.0;
  double at = w.began;
  auto phase = [&](EventName name, std::optional<double>& out) {
    auto it = w.last.find(name);
    if (it == w.last.end() || it->second < at) return;
    out = (it->second - at) * 1000.0;
    at = it->second;
  };
  phase(kTeardown, r.teardown_ms);
  if (w.delayed_at && w.rejoined_at && *w.rejoined_at >= at) {
    r.backoff_ms = (*w.rejoined_at - at) * 1000.0;
    at = *w.rejoined_at;
  }
  if (w.quarantine_over_at && *w.quarantine_over_at >= at) {
    r.quarantine_ms = (*w.quarantine_over_at - at) * 1000.0;
    at = *w.quarantine_over_at;
  }
  std::optional<double>* after_backoff[] = {&r.rendezvous_ms,    &r.spawn_ms,
                                            &r.process_start_ms, &r.pg_init_ms,
                                            &r.snapshot_load_ms, &r.first_step_ms};
  for (size_t i = 0; i < std::size(kAfterBackoff); ++i) phase(kAfterBackoff[i], *after_backoff[i]);
  r.total_ms = (at - (w.fault_at ? *w.fault_at : w.began)) * 1000.0;
  return r;
}

std::vector<const RecoveryTracker::Window*> RecoveryTracker::recovery_windows() const {
  std::vector<const Window*> out;
  for (const Window& w : windows_)
    if (!w.ended_job) out.push_back(&w);
  return out;
}

std::vector<Recovery> RecoveryTracker::recoveries() const {
  std::vector<Recovery> out;
  for (const Window* w : recovery_windows()) out.push_back(phases_of(*w));
  return out;
}

std::optional<Recovery> RecoveryTracker::last() const {
  const auto windows = recovery_windows();
  if (windows.empty()) return std::nullopt;
  return phases_of(*windows.back());
}

}  // namespace ddprun::agent
