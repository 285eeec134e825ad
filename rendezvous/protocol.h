#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/enum_names.h"
#include "common/result.h"

// The messages of ddprun's rendezvous protocol (docs/design.md#rendezvous-protocol), as typed
// values, and their JSON form. Pure: the server and client put these in frames (framing.h).
//
//   agent                                   server
//     | hello{protocol}                       |
//     | join{run_id, node, settings, resume?} |   (again before every round)
//     |<------------------ waiting{...}       |   (while the round forms; a status line)
//     |<------------------ round{rank, ...}   |   (the round is complete: start workers)
//     | heartbeat (every keep_alive_interval) |
//     | workers_failed / workers_succeeded    |
//     |<------------------ restart{reason}    |   (stop workers, then join again)
//     |<------------------ closed{outcome}    |   (the job is over: exit)
//     |<------------------ refused{kind, msg} |   (this node cannot take part: exit)

namespace ddprun::rdzv {

using Millis = std::chrono::milliseconds;

/// --quarantine_after's default, and what a peer that does not send it runs with.
inline constexpr int kDefaultQuarantineAfter = 2;

/// What every node of a job must agree on, plus the timeouts of --rdzv_conf.
struct RdzvSettings {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 0;
  Millis join_timeout{600'000};
  Millis last_call_timeout{30'000};
  Millis close_timeout{30'000};
  Millis keep_alive_interval{5'000};
  int keep_alive_max_attempt = 3;
  /// --restart_window: --max_restarts counts the restarts of the last window only (0: all of
  /// the job's restarts).
  Millis restart_window{0};
  /// --crash_loop_stop: the same failure this many times in a row without progress ends the
  /// job (0: never).
  int crash_loop_limit = 3;
  /// --fatal_exit_codes: a worker exiting with one of these ends the job at once (sorted).
  std::vector<int> fatal_exit_codes;
  /// --quarantine_after: a node (its host and address) whose workers caused this many group
  /// failures in a row sits out of the job for a while, when the job can go on without it (0:
  /// never, as in a value made here; a peer that does not send it has the flag's default,
  /// kDefaultQuarantineAfter, like every node started without the flag).
  int quarantine_after = 0;
  /// --quarantine_cooldown: how long the first quarantine of a node lasts; each further one of
  /// the same node doubles it, up to quarantine_cooldown_max.
  Millis quarantine_cooldown{30'000};
  Millis quarantine_cooldown_max{600'000};
  /// --restart_backoff BASE:MAX: the agents' pause before they rejoin after repeated failures
  /// (restart_pause()). The rendezvous starts a round's join timeout after the longest pause
  /// its nodes may take.
  Millis restart_backoff{1'000};
  Millis restart_backoff_max{30'000};

  /// How long a node may stay silent before it is declared lost.
  Millis keep_alive_window() const { return keep_alive_interval * keep_alive_max_attempt; }
  /// How long a restarted server waits for the participants of a running round to re-register
  /// (adoption): the keep-alive window, and at least twice kMaxReconnectBackoff, as a live agent
  /// may be waiting out its back-off when the server comes back
  /// (docs/design.md#rendezvous-state-machine).
  Millis adoption_window() const;
};

/// The longest a client waits between two attempts to reach a lost server (its back-off doubles
/// from 100 ms up to this).
constexpr Millis kMaxReconnectBackoff{2'000};

/// The longest --restart_backoff pause (a day), as the command line allows.
inline constexpr Millis kMaxRestartBackoff{86'400'000};

/// --restart_backoff: the pause before the next round after `failures_in_a_row` counted
/// failures in a row (each a repeat of the last): none after the first, then `base`, doubling
/// up to `max`. The agent pauses so long; the rendezvous waits for it before the join timeout.
template <typename Duration>
Duration restart_pause(int failures_in_a_row, Duration base, Duration max) {
  if (failures_in_a_row < 2 || base <= Duration{0}) return Duration{0};
  Duration pause = base;
  for (int i = 2; i < failures_in_a_row && pause < max; ++i) pause *= 2;
  return std::min(pause, std::max(max, base));
}

inline Millis RdzvSettings::adoption_window() const {
  return std::max(keep_alive_window(), 2 * kMaxReconnectBackoff);
}

/// The round a node's workers are running, as the node remembers it: sent when the node
/// re-registers after losing its connection (e.g. the daemon restarted) so that the server can
/// adopt the running group instead of restarting it.
struct RoundClaim {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int restart_count = 0;
  std::string master_addr;
  int master_port = 0;
  bool succeeded = false;  ///< this node's workers already finished successfully
};

// ---- agent -> server ----------------------------------------------------------------------

/// A node asks to take part in the next round of job `run_id`.
struct Join {
  std::string run_id;
  std::string node_id;  ///< unique per agent process ("host:pid:random")
  std::string name;     ///< what users see, and the numeric-aware ordering key (addr or host)
  std::string addr;     ///< published as MASTER_ADDR if this node becomes group rank 0
  int master_port = 0;  ///< a free port on addr, used if this node becomes group rank 0
  std::optional<int> node_rank;  ///< --node_rank when given
  RdzvSettings settings;
  int restart_count = 0;  ///< the job's restart count as this node last heard it
  std::optional<RoundClaim> resume;
  /// Not empty: this node's --health_check failed (this says why). The job holds it without
  /// placing it in a round (NodeState::KeptOut): status lists it and it hears the job's end. A
  /// join without it, once a check passes, makes it a newcomer.
  std::string kept_out{};
};

/// "I am alive", every keep_alive_interval.
struct Heartbeat {};

/// A worker of this node failed in `round`; the node is stopping its workers.
struct WorkersFailed {
  int round = 0;
  std::string description;  ///< e.g. "worker rank 3 (local rank 1) exited with code 1"
  int exit_code = 0;        ///< the worker's exit code, when it exited
  int signal = 0;           ///< the signal that killed the worker, when it was killed
  int rank = -1;            ///< the failed worker's global rank (-1: not said)
  /// The Python exception type its error file names ("ValueError"; "" for none).
  std::string exception{};
  /// Whether the group made progress before it failed (docs/usage.md#failure-policy): a
  /// worker reported a training step, or the group ran for --restart_backoff_reset. Assumed
  /// (never a crash loop) when an agent does not say: older agents send no such field.
  bool progress = true;
  /// Whether this node's worker caused the failure. False when the watchdog killed a worker
  /// that was not stopped: the peers of a hung worker wait silently in the collective, and
  /// whichever node's watchdog fires first reports (docs/design.md, "Who hung"). Then no
  /// node's failures are counted for quarantine. Assumed when an older agent does not say.
  bool culprit = true;
};

/// Every worker of this node exited 0 in `round`.
struct WorkersSucceeded {
  int round = 0;
};

/// The node leaves the job on purpose (the agent got a signal).
struct Leave {
  std::string reason;
};

/// `ddprun status`: describe the jobs on this server (one when run_id is set).
struct StatusQuery {
  std::optional<std::string> run_id;
  /// The `next` of the previous reply: jobs after this run id (status comes in pages).
  std::optional<std::string> after;
};

using AgentMessage =
    std::variant<Join, Heartbeat, WorkersFailed, WorkersSucceeded, Leave, StatusQuery>;

// ---- server -> agent ----------------------------------------------------------------------

/// A value that many messages carry alike, held once: every participant's RoundReady names the
/// same first nodes, every Restart of a round gives the same reason, and a round of 16,384 nodes
/// held 16,384 copies of them while it was answered (docs/design.md#rendezvous-at-scale).
/// Copies share the value; it never changes. Reads as a `const T&`.
template <class T>
class Shared {
 public:
  Shared() = default;
  template <class U>
  requires(!std::is_base_of_v<Shared, std::remove_cvref_t<U>> && std::is_convertible_v<U&&, T>)
      Shared(U&& value)  // NOLINT: implicit, like the value it holds
      : value_(std::make_shared<const T>(std::forward<U>(value))) {}
  const T& get() const {
    static const T kNone{};
    return value_ ? *value_ : kNone;
  }
  operator const T&() const { return get(); }  // NOLINT: implicit, as above
  friend bool operator==(const Shared& a, const T& b) { return a.get() == b; }

 private:
  std::shared_ptr<const T> value_;
};

/// Names of nodes (RoundReady.participants, Waiting.joined).
class SharedNames : public Shared<std::vector<std::string>> {
 public:
  using Shared::Shared;
  SharedNames(std::initializer_list<std::string> names)  // NOLINT: implicit, as above
      : Shared(std::vector<std::string>(names)) {}
  std::size_t size() const { return get().size(); }
};

/// A reason (Restart.reason).
using SharedText = Shared<std::string>;

/// Progress of the round being formed, sent to its members on every change.
struct Waiting {
  int round = 0;
  SharedNames joined;  ///< names of the nodes in the forming round (the first few)
  /// How many nodes are in the forming round; for a node on the wait list while a round runs
  /// (join_timeout 0), in the running round.
  int joined_count = 0;
  int min_nodes = 1;
  int max_nodes = 1;
  /// Given --node_rank values not yet joined (if any; the first few).
  Shared<std::vector<int>> missing_node_ranks;
  Millis waited{0};  ///< since the round started forming
  Millis join_timeout{0};
  bool wait_listed = false;  ///< this node waits for a place in a later round
  /// Set while this node is quarantined: why, and how long until it may join again.
  std::string quarantined{};
  Millis quarantine_left{0};
  /// The job's round runs (this node, wait-listed, is a spare): no deadline applies. An older
  /// server does not say; it is read as wait_listed with a join_timeout of 0, as it sent then.
  bool job_running = false;
};

/// The round is complete: this node's place in the job.
struct RoundReady {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  SharedNames participants;  ///< names in group-rank order (the first few)
};

/// Stop the workers and join again for round `next_round`.
struct Restart {
  int next_round = 0;
  SharedText reason;
  bool counted = false;  ///< uses one of --max_restarts (false for a scale-up)
  int restart_count = 0;
  /// Non-zero when this node is quarantined for that long (--quarantine_after): it stops its
  /// workers, joins again and waits; `reason` says why.
  Millis quarantine{0};
  /// The failure is the same as the one before it, with no progress between (what
  /// --crash_loop_stop counts): only such a restart makes --restart_backoff's pause grow. True
  /// when a peer does not say (it backs off on every failure in a row, as before).
  bool repeat = true;
  /// With --restart_window (`window` > 0): the counted restarts within it, this one included,
  /// which --max_restarts is held against; restart_count counts every restart of the job.
  int window_restarts = 0;
  Millis window{0};
  /// --restart_backoff as the rendezvous counts the job's failures (JobState::pause_count), so
  /// that every node of the round pauses alike and the join timeout starts after it: the
  /// failures in a row, and the pause before this node joins again. An older server sends
  /// neither: the agent counts for itself.
  std::optional<int> failures_in_a_row{};
  Millis pause{0};
};

/// How a job ended.
enum class JobOutcomeKind { Succeeded, Failed, TimedOut };

/// Names of JobOutcomeKind in `closed.outcome` and in status's "outcome" (protocol 1 spells
/// TimedOut "timed_out" on the wire; status said "timed out" before these names were shared).
inline constexpr std::array<common::EnumName<JobOutcomeKind>, 3> kJobOutcomeNames{{
    {JobOutcomeKind::Succeeded, "succeeded"},
    {JobOutcomeKind::Failed, "failed"},
    {JobOutcomeKind::TimedOut, "timed_out"},
}};
static_assert(common::name_table_complete(kJobOutcomeNames));

/// The job is over; every node exits.
struct Closed {
  JobOutcomeKind outcome = JobOutcomeKind::Succeeded;
  std::string message;
  int exit_code = 0;  ///< root-cause worker's exit code (Failed)
  int signal = 0;     ///< root-cause worker's signal (Failed)
  /// Failed for a reason a requeue of the same job would meet again: a crash loop or a fatal
  /// exit code (ddprun exits kExitDoNotRequeue).
  bool do_not_requeue = false;
};

/// Why a node cannot take part.
enum class RefusalKind {
  Mismatch,
  DuplicateRank,
  BadRank,
  Closed,
  Protocol,
  Dropped,
  Unauthorized
};

/// Names of RefusalKind in `refused.kind`.
inline constexpr std::array<common::EnumName<RefusalKind>, 7> kRefusalNames{{
    {RefusalKind::Mismatch, "mismatch"},
    {RefusalKind::DuplicateRank, "duplicate_rank"},
    {RefusalKind::BadRank, "bad_rank"},
    {RefusalKind::Closed, "closed"},
    {RefusalKind::Protocol, "protocol"},
    {RefusalKind::Dropped, "dropped"},
    {RefusalKind::Unauthorized, "unauthorized"},
}};
static_assert(common::name_table_complete(kRefusalNames));

/// This node cannot take part; it exits with the message.
struct Refused {
  RefusalKind kind = RefusalKind::Protocol;
  std::string message;
};

/// Reply to StatusQuery: a JSON description of the jobs (see describe_job in job_status.h).
struct StatusReply {
  nlohmann::json jobs;
  /// Set when more jobs follow: ask again with `after` set to it. Each reply stays under
  /// kStatusPageBytes of jobs (plus one job), so any number of jobs reads back.
  std::optional<std::string> next;
};

using ServerMessage = std::variant<Waiting, RoundReady, Restart, Closed, Refused, StatusReply>;

// ---- JSON ---------------------------------------------------------------------------------

/// A job's settings as every node sends them with its join (and etcd keeps them in `state`).
nlohmann::json settings_json(const RdzvSettings& settings);
/// settings_json read back, as a join's settings are: the types only (which values a job may
/// run with is check_settings's, admission.h); the error names the field under `what`.
common::Result<RdzvSettings> parse_settings(const nlohmann::json& body, const std::string& what);

/// The message as a JSON object with a "type" field.
nlohmann::json to_json(const AgentMessage& message);
nlohmann::json to_json(const ServerMessage& message);

/// Parses a frame body; the error names what is wrong for anything malformed (never throws).
common::Result<AgentMessage> parse_agent_message(const nlohmann::json& body);
common::Result<ServerMessage> parse_server_message(const nlohmann::json& body);

/// The hello each side sends first (checked with check_hello in framing.h).
nlohmann::json make_hello(const std::string& role);

}  // namespace ddprun::rdzv
