#include "rendezvous/rdzv_client.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/strings.h"

namespace ddprun::rdzv {

namespace {

constexpr Millis kFirstBackoff{100};
constexpr Millis kMaxBackoff = kMaxReconnectBackoff;
/// How long a first contact may fail before the node says it waits for the server.
constexpr Millis kUnreachableNotice{5'000};
/// How long a server may take to greet (TLS, its hello, the secret's proof) once it took the
/// connection: a port that takes connections and says nothing (another service, a stalled
/// server) would otherwise hold the node for good. The daemon's --hello_timeout default.
constexpr Millis kGreetingLimit{10'000};

long long seconds(Millis m) { return static_cast<long long>(m.count() / 1000); }

class Stepper {
 public:
  Stepper(ClientState& s, TimePoint now, const ClientSpec& spec) : s_(s), now_(now), spec_(spec) {}

  std::vector<ClientEffect> take() { return std::move(out_); }

  void on(const NextRound&) {
    if (s_.phase == ClientPhase::Done) {
      // Done -> Done: the job is over for this node; the round fails at once (later, as if
      // it had gone to the server).
      out_.push_back(Deliver{
          RendezvousError{RendezvousErrorKind::Closed, "the rendezvous is over for this node"},
          true});
      return;
    }
    // Idle/Running -> Joining: the agent asks for the next round.
    s_.phase = ClientPhase::Joining;
    s_.round.reset();
    s_.last_waiting.reset();  // a quarantine, too, is said afresh for every join
    s_.succeeded = false;
    s_.unsent_failure.reset();
    s_.kept_out.clear();
    if (ready())
      send_join();
    else if (s_.link == ClientLink::Down)
      connect();
    // else: the handshake is under way; the join follows once the link is ready.
  }

  void on(const Connected& e) {
    if (s_.phase == ClientPhase::Done) {
      out_.push_back(CloseConnection{});
      return;
    }
    s_.link = e.can_send ? ClientLink::Ready : ClientLink::Handshaking;
    s_.link_greeted = false;
    s_.link_opened = now_;
    // No longer than what is left of connect_timeout, when the server was already unreachable
    const Millis left =
        spec_.connect_timeout -
        (s_.lost_since ? std::chrono::duration_cast<Millis>(now_ - *s_.lost_since) : Millis{0});
    out_.push_back(ArmClientTimer{ClientTimer::Greeting,
                                  std::max(Millis{1'000}, std::min(kGreetingLimit, left))});
    s_.joined_on_link = false;         // a new link: its server has heard nothing of this node yet
    s_.server_holds_kept_out.reset();  // a new link: its server has not greeted yet
    // Without a secret the join follows the hello at once (one round trip saved); with one,
    // nothing is sent before the server has proved that it holds the secret.
    if (ready()) after_ready();
    if (spec_.heartbeats)
      out_.push_back(ArmClientTimer{ClientTimer::Heartbeat, spec_.settings.keep_alive_interval});
  }

  void on(const Greeted& e) {
    if (s_.link == ClientLink::Down || s_.link == ClientLink::Connecting) return;
    s_.server_holds_kept_out = e.holds_kept_out;
    if (e.holds_kept_out) s_.server_lacks_kept_out = false;  // upgraded since
    // A link that could send before the greeting: the kept-out join waited for it.
    if (s_.link == ClientLink::Ready && s_.phase == ClientPhase::KeptOut) send_kept_out();
    // Reachable again only once the server greeted: a connection that a server closes at once
    // (TLS expected, out of descriptors) keeps counting towards connect_timeout.
    if (s_.lost_since && s_.round)
      log(ClientLogLevel::Info, fmt::format("reconnected to the rendezvous at {}", spec_.endpoint));
    s_.lost_since.reset();
    s_.greeted = true;
    s_.link_greeted = true;
    out_.push_back(DisarmClientTimer{ClientTimer::Greeting});
    s_.backoff = kFirstBackoff;
    if (s_.link == ClientLink::Handshaking) {
      s_.link = ClientLink::Ready;
      after_ready();
    }
  }

  void on(const ConnectionLost& e) {
    const bool had_link = s_.link != ClientLink::Down;
    s_.link = ClientLink::Down;
    if (had_link) out_.push_back(CloseConnection{});
    out_.push_back(DisarmClientTimer{ClientTimer::Heartbeat});
    out_.push_back(DisarmClientTimer{ClientTimer::Greeting});
    if (s_.phase == ClientPhase::Done) return;
    // A certificate refused, or TLS on one side only: no retry cures that.
    if (e.tls_failed)
      return give_up(RendezvousError{RendezvousErrorKind::State,
                                     e.why + "; check --rdzv_conf tls_ca, tls_cert and tls_key "
                                             "against the server's TLS settings"});
    if (!s_.lost_since) {
      s_.lost_since = now_;
      log(ClientLogLevel::Warn,
          fmt::format("lost the {} at {}: {}; reconnecting", spec_.server, spec_.endpoint, e.why));
    }
    // any -> Done: the server stayed unreachable for connect_timeout
    if (now_ - *s_.lost_since >= spec_.connect_timeout) return give_up_unreachable(e.why);
    // First contact that takes a while (the host node starts later, or the endpoint is wrong):
    // said once, so the wait up to connect_timeout is no silence.
    if (!s_.greeted && !s_.unreachable_said && now_ - *s_.lost_since >= kUnreachableNotice) {
      s_.unreachable_said = true;
      log(ClientLogLevel::Warn,
          fmt::format("the {} at {} is not reachable yet ({}); retrying for {} s in all "
                      "(--rdzv_conf connect_timeout)",
                      spec_.server, spec_.endpoint, e.why, seconds(spec_.connect_timeout)));
    }
    out_.push_back(ArmClientTimer{ClientTimer::Retry, s_.backoff});
    s_.backoff = std::min(s_.backoff * 2, kMaxBackoff);
  }

  void on(const ServerUnusable& e) {
    // any -> Done: the server refused the handshake or spoke nonsense; no retry cures that
    give_up(e.error);
  }

  void on(const FrameReceived& e) {
    std::visit([this](const auto& m) { on_message(m); }, e.message);
  }

  void on(const ReportFailure& e) {
    if (s_.phase != ClientPhase::Running) return;
    if (ready()) return out_.push_back(Send{e.failure});
    // Goes out once the link is ready again. A worker that fails while the server is lost has
    // most likely lost a peer with it (the agent hosting the rendezvous died, and its workers
    // with it): its failure blames no node for --quarantine_after.
    s_.unsent_failure = e.failure;
    if (s_.lost_since) s_.unsent_failure->culprit = false;
  }

  void on(const ReportSuccess&) {
    if (s_.phase != ClientPhase::Running || !s_.round) return;
    s_.succeeded = true;
    // Not yet ready: the join after the handshake claims the round as succeeded.
    if (ready()) out_.push_back(Send{WorkersSucceeded{s_.round->round}});
  }

  void on(const KeepOut& e) {
    // Only between rounds: a node that joins or runs a round is not checking itself.
    if (s_.phase != ClientPhase::Idle && s_.phase != ClientPhase::KeptOut) return;
    // Idle -> KeptOut: known to the job, placed in no round, told of its end
    s_.phase = ClientPhase::KeptOut;
    s_.kept_out = e.why;
    if (ready())
      after_ready();
    else if (s_.link == ClientLink::Down && !s_.server_lacks_kept_out)
      connect();  // (a server found too old is not asked again: it was said once)
  }

  void on(const LeaveJob& e) {
    if (s_.link != ClientLink::Down && s_.phase != ClientPhase::Done) {
      // A link that never joined: its server knows nothing of this node to forget.
      if (ready() && s_.joined_on_link) out_.push_back(Send{Leave{e.reason}});
      out_.push_back(CloseConnection{true});
    }
    // any -> Done: this node leaves the job
    s_.phase = ClientPhase::Done;
    out_.push_back(Detach{});
    disarm_all();
  }

  void on(const RetryDue&) { connect(); }

  void on(const GreetingDue&) {
    if (s_.link == ClientLink::Down || s_.link == ClientLink::Connecting || s_.link_greeted ||
        s_.phase == ClientPhase::Done)
      return;
    // Handshaking/Ready -> Down: the port took the connection and said nothing; like an
    // unreachable server's, the time counts towards connect_timeout from the first attempt
    on(ConnectionLost{fmt::format(
        "it took the connection but sent no greeting within {} s: a port of another service, "
        "such as torchrun's store, or a server that has stalled",
        seconds(std::chrono::duration_cast<Millis>(now_ - s_.link_opened) + Millis{500}))});
  }

  void on(const HeartbeatDue&) {
    if (s_.link == ClientLink::Down || s_.link == ClientLink::Connecting ||
        s_.phase == ClientPhase::Done)
      return;
    // Only once this link joined: a server knows the node by its join, and one restarted while
    // this node paused between rounds refuses a connection whose first message is no join.
    if (ready() && s_.joined_on_link) out_.push_back(Send{Heartbeat{}});
    out_.push_back(ArmClientTimer{ClientTimer::Heartbeat, spec_.settings.keep_alive_interval});
  }

  void on(const StatusDue&) {
    if (s_.phase != ClientPhase::Joining || !s_.last_waiting) return;
    Waiting w = *s_.last_waiting;
    const auto elapsed = std::chrono::duration_cast<Millis>(now_ - s_.last_waiting_at);
    w.waited += elapsed;
    w.quarantine_left = std::max(Millis{0}, w.quarantine_left - elapsed);
    log(ClientLogLevel::Info, format_waiting(w));
    out_.push_back(ArmClientTimer{ClientTimer::Status, spec_.status_interval});
  }

 private:
  void on_message(const Waiting& w) {
    s_.last_waiting = w;
    s_.last_waiting_at = now_;
    const std::string line = format_waiting(w);
    // Print on a change of membership (the line without its time), else every interval.
    const std::string key = line.substr(0, line.rfind(", "));
    if (key == s_.last_status_line) return;
    s_.last_status_line = key;
    log(ClientLogLevel::Info, line);
    out_.push_back(ArmClientTimer{ClientTimer::Status, spec_.status_interval});
  }

  void on_message(const RoundReady& ready) {
    if (s_.phase != ClientPhase::Joining) {
      log(ClientLogLevel::Debug,
          "ignoring round " + std::to_string(ready.round) + " from the server: not joining");
      return;
    }
    // Joining -> Running: the round is complete
    s_.phase = ClientPhase::Running;
    s_.round = ready;
    s_.known_restart_count = ready.restart_count;
    out_.push_back(DisarmClientTimer{ClientTimer::Status});
    s_.last_status_line.clear();
    RendezvousInfo info;
    info.group_rank = ready.group_rank;
    info.group_world_size = ready.group_world_size;
    info.master_addr = ready.master_addr;
    info.master_port = ready.master_port;
    info.restart_count = ready.restart_count;
    info.round = ready.round;
    log(ClientLogLevel::Info,
        fmt::format("rendezvous round {} complete: group rank {} of {} nodes ({}), master {}:{}",
                    ready.round, ready.group_rank, ready.group_world_size,
                    common::join(ready.participants.get(), ", "), ready.master_addr,
                    ready.master_port));
    out_.push_back(Deliver{info});
  }

  void on_message(const Restart& restart) {
    if (s_.phase == ClientPhase::Joining && s_.last_waiting &&
        !s_.last_waiting->quarantined.empty()) {
      // Joining -> Idle: the node was quarantined and may join again; the agent checks itself
      // first, then asks for a round. (Any other Restart while joining is a late echo.)
      s_.phase = ClientPhase::Idle;
      s_.known_restart_count = std::max(s_.known_restart_count, restart.restart_count);
      s_.last_status_line.clear();
      return fail_round(RendezvousError{RendezvousErrorKind::Rejoin, restart.reason});
    }
    if (s_.phase != ClientPhase::Running) return;
    // Running -> Idle: the workers stop; the agent asks for the next round
    s_.phase = ClientPhase::Idle;
    s_.known_restart_count = std::max(s_.known_restart_count, restart.restart_count);
    out_.push_back(Notify{restart});
  }

  void on_message(const Closed& closed) {
    const ClientPhase was = s_.phase;
    // any -> Done: the job is over
    s_.phase = ClientPhase::Done;
    if (was == ClientPhase::Joining && closed.outcome != JobOutcomeKind::TimedOut) {
      // A spare (or a node rejoining, or one quarantined) of a job that ended without it: the
      // job's end, with the job's exit status (the agent says why), not a failed rendezvous
      out_.push_back(DisarmClientTimer{ClientTimer::Status});
      log(ClientLogLevel::Info,
          "the job ended while this node waited for a round" +
              (closed.outcome == JobOutcomeKind::Succeeded ? ": " + closed.message : ""));
      return out_.push_back(Notify{closed});
    }
    if (was == ClientPhase::Joining)
      return fail_round(RendezvousError{RendezvousErrorKind::Timeout, closed.message});
    out_.push_back(Notify{closed});
  }

  void on_message(const Refused& refused) {
    // A node whose workers already succeeded does not rejoin: as a newcomer it would make the
    // job scale up and run again. It ends with the refusal, as any refused node does.
    if (refused.kind == RefusalKind::Dropped && s_.phase != ClientPhase::Done && !s_.succeeded)
      return rejoin_as_new_node(refused.message);
    const ClientPhase was = s_.phase;
    // any -> Done: this node cannot take part
    s_.phase = ClientPhase::Done;
    RendezvousError error{refused.kind == RefusalKind::Closed ? RendezvousErrorKind::Closed
                                                              : RendezvousErrorKind::State,
                          refused.message};
    if (was == ClientPhase::Joining) return fail_round(error);
    out_.push_back(Notify{error});
  }

  void on_message(const StatusReply&) {}  // never sent to an agent

  /// The server dropped this node (silence, a partition) and will not take its id again: join
  /// once more as a newcomer with a new id; workers that ran a round are stopped (Restart).
  void rejoin_as_new_node(const std::string& why) {
    const ClientPhase was = s_.phase;
    // A participant running its workers cost the job a restart (the server counted it when it
    // dropped the node); its next round brings the job's count.
    const bool counted = was == ClientPhase::Running;
    const int next_round = s_.round ? s_.round->round + 1 : 0;
    out_.push_back(RenewNodeId{});
    s_.round.reset();
    s_.succeeded = false;
    s_.unsent_failure.reset();
    // The server closes this connection; the next one speaks for the new id.
    if (s_.link != ClientLink::Down) out_.push_back(CloseConnection{});
    s_.link = ClientLink::Down;
    out_.push_back(DisarmClientTimer{ClientTimer::Heartbeat});
    log(ClientLogLevel::Warn,
        fmt::format("the rendezvous dropped this node: {}; joining the job again as a new node",
                    why));
    // Joining -> Joining: the same request for a round, with the new id (KeptOut -> KeptOut:
    // the same for its kept-out join)
    if (was == ClientPhase::Joining || was == ClientPhase::KeptOut) return connect();
    // Running -> Idle: the workers stop (Restart), then the next round joins with the new id.
    // Idle -> Idle: a Restart already came; the join that follows it uses the new id.
    s_.phase = ClientPhase::Idle;
    if (was == ClientPhase::Running)
      out_.push_back(Notify{Restart{next_round,
                                    "this node was dropped by the rendezvous and joins again as a "
                                    "new node (a spare if the job went on without it)",
                                    counted, s_.known_restart_count + (counted ? 1 : 0)}});
  }

  bool ready() const { return s_.link == ClientLink::Ready; }

  void connect() {
    if (s_.link != ClientLink::Down || s_.phase == ClientPhase::Done) return;
    s_.link = ClientLink::Connecting;
    if (!s_.lost_since) s_.lost_since = now_;
    out_.push_back(Connect{});
  }

  /// Sends what waits for a ready link: the join (again) and an unsent failure.
  void after_ready() {
    if (s_.phase == ClientPhase::Joining || s_.phase == ClientPhase::Running) send_join();
    if (s_.phase == ClientPhase::KeptOut && s_.server_holds_kept_out) send_kept_out();
    if (s_.unsent_failure) {
      out_.push_back(Send{*s_.unsent_failure});
      s_.unsent_failure.reset();
    }
  }

  /// What every join of this node says (the executor adds its id and addresses).
  Join this_node_join() const {
    Join join;
    join.run_id = spec_.run_id;
    join.name = spec_.name;
    join.node_rank = spec_.node_rank;
    join.settings = spec_.settings;
    join.restart_count = s_.known_restart_count;
    return join;
  }

  void send_join() {
    Join join = this_node_join();
    if (s_.phase == ClientPhase::Running && s_.round) {
      // Re-registering after a lost connection: the workers still run this round.
      const RoundReady& r = *s_.round;
      join.resume = RoundClaim{r.round,       r.group_rank,  r.group_world_size, r.restart_count,
                               r.master_addr, r.master_port, s_.succeeded};
    }
    s_.joined_on_link = true;
    out_.push_back(SendJoin{std::move(join)});
  }

  /// KeptOut, once the server greeted: the join that makes the job hold this node out of rounds.
  /// A server that predates it would place the node: it gets nothing, and the link closes until
  /// the next round.
  void send_kept_out() {
    if (!*s_.server_holds_kept_out) {
      const bool said = s_.server_lacks_kept_out;
      s_.server_lacks_kept_out = true;
      if (!said)
        log(ClientLogLevel::Warn,
            fmt::format("the {} at {} is older than this ddprun and would place a node kept out by "
                        "its health check in a round: this node stays away from it until a check "
                        "passes, and will not hear of the job's end meanwhile",
                        spec_.server, spec_.endpoint));
      out_.push_back(CloseConnection{});
      out_.push_back(DisarmClientTimer{ClientTimer::Heartbeat});
      s_.link = ClientLink::Down;
      return;
    }
    Join join = this_node_join();
    join.kept_out = s_.kept_out.empty() ? "its health check failed" : s_.kept_out;
    s_.joined_on_link = true;
    out_.push_back(SendJoin{std::move(join)});
  }

  /// How long the server has been unreachable: connect_timeout, or more when the attempt that
  /// ended past it waited for an answer.
  Millis unreachable_for() const {
    return std::max(spec_.connect_timeout,
                    std::chrono::duration_cast<Millis>(now_ - s_.lost_since.value_or(now_)));
  }

  void give_up_unreachable(const std::string& why) {
    give_up(RendezvousError{RendezvousErrorKind::Connection,
                            "cannot reach the " + spec_.server + " at " + spec_.endpoint + " for " +
                                std::to_string(seconds(unreachable_for())) + " s (" + why + "); " +
                                spec_.unreachable_advice});
  }

  void give_up(RendezvousError error) {
    const ClientPhase was = s_.phase;
    s_.phase = ClientPhase::Done;
    if (s_.link != ClientLink::Down) out_.push_back(CloseConnection{});
    s_.link = ClientLink::Down;
    disarm_all();
    if (was == ClientPhase::Joining) return fail_round(error);
    out_.push_back(Notify{error});
  }

  void fail_round(RendezvousError error) {
    out_.push_back(DisarmClientTimer{ClientTimer::Status});
    out_.push_back(Deliver{std::move(error)});
  }

  void disarm_all() {
    out_.push_back(DisarmClientTimer{ClientTimer::Retry});
    out_.push_back(DisarmClientTimer{ClientTimer::Heartbeat});
    out_.push_back(DisarmClientTimer{ClientTimer::Status});
    out_.push_back(DisarmClientTimer{ClientTimer::Greeting});
  }

  void log(ClientLogLevel level, std::string text) {
    out_.push_back(ClientLog{level, std::move(text)});
  }

  ClientState& s_;
  TimePoint now_;
  const ClientSpec& spec_;
  std::vector<ClientEffect> out_;
};

}  // namespace

std::string format_waiting(const Waiting& w) {
  const int joined = w.joined_count;
  // A quarantined node hears once, as it joins (while the job forms again without it): no
  // node count that would stay as it was then.
  if (!w.quarantined.empty())
    return "this node is quarantined: " + w.quarantined + "; it checks itself and joins again in " +
           std::to_string(seconds(w.quarantine_left)) + " s";
  if (w.wait_listed && w.job_running)  // no deadline
    return "waiting for a place in the job: it runs with " + std::to_string(joined) +
           " node(s), at most " + std::to_string(w.max_nodes);
  if (w.wait_listed)  // the deadline is the round's, not this node's
    return "waiting for a place in the job: the next round is full (" + std::to_string(joined) +
           " of at most " + std::to_string(w.max_nodes) + " node(s), those restarting included)";
  const int target = joined < w.min_nodes ? w.min_nodes : w.max_nodes;
  std::string line =
      "waiting for nodes: " + std::to_string(joined) + "/" + std::to_string(target) + " joined";
  if (w.min_nodes != w.max_nodes)
    line += " (min " + std::to_string(w.min_nodes) + ", max " + std::to_string(w.max_nodes) + ")";
  if (const std::vector<int>& missing = w.missing_node_ranks; !missing.empty()) {
    line += ", node_rank ";
    for (size_t i = 0; i < missing.size(); ++i)
      line += (i ? ", " : "") + std::to_string(missing[i]);
    line += " missing";
  }
  return line + ", " + std::to_string(seconds(w.waited)) + " s of " +
         std::to_string(seconds(w.join_timeout)) + " s";
}

const char* client_phase_name(ClientPhase phase) {
  switch (phase) {
    case ClientPhase::Idle:
      return "idle";
    case ClientPhase::Joining:
      return "joining";
    case ClientPhase::Running:
      return "running";
    case ClientPhase::KeptOut:
      return "kept_out";
    case ClientPhase::Done:
      return "done";
  }
  return "?";
}

std::vector<ClientEffect> rdzv_client_step(ClientState& state, const ClientEvent& event,
                                           TimePoint now, const ClientSpec& spec) {
  Stepper stepper(state, now, spec);
  std::visit([&stepper](const auto& e) { stepper.on(e); }, event);
  return stepper.take();
}

}  // namespace ddprun::rdzv
