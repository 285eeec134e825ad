#pragma once
#include <array>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "common/enum_names.h"
#include "common/shared_string.h"
#include "rendezvous/protocol.h"

// The rendezvous server's logic for one job (one rdzv_id), as a pure state machine:
// step(state, event, now) -> {next state, messages to nodes, when to wake up}. No sockets, no
// clock reads; the Asio server (rendezvous/server.h) feeds it events and delivers its messages.
// Split by concept: who may join is admission.h, who gets which group rank rank_assignment.h,
// and what `ddprun status` shows job_status.h; this file holds the job's state and its phases.
// States and transitions are drawn in docs/design.md#rendezvous-state-machine.
//
//        join (first)            max joined, or min joined and last call over,
//   [none] ------> Joining(r) ---or (r > 0) every live node of the job rejoined----> Running(r)
//                    ^  |                                                                |
//                    |  | join timeout, under min: Closed(TimedOut)                      |
//                    |  v                                                                |
//                    | Closed <--- all participants succeeded / budget used up ----------+
//                    |                                                                   |
//                    +--- worker failure, node lost (counted), newcomer under max (not) -+

namespace ddprun::rdzv {

using common::TimePoint;

/// What the server knows about one node of a job.
enum class NodeState {
  Joined,       ///< in the round being formed
  Running,      ///< a participant of the running round
  Succeeded,    ///< a participant whose workers all exited 0
  Stopping,     ///< told to restart; its Join for the next round has not arrived yet
  WaitListed,   ///< arrived while the round ran at max nodes (or while Running, before scale-up):
                ///< a spare, which takes the place of a node the job loses
  Quarantined,  ///< its host's workers kept failing: out of the job until its cooldown is over
  KeptOut       ///< its own --health_check failed (Join::kept_out): never placed in a round, it
                ///< hears the job's end; a join without kept_out makes it a newcomer
};

/// Names of NodeState in status (job_status.h); snake_case like every name on the wire.
inline constexpr std::array<common::EnumName<NodeState>, 7> kNodeStateNames{{
    {NodeState::Joined, "joined"},
    {NodeState::Running, "running"},
    {NodeState::Succeeded, "succeeded"},
    {NodeState::Stopping, "stopping"},
    {NodeState::WaitListed, "wait_listed"},
    {NodeState::Quarantined, "quarantined"},
    {NodeState::KeptOut, "kept_out"},
}};
static_assert(common::name_table_complete(kNodeStateNames));

/// A value few holders have, behind one pointer (8 bytes, where a shared_ptr is 16): a copy of
/// the holder copies the value, so it behaves like a std::optional<T> that takes no room while
/// empty.
template <class T>
class Boxed {
 public:
  Boxed() = default;
  explicit Boxed(const T& value) : value_(std::make_unique<T>(value)) {}
  Boxed(const Boxed& other) : value_(other.value_ ? std::make_unique<T>(*other.value_) : nullptr) {}
  Boxed(Boxed&&) noexcept = default;
  Boxed& operator=(const Boxed& other) { return *this = Boxed(other); }
  Boxed& operator=(Boxed&&) noexcept = default;
  ~Boxed() = default;
  explicit operator bool() const { return value_ != nullptr; }
  const T& operator*() const { return *value_; }
  const T* operator->() const { return value_.get(); }

