#pragma once
// The rendezvous client's logic for one node, as a pure state machine, the twin of the server's
// step() in rdzv_state.h:
//
//   rdzv_client_step(state, event, now, spec) -> effects
//
// No sockets, no clock reads, no randomness: NetworkRendezvous (network_rendezvous.cpp) turns
// what happens (the agent asks for a round, a connection opens or breaks, a frame arrives, a
// timer fires) into a ClientEvent, calls rdzv_client_step and applies the ClientEffects in order
// (connect, send, deliver, notify, close, arm a timer, log). The handshake stays with the
// executor: it says when the connection may carry requests (Connected) and when the server has
// proved itself (Greeted). docs/design.md#rendezvous-state-machine draws the phases.
//
//   [Idle] --next round--> Joining --RoundReady--> Running --Restart--> Idle
//     |                     |  ^                     |
//     | keep out            +--+ Refused(Dropped):   | Refused(Dropped): new id, a counted
//     v                     |    new id, join again  | Restart to the agent, then Idle
//   KeptOut --next round----^                        v
//   Done <-- Closed, Refused, unreachable for connect_timeout, a TLS failure, leave
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "rendezvous/protocol.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv {

using common::TimePoint;

/// What the client knows of the agent's request.
enum class ClientPhase {
  Idle,     ///< between rounds: no round asked for, none running
  Joining,  ///< a round was asked for; its result is owed to the agent
  Running,  ///< this node's workers run a round
  /// The agent's --health_check failed: the server holds the node out of rounds (Join::
  /// kept_out) until the agent asks for a round, and tells it the job's end.
  KeptOut,
  Done,  ///< the job is over for this node (closed, refused, unreachable, left)
};

/// The connection to the server as the client sees it.
enum class ClientLink {
  Down,         ///< none (a retry may be armed)
  Connecting,   ///< resolving and connecting
  Handshaking,  ///< open, the hello sent; requests wait for the server's proof
  Ready,        ///< requests may go out
};

/// Everything the client holds between events.
struct ClientState {
  ClientPhase phase = ClientPhase::Idle;
  ClientLink link = ClientLink::Down;
  /// The round this node's workers run (Running), as the server announced it.
  std::optional<RoundReady> round;
  bool succeeded = false;       ///< this node's workers of the running round all exited 0
  int known_restart_count = 0;  ///< the job's count as last heard, sent with every join
  std::optional<WorkersFailed> unsent_failure;  ///< reported while the link was not ready
  /// Since when the server has been unreachable (first contact counts too); cleared once it
  /// greets.
  std::optional<TimePoint> lost_since;
  /// This link sent a join (or a kept-out join): heartbeats may follow it.
  bool joined_on_link = false;
  bool greeted = false;           ///< a server greeted this node once (first contact is over)
  bool link_greeted = false;      ///< the current link's server greeted
  TimePoint link_opened;          ///< when the current link opened (Connected)
  bool unreachable_said = false;  ///< the first contact's "not reachable yet" line was logged
  Millis backoff{100};            ///< the next retry's delay
  std::optional<Waiting> last_waiting;
  TimePoint last_waiting_at;
  std::string last_status_line;  ///< the waiting line without its time, as last printed
  std::string kept_out;          ///< KeptOut: why the health check failed
  /// What the current link's server said in its greeting: it holds kept-out nodes (an older one
  /// would place them). Unknown until it greets: a kept-out join waits for it.
  std::optional<bool> server_holds_kept_out;
  /// A server greeted without holding kept-out nodes: a kept-out node stays away from it.
  bool server_lacks_kept_out = false;
};

