#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <deque>
#include <map>
#include <string>

#include "common/clock.h"
#include "common/enum_names.h"
#include "rendezvous/rdzv_state.h"
#include "rendezvous/server_metrics.h"

// What the rendezvous server saw of each job, for the daemon's status page
// (docs/operations.md#status-page): rounds opened and formed, failures reported, nodes lost or
// gone, the end. Fed with what step() received and returned, like ServerMetrics, so the state
// machine stays pure; no sockets, no clock reads (time is an argument).

namespace ddprun::rdzv {

enum class JobEventKind {
  RoundOpened,      ///< a round began forming: the first join, a restart or a scale-up
  RoundFormed,      ///< the round completed: every participant got its ranks
  FailureReported,  ///< a node reported a failed worker
  NodeLost,         ///< a node disconnected or went silent without leaving
  NodeLeft,         ///< a node left (its agent ended)
  Closed            ///< the job ended (succeeded, failed, timed out)
};

/// Names of JobEventKind in the status document.
inline constexpr std::array<common::EnumName<JobEventKind>, 6> kJobEventNames{{
    {JobEventKind::RoundOpened, "round_opened"},
    {JobEventKind::RoundFormed, "round_formed"},
    {JobEventKind::FailureReported, "failure_reported"},
    {JobEventKind::NodeLost, "node_lost"},
    {JobEventKind::NodeLeft, "node_left"},
    {JobEventKind::Closed, "closed"},
}};
static_assert(common::name_table_complete(kJobEventNames));

struct JobEvent {
  JobEventKind kind = JobEventKind::RoundOpened;
  TimePoint at;
  int round = 0;         ///< the round the event belongs to
  std::string node;      ///< the node's name, when one node is concerned
  std::string detail;    ///< the restart's reason, the failure, the outcome's message
  bool counted = false;  ///< RoundOpened: the restart used one of --max_restarts
  int nodes = 0;         ///< RoundFormed: participants
  std::string outcome;   ///< Closed: succeeded, failed or timed_out (kJobOutcomeNames)
};

/// At most this many events are kept per job (the oldest go first; `dropped` counts them).
constexpr std::size_t kMaxEventsPerJob = 200;

/// Why a round opened with no Restart sent: the last participant of the running round went
/// (`removed` names it), so nobody restarts until nodes join again.
std::string no_node_left(const std::vector<std::string>& removed);

/// The history of every job the server holds; a job's history goes when the job is forgotten.
class JobHistory {
 public:
  /// What one step() did to one job: `before` as step() received it (ServerMetrics takes the
  /// same snapshot), `event` what it was fed, `after` what it returned, at `now`.
  void stepped(const ServerMetrics::Before& before, const std::string& run_id, const Event& event,
               const StepResult& after, TimePoint now);

  struct Job {
    std::deque<JobEvent> events;
    std::size_t dropped = 0;
  };

  /// The job's history; nullptr when none was recorded.
  const Job* find(const std::string& run_id) const;

  std::size_t jobs() const { return jobs_.size(); }

 private:
  void add(Job& job, JobEvent event);
  std::map<std::string, Job> jobs_;
};

/// The job's events and recoveries as the status document shows them (times as seconds before
/// `now`): {"events": [...], "events_dropped": n, "recoveries": [...]}. A recovery runs from a
/// counted restart (its round_opened, or the failure report just before it) to the next
/// round_formed; one not formed yet has no "formed_ago_s".
nlohmann::json describe_history(const JobHistory::Job& job, TimePoint now);

}  // namespace ddprun::rdzv
