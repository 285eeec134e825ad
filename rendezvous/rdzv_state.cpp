#include "rendezvous/rdzv_state.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <set>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "common/strings.h"
#include "rendezvous/admission.h"
#include "rendezvous/rank_assignment.h"

namespace ddprun::rdzv {
namespace {

using std::chrono::duration_cast;

/// The job being stepped and the messages the step has produced so far.
struct Step {
  JobState s;
  std::vector<Outgoing> out;
  TimePoint now;
  bool erase = false;
  std::vector<std::string> removed{};  ///< StepResult::removed
};

/// "15 s" for whole seconds, "1500 ms" otherwise: users read these in error messages.
std::string duration_text(Millis ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000) + " s";
  return std::to_string(ms.count()) + " ms";
}

/// A time measured, as users read it: "600 s" from 10 s on (rounded), "3.0 s" from 1 s on,
/// "250 ms" below (a timer's lateness is no news: "3001 ms" for a 3 s timeout read as more).
std::string elapsed_text(Millis ms) {
  const long long n = ms.count();
  if (n >= 10'000) return std::to_string((n + 500) / 1000) + " s";
  if (n >= 1'000) {
    const long long tenths = (n + 50) / 100;
    return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
  }
  return std::to_string(n) + " ms";
}

Millis since(TimePoint from, TimePoint now) { return duration_cast<Millis>(now - from); }

bool is_participant(NodeState state) {
  return state == NodeState::Running || state == NodeState::Succeeded;
}

std::size_t slot(NodeState state) { return static_cast<std::size_t>(state); }

int count_in(const JobState& s, NodeState state) { return s.index.count_of(state); }

/// The node's entry in the job's table (it must be there).
const NodeEntry& entry_of(const JobState& s, std::string_view id) {
  auto it = s.nodes.find(id);
  DDPRUN_CHECK(it != s.nodes.end(), "rdzv_state: a node the job does not hold");
  return *it;
}
NodeEntry& entry_of(JobState& s, std::string_view id) {
  return const_cast<NodeEntry&>(entry_of(std::as_const(s), id));
}

/// The record of node `id` (the job must hold it).
const NodeRecord& node_at(const JobState& s, std::string_view id) { return entry_of(s, id).second; }
NodeRecord& node_at(JobState& s, std::string_view id) { return entry_of(s, id).second; }

int count_participants(const JobState& s) {
  return count_in(s, NodeState::Running) + count_in(s, NodeState::Succeeded);
}

/// Node ids matching `keep` (called with the node's record, or with its id and record),
/// in numeric-aware order of their names (node_id breaks ties), so that
/// every message list and every choice among nodes is deterministic.
template <typename Pred>
std::vector<std::string> ids_where(const JobState& s, Pred keep) {
  // Sorted as (name, id) pointers: no map look-ups inside the comparisons.
  std::vector<std::pair<const std::string*, const NodeId*>> keyed;
  for (const auto& [id, node] : s.nodes) {
    bool kept = false;
    if constexpr (std::is_invocable_v<Pred, const NodeId&, const NodeRecord&>)
      kept = keep(id, node);
    else
      kept = keep(node);
    if (kept) keyed.emplace_back(&node.request.name, &id);
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    if (natural_less(*a.first, *b.first)) return true;
    if (natural_less(*b.first, *a.first)) return false;
    return *a.second < *b.second;
  });
  std::vector<std::string> ids;
  ids.reserve(keyed.size());
  for (const auto& key : keyed) ids.push_back(key.second->str());
  return ids;
}

/// Ids of the nodes in `state`, in the order of ids_where, from the index.
std::vector<std::string> ids_in(const JobState& s, NodeState state) {
  std::vector<std::string> ids;
  const auto& keys = s.index.by_name[slot(state)];
  ids.reserve(keys.size());
  for (const NodeKey& key : keys) ids.push_back(key.id().str());
  return ids;
}

std::vector<std::string> names_of(const JobState& s, const std::vector<std::string>& ids) {
  std::vector<std::string> names;
  for (const std::string& id : ids) names.push_back(node_at(s, id).request.name);
  return names;
}

void send(Step& st, const NodeId& id, ServerMessage message, bool close_after = false) {
  st.out.push_back(Outgoing{id, std::move(message), close_after});
}

/// The same for an id given as a string: the node table's copy of it when the job holds the
/// node (a look-up, where a copy of the id would be an allocation).
void send(Step& st, std::string_view id, ServerMessage message, bool close_after = false) {
  auto it = st.s.nodes.find(id);
  send(st, it != st.s.nodes.end() ? it->first : NodeId(id), std::move(message), close_after);
}

// ---- the node table and its index ------------------------------------------------------------
// Every change of JobState::nodes goes through put_node, set_state, set_request and
// erase_node, which keep JobState::index in step; check_index() holds them to it.

/// Indexes a node of the job's table: the index points at the entry's id and name.
void index_in(NodeIndex& index, const NodeEntry& entry) {
  const auto& [id, node] = entry;
  ++index.count[slot(node.state)];
  if (node.previous_rank >= 0) ++index.previous_ranked;
  index.by_name[slot(node.state)].insert(NodeKey{&entry});
  if (node.request.node_rank) index.by_node_rank.emplace(*node.request.node_rank, &id);
  index.by_last_seen.insert(LastSeen{&entry});
}

void index_out(NodeIndex& index, const NodeEntry& entry) {
  const auto& [id, node] = entry;
  --index.count[slot(node.state)];
  if (node.previous_rank >= 0) --index.previous_ranked;
  index.by_name[slot(node.state)].erase(NodeKey{&entry});
  index.by_last_seen.erase(LastSeen{&entry});
  if (!node.request.node_rank) return;
  auto [first, last] = index.by_node_rank.equal_range(*node.request.node_rank);
  for (auto it = first; it != last; ++it) {
    if (*it->second == id) {
      index.by_node_rank.erase(it);
      return;
    }
  }
}

/// Adds a node, or replaces what the job holds of it (but its previous rank).
NodeRecord& put_node(JobState& s, std::string_view id, NodeRecord record) {
  auto it = s.nodes.find(id);
  if (it != s.nodes.end()) {
    index_out(s.index, *it);
    record.previous_rank = it->second.previous_rank;
    it->second = std::move(record);
  } else {
    it = s.nodes.emplace(NodeId(id), std::move(record)).first;
  }
  index_in(s.index, *it);
  return it->second;
}

NodeRecord& set_state(JobState& s, std::string_view id, NodeState state) {
  NodeEntry& entry = entry_of(s, id);
  index_out(s.index, entry);
  entry.second.state = state;
  index_in(s.index, entry);
  return entry.second;
}

/// A known node's new Join (its name or --node_rank may differ from the last).
void set_request(JobState& s, const std::string& id, const Join& join) {
  NodeEntry& entry = entry_of(s, id);
  index_out(s.index, entry);
  entry.second.request = node_join(join);
  index_in(s.index, entry);
}

/// Sets a node's previous rank (-1: none).
void set_previous_rank(JobState& s, NodeRecord& node, int rank) {
  s.index.previous_ranked += (rank >= 0 ? 1 : 0) - (node.previous_rank >= 0 ? 1 : 0);
  node.previous_rank = rank;
}

/// No node of the job has a previous rank any more.
void clear_previous_ranks(JobState& s) {
  if (s.index.previous_ranked == 0) return;
  for (auto& [id, node] : s.nodes) node.previous_rank = -1;
  s.index.previous_ranked = 0;
}

void erase_node(JobState& s, NodeTable::iterator it) {
  index_out(s.index, *it);
  s.nodes.erase(it);
}

/// The node was heard from at `now` (any message proves it alive).
void touch(JobState& s, NodeEntry& entry, TimePoint now) {
  NodeRecord& node = entry.second;
  // Nothing moves: the etcd driver marks every node seen before each event of its pass.
  if (node.last_seen == now) return;
  s.index.by_last_seen.erase(LastSeen{&entry});
  node.last_seen = now;
  s.index.by_last_seen.insert(LastSeen{&entry});
}

/// Jobs of at most this many nodes have their whole index checked after every step (tests and
/// fuzzers run those); larger ones only its total, so the check stays O(1) where it matters.
constexpr std::size_t kFullIndexCheckNodes = 64;

void check_index(const JobState& s) {
  int total = 0;
  for (const int count : s.index.count) total += count;
  DDPRUN_CHECK(total == static_cast<int>(s.nodes.size()),
               "rdzv_state: the node index counts another number of nodes than the job holds");
  if (s.nodes.size() > kFullIndexCheckNodes) return;
  JobState fresh;
  fresh.nodes = s.nodes;
  reindex(fresh);
  DDPRUN_CHECK(fresh.index.count == s.index.count && fresh.index.by_name == s.index.by_name &&
                   fresh.index.previous_ranked == s.index.previous_ranked,
               "rdzv_state: the node index disagrees with the nodes' states or names");
  const auto sorted = [](const std::multimap<int, const NodeId*>& ranks) {
    std::vector<std::pair<int, std::string_view>> v;
    for (const auto& [rank, id] : ranks) v.emplace_back(rank, id->view());
    std::sort(v.begin(), v.end());
    return v;
  };
  DDPRUN_CHECK(sorted(fresh.index.by_node_rank) == sorted(s.index.by_node_rank) &&
                   fresh.index.by_last_seen == s.index.by_last_seen,
               "rdzv_state: the node index disagrees with the nodes' --node_rank or last_seen");
}

/// --node_rank values in 0..min_nodes-1 that no joined node holds, when the nodes use
/// --node_rank: the first `limit` of them. Walks the index's ranks only as far as it must.
std::vector<int> missing_node_ranks(const JobState& s,
                                    std::size_t limit = std::numeric_limits<std::size_t>::max()) {
  std::vector<int> missing;
  const auto& ranks = s.index.by_node_rank;
  auto it = ranks.begin();
  for (int rank = 0; !ranks.empty() && rank < s.settings.min_nodes && missing.size() < limit;
       ++rank) {
    bool held = false;
    for (; it != ranks.end() && it->first <= rank; ++it)
      held = held || (it->first == rank && node_at(s, *it->second).state == NodeState::Joined);
    if (!held) missing.push_back(rank);
  }
  return missing;
}

/// "a, b, c" for the first kMaxNamesInMessage of `items`, then "and N more": one line for a
/// person to read, however many thousands of nodes a job has.
template <typename T, typename Text>
std::string few_of(const std::vector<T>& items, Text text) {
  std::string out;
  const std::size_t shown = std::min(items.size(), kMaxNamesInMessage);
  for (std::size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + text(items[i]);
  if (items.size() > shown) out += " and " + std::to_string(items.size() - shown) + " more";
  return out;
}

/// Names of the nodes in `state`, the first kMaxNamesInMessage in numeric-aware order, from the
/// index: a message never carries more, and a join must not walk thousands of nodes.
std::vector<std::string> first_names_in(const JobState& s, NodeState state) {
  std::vector<std::string> out;
  for (const NodeKey& key : s.index.by_name[slot(state)]) {
    if (out.size() == kMaxNamesInMessage) break;
    out.push_back(key.name());
  }
  return out;
}

/// The nodes in `states`, in the order of ids_where, as the index's keys: pointers into the node
/// table, valid while no node is removed (a round of 16,384 nodes copies no id to walk them).
std::vector<NodeKey> keys_in(const JobState& s, std::initializer_list<NodeState> states) {
  std::vector<NodeKey> keys;
  for (const NodeState state : states) {
    const auto& in_state = s.index.by_name[slot(state)];
    keys.insert(keys.end(), in_state.begin(), in_state.end());
  }
  if (states.size() > 1) std::sort(keys.begin(), keys.end(), NodeKeyLess{});
  return keys;
}

/// Who hears a Waiting broadcast: the wait-listed, and the forming round's members.
int waiting_listeners(const JobState& s) {
  return count_in(s, NodeState::WaitListed) +
         (s.phase == JobPhase::Joining ? count_in(s, NodeState::Joined) : 0);
}

/// When the quiet period after the last Waiting broadcast ends (waiting_quiet_until is set):
/// kWaitingQuietPeriod after it, or kWaitingPacePerListener per listener when that is longer.
TimePoint quiet_end(const JobState& s) {
  const Millis paced = kWaitingPacePerListener * waiting_listeners(s);
  return *s.waiting_quiet_until + std::max(Millis{0}, paced - kWaitingQuietPeriod);
}

/// Where the round stands, for the members of the forming round (and the wait-listed). Sent to
/// all of them at most once per quiet period (quiet_end()); in between only `trigger` (the node
/// whose join or return changed things) hears at once, and a broadcast is owed at the period's end.
int round_world_size(const JobState& s);

/// The longest pause the nodes take before they rejoin the round now forming.
Millis pause_before_round(const JobState& s) {
  return restart_pause(s.pause_count, s.settings.restart_backoff, s.settings.restart_backoff_max);
}

void send_waiting(Step& st, const std::string& trigger = "") {
  JobState& s = st.s;
  const bool quiet = s.waiting_quiet_until && st.now < quiet_end(s);
  const NodeState members =
      s.phase == JobPhase::Joining ? NodeState::Joined : NodeState::WaitListed;
  if (s.phase != JobPhase::Joining && s.phase != JobPhase::Running) return;
  const int count = count_in(s, members);
  // Made once, shared by every listener's Waiting (a broadcast to 16,384 nodes held 16,384
  // copies of the names).
  const SharedNames names = first_names_in(s, members);
  const Shared<std::vector<int>> missing =
      s.phase == JobPhase::Joining ? missing_node_ranks(s, kMaxNamesInMessage) : std::vector<int>{};
  // What a node on the wait list is told: while a round runs, its size; while one forms, its
  // places taken, by the nodes joined and those restarting into it. Once per broadcast.
  const int running = s.phase == JobPhase::Running ? round_world_size(s) : 0;
  const int taken = count + count_in(s, NodeState::Stopping);
  const Millis pause = pause_before_round(s);
  const auto waiting_for = [&](const NodeRecord& node) {
    // While a round runs, the wait list is who would join the next round; it has no deadline
    // (join_timeout 0): a place opens when the round loses a node or scales up.
    if (s.phase == JobPhase::Running) {
      Waiting spare{s.round + 1, names,     running, s.settings.min_nodes, s.settings.max_nodes, {},
                    Millis{0},   Millis{0}, true};
      spare.job_running = true;
      return spare;
    }
    const bool listed = node.state == NodeState::WaitListed;
    return Waiting{s.round, names, listed ? taken : count, s.settings.min_nodes,
                   s.settings.max_nodes, missing,
                   // Counted from the restart: the nodes' pause, then the join timeout.
                   std::max(Millis{0}, since(s.round_started - pause, st.now)),
                   s.settings.join_timeout + pause, listed};
  };
  const auto hears = [&](const NodeRecord& node) {
    return node.state == NodeState::WaitListed ||
           (s.phase == JobPhase::Joining && node.state == NodeState::Joined);
  };
  if (quiet) {
    // In the quiet period only the trigger hears now; anyone else is owed a broadcast.
    int listeners = waiting_listeners(s);
    if (auto it = s.nodes.find(trigger); it != s.nodes.end() && hears(it->second)) {
      send(st, trigger, waiting_for(it->second));
      --listeners;
    }
    if (listeners > 0) s.waiting_dirty = true;
    return;
  }
  for (const std::string& id : ids_where(s, hears)) send(st, id, waiting_for(node_at(s, id)));
  s.waiting_quiet_until = st.now + kWaitingQuietPeriod;
  s.waiting_dirty = false;
}

/// Ends the job: every node hears how, and the job stays as a tombstone for close_timeout.
void close_job(Step& st, Closed closed) {
  JobState& s = st.s;
  DDPRUN_CHECK(s.phase != JobPhase::Closed, "close_job: the job is already closed");
  s.phase = JobPhase::Closed;
  s.closed = closed;
  s.closed_at = st.now;
  s.last_call.reset();
  s.adopt_deadline.reset();
  for (const std::string& id : ids_where(s, [](const NodeRecord&) { return true; })) {
    send(st, id, closed, true);
  }
}

/// Promotes wait-listed nodes into the forming round while places are free; places of nodes that
/// are stopping to rejoin stay reserved for them, so survivors keep their ranks.
bool fill_places(JobState& s) {
  if (s.phase != JobPhase::Joining) return false;
  int room =
      s.settings.max_nodes - count_in(s, NodeState::Joined) - count_in(s, NodeState::Stopping);
  bool changed = false;
  for (const std::string& id : ids_in(s, NodeState::WaitListed)) {
    if (room <= 0) break;
    // WaitListed -> Joined: a place in the forming round is free
    set_state(s, id, NodeState::Joined);
    --room;
    changed = true;
  }
  return changed;
}

/// Starts the round: ranks, master address, RoundReady to each participant.
void complete_round(Step& st) {
  JobState& s = st.s;
  DDPRUN_CHECK(s.phase == JobPhase::Joining, "complete_round: no round is forming");
  std::vector<const NodeId*> joined;
  for (const NodeKey& key : keys_in(s, {NodeState::Joined})) joined.push_back(&key.id());
  DDPRUN_CHECK(!joined.empty() && static_cast<int>(joined.size()) <= s.settings.max_nodes,
               "complete_round: a round needs 1 to max_nodes joined nodes");
  const std::vector<const NodeId*> by_rank = assign_group_ranks(s.nodes, joined);
  // Every participant hears the same first names: made once and shared by every RoundReady
  // (SharedNames), and only for the first ids (not a name per participant to keep 16 of them).
  std::vector<std::string> first;
  for (std::size_t rank = 0; rank < by_rank.size() && rank < kMaxNamesInMessage; ++rank)
    first.push_back(node_at(s, *by_rank[rank]).request.name);
  const SharedNames names = std::move(first);
  const NodeJoin& master = node_at(s, *by_rank.front()).request;
  const int world_size = static_cast<int>(by_rank.size());
  st.out.reserve(st.out.size() + by_rank.size());
  for (std::size_t rank = 0; rank < by_rank.size(); ++rank) {
    const NodeId& id = *by_rank[rank];
    NodeRecord& node = set_state(s, id, NodeState::Running);
    node.group_rank = static_cast<int>(rank);
    send(st, id,
         RoundReady{s.round, node.group_rank, world_size, master.addr, master.master_port,
                    s.restart_count, names});
  }
  // The running round's ranks are its participants' group_rank: restart_round makes them the
  // previous ranks when the round ends.
  clear_previous_ranks(s);
  s.phase = JobPhase::Running;
  s.last_call.reset();
  s.waiting_dirty = false;
  s.waiting_quiet_until.reset();
}

/// Completes the forming round when it may, else keeps its last call deadline up to date.
void maybe_complete(Step& st) {
  JobState& s = st.s;
  if (s.phase != JobPhase::Joining || s.settings_from.empty()) return;
  const int joined = count_in(s, NodeState::Joined);
  if (joined >= s.settings.max_nodes) {
    // Joining -> Running: max nodes joined
    complete_round(st);
  } else if (joined >= s.settings.min_nodes && s.last_call && st.now >= *s.last_call) {
    // Joining -> Running: min nodes joined and the last call is over
    complete_round(st);
  } else if (s.round > 0 && joined >= s.settings.min_nodes &&
             count_in(s, NodeState::Stopping) == 0) {
    // Joining -> Running: a re-round in which every live node of the job rejoined
    complete_round(st);
  } else if (joined >= s.settings.min_nodes) {
    if (!s.last_call) s.last_call = st.now + s.settings.last_call_timeout;
  } else {
    s.last_call.reset();
  }
}

/// A Closed(Failed) whose message restart_round writes if the budget is used up.
Closed job_failed() {
  Closed closed;
  closed.outcome = JobOutcomeKind::Failed;
  return closed;
}

/// Forgets the counted restarts that fell out of --restart_window.
void forget_old_restarts(JobState& s, TimePoint now) {
  if (s.settings.restart_window.count() <= 0) return s.window_restarts.clear();
  while (!s.window_restarts.empty() && now - s.window_restarts.front() >= s.settings.restart_window)
    s.window_restarts.pop_front();
}

/// The counted restarts --max_restarts is held against: the job's, or the window's.
int restarts_used(const JobState& s) {
  return s.settings.restart_window.count() > 0 ? static_cast<int>(s.window_restarts.size())
                                               : s.restart_count;
}

/// Why a Closed(Failed) ends the job when a restart is needed and the budget is used up.
std::string budget_used_up(const JobState& s, const std::string& reason) {
  if (s.settings.restart_window.count() > 0)
    return reason + "; no restart left: " + std::to_string(restarts_used(s)) +
           " restarts in the last " + seconds_text(s.settings.restart_window) +
           " s (--max_restarts " + std::to_string(s.settings.max_restarts) + ", --restart_window " +
           seconds_text(s.settings.restart_window) + ")";
  return reason + "; no restart left: " + std::to_string(s.restart_count) + " of --max_restarts " +
         std::to_string(s.settings.max_restarts) + " used";
}

/// Whether the budget (of the window, after forgetting the restarts that fell out of it) has a
/// counted restart left.
bool restart_left(JobState& s, TimePoint now) {
  forget_old_restarts(s, now);
  return restarts_used(s) < s.settings.max_restarts;
}

/// Stops the running round and forms the next one. `rejoiner` (if any) already asked to join
/// and goes straight to Joined instead of being told to restart.
void restart_round(Step& st, const std::string& reason, bool counted, Closed if_no_budget,
                   const std::string& rejoiner = {}, bool repeat = false) {
  JobState& s = st.s;
  DDPRUN_CHECK(s.phase == JobPhase::Running, "restart_round: no round is running");
  if (counted && !restart_left(s, st.now)) {
    // Running -> Closed: a restart is needed and the budget (of the window) is used up
    if_no_budget.outcome = JobOutcomeKind::Failed;
    // What the caller adds (a crash loop's account) follows the budget's.
    if_no_budget.message = budget_used_up(s, reason) + if_no_budget.message;
    close_job(st, if_no_budget);
    return;
  }
  if (counted) {
    // The nodes' pause before they rejoin (--restart_backoff) grows with a counted repeat; any
    // other counted restart starts it afresh, an uncounted one keeps it.
    s.pause_count = repeat ? s.pause_count + 1 : 1;
    // A node back from a quarantine is watched until the next counted restart only.
    for (auto& [identity, standing] : s.standing) standing.relapse_armed = false;
    ++s.restart_count;
    if (s.settings.restart_window.count() > 0) s.window_restarts.push_back(st.now);
  }
  // Every node pauses as long (its Restart says), and the next round forms after that.
  const Millis pause = pause_before_round(s);
  clear_previous_ranks(s);
  // The loop changes the participants' states, never their keys: the keys stay valid.
  const std::vector<NodeKey> participants = keys_in(s, {NodeState::Running, NodeState::Succeeded});
  // One Restart each: grown by doubling, the list would hold up to three times its size while
  // a job of 16,384 nodes restarts.
  st.out.reserve(st.out.size() + participants.size());
  const SharedText shared_reason = reason;  // one copy for every participant's Restart
  for (const NodeKey& key : participants) {
    const NodeId& id = key.id();
    NodeRecord& node = node_at(s, id);
    if (node.group_rank >= 0) set_previous_rank(s, node, node.group_rank);
    node.group_rank = -1;
    if (id == rejoiner) {
      set_state(s, id, NodeState::Joined);
      continue;
    }
    set_state(s, id, NodeState::Stopping);
    Restart restart{s.round + 1, shared_reason, counted, s.restart_count};
    restart.repeat = repeat;
    restart.failures_in_a_row = s.pause_count;
    restart.pause = pause;
    if (s.settings.restart_window.count() > 0) {
      restart.window_restarts = static_cast<int>(s.window_restarts.size());
      restart.window = s.settings.restart_window;
    }
    send(st, id, std::move(restart));
  }
  ++s.round;
  s.phase = JobPhase::Joining;
  // The round forms once the nodes' pause is over: its join timeout starts then.
  s.round_started = st.now + pause;
  s.last_call.reset();
  s.adopt_deadline.reset();
  s.waiting_quiet_until.reset();  // a new round: everyone hears of it at once
  fill_places(s);
  maybe_complete(st);
  if (s.phase == JobPhase::Joining) send_waiting(st);
}

/// Starts a scale-up round when nodes wait, the round runs under max nodes and nothing has
/// finished yet. Returns whether it did.
bool maybe_scale_up(Step& st) {
  JobState& s = st.s;
  if (s.phase != JobPhase::Running || s.adopt_deadline) return false;
  const std::vector<std::string> waiting = ids_in(s, NodeState::WaitListed);
  const int participants = count_participants(s);
  if (waiting.empty() || participants >= s.settings.max_nodes) return false;
  if (count_in(s, NodeState::Succeeded) > 0) return false;  // the job is finishing
  const int next = std::min(s.settings.max_nodes, participants + static_cast<int>(waiting.size()));
  // Running -> Joining (not counted): newcomers while the round runs under max nodes. The round
  // ended without a failure: a crash loop's failures are no longer in a row.
  s.repeated_failure.clear();
  s.failure_repeats = 0;
  restart_round(st,
                common::join(names_of(s, waiting), ", ") + " joined: scaling up from " +
                    std::to_string(participants) + " to " + std::to_string(next) + " nodes",
                false, Closed{});
  return true;
}

/// Closes the job once every participant's workers succeeded.
void maybe_close_succeeded(Step& st) {
  JobState& s = st.s;
  if (s.phase != JobPhase::Running || s.adopt_deadline) return;
  const int succeeded = count_in(s, NodeState::Succeeded);
  if (succeeded == 0 || count_in(s, NodeState::Running) > 0) return;
  // Running -> Closed: every participant's workers succeeded
  close_job(st, Closed{JobOutcomeKind::Succeeded,
                       "the workers of all " + std::to_string(succeeded) +
                           " nodes succeeded in round " + std::to_string(s.round),
                       0, 0, false});
}

/// Forgets a node (left, disconnected, silent, refused) and repairs the job around the gap.
void remove_node(Step& st, const std::string& id, const std::string& reason, bool tell = false) {
  JobState& s = st.s;
  auto it = s.nodes.find(id);
  if (it == s.nodes.end()) return;
  const NodeState was = it->second.state;
  const std::string name = it->second.request.name;
  st.removed.push_back(name);
  erase_node(s, it);
  if (tell) {
    // Its id is dead from now on: if the node is alive (a partition), it rejoins as a newcomer.
    s.dropped_ids.push_back(id);
    if (s.dropped_ids.size() > kMaxDroppedIds) s.dropped_ids.pop_front();
  }
  if (s.phase == JobPhase::Running) {
    if (was == NodeState::Running) {
      // Running -> Joining (counted): a participant was lost; its workers' state is gone. A
      // loss is no repeat of a worker's failure: a crash loop counts afresh after it.
      s.repeated_failure.clear();
      s.failure_repeats = 0;
      restart_round(st, reason, true, job_failed());
    } else if (was == NodeState::Succeeded) {
      maybe_close_succeeded(st);
    }
  } else if (s.phase == JobPhase::Joining) {
    // Joining -> Joining: the forming round lost a member (under min: last call cancelled)
    const bool promoted = fill_places(s);
    maybe_complete(st);
    if (s.phase == JobPhase::Joining && (was == NodeState::Joined || promoted)) send_waiting(st);
  }
  // A node dropped for silence may still listen: it hears why and its connection ends, so it
  // does not wait for a job that has gone on without it. If the loss ended the job, it hears
  // the job's end instead, and exits with it like every other node.
  if (tell && s.phase == JobPhase::Closed && s.closed) {
    send(st, id, *s.closed, true);
  } else if (tell) {
    send(st, id,
         Refused{RefusalKind::Dropped,
                 reason + "; node " + name + " is no longer part of job '" + s.run_id + "'"},
         true);
  }
}

/// Refuses a Join; a node already in the job is removed as if it had left.
void refuse(Step& st, const std::string& id, RefusalKind kind, const std::string& message) {
  send(st, id, Refused{kind, message}, true);
  if (st.s.nodes.count(id)) {
    remove_node(st, id, "node " + node_at(st.s, id).request.name + " was refused: " + message);
  }
}

/// The world size of the running round: the claimed one while adopting, else its participants.
int round_world_size(const JobState& s) {
  for (const auto& [id, node] : s.nodes) {
    if (is_participant(node.state) && node.request.resume) {
      return node.request.resume->group_world_size;
    }
  }
  return count_participants(s);
}

/// Whether a re-registering node's claim fits the running round: same round and restart count,
/// same world size and master, and a group rank nobody else holds.
bool claim_fits(const JobState& s, const std::string& id, const RoundClaim& claim) {
  if (s.phase != JobPhase::Running || claim.round != s.round ||
      claim.restart_count != s.restart_count || claim.group_world_size != round_world_size(s)) {
    return false;
  }
  for (const auto& [other_id, node] : s.nodes) {
    if (!is_participant(node.state)) continue;
    if (other_id == id) {
      if (node.group_rank != claim.group_rank) return false;
      continue;
    }
    if (node.group_rank == claim.group_rank) return false;
    // Every participant must have been told the same master; a resumed one's claim says which,
    // a RoundReady one got it from group rank 0's Join.
    if (node.request.resume) {
      if (node.request.resume->master_addr != claim.master_addr ||
          node.request.resume->master_port != claim.master_port) {
        return false;
      }
    } else if (node.group_rank == 0 && (node.request.addr != claim.master_addr ||
                                        node.request.master_port != claim.master_port)) {
      return false;
    }
  }
  return true;
}

/// Group ranks of the adopted round nobody has re-registered for (yet).
std::vector<int> unclaimed_ranks(const JobState& s) {
  std::set<int> held;
  for (const auto& [id, node] : s.nodes) {
    if (is_participant(node.state)) held.insert(node.group_rank);
  }
  std::vector<int> missing;
  for (int rank = 0; rank < round_world_size(s); ++rank) {
    if (!held.count(rank)) missing.push_back(rank);
  }
  return missing;
}

/// Ends the adoption window once every group rank of the adopted round is back.
void finish_adoption_if_complete(Step& st) {
  JobState& s = st.s;
  if (s.phase != JobPhase::Running || !s.adopt_deadline || !unclaimed_ranks(s).empty()) return;
  s.adopt_deadline.reset();
  maybe_close_succeeded(st);
  maybe_scale_up(st);
}

NodeRecord record_for(const Join& join, NodeState state, int group_rank, TimePoint now) {
  return NodeRecord{node_join(join), state, group_rank, -1, now};
}

/// A Join carrying a RoundClaim: the node's workers run a round it got before losing its
/// connection (typically the server restarted).
void on_resume_join(Step& st, const std::string& id, const Join& join) {
  JobState& s = st.s;
  const RoundClaim& claim = *join.resume;
  const NodeState claimed_state = claim.succeeded ? NodeState::Succeeded : NodeState::Running;
  if (s.phase == JobPhase::Joining && s.round == 0) {
    // [none] -> Running: the server restarted and a node re-registers its running round; nodes
    // that only waited for a round are wait-listed behind it (one kept out by its health
    // check stays out: it asked for no round)
    for (const std::string& other_id :
         ids_where(s, [](const NodeRecord& node) { return node.state != NodeState::KeptOut; }))
      set_state(s, other_id, NodeState::WaitListed);
    s.phase = JobPhase::Running;
    s.round = claim.round;
    s.restart_count = claim.restart_count;
    s.round_started = st.now;
    s.last_call.reset();
    s.adopt_deadline = st.now + s.settings.adoption_window();
    s.waiting_quiet_until.reset();  // the job is Running again: the wait-listed hear it at once
    clear_previous_ranks(s);
    set_previous_rank(s, put_node(s, id, record_for(join, claimed_state, claim.group_rank, st.now)),
                      claim.group_rank);
    finish_adoption_if_complete(st);
    if (s.phase == JobPhase::Running) send_waiting(st, id);  // to the wait-listed, if any
    return;
  }
  if (s.phase == JobPhase::Running) {
    if (claim_fits(s, id, join.resume.value())) {
      // Running -> Running: a participant of the running round re-registered; it carries on
      set_previous_rank(s,
                        put_node(s, id, record_for(join, claimed_state, claim.group_rank, st.now)),
                        claim.group_rank);
      finish_adoption_if_complete(st);
      return;
    }
    if (!s.adopt_deadline && s.nodes.count(id) == 0) {
      // Running -> Running: a node the round does not know claims another round while nothing
      // of the running one is in doubt (formed here, or taken back whole after a restart): a
      // stale claim, or a made-up one. The claimant alone stops its workers and joins as a
      // newcomer; the round goes on.
      put_node(s, id, record_for(join, NodeState::Stopping, -1, st.now));
      send(st, id,
           Restart{s.round,
                   "node " + join.name + " re-registered round " + std::to_string(claim.round) +
                       ", but job '" + s.run_id + "' runs round " + std::to_string(s.round) +
                       " without it",
                   false, s.restart_count});
      return;
    }
    // Running -> Joining (not counted): the claim conflicts with the running round while it is
    // being taken back, so nobody can tell which group is right; everyone (the claimant too)
    // stops and forms a new round
    const std::string reason =
        "node " + join.name + " claims round " + std::to_string(claim.round) + " (group rank " +
        std::to_string(claim.group_rank) + " of " + std::to_string(claim.group_world_size) +
        ", restart count " + std::to_string(claim.restart_count) +
        "), which conflicts with the running round " + std::to_string(s.round);
    put_node(s, id, record_for(join, NodeState::Running, -1, st.now));
    restart_round(st, reason, false, Closed{});
    return;
  }
  // Joining -> Joining: the node's workers run a round that has ended; it stops them and joins
  // the forming round like every other restarted node
  put_node(s, id, record_for(join, NodeState::Stopping, -1, st.now));
  send(st, id,
       Restart{s.round,
               "node " + join.name + " re-registered round " + std::to_string(claim.round) +
                   ", but job '" + s.run_id + "' is forming round " + std::to_string(s.round),
               false, s.restart_count});
}

/// Whether nodes of `identity` are kept out of the job at `now`.
bool under_quarantine(const JobState& s, const std::string& identity, TimePoint now) {
  auto it = s.standing.find(identity);
  return it != s.standing.end() && it->second.until && now < *it->second.until;
}

/// How long the next quarantine of a node quarantined `before` times lasts: the cooldown,
/// doubled per earlier quarantine, at most the maximum.
Millis cooldown_after(const RdzvSettings& settings, int before) {
  Millis cooldown = settings.quarantine_cooldown;
  for (int i = 0; i < before && cooldown < settings.quarantine_cooldown_max; ++i) cooldown *= 2;
  return std::min(cooldown, settings.quarantine_cooldown_max);
}

/// Counts a group failure against `culprit`; every other identity's run of failures ends.
/// Returns how many in a row `culprit` has caused now.
int count_failure(JobState& s, const std::string& culprit) {
  for (auto it = s.standing.begin(); it != s.standing.end();) {
    if (it->first != culprit) it->second.failures_in_a_row = 0;
    // Nothing to remember of it: no run of failures, no quarantine to double.
    if (it->first != culprit && it->second.quarantines == 0 && !it->second.until)
      it = s.standing.erase(it);
    else
      ++it;
  }
  return ++s.standing[culprit].failures_in_a_row;
}

/// Whether the job can go on without every node of `identity`: the others (participants,
/// spares, nodes of the forming round) are at least min_nodes.
bool can_go_on_without(const JobState& s, const std::string& identity) {
  int others = 0;
  for (const auto& [id, node] : s.nodes)
    if (node.state != NodeState::Quarantined && node.state != NodeState::KeptOut &&
        node_identity(id, node.request) != identity)
      ++others;
  return others >= s.settings.min_nodes;
}

/// The Waiting a quarantined node hears when it joins: why, and for how long.
Waiting quarantine_waiting(const JobState& s, const NodeStanding& standing, TimePoint now) {
  Waiting w;
  w.round = s.round;
  w.joined_count = count_participants(s);
  w.min_nodes = s.settings.min_nodes;
  w.max_nodes = s.settings.max_nodes;
  w.wait_listed = true;
  w.quarantined = standing.why;
  w.quarantine_left = standing.until ? std::max(Millis{0}, since(now, *standing.until)) : Millis{0};
  return w;
}

/// Running -> Joining (counted), with the failing node quarantined: every node of `identity`
/// leaves the job before the restart, so a spare (or the elastic minimum) takes its place.
void quarantine_and_restart(Step& st, const std::string& identity, const std::string& reason,
                            Closed if_no_budget, bool relapsed) {
  JobState& s = st.s;
  NodeStanding& standing = s.standing[identity];
  const Millis cooldown = cooldown_after(s.settings, standing.quarantines);
  const std::vector<std::string> ids = ids_where(s, [&](const NodeId& id, const NodeRecord& node) {
    return node.state != NodeState::Quarantined && node.state != NodeState::KeptOut &&
           node_identity(id, node.request) == identity;
  });
  const std::string names = common::join(names_of(s, ids), ", ");
  standing.why =
      relapsed ? "its workers failed again, with no progress, after its last quarantine: " + reason
               : "its workers caused " + std::to_string(standing.failures_in_a_row) +
                     " group failures in a row (--quarantine_after " +
                     std::to_string(s.settings.quarantine_after) + "), the last: " + reason;
  ++standing.quarantines;
  standing.failures_in_a_row = 0;
  standing.until = st.now + cooldown;
  for (const std::string& id : ids) {
    // Running -> Quarantined: its workers stop like everyone's, but it sits out the next rounds
    set_state(s, id, NodeState::Quarantined).group_rank = -1;
  }
  restart_round(
      st,
      reason + "; node " + names + " is quarantined for " + duration_text(cooldown) +
          (relapsed ? " (it failed again after its last quarantine, with no progress)"
                    : " (--quarantine_after " + std::to_string(s.settings.quarantine_after) + ")"),
      true, std::move(if_no_budget));
  if (s.phase == JobPhase::Closed) return;  // the budget was used up: everyone heard the end
  for (const std::string& id : ids) {
    Restart restart{
        s.round,
        "node " + names + " is quarantined for " + duration_text(cooldown) + ": " + standing.why,
        true, s.restart_count, cooldown};
    restart.repeat = false;  // it waits out its cooldown, no back-off on top
    send(st, id, std::move(restart));
  }
}

/// Ends quarantines that are over, or that keep the forming round under min_nodes: the node is
/// forgotten and told to join again (it checks itself first, and comes back as a newcomer: a
/// spare while the round runs).
void release_quarantines(Step& st) {
  JobState& s = st.s;
  // Every step runs this (a heartbeat too): without a quarantine it costs no pass over nodes.
  if (s.phase == JobPhase::Closed ||
      std::none_of(s.standing.begin(), s.standing.end(),
                   [](const auto& entry) { return entry.second.until.has_value(); }))
    return;
  const bool short_of_nodes = s.phase == JobPhase::Joining && !s.settings_from.empty() &&
                              count_in(s, NodeState::Joined) + count_in(s, NodeState::Stopping) +
                                      count_in(s, NodeState::WaitListed) <
                                  s.settings.min_nodes;
  for (auto& [identity, standing] : s.standing) {
    if (!standing.until) continue;
    const bool over = st.now >= *standing.until;
    if (!over && !short_of_nodes) continue;
    standing.until.reset();
    standing.relapse_armed = true;
    const std::string why = over ? "its quarantine is over"
                                 : "the job needs it: the round it forms is short of min_nodes";
    const std::string id_of = identity;
    for (const std::string& id : ids_where(s, [&](const NodeId&node_id, const NodeRecord&node) {
           return node.state == NodeState::Quarantined &&
                  node_identity(node_id, node.request) == id_of;
         })) {
      // Quarantined -> [forgotten]: it joins again as a newcomer, after its health check
      const std::string name = node_at(s, id).request.name;
      erase_node(s, s.nodes.find(id));
      send(st, id,
           Restart{s.round,
                   "node " + name + " may take part in job '" + s.run_id + "' again: " + why +
                       "; it joins as a newcomer",
                   false, s.restart_count});
    }
  }
}

/// After remove_node took a node out because of its own join: whether that ended the job. The
/// node is no longer in the table, so close_job did not tell it; it hears the end here.
bool told_end_after_removal(Step& st, const std::string& id) {
  if (st.s.phase != JobPhase::Closed) return false;
  if (st.s.closed) send(st, id, *st.s.closed, true);
  return true;
}

/// A Join with kept_out: the node's health check failed. It stays known to the job (status
/// lists it, it hears the job's end) but no round places it, and no deadline waits for it.
void on_kept_out_join(Step& st, const std::string& id, const Join& join) {
  JobState& s = st.s;
  auto it = s.nodes.find(id);
  if (it != s.nodes.end() && it->second.state != NodeState::KeptOut) {
    // Its place in the running round (or its reserved place in the forming one) goes, as if it
    // had left: the round forms without waiting for it, and a spare may take the place
    remove_node(st, id, "node " + join.name + " is kept out by its health check: " + join.kept_out);
    if (told_end_after_removal(st, id)) return;
    it = s.nodes.end();
  }
  if (it == s.nodes.end()) {
    // [new] -> KeptOut
    put_node(s, id, record_for(join, NodeState::KeptOut, -1, st.now));
  } else {
    // KeptOut -> KeptOut: a later failed check (its reason may differ)
    set_request(s, id, join);
  }
}

void on_join(Step& st, const std::string& id, Join join) {
  JobState& s = st.s;
  join.node_id = id;  // the connection's identity is authoritative
  if (std::find(s.dropped_ids.begin(), s.dropped_ids.end(), id) != s.dropped_ids.end()) {
    // [dropped] -> [dropped]: a dropped id is dead; the node rejoins with a new one, as a
    // newcomer (a node of a job that has ended hears the end, and exits with the job's result)
    if (s.phase == JobPhase::Closed && s.closed) {
      send(st, id, *s.closed, true);
    } else {
      send(st, id,
           Refused{RefusalKind::Dropped,
                   "node " + join.name + " was dropped from job '" + s.run_id +
                       "' (nothing heard from it for the keep-alive window) and its id is no "
                       "longer valid: it joins again as a new node"},
           true);
    }
    return;
  }
  if (s.phase == JobPhase::Closed && !join.kept_out.empty() && s.closed) {
    // Closed -> Closed: a node kept out by its health check hears the job's end, and exits with
    // it like every node of the job
    send(st, id, *s.closed, true);
    return;
  }
  if (s.phase == JobPhase::Closed) {
    // Closed -> Closed: a late join is refused with the job's end
    const std::string end = s.closed ? s.closed->message : "it ended";
    send(st, id,
         Refused{RefusalKind::Closed, "job '" + s.run_id + "' is closed (" + end +
                                          "): start a new job with another --rdzv_id"},
         true);
    return;
  }
  if (auto refusal = check_join(s, join)) {
    // [new] -> [refused], or a known node -> [removed]: admission.h says why, in the user's words
    refuse(st, id, refusal->kind, refusal->message);
    return;
  }
  const bool first = s.settings_from.empty();
  if (first) {
    s.settings = join.settings;
    s.settings_from = join.name;
    s.round_started = st.now;  // round 0 forms from the first Join on
  }
  // A node remembers the job's count: a restarted server keeps counting where it was, so
  // losing the server cannot hand out restarts again. Only while the job has not completed a
  // round here (the server was just started), while it takes back a round after a restart, or
  // from a node the job knows: a newcomer to a job that runs cannot spend its budget, with a
  // claim or without.
  const bool rebuilding =
      s.round == 0 && s.phase == JobPhase::Joining && s.index.previous_ranked == 0;
  if (rebuilding || (join.resume && (s.adopt_deadline || s.nodes.count(id) > 0)))
    s.restart_count = std::max(s.restart_count, join.restart_count);
  if (!join.kept_out.empty()) {
    on_kept_out_join(st, id, join);
    return;
  }
  if (join.resume) {
    on_resume_join(st, id, join);
    return;
  }
  if (const std::string identity = node_identity(join); under_quarantine(s, identity, st.now)) {
    // any -> Quarantined: a node of a quarantined host (a restarted agent, too) waits it out
    auto it = s.nodes.find(id);
    if (it != s.nodes.end() && it->second.state != NodeState::Quarantined) {
      // Its place in the running round (or the forming one) goes, as if it had left
      remove_node(st, id, "node " + join.name + " is quarantined");
      if (told_end_after_removal(st, id)) return;
      put_node(s, id, record_for(join, NodeState::Quarantined, -1, st.now));
    } else if (it == s.nodes.end()) {
      put_node(s, id, record_for(join, NodeState::Quarantined, -1, st.now));
    } else {
      set_request(s, id, join);
    }
    send(st, id, quarantine_waiting(s, s.standing.at(identity), st.now));
    return;
  }

  auto known = s.nodes.find(id);
  if (known != s.nodes.end() && known->second.state == NodeState::KeptOut) {
    // KeptOut -> [new]: its health check passed; it joins as a newcomer
    erase_node(s, known);
    known = s.nodes.end();
  }
  if (known != s.nodes.end()) {
    const NodeState was = known->second.state;
    if (was == NodeState::Succeeded) return;  // finished; waits for the job to close
    set_request(s, id, join);
    if (s.phase == JobPhase::Joining) {
      if (was == NodeState::Stopping) {
        // Stopping -> Joined: a restarted node joins the forming round (its place was kept)
        set_state(s, id, NodeState::Joined);
        maybe_complete(st);
      }
      if (s.phase == JobPhase::Joining) send_waiting(st, id);
    } else if (was == NodeState::Running) {
      // Running -> Joining (counted): a participant left its running round to join again, so its
      // workers stopped; leaving and rejoining must not bypass --max_restarts
      const std::string reason =
          "node " + join.name + " left round " + std::to_string(s.round) + " and joined again";
      restart_round(st, reason, true, job_failed(), id);
    } else if (was == NodeState::Stopping) {
      // Stopping -> WaitListed: the round it was to rejoin completed without it
      set_state(s, id, NodeState::WaitListed);
      if (!maybe_scale_up(st)) send_waiting(st, id);
    }
    return;
  }

  if (s.phase == JobPhase::Joining) {
    const int room =
        s.settings.max_nodes - count_in(s, NodeState::Joined) - count_in(s, NodeState::Stopping);
    // [new] -> Joined; or [new] -> WaitListed when the free places are kept for restarted nodes
    put_node(s, id,
             record_for(join, room > 0 ? NodeState::Joined : NodeState::WaitListed, -1, st.now));
    maybe_complete(st);
    if (s.phase == JobPhase::Joining) send_waiting(st, id);
    return;
  }
  // [new] -> WaitListed: the round is running; under max nodes this starts a scale-up round
  put_node(s, id, record_for(join, NodeState::WaitListed, -1, st.now));
  if (!maybe_scale_up(st)) send_waiting(st, id);
}

/// What makes two failures "the same" for --crash_loop_stop: how the worker ended and the
/// exception type its error file names. Not the rank: a script that fails on every rank is
/// reported by whichever rank's exit was seen first, which changes from round to round.
std::string failure_signature(const WorkersFailed& failed) {
  return std::to_string(failed.exit_code) + "/" + std::to_string(failed.signal) + "/" +
         failed.exception;
}

bool is_fatal(const RdzvSettings& settings, const WorkersFailed& failed) {
  return failed.signal == 0 &&
         std::binary_search(settings.fatal_exit_codes.begin(), settings.fatal_exit_codes.end(),
                            failed.exit_code);
}

/// Why a node that caused every failure of a crash loop was not quarantined, for its message.
std::string not_quarantined_because(const RdzvSettings& settings, bool spare_can_replace,
                                    int in_a_row) {
  if (!spare_can_replace) return "no spare could take its place";
  if (settings.quarantine_after == 0) return "--quarantine_after 0: no node is quarantined";
  if (in_a_row >= settings.quarantine_after) return "no restart was left to quarantine it";
  return "--crash_loop_stop " + std::to_string(settings.crash_loop_limit) +
         " came before --quarantine_after " + std::to_string(settings.quarantine_after) +
         ", which would have let the job go on without it";
}

/// What a job's end says of its crash loop, after the failure; `on_node` names the one node
/// every failure of the loop was on, with why it was not quarantined (empty: none).
std::string crash_loop_account(const JobState& s, const std::string& on_node) {
  std::string account =
      "; a crash loop: the same failure " + std::to_string(s.failure_repeats) +
      " times in a row (--crash_loop_stop " + std::to_string(s.settings.crash_loop_limit) +
      ") with no progress in between that ddprun could see: no training step was reported (the "
      "SDK, or a file named by --progress_file that the script updates) and no group ran for "
      "--restart_backoff_reset; --crash_loop_stop 0 restarts such a job up to --max_restarts";
  if (!on_node.empty())
    account += "; each time on node " + on_node +
               ": if that machine is at fault, leave it out (sbatch --exclude, a node selector) "
               "when the job runs again";
  return account;
}

void on_workers_failed(Step& st, const std::string& id, const WorkersFailed& failed) {
  JobState& s = st.s;
  const NodeRecord& node = node_at(s, id);
  // One failure round per round: reports for an older round (or the forming one) are late echoes.
  if (s.phase != JobPhase::Running || failed.round != s.round || node.state != NodeState::Running) {
    return;
  }
  const std::string reason =
      "worker failure on node " + node.request.name + ": " + failed.description;
  Closed ends = job_failed();
  ends.exit_code = failed.exit_code;
  ends.signal = failed.signal;
  if (is_fatal(s.settings, failed)) {
    // Running -> Closed (do not requeue): the exit code says no restart can help
    ends.message = reason + "; exit code " + std::to_string(failed.exit_code) +
                   " is one of --fatal_exit_codes " + codes_text(s.settings.fatal_exit_codes) +
                   ": no restart";
    ends.do_not_requeue = true;
    return close_job(st, ends);
  }
  const std::string signature = failure_signature(failed);
  if (failed.progress || signature != s.repeated_failure) {
    s.repeated_failure = failed.progress ? std::string() : signature;
    s.failure_repeats = s.repeated_failure.empty() ? 0 : 1;
  } else {
    ++s.failure_repeats;
  }
  // A blamed node's failure counts against it first: a node that keeps failing is quarantined
  // before its failures add up to a crash loop of the whole job (a spare that came late, or
  // --quarantine_after equal to --crash_loop_stop, takes its place rather than the job ending).
  const std::string culprit = failed.culprit ? node_identity(id, node.request) : std::string();
  const int in_a_row = failed.culprit ? count_failure(s, culprit) : 0;
  const bool spare_can_replace = failed.culprit && can_go_on_without(s, culprit);
  // Every repeat of the failure came from this node: its machine is suspect rather than the
  // script (which fails on whichever node reports first).
  const bool all_on_culprit = failed.culprit && in_a_row >= s.failure_repeats;
  const RdzvSettings& settings = s.settings;
  const bool looping =
      settings.crash_loop_limit > 0 && s.failure_repeats >= settings.crash_loop_limit;
  // A budget no larger than the stop (torchrun's usual --max_restarts 3) ends a loop about as
  // soon, so it is spent whole, as under torchrun; unless --restart_window makes it a rate,
  // which a loop spaced out by --restart_backoff may never use up.
  const bool stop_early = looping && (settings.max_restarts > settings.crash_loop_limit ||
                                      settings.restart_window.count() > 0);
  // A node back from a quarantine whose workers fail again before any progress is quarantined
  // again at once: it would cost the job --quarantine_after restarts each time it came back.
  const bool relapsed = failed.culprit && !failed.progress && s.standing.at(culprit).relapse_armed;
  // With no restart left there is no round to keep the node out of: the budget ends the job
  // (a crash loop's account and do_not_requeue included), and no quarantine is announced.
  if (settings.quarantine_after > 0 && (in_a_row >= settings.quarantine_after || relapsed) &&
      spare_can_replace && restart_left(s, st.now) && (all_on_culprit || !stop_early)) {
    // Running -> Joining (counted), the failing node Quarantined: its workers failed again.
    // Its failures count as one repeat of a crash loop: a node that takes its place and fails
    // the same way twice more points at the script, not at the machines.
    s.failure_repeats = std::min(s.failure_repeats, 1);
    return quarantine_and_restart(st, culprit, reason, ends, relapsed);
  }
  if (looping) {
    // Every one of them on one machine of several: a broken machine looks the same as a broken
    // script. (On a job of one node every failure is on it: nothing to tell.)
    const bool one_machine = all_on_culprit && count_participants(s) > 1;
    ends.message = crash_loop_account(
        s, one_machine ? node.request.name + " (" +
                             not_quarantined_because(settings, spare_can_replace, in_a_row) + ")"
                       : std::string());
    // Not to be requeued, whether now or once the budget is spent: a new run would loop too.
    ends.do_not_requeue = true;
  }
  if (stop_early) {
    // Running -> Closed (do not requeue): the same failure again and again, no progress between
    ends.message = reason + ends.message;
    return close_job(st, ends);
  }
  if (!failed.culprit) {
    // Running -> Joining (counted), no node blamed: a watchdog killed a worker that was only
    // waiting, perhaps for a peer that hung (the hung one is stopped with the group), or a
    // worker failed while its agent had lost this server (and most likely a peer with it).
    // Every node's run of failures stays as it was.
    return restart_round(st,
                         reason +
                             " (no node is blamed: its worker was waiting for a peer, "
                             "or failed while its node had lost the rendezvous)",
                         true, ends, {}, s.failure_repeats >= 2);
  }
  // Running -> Joining (counted): a worker failed; the same failure again makes the nodes'
  // pause before the next round grow (--restart_backoff)
  restart_round(st, reason, true, ends, {}, s.failure_repeats >= 2);
}

void on_workers_succeeded(Step& st, const std::string& id, const WorkersSucceeded& succeeded) {
  JobState& s = st.s;
  NodeRecord& node = node_at(s, id);
  if (s.phase != JobPhase::Running || succeeded.round != s.round ||
      node.state != NodeState::Running) {
    return;
  }
  // Running -> Succeeded: this node's workers all exited 0
  set_state(s, id, NodeState::Succeeded);
  maybe_close_succeeded(st);
}

void on_from_node(Step& st, const FromNode& from) {
  if (const auto* join = std::get_if<Join>(&from.message)) {
    auto known = st.s.nodes.find(from.node_id);
    if (known != st.s.nodes.end() && st.s.phase != JobPhase::Closed) {
      touch(st.s, *known, st.now);
    }
    on_join(st, from.node_id, *join);
    return;
  }
  auto known = st.s.nodes.find(from.node_id);
  if (known == st.s.nodes.end() || st.s.phase == JobPhase::Closed) return;  // stale or unknown
  touch(st.s, *known, st.now);  // any message proves the node alive
  const std::string name = known->second.request.name;
  if (const auto* failed = std::get_if<WorkersFailed>(&from.message)) {
    on_workers_failed(st, from.node_id, *failed);
  } else if (const auto* succeeded = std::get_if<WorkersSucceeded>(&from.message)) {
    on_workers_succeeded(st, from.node_id, *succeeded);
  } else if (const auto* leave = std::get_if<Leave>(&from.message)) {
    remove_node(
        st, from.node_id,
        "node " + name + " left" + (leave->reason.empty() ? "" : " (" + leave->reason + ")"));
  }
  // Heartbeat: last_seen above is all it does. StatusQuery never reaches step().
}

/// "; kept out by their health check: node3 (gpu0: ECC errors)" when the job holds such nodes,
/// for the join timeout's message: the nodes that came but could not take part.
std::string kept_out_text(const JobState& s) {
  const std::vector<std::string> ids = ids_in(s, NodeState::KeptOut);
  if (ids.empty()) return "";
  return "; kept out by their health check: " + few_of(ids, [&](const std::string& id) {
           const NodeJoin& node = node_at(s, id).request;
           return node.name + (node.kept_out ? " (" + *node.kept_out + ")" : "");
         });
}

/// ", after the nodes' --restart_backoff pause of up to 12 s" for the join timeout's
/// message when its round formed after one: the wait it names began then.
std::string round_pause_text(const JobState& s) {
  const Millis pause = pause_before_round(s);
  if (pause <= Millis{0}) return "";
  return ", after the nodes' --restart_backoff pause of up to " + elapsed_text(pause);
}

/// Deadlines that are due at `now`: tombstone, keep-alive, adoption, last call, join timeout.
void run_deadlines(Step& st) {
  JobState& s = st.s;
  if (s.phase == JobPhase::Closed) {
    // Closed -> [erased]: the tombstone has answered late joiners for close_timeout
    if (s.closed_at && st.now >= *s.closed_at + s.settings.close_timeout) st.erase = true;
    return;
  }
  const Millis window = s.settings.keep_alive_window();
  // The silent, from the oldest last_seen on: a step where nobody is silent walks no nodes.
  std::vector<NodeKey> keys;
  for (const LastSeen& seen : s.index.by_last_seen) {
    if (seen.at() + window > st.now) break;
    keys.push_back(NodeKey{seen.entry});
  }
  std::sort(keys.begin(), keys.end(), NodeKeyLess{});  // the order of every node list
  // Copies: removing a node frees the id its key points at.
  std::vector<std::string> silent;
  for (const NodeKey& key : keys) silent.push_back(key.id().str());
  for (const std::string& id : silent) {
    if (s.phase == JobPhase::Closed) return;
    auto it = s.nodes.find(id);
    if (it == s.nodes.end()) continue;
    // any state -> [removed]: the node stopped sending heartbeats
    remove_node(st, id,
                "node " + it->second.request.name + " was lost: nothing heard from it for " +
                    duration_text(duration_cast<Millis>(st.now - it->second.last_seen)) +
                    " (keep_alive_interval " + duration_text(s.settings.keep_alive_interval) +
                    " x keep_alive_max_attempt " +
                    std::to_string(s.settings.keep_alive_max_attempt) + ")",
                /*tell=*/true);
  }
  if (s.phase == JobPhase::Closed) return;
  release_quarantines(st);
  if (s.phase == JobPhase::Running && s.adopt_deadline && st.now >= *s.adopt_deadline) {
    const std::vector<int> missing = unclaimed_ranks(s);
    if (missing.empty()) {
      finish_adoption_if_complete(st);
    } else {
      std::string ranks;
      for (int rank : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
      const std::string reason = "group rank " + ranks + " of round " + std::to_string(s.round) +
                                 " did not re-register within " +
                                 duration_text(s.settings.adoption_window()) +
                                 " after the rendezvous server restarted";
      s.adopt_deadline.reset();
      // Running -> Joining (counted): participants of the adopted round were lost
      restart_round(st, reason, true, job_failed());
    }
  }
  if (s.waiting_dirty && s.waiting_quiet_until && st.now >= quiet_end(s)) {
    s.waiting_quiet_until.reset();
    send_waiting(st);  // the broadcast owed since the quiet period began
  }
  if (s.phase != JobPhase::Joining || s.settings_from.empty()) return;
  maybe_complete(st);  // the last call may be over
  if (s.phase != JobPhase::Joining) return;
  const int count = count_in(s, NodeState::Joined);
  if (count >= s.settings.min_nodes || st.now < s.round_started + s.settings.join_timeout) return;
  const std::vector<std::string> joined = ids_in(s, NodeState::Joined);
  std::string missing_text;
  const std::vector<int> missing_ranks = missing_node_ranks(s);
  if (!missing_ranks.empty()) {
    missing_text = (missing_ranks.size() == 1 ? "node_rank " : "node_ranks ") +
                   few_of(missing_ranks, [](int rank) { return std::to_string(rank); });
  } else {
    const int more = s.settings.min_nodes - count;
    missing_text = std::to_string(more) + " more node" + (more == 1 ? "" : "s");
  }
  const std::vector<std::string> names = names_of(s, joined);
  // Joining -> Closed: the join timeout passed with fewer than min nodes
  close_job(
      st, Closed{JobOutcomeKind::TimedOut,
                 "join timeout: waited " + elapsed_text(since(s.round_started, st.now)) +
                     " for job '" + s.run_id + "'" +
                     (s.round > 0 ? " (round " + std::to_string(s.round) + round_pause_text(s) + ")"
                                  : "") +
                     ": " + std::to_string(count) + " of min " +
                     std::to_string(s.settings.min_nodes) + " nodes joined (" +
                     (names.empty() ? "none"
                                    : few_of(names, [](const std::string& name) { return name; })) +
                     "); missing: " + missing_text + kept_out_text(s),
                 0, 0, false});
}

/// The earliest time at which run_deadlines() has something to do.
std::optional<TimePoint> next_wake(const JobState& s) {
  std::optional<TimePoint> wake;
  const auto consider = [&](TimePoint t) {
    if (!wake || t < *wake) wake = t;
  };
  if (s.phase == JobPhase::Closed) {
    if (s.closed_at) consider(*s.closed_at + s.settings.close_timeout);
    return wake;
  }
  if (!s.index.by_last_seen.empty())
    consider(s.index.by_last_seen.begin()->at() + s.settings.keep_alive_window());
  if (s.adopt_deadline) consider(*s.adopt_deadline);
  for (const auto& [identity, standing] : s.standing)
    if (standing.until) consider(*standing.until);
  if (s.waiting_dirty && s.waiting_quiet_until) consider(quiet_end(s));
  if (s.phase == JobPhase::Joining && !s.settings_from.empty()) {
    if (s.last_call) consider(*s.last_call);
    if (count_in(s, NodeState::Joined) < s.settings.min_nodes) {
      consider(s.round_started + s.settings.join_timeout);
    }
  }
  return wake;
}

}  // namespace

namespace {

/// The host part of a node id ("host:pid:random").
std::string host_of(std::string_view node_id) {
  return std::string(node_id.substr(0, node_id.find(':')));
}

}  // namespace

std::string node_identity(const Join& join) { return host_of(join.node_id) + "/" + join.addr; }

std::string node_identity(std::string_view id, const NodeJoin& join) {
  return host_of(id) + "/" + join.addr;
}

NodeJoin node_join(const Join& join) {
  return NodeJoin{join.name,
                  join.addr,
                  join.master_port,
                  join.node_rank,
                  join.restart_count,
                  join.resume ? Boxed<RoundClaim>(*join.resume) : Boxed<RoundClaim>(),
                  join.kept_out.empty() ? Boxed<std::string>() : Boxed<std::string>(join.kept_out)};
}

Join join_message(const JobState& job, std::string_view id, const NodeJoin& node) {
  return Join{job.run_id,
              std::string(id),
              node.name,
              node.addr,
              node.master_port,
              node.node_rank,
              job.settings,
              node.restart_count,
              node.resume ? std::optional<RoundClaim>(*node.resume) : std::nullopt,
              node.kept_out ? *node.kept_out : std::string()};
}

bool NodeKeyLess::operator()(const NodeKey& a, const NodeKey& b) const {
  if (natural_less(a.name(), b.name())) return true;
  if (natural_less(b.name(), a.name())) return false;
  return a.id() < b.id();
}

void reindex(JobState& state) {
  state.index = NodeIndex{};
  for (const NodeEntry& entry : state.nodes) index_in(state.index, entry);
}

JobState::JobState(const JobState& other) : JobFields(other) { reindex(*this); }

JobState& JobState::operator=(const JobState& other) {
  if (this != &other) {
    JobFields::operator=(other);
    reindex(*this);
  }
  return *this;
}

void mark_all_seen(JobState& state, TimePoint now) {
  for (NodeEntry& entry : state.nodes) touch(state, entry, now);
}

JobState new_job(std::string run_id, TimePoint now) {
  JobState s;
  s.run_id = std::move(run_id);
  s.round_started = now;
  return s;
}

StepResult step(JobState state, const Event& event, TimePoint now) {
  Step st{std::move(state), {}, now, false};
  if (const auto* from = std::get_if<FromNode>(&event)) {
    on_from_node(st, *from);
  } else if (const auto* gone = std::get_if<Disconnected>(&event)) {
    auto it = st.s.nodes.find(gone->node_id);
    if (it != st.s.nodes.end() && st.s.phase != JobPhase::Closed) {
      remove_node(st, gone->node_id,
                  "node " + it->second.request.name + " disconnected without leaving");
    }
  } else if (std::holds_alternative<Resumed>(event)) {
    // Any phase, nodes unchanged: the server was not running, so no node's silence is news.
    // Each gets a full keep-alive window from now; what it sent meanwhile is read next.
    const Millis window = st.s.settings.adoption_window();
    for (NodeEntry& entry : st.s.nodes) touch(st.s, entry, std::max(entry.second.last_seen, now));
    if (st.s.adopt_deadline) st.s.adopt_deadline = std::max(*st.s.adopt_deadline, now + window);
  }
  // Every event (not only Tick) runs the due deadlines, so a late Tick cannot reorder outcomes.
  run_deadlines(st);
  // [none] -> [forgotten]: the job's first join was refused, so nobody ever took part in it
  if (st.s.settings_from.empty() && st.s.nodes.empty() && st.s.phase == JobPhase::Joining)
    st.erase = true;
  check_index(st.s);
  StepResult result;
  result.wake_at = st.erase ? std::nullopt : next_wake(st.s);
  result.state = std::move(st.s);
  result.messages = std::move(st.out);
  result.removed = std::move(st.removed);
  result.erase = st.erase;
  return result;
}

}  // namespace ddprun::rdzv