 private:
  std::unique_ptr<T> value_;
};

/// What the server keeps of a node's latest Join: what it reads once the join is admitted.
/// The join's run id and settings are the job's (admission checked them), so no node keeps its
/// own copy: 16,384 nodes held 16,384 copies (docs/design.md#rendezvous-at-scale).
/// Its host (node_identity) is the host part of its node id, read from the key when needed.
struct NodeJoin {
  std::string name;  ///< Join::name
  std::string addr;  ///< Join::addr
  int master_port = 0;
  std::optional<int> node_rank;
  int restart_count = 0;  ///< the job's count as the node last heard it
  /// Join::resume: behind a pointer, as only a node re-registering after a server restart has
  /// one (inline, it cost every node of a 16,384-node job 64 bytes; a shared_ptr, 8 more).
  Boxed<RoundClaim> resume{};
  /// Join::kept_out: why its health check failed (KeptOut), behind a pointer like resume.
  Boxed<std::string> kept_out{};
};

/// What `join` leaves in its node's record.
NodeJoin node_join(const Join& join);

struct JobState;

/// The Join node `id` of `job` sent, as far as the server keeps it (the job's run id and
/// settings in it): etcd's stored state holds each node's join as a message.
Join join_message(const JobState& job, std::string_view id, const NodeJoin& node);

struct NodeRecord {
  NodeJoin request;  ///< the node's latest Join
  NodeState state = NodeState::Joined;
  int group_rank = -1;  ///< in the running round; -1 otherwise
  /// Its group rank in the last round, while the next one forms (a survivor keeps it if it
  /// fits), or the rank it claimed when it re-registered after a server restart; -1 otherwise.
  /// A field, not a map beside the nodes: a map cost a restart of 16,384 nodes 2 MB.
  int previous_rank = -1;
  TimePoint last_seen;  ///< last message of any kind (heartbeats included)
};

/// What the job holds against one node identity (node_identity(): its host and address, so
/// that an agent restarted on the same machine is the same node) for --quarantine_after.
struct NodeStanding {
  int failures_in_a_row = 0;  ///< group failures its workers caused, with no other node's between
  int quarantines = 0;        ///< how often it was quarantined (each doubles the cooldown)
  std::optional<TimePoint> until;  ///< set while it is quarantined
  std::string why{};               ///< why it was quarantined last
  /// Its quarantine ended and no counted restart came since: its next failure with no
  /// progress quarantines it again at once (relapsed).
  bool relapse_armed = false;
};

/// A node as --quarantine_after counts it: "host/addr" (the host of its node id, the address it
/// publishes).
std::string node_identity(const Join& join);
/// The same for node `id` of a job's node table.
std::string node_identity(std::string_view id, const NodeJoin& join);

/// A node's id as the node table keys it: held once, shared with the connection that speaks for
/// the node (a copy in each cost a node of 16,384 a second heap block, docs/design.md).
using NodeId = common::SharedString;

/// A job's node table (JobState::nodes), by node id; looked up by any string (std::less<>).
using NodeTable = std::map<NodeId, NodeRecord, std::less<>>;

/// An entry of a job's node table (JobState::nodes): its id and record.
using NodeEntry = std::pair<const NodeId, NodeRecord>;

/// A node's place in the name order of its state (NodeIndex::by_name): one pointer to its entry
/// of the job's node table, whose name and id it reads (16,384 nodes held each id three times,
/// then two pointers each, docs/design.md#rendezvous-at-scale). The index takes an entry out
/// before its name changes and puts it back after, so a set of keys never sees one move.
struct NodeKey {
  const NodeEntry* entry = nullptr;
  const std::string& name() const { return entry->second.request.name; }
  const NodeId& id() const { return entry->first; }
  friend bool operator==(const NodeKey& a, const NodeKey& b) {
    return a.name() == b.name() && a.id() == b.id();
  }
};

/// The order of every node list: numeric-aware by name ("node2" before "node10"), then node_id.
struct NodeKeyLess {
  bool operator()(const NodeKey& a, const NodeKey& b) const;
};

/// When a node was last heard from (NodeIndex::by_last_seen): its entry, whose last_seen it
/// reads; like NodeKey, taken out of the index before last_seen changes.
struct LastSeen {
  const NodeEntry* entry = nullptr;
  TimePoint at() const { return entry->second.last_seen; }
  const NodeId& id() const { return entry->first; }
  friend bool operator==(const LastSeen& a, const LastSeen& b) {
    return a.at() == b.at() && a.id() == b.id();
  }
};

/// By time, then by node id.
struct LastSeenLess {
  bool operator()(const LastSeen& a, const LastSeen& b) const {
    return a.at() != b.at() ? a.at() < b.at() : a.id() < b.id();
  }
};

/// What JobState::nodes implies, kept up to date by rdzv_state.cpp with every change of a node
/// (added, removed, its state or its Join replaced), so that a join, a heartbeat or a deadline
/// costs O(log N) in the job's nodes, never a walk over all of them: a round of 16,384 nodes
/// would otherwise cost N^2 steps (docs/design.md#rendezvous-at-scale). Its entries point into
/// JobState::nodes (whose entries stay put when the map is moved); a copied JobState builds its
/// own.
struct NodeIndex {
  static constexpr std::size_t kStates = kNodeStateNames.size();
  std::array<int, kStates> count{};                               ///< nodes per NodeState
  int previous_ranked = 0;                                        ///< nodes with a previous_rank
  std::array<std::set<NodeKey, NodeKeyLess>, kStates> by_name{};  ///< per NodeState, in order
  /// node_rank -> &node_id, of every node started with --node_rank.
  std::multimap<int, const NodeId*> by_node_rank{};
  /// Every node by last_seen: the keep-alive deadline and who is silent, at once.
  std::set<LastSeen, LastSeenLess> by_last_seen{};