/// What does not change while the node runs.
struct ClientSpec {
  std::string run_id;
  std::string endpoint;  ///< host:port, as format_endpoint writes it (for messages)
  std::string name;
  std::optional<int> node_rank;
  RdzvSettings settings;
  Millis connect_timeout{60'000};
  Millis status_interval{5'000};
  /// False over a link that cannot go silent (LocalRendezvous's in-memory one): no heartbeats.
  bool heartbeats = true;
  /// What the endpoint is, in "lost the <server> at <endpoint>" (the etcd backend: "etcd").
  std::string server = "rendezvous server";
  /// What to check when it stays unreachable for connect_timeout.
  std::string unreachable_advice =
      "check --rdzv_endpoint and that the node hosting it (the endpoint's host) or "
      "ddprun-rdzvd is running";
};

// ---- events -------------------------------------------------------------------------------

/// The agent asks for the next round (RendezvousHandler::next_rendezvous).
struct NextRound {};
/// A connection opened and the hello went out; `can_send`: requests may follow at once (no
/// secret to wait for).
struct Connected {
  bool can_send = false;
};
/// The server's hello (and proof of the secret, when there is one) arrived.
struct Greeted {
  bool holds_kept_out = true;  ///< the server takes Join::kept_out (an older one does not)
};
/// The connection broke, or no connection could be made.
struct ConnectionLost {
  std::string why;
  bool tls_failed = false;  ///< a certificate refused, TLS on one side only: no retry helps
};
/// The server cannot be used: it refused the handshake, speaks another protocol, or sent a
/// message that does not parse.
struct ServerUnusable {
  RendezvousError error;
};
/// A message from the server, after the handshake.
struct FrameReceived {
  ServerMessage message;
};
struct ReportFailure {
  WorkersFailed failure;
};
struct ReportSuccess {};
/// The agent's health check failed (`why`): be known to the job without a place in a round
/// (RendezvousHandler::keep_out).
struct KeepOut {
  std::string why;
};
struct LeaveJob {
  std::string reason;
};
struct RetryDue {};
struct HeartbeatDue {};
struct StatusDue {};
/// The link opened kGreetingLimit ago (or what was left of connect_timeout, if less) and the
/// server has not greeted on it.
struct GreetingDue {};

using ClientEvent = std::variant<NextRound, Connected, Greeted, ConnectionLost, ServerUnusable,
                                 FrameReceived, ReportFailure, ReportSuccess, KeepOut, LeaveJob,
                                 RetryDue, HeartbeatDue, StatusDue, GreetingDue>;

// ---- effects ------------------------------------------------------------------------------

/// Open a connection to the endpoint (Connected or ConnectionLost follows).
struct Connect {};
/// Send a Join. The executor fills node_id, addr and master_port (they need I/O: the node's
/// id, the connection's local address, a free port).
struct SendJoin {
  Join join;
};
/// Send Heartbeat, WorkersFailed, WorkersSucceeded or Leave.
struct Send {
  AgentMessage message;
};
/// Hand the round's result to the agent's pending next_rendezvous callback. `posted`: later on
/// the event loop, not from inside the agent's call.
struct Deliver {
  RendezvousResult result;
  bool posted = false;
};
/// Tell the agent (Restart, Closed, RendezvousError).
struct Notify {
  Notice notice;
};
/// Close the connection, at once or once what is queued has been written.
struct CloseConnection {
  bool after_writes = false;
};
/// This node's id is dead at the server: pick a new one for the joins that follow.
struct RenewNodeId {};
/// The agent left: drop its callbacks, nothing reaches it any more.
struct Detach {};

enum class ClientTimer { Retry, Heartbeat, Status, Greeting };
struct ArmClientTimer {
  ClientTimer timer = ClientTimer::Retry;
  Millis after{0};
};
struct DisarmClientTimer {
  ClientTimer timer = ClientTimer::Retry;
};

enum class ClientLogLevel { Debug, Info, Warn };
struct ClientLog {
  ClientLogLevel level = ClientLogLevel::Info;
  std::string text;
};

using ClientEffect =
    std::variant<Connect, SendJoin, Send, Deliver, Notify, CloseConnection, RenewNodeId, Detach,
                 ArmClientTimer, DisarmClientTimer, ClientLog>;

/// Applies `event` at time `now` to `state` and returns what the executor must do, in order.
/// Transitions (one comment each in the implementation):
/// - NextRound: Done -> the round fails at once (posted); else Joining, and the join goes out
///   (or a connection is made first).
/// - RoundReady while Joining -> Running, delivered; Restart while Running -> Idle, notified;
///   Closed -> Done (a Joining round fails with it, else notified).
/// - Refused(Dropped) before the workers succeeded: a new node id; Joining joins again at once,
///   Running tells the agent to restart (counted) and goes Idle. Other refusals -> Done.
/// - ConnectionLost: retry with back-off doubling to 2 s; unreachable for connect_timeout ->
///   Done with a Connection error naming the endpoint; a TLS failure -> Done at once.
/// - GreetingDue (a link whose server took the connection but has not greeted, TLS and the
///   secret's proof included, within kGreetingLimit): as ConnectionLost, counted towards
///   connect_timeout from the first attempt.
/// - Greeted after a loss: the Running round is claimed again in the join (RoundClaim).
/// - KeepOut while Idle (or KeptOut): KeptOut, and a join with kept_out goes out (again after a
///   loss or a drop); a server that does not hold kept-out nodes gets no join (the link closes).
///   Closed -> Done, notified; NextRound joins as usual.
std::vector<ClientEffect> rdzv_client_step(ClientState& state, const ClientEvent& event,
                                           TimePoint now, const ClientSpec& spec);

/// The status line printed while a round forms, e.g. "waiting for nodes: 3/4 joined,
/// node_rank 2 missing, 12 s of 600 s".
std::string format_waiting(const Waiting& waiting);

/// Names of ClientPhase for the design doc and logs.
const char* client_phase_name(ClientPhase phase);

}  // namespace ddprun::rdzv
