#include "agent/event_names.h"

#include <array>
#include <utility>

namespace ddprun::agent {
namespace {

// clang-format off
constexpr std::array<std::pair<EventName, std::string_view>, 26> kNames = {{
    {EventName::RendezvousStart, "rendezvous_start"},
    {EventName::RendezvousComplete, "rendezvous_complete"},
    {EventName::RendezvousFailed, "rendezvous_failed"},
    {EventName::WorkersStarted, "workers_started"},
    {EventName::FailureDetected, "failure_detected"},
    {EventName::TeardownDone, "teardown_done"},
    {EventName::Restart, "restart"},
    {EventName::RestartDelayed, "restart_delayed"},
    {EventName::Signal, "signal"},
    {EventName::JobClosed, "job_closed"},
    {EventName::HealthCheckPassed, "health_check_passed"},
    {EventName::HealthCheckFailed, "health_check_failed"},
    {EventName::Quarantined, "quarantined"},
    {EventName::QuarantineOver, "quarantine_over"},
    {EventName::JobEnd, "job_end"},
    {EventName::StacksDumped, "stacks_dumped"},
    {EventName::LogWriteFailed, "log_write_failed"},
    {EventName::StandbysStarted, "standbys_started"},
    {EventName::ZygoteStarted, "zygote_started"},
    {EventName::ZygoteReady, "zygote_ready"},
    {EventName::WorkerMain, "worker_main"},
    {EventName::PgReady, "pg_ready"},
    {EventName::SnapshotLoaded, "snapshot_loaded"},
    {EventName::FirstStep, "first_step"},
    {EventName::FaultInjected, "fault_injected"},
    {EventName::Other, "other"},
}};
// clang-format on

constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (static_cast<std::size_t>(kNames[i].first) != i) return false;
  return static_cast<std::size_t>(EventName::Other) + 1 == kNames.size();
}
static_assert(in_enum_order(), "kNames has one row per EventName, in its order");

}  // namespace

std::string_view event_name(EventName event) {
  return kNames[static_cast<std::size_t>(event)].second;
}

EventName event_named(std::string_view name) {
  for (const auto& [event, text] : kNames)
    if (text == name && event != EventName::Other) return event;
  return EventName::Other;
}

}  // namespace ddprun::agent