  /// How many nodes are in `state`.
  int count_of(NodeState state) const { return count[static_cast<std::size_t>(state)]; }
};

enum class JobPhase { Joining, Running, Closed };

/// Names of JobPhase in status (job_status.h).
inline constexpr std::array<common::EnumName<JobPhase>, 3> kJobPhaseNames{{
    {JobPhase::Joining, "joining"},
    {JobPhase::Running, "running"},
    {JobPhase::Closed, "closed"},
}};
static_assert(common::name_table_complete(kJobPhaseNames));

/// Everything the server holds for one job (JobState adds how it is copied).
struct JobFields {
  std::string run_id;
  RdzvSettings settings;      ///< set by the first node to join; later nodes must agree
  std::string settings_from;  ///< name of the node that set them (for mismatch messages)
  JobPhase phase = JobPhase::Joining;
  int round = 0;          ///< the round being formed (Joining) or running (Running)
  int restart_count = 0;  ///< counted restarts so far, job-wide
  /// By node_id: every live node of the job. Changed only through rdzv_state.cpp's helpers,
  /// which keep `index` in step (a JobState built elsewhere calls reindex()).
  NodeTable nodes;
  NodeIndex index;
  TimePoint round_started;                  ///< when the forming round began
  std::optional<TimePoint> last_call;       ///< deadline once min nodes joined (Joining)
  std::optional<TimePoint> adopt_deadline;  ///< re-registration window after a server restart
  std::optional<TimePoint> closed_at;       ///< set in Closed; erased after close_timeout
  std::optional<Closed> closed;             ///< how it ended, repeated to late joiners
  /// Waiting broadcasts go out at most once per kWaitingQuietPeriod (longer in a large job:
  /// kWaitingPacePerListener): until this time only the
  /// node that caused a change hears about it; `waiting_dirty` marks a broadcast owed then.
  /// (Thousands of nodes joining within a second cost O(N) messages, not O(N^2).)
  std::optional<TimePoint> waiting_quiet_until;
  bool waiting_dirty = false;
  /// Ids of nodes dropped for silence, oldest first (at most kMaxDroppedIds). Such a node may
  /// still be alive (a partition): it rejoins as a newcomer with a new id, and its old id is
  /// refused for good. Never shown by status.
  std::deque<std::string> dropped_ids;
  /// --restart_window: when each counted restart of the window happened, oldest first (at
  /// most --max_restarts of them).
  std::deque<TimePoint> window_restarts;
  /// --crash_loop_stop: the last worker failure without progress (failure_signature in
  /// rdzv_state.cpp; "" after progress or a lost node) and how often it came in a row.
  std::string repeated_failure;
  int failure_repeats = 0;
  /// --restart_backoff: counted restarts in a row, each a repeat, as the agents count them
  /// (AgentState::failures_in_a_row, which can only be lower): the pause before the round now
  /// forming is restart_pause() of it, and its join timeout starts after that pause.
  int pause_count = 0;
  /// --quarantine_after: by node identity, those that caused a failure or were quarantined
  /// (at most one entry per counted restart; entries with nothing to remember are dropped).
  std::map<std::string, NodeStanding> standing;
};

/// Everything the server holds for one job. A copy rebuilds its index (which points into its own
/// nodes); a move keeps it, as the moved map keeps its entries where they are.
struct JobState : JobFields {
  JobState() = default;
  JobState(const JobState& other);
  JobState& operator=(const JobState& other);
  JobState(JobState&&) = default;
  JobState& operator=(JobState&&) = default;
  ~JobState() = default;
};

/// The shortest time between two Waiting broadcasts of one job.
constexpr Millis kWaitingQuietPeriod{1'000};

/// A Waiting broadcast costs one frame per listener, so a job with more than 1,000 listeners
/// waits this long per listener between two (16 s at 16,384): broadcasts then cost the server
/// at most about 1,000 frames a second however large the job, and a round whose nodes join
/// faster than that forms with one Waiting (the join's reply) and one RoundReady per node.
constexpr Millis kWaitingPacePerListener{1};

/// At most this many nodes are listed per job in a status reply (node_count has them all), so
/// one job's description stays far under kMaxFrameBytes.
constexpr std::size_t kMaxNodesInStatus = 500;

/// At most this many names travel in Waiting.joined and RoundReady.participants.
constexpr std::size_t kMaxNamesInMessage = 16;

/// At most this many dropped ids are remembered per job (the oldest are forgotten first).
constexpr std::size_t kMaxDroppedIds = 256;

// ---- events -------------------------------------------------------------------------------

/// A node's message arrived (Join, Heartbeat, WorkersFailed, WorkersSucceeded, Leave).
/// StatusQuery is answered by the server directly and never reaches step().
struct FromNode {
  std::string node_id;
  AgentMessage message;
};

/// A node's connection closed without a Leave (the agent died or its host went away).
struct Disconnected {
  std::string node_id;
};

/// Time passed: deadlines (join timeout, last call, heartbeats, adoption, tombstone) are due.
struct Tick {};

/// The server did not run for a while (it was stopped, swapped out or starved) and runs again:
/// silence while it was not running is no evidence, and heartbeats may sit unread in socket
/// buffers. Every node gets a full keep-alive window from now. The server applies this before
/// any other event once it notices the gap (docs/design.md#stall-tolerance).
struct Resumed {};

using Event = std::variant<FromNode, Disconnected, Tick, Resumed>;

// ---- outputs ------------------------------------------------------------------------------

/// One message for one node.
struct Outgoing {
  /// The node table's own id when the job holds the node (a round's answer to 16,384 nodes held
  /// a copy of each id, docs/design.md#rendezvous-at-scale).
  NodeId node_id;
  ServerMessage message;
  bool close_after = false;  ///< Refused and Closed end the connection once sent
};

struct StepResult {
  JobState state;
  std::vector<Outgoing> messages;
  /// Names of the nodes this step removed (left, lost, dropped for silence, refused after
  /// joining), for those who say what went: the status page's history keeps no node list.
  std::vector<std::string> removed;
  std::optional<TimePoint> wake_at;  ///< call step(Tick) at this time (earliest deadline)
  bool erase = false;                ///< the job's tombstone expired: forget the job
};

/// A new, empty job (phase Joining, round 0) whose first Join will set its settings.
JobState new_job(std::string run_id, TimePoint now);

/// Rebuilds `state.index` from `state.nodes`: for a JobState made outside step() (read back
/// from etcd, or built by a test).
void reindex(JobState& state);

/// Every node of the job was heard from at `now` (on etcd, liveness is the lease's: a node
/// whose key exists is alive), keeping the index in step.
void mark_all_seen(JobState& state, TimePoint now);

/// The state machine. Transitions (one comment each in the implementation):
/// - Join, job Joining or Running: refused when admission.h's check_join() says so (settings
///   mismatch -> Refused(Mismatch) naming both values and both nodes; bad or duplicate
///   node_rank -> Refused(BadRank/DuplicateRank); impossible settings, restart count or claim
///   -> Refused(Protocol)); a refused first join leaves no job behind (erase).
/// - Join, job Joining: Joined. At max joined -> complete. At min joined -> last call deadline.
/// Waiting to
///   every Joined node on each change.
/// - Join, job Running: WaitListed; if participants < max -> scale-up round (Restart not
///   counted to every participant). Join with `resume` matching the running round -> adopted
///   as Running with its claimed rank.
/// - Join, job Closed: Refused(Closed) with the job's end.
/// - Join with `resume` on an unknown/new job (server restarted): the job is rebuilt Running at
///   the claimed round and restart count; participants missing after adoption_window() are
///   lost (-> new round). A claim conflicting with the adopted round -> new round, not counted.
/// - Complete: ranks from assign_group_ranks(); master addr/port from group rank 0's Join;
///   RoundReady to each participant; phase Running.
/// - Heartbeat: last_seen = now.
/// - WorkersFailed for the running round: an exit code of --fatal_exit_codes, or the same
///   failure (exit code or signal, exception type) --crash_loop_stop times in a row without
///   progress -> Closed(Failed, do_not_requeue) to all. Else budget left (--max_restarts, within
///   --restart_window when set) -> restart_count+1, Restart(counted) to every participant,
///   phase Joining(round+1), wait-listed nodes become Joined; budget used up -> Closed(Failed)
///   to all. A WorkersFailed for an older round is ignored (one failure
///   round per round, however many nodes report it).
///   Before the restart, the failing node's identity counts one more failure in a row (every
///   other identity's count starts afresh); at --quarantine_after in a row, when the other
///   nodes (participants, spares) are at least min_nodes, every node of that identity becomes
///   Quarantined for the cooldown (--quarantine_cooldown, doubling per quarantine up to its
///   max) and hears Restart with `quarantine` set; a spare takes its place in the next round.
/// - Join of a quarantined identity (a known node or a restarted agent): Quarantined, and a
///   Waiting that says why and for how long.
/// - Join with kept_out (its health check failed): KeptOut, placed in no round, counted by no
///   deadline; a node of the forming or running round leaves it first (as if it had left); a
///   closed job answers with its Closed. A join without kept_out: a newcomer.
/// - Tick: a quarantine over (or the forming round under min_nodes without it) -> the node is
///   forgotten and hears Restart (not counted): it checks itself and joins again as a newcomer.
/// - WorkersSucceeded: node Succeeded; all participants Succeeded -> Closed(Succeeded).
/// - Leave / Disconnected / keep-alive expiry (Tick): node removed. A Running participant lost
///   -> like a failure (counted; Closed(Failed) when the budget is used up). Under min in
///   Joining -> last call cancelled; keep waiting until the join timeout.
/// - Keep-alive expiry also drops the node's id: the node hears Refused(Dropped) (or the job's
///   Closed, when the loss ended the job) and rejoins, if alive, as a newcomer with a new id. A
///   Join with a dropped id gets Refused(Dropped) again (the job's Closed once it has ended).
/// - Tick: join timeout with fewer than min joined -> Closed(TimedOut) naming joined and
///   missing nodes and the time waited; last call over with >= min -> complete.
/// - Resumed: every node's last_seen and the adoption deadline move to give a full keep-alive
///   window from now; other deadlines (join timeout, last call) keep their time.
/// - Closed: erase once close_timeout has passed since closing.
StepResult step(JobState state, const Event& event, TimePoint now);

}  // namespace ddprun::rdzv
