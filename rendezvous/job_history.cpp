#include "rendezvous/job_history.h"

#include <optional>

#include "common/strings.h"

namespace ddprun::rdzv {

using common::name_of;
using nlohmann::json;

std::string no_node_left(const std::vector<std::string>& removed) {
  return "the last node of the round went" +
         (removed.empty() ? std::string() : " (" + common::join(removed, ", ") + ")") +
         ": nobody restarts until nodes join again";
}

namespace {

JobEvent make_event(JobEventKind kind, TimePoint at, int round, std::string node,
                    std::string detail) {
  JobEvent e;
  e.kind = kind;
  e.at = at;
  e.round = round;
  e.node = std::move(node);
  e.detail = std::move(detail);
  return e;
}

}  // namespace

void JobHistory::add(Job& job, JobEvent event) {
  if (job.events.size() >= kMaxEventsPerJob) {
    job.events.pop_front();
    ++job.dropped;
  }
  job.events.push_back(std::move(event));
}

void JobHistory::stepped(const ServerMetrics::Before& before, const std::string& run_id,
                         const Event& event, const StepResult& after, TimePoint now) {
  if (after.erase) {
    jobs_.erase(run_id);  // the job's tombstone expired: its history goes with it
    return;
  }
  auto [it, fresh] = jobs_.try_emplace(run_id);
  Job& job = it->second;
  const JobState& state = after.state;
  const auto* from = std::get_if<FromNode>(&event);
  const auto* join = from ? std::get_if<Join>(&from->message) : nullptr;
  if (fresh) {
    JobEvent opened = make_event(JobEventKind::RoundOpened, now, before.round, "", "first join");
    if (join && join->resume) opened.detail = "nodes re-registered after a server restart";
    add(job, std::move(opened));
  }
  if (const auto* failed = from ? std::get_if<WorkersFailed>(&from->message) : nullptr) {
    auto node = state.nodes.find(from->node_id);
    add(job, make_event(JobEventKind::FailureReported, now, failed->round,
                        node == state.nodes.end() ? std::string() : node->second.request.name,
                        failed->description));
  }
  const bool lost =
      (std::holds_alternative<Disconnected>(event) || std::holds_alternative<Tick>(event)) &&
      before.phase != JobPhase::Closed && state.phase != JobPhase::Closed;
  const bool left =
      from && std::holds_alternative<Leave>(from->message) && state.phase != JobPhase::Closed;
  if (lost || left) {
    for (const std::string& name : after.removed)
      add(job, make_event(lost ? JobEventKind::NodeLost : JobEventKind::NodeLeft, now, before.round,
                          name, ""));
  }
  bool restarted = false;
  for (const Outgoing& out : after.messages) {
    if (const auto* ready = std::get_if<RoundReady>(&out.message);
        ready && ready->group_rank == 0) {
      JobEvent formed = make_event(JobEventKind::RoundFormed, now, ready->round, "", "");
      formed.nodes = ready->group_world_size;
      add(job, std::move(formed));
    } else if (const auto* restart = std::get_if<Restart>(&out.message); restart && !restarted) {
      // Every node hears the same Restart: the round opens once.
      restarted = true;
      JobEvent opened =
          make_event(JobEventKind::RoundOpened, now, restart->next_round, "", restart->reason);
      opened.counted = restart->counted;
      add(job, std::move(opened));
    }
  }
  if (!restarted && before.phase == JobPhase::Running && state.phase == JobPhase::Joining &&
      state.round > before.round) {
    // The last participant gone: the round opens (counted, as any loss) with nobody to tell.
    JobEvent opened =
        make_event(JobEventKind::RoundOpened, now, state.round, "", no_node_left(after.removed));
    opened.counted = state.restart_count > before.restart_count;
    add(job, std::move(opened));
  }
  if (before.phase != JobPhase::Closed && state.phase == JobPhase::Closed && state.closed) {
    JobEvent closed = make_event(JobEventKind::Closed, now, state.round, "", state.closed->message);
    closed.outcome = std::string(name_of(state.closed->outcome, kJobOutcomeNames));
    add(job, std::move(closed));
  }
}

const JobHistory::Job* JobHistory::find(const std::string& run_id) const {
  auto it = jobs_.find(run_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

namespace {

double seconds_between(TimePoint earlier, TimePoint later) {
  return std::chrono::duration<double>(later - earlier).count();
}

}  // namespace

json describe_history(const JobHistory::Job& job, TimePoint now) {
  json events = json::array();
  for (const JobEvent& e : job.events) {
    json entry = {{"kind", std::string(name_of(e.kind, kJobEventNames))},
                  {"ago_s", seconds_between(e.at, now)},
                  {"round", e.round}};
    if (!e.node.empty()) entry["node"] = e.node;
    if (!e.detail.empty()) entry["detail"] = e.detail;
    if (e.kind == JobEventKind::RoundOpened) entry["counted"] = e.counted;
    if (e.kind == JobEventKind::RoundFormed) entry["nodes"] = e.nodes;
    if (e.kind == JobEventKind::Closed) entry["outcome"] = e.outcome;
    events.push_back(std::move(entry));
  }
  // Recoveries: a counted restart, from the first failure or loss noticed since the last round
  // formed, to the next round formed.
  json recoveries = json::array();
  std::optional<TimePoint> trouble_at;  // the first failure or loss since the last round formed
  std::size_t open = 0;                 // 1 + the index of the recovery waiting for its round
  TimePoint open_started;
  for (const JobEvent& e : job.events) {
    switch (e.kind) {
      case JobEventKind::FailureReported:
      case JobEventKind::NodeLost:
        if (!trouble_at) trouble_at = e.at;
        break;
      case JobEventKind::RoundOpened:
        if (e.counted && open == 0) {
          const TimePoint started = trouble_at.value_or(e.at);
          recoveries.push_back({{"round", e.round},
                                {"cause", e.detail},
                                {"started_ago_s", seconds_between(started, now)},
                                {"restart_ago_s", seconds_between(e.at, now)}});
          open = recoveries.size();
          open_started = started;
        }
        break;
      case JobEventKind::RoundFormed:
        if (open != 0) {
          recoveries[open - 1]["formed_ago_s"] = seconds_between(e.at, now);
          recoveries[open - 1]["duration_s"] = seconds_between(open_started, e.at);
          open = 0;
        }
        trouble_at.reset();
        break;
      case JobEventKind::NodeLeft:
      case JobEventKind::Closed:
        break;
    }
  }
  return {{"events", std::move(events)},
          {"events_dropped", job.dropped},
          {"recoveries", std::move(recoveries)}};
}

}  // namespace ddprun::rdzv
