#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "etcd/codec.h"
#include "rendezvous/rdzv_state.h"

// The rendezvous on etcd v3 without sockets (docs/design.md#rendezvous-on-etcd-v3): the keys of
// a job, the job's state as etcd stores it, and the driver's work, drive(), which turns what the
// prefix holds into events for the rendezvous server's own step() (rdzv_state.h). The one
// policy stays step(); this file only decides which events the keys mean.
//
//   nodes/<id> put (new mod revision) --> FromNode{Join}      --+
//   reports/<id> put (new mod revision) -> FromNode{report}     --+--> step() --> `state` value:
//   nodes/<id> gone -------------------> Disconnected           --+    {job, applied}; `messages`
//   a deadline inside the job ---------> Tick                   --+
//
// `applied` remembers the mod revision of each key already fed to step(), so a new driver (or the
// same one after a failed compare) feeds each change exactly once, whatever it saw before.
// `messages/NN` (put in the same txn) are what step() sent to nodes in that pass, spread over
// kMessageKeys keys by node id; every agent watches only its own messages key and reads those
// addressed to it, as the TCP client reads frames. Only the driver reads `state` (O(N)) and
// watches the joins and reports, so what etcd sends per round grows linearly with N.

namespace ddprun::etcd {

/// "/ddprun/<run_id>/": every key of one job lies under it.
std::string job_prefix(const std::string& run_id);
std::string state_key(const std::string& prefix);
std::string node_key(const std::string& prefix, const std::string& node_id);
std::string report_key(const std::string& prefix, const std::string& node_id);
/// "<prefix>nodes/": the joins; the range [nodes_dir, reports_end) holds nodes/ and reports/,
/// what the driver watches (and nothing else of the job: messages/ sorts before, state after).
std::string nodes_dir(const std::string& prefix);
std::string reports_end(const std::string& prefix);

/// Messages to nodes go into kMessageKeys keys, each node's to the one its id hashes to, so a
/// node watches one key that carries its own messages and those of about N / kMessageKeys
/// others, and the driver's txn writes at most kMessageKeys + 1 keys (etcd's --max-txn-ops
/// is 128 by default).
inline constexpr int kMessageKeys = 64;
static_assert(kMessageKeys <= 100, "messages keys are named with two digits");
/// The key that carries the messages to `node_id`: "<prefix>messages/NN" (FNV-1a of the id,
/// the same on every host).
std::string messages_key(const std::string& prefix, const std::string& node_id);

/// Deadlines are stored as wall-clock times (milliseconds since the Unix epoch) so that another
/// host, whose steady clock has another origin, reads them right. The anchor pairs one steady
/// time with the wall-clock time it was; conversions through one anchor round-trip exactly.
struct TimeAnchor {
  common::TimePoint steady;
  std::int64_t wall_ms = 0;
  std::int64_t to_wall(common::TimePoint t) const;
  common::TimePoint to_steady(std::int64_t wall) const;
};

/// What step() has consumed of one node's keys.
struct Applied {
  std::int64_t join = 0;    ///< mod revision of nodes/<id> last fed as a Join
  std::int64_t report = 0;  ///< mod revision of reports/<id> last fed as a report
  bool operator==(const Applied&) const = default;
};

/// The value of `state`.
struct StoredState {
  rdzv::JobState job;
  std::map<std::string, Applied> applied;
  std::vector<rdzv::Outgoing> messages;  ///< sent by the pass (stored under `messages`)
};

/// Bounds on what a `state` value may hold (etcd refuses requests over 1.5 MiB).
inline constexpr std::size_t kMaxStateBytes = 1'400'000;
inline constexpr std::size_t kMaxNodesInState = 4'096;
/// The most nodes one job may hold on etcd: a node takes 709 to 715 bytes of `state` with the
/// bench's names (docs/benchmarks.md, "How large a job etcd v3 can hold"), so about 1,960 fit
/// kMaxStateBytes; 1,800 leave 777 bytes a node for longer host names. The join of one more
/// is refused, naming ddprun-rdzvd for larger jobs.
inline constexpr std::size_t kMaxNodesOnEtcd = 1'800;
inline constexpr std::size_t kMaxMessagesInState = 3 * kMaxNodesInState;

/// The value of `state`: the job and `applied` (the messages go to encode_notices).
std::string encode_state(const StoredState& state, const TimeAnchor& anchor);
/// The value of one `messages/NN` key: the job's phase after the pass and what it sent to the
/// nodes of that key.
std::string encode_notices(rdzv::JobPhase phase, const std::vector<rdzv::Outgoing>& messages);
/// The puts of one pass's messages: for each messages key that a message goes to, that key and
/// its value (encode_notices of the messages to its nodes, in the order step() sent them).
std::map<std::string, std::string> notices_by_key(const std::string& prefix, rdzv::JobPhase phase,
                                                  const std::vector<rdzv::Outgoing>& messages);
/// The value read back; anything malformed is an error naming `key` and what is wrong (never
/// throws). Node records get last_seen = `now`: liveness is the lease's business.
common::Result<StoredState> decode_state(const std::string& value, const std::string& key,
                                         const TimeAnchor& anchor, common::TimePoint now);

/// What a node reads of a `messages` value: the phase, and the messages addressed to it.
struct Notices {
  rdzv::JobPhase phase = rdzv::JobPhase::Joining;
  std::vector<rdzv::ServerMessage> messages;
};
/// Errors as decode_state's, naming the key.
common::Result<Notices> decode_notices(const std::string& value, const std::string& key,
                                       const std::string& node_id);

/// The job's keys as the driver knows them (a read of `state`, nodes/ and reports/, then the
/// watch's events).
struct View {
  std::string prefix;
  std::optional<KeyValue> state;
  std::map<std::string, KeyValue> nodes;    ///< by node id
  std::map<std::string, KeyValue> reports;  ///< by node id
};

/// Applies one key's put or delete; keys outside the job's layout are ignored.
void apply_event(View& view, const Event& event);
/// Replaces the view by a range read of the prefix.
void load_range(View& view, const std::vector<KeyValue>& kvs);

/// The node that drives: the one whose nodes/ key has the lowest create revision (etcd's
/// election recipe), or none when no node has joined.
std::optional<std::string> driver_of(const View& view);

/// What one pass of the driver decided.
struct DriveResult {
  StoredState next;
  /// Whether `state` must be written: the job, what was applied, or messages changed.
  bool changed = false;
  std::optional<common::TimePoint> wake_at;  ///< run drive() again then (a deadline)
  bool erase = false;  ///< the closed job's tombstone expired: delete the prefix
};

/// The driver's pass at `now`: nodes that are gone first (Disconnected), then every put not yet
/// applied in revision order, then a Tick. `current` is the decoded `state` (or a new job when
/// there is none). A node key whose value is not a join for that id gets a Refused(Protocol)
/// naming the key.
DriveResult drive(StoredState current, const View& view, common::TimePoint now);

/// The value of nodes/<id>: the node's Join. Of reports/<id>: WorkersFailed, WorkersSucceeded or
/// Leave. Both are the TCP protocol's JSON (protocol.h).
std::string encode_message(const rdzv::AgentMessage& message);

}  // namespace ddprun::etcd
