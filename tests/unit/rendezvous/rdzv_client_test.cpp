#include "rendezvous/rdzv_client.h"

#include <catch2/catch.hpp>

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {

/// One client, a made-up clock and the effects of the last step.
struct Client {
  ClientState s;
  ClientSpec spec;
  TimePoint now{};
  std::vector<ClientEffect> out;

  Client() {
    spec.run_id = "job";
    spec.endpoint = "rdzv.example:29400";
    spec.name = "node-a";
    spec.settings.min_nodes = 2;
    spec.settings.max_nodes = 2;
    spec.settings.max_restarts = 3;
    spec.connect_timeout = 10s;
  }

  const std::vector<ClientEffect>& on(const ClientEvent& e) {
    out = rdzv_client_step(s, e, now, spec);
    return out;
  }

  template <class T>
  std::vector<T> all() const {
    std::vector<T> found;
    for (const auto& e : out)
      if (const auto* t = std::get_if<T>(&e)) found.push_back(*t);
    return found;
  }
  template <class T>
  bool has() const {
    return !all<T>().empty();
  }
  template <class M>
  std::vector<M> sent() const {
    std::vector<M> found;
    for (const auto& send : all<Send>())
      if (const auto* m = std::get_if<M>(&send.message)) found.push_back(*m);
    return found;
  }
  bool logged(const std::string& text) const {
    for (const auto& line : all<ClientLog>())
      if (line.text.find(text) != std::string::npos) return true;
    return false;
  }
  std::optional<Millis> armed(ClientTimer timer) const {
    for (const auto& arm : all<ArmClientTimer>())
      if (arm.timer == timer) return arm.after;
    return std::nullopt;
  }

  /// Asks for a round over a connection without a secret.
  void join() {
    on(NextRound{});
    on(Connected{true});
    on(Greeted{});
  }
  /// Joins and completes round `round` as group rank 0 of 2.
  void run_round(int round = 0, int restart_count = 0) {
    join();
    on(FrameReceived{RoundReady{round, 0, 2, "10.0.0.1", 29500, restart_count, {"a", "b"}}});
  }
};

}  // namespace

TEST_CASE("asking for a round without a connection connects first and joins once it is up",
          "[rdzv][client][unit]") {
  Client c;
  c.on(NextRound{});
  CHECK(c.s.phase == ClientPhase::Joining);
  CHECK(c.has<Connect>());
  CHECK_FALSE(c.has<SendJoin>());
  c.on(Connected{true});
  REQUIRE(c.all<SendJoin>().size() == 1);
  const Join join = c.all<SendJoin>()[0].join;
  CHECK(join.run_id == "job");
  CHECK(join.name == "node-a");
  CHECK_FALSE(join.resume);
  CHECK(c.armed(ClientTimer::Heartbeat) == c.spec.settings.keep_alive_interval);
}

TEST_CASE("a link that cannot go silent arms no heartbeat", "[rdzv][client][unit]") {
  Client c;
  c.spec.heartbeats = false;
  c.on(NextRound{});
  c.on(Connected{true});
  CHECK(c.all<SendJoin>().size() == 1);
  CHECK_FALSE(c.armed(ClientTimer::Heartbeat));
}

TEST_CASE("with a secret the join waits for the server's proof", "[rdzv][client][unit]") {
  Client c;
  c.on(NextRound{});
  c.on(Connected{false});
  CHECK(c.s.link == ClientLink::Handshaking);
  CHECK_FALSE(c.has<SendJoin>());
  c.on(Greeted{});
  CHECK(c.s.link == ClientLink::Ready);
  CHECK(c.all<SendJoin>().size() == 1);
}

TEST_CASE("a completed round is delivered with this node's place and logged",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round(0, 1);
  CHECK(c.s.phase == ClientPhase::Running);
  REQUIRE(c.all<Deliver>().size() == 1);
  const auto info = std::get<RendezvousInfo>(c.all<Deliver>()[0].result);
  CHECK(info.group_world_size == 2);
  CHECK(info.master_port == 29500);
  CHECK(info.restart_count == 1);
  CHECK(
      c.logged("rendezvous round 0 complete: group rank 0 of 2 nodes (a, b), master "
               "10.0.0.1:29500"));
  CHECK(c.s.known_restart_count == 1);
}

TEST_CASE("a round announced while not joining is ignored", "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(FrameReceived{RoundReady{1, 1, 2, "x", 1, 0, {}}});
  CHECK_FALSE(c.has<Deliver>());
  CHECK(c.s.round->round == 0);
}

TEST_CASE("a restart while running tells the agent and the next join carries the count",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(FrameReceived{Restart{1, "worker failure on node b: boom", true, 1}});
  CHECK(c.s.phase == ClientPhase::Idle);
  REQUIRE(c.all<Notify>().size() == 1);
  CHECK(std::get<Restart>(c.all<Notify>()[0].notice).restart_count == 1);
  c.on(NextRound{});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.restart_count == 1);
  CHECK_FALSE(c.all<SendJoin>()[0].join.resume);
}

TEST_CASE("a restart that arrives while joining is ignored", "[rdzv][client][unit]") {
  Client c;
  c.join();
  c.on(FrameReceived{Restart{1, "late", true, 1}});
  CHECK(c.s.phase == ClientPhase::Joining);
  CHECK_FALSE(c.has<Notify>());
}

TEST_CASE("a quarantined node told to join again hands the agent a rejoin, not a failure",
          "[rdzv][client][unit][spares]") {
  Client c;
  c.join();
  Waiting w;
  w.wait_listed = true;
  w.quarantined = "its workers caused 2 group failures in a row";
  w.quarantine_left = std::chrono::seconds(30);
  c.on(FrameReceived{w});
  c.on(FrameReceived{Restart{4, "node b may take part again: its quarantine is over", false, 2}});
  CHECK(c.s.phase == ClientPhase::Idle);
  REQUIRE(c.all<Deliver>().size() == 1);
  const auto error = std::get<RendezvousError>(c.all<Deliver>()[0].result);
  CHECK(error.kind == RendezvousErrorKind::Rejoin);
  CHECK_THAT(error.message, Catch::Contains("its quarantine is over"));
  CHECK_FALSE(c.has<Notify>());
  c.on(NextRound{});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.restart_count == 2);
}

TEST_CASE("a job that succeeded while this node waited (a spare) ends it as the job ended",
          "[rdzv][client][unit][spares]") {
  Client c;
  c.join();
  c.on(FrameReceived{Closed{JobOutcomeKind::Succeeded,
                            "the workers of all 2 nodes succeeded in "
                            "round 2",
                            0, 0, false}});
  CHECK(c.s.phase == ClientPhase::Done);
  CHECK_FALSE(c.has<Deliver>());
  REQUIRE(c.all<Notify>().size() == 1);
  CHECK(std::get<Closed>(c.all<Notify>()[0].notice).outcome == JobOutcomeKind::Succeeded);
}

TEST_CASE("a job that failed while this node waited (a spare) ends it as the job ended",
          "[rdzv][client][unit][spares]") {
  Client c;
  c.join();
  c.on(FrameReceived{Closed{JobOutcomeKind::Failed, "a crash loop", 3, 0, true}});
  CHECK(c.s.phase == ClientPhase::Done);
  CHECK_FALSE(c.has<Deliver>());
  REQUIRE(c.all<Notify>().size() == 1);
  const auto closed = std::get<Closed>(c.all<Notify>()[0].notice);
  CHECK(closed.exit_code == 3);
  CHECK(closed.do_not_requeue);
}

TEST_CASE("a job that timed out while joining fails the round as a timeout",
          "[rdzv][client][unit]") {
  Client c;
  c.join();
  c.on(FrameReceived{Closed{JobOutcomeKind::TimedOut, "only 1 of 2 nodes joined", 0, 0}});
  CHECK(c.s.phase == ClientPhase::Done);
  REQUIRE(c.all<Deliver>().size() == 1);
  const auto error = std::get<RendezvousError>(c.all<Deliver>()[0].result);
  CHECK(error.kind == RendezvousErrorKind::Timeout);
  CHECK(error.message == "only 1 of 2 nodes joined");
}

TEST_CASE("a job closed while running is a notice", "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(FrameReceived{Closed{JobOutcomeKind::Failed, "no restart left", 3, 0}});
  CHECK(c.s.phase == ClientPhase::Done);
  REQUIRE(c.all<Notify>().size() == 1);
  CHECK(std::get<Closed>(c.all<Notify>()[0].notice).exit_code == 3);
}

TEST_CASE("a refusal while joining ends the node with a state error", "[rdzv][client][unit]") {
  Client c;
  c.join();
  c.on(FrameReceived{Refused{RefusalKind::Mismatch, "--nnodes 2 differs"}});
  CHECK(c.s.phase == ClientPhase::Done);
  const auto error = std::get<RendezvousError>(c.all<Deliver>().at(0).result);
  CHECK(error.kind == RendezvousErrorKind::State);
  CHECK(error.message == "--nnodes 2 differs");
}

TEST_CASE("a closed job's refusal is a closed error", "[rdzv][client][unit]") {
  Client c;
  c.join();
  c.on(FrameReceived{Refused{RefusalKind::Closed, "job 'job' is closed"}});
  CHECK(std::get<RendezvousError>(c.all<Deliver>().at(0).result).kind ==
        RendezvousErrorKind::Closed);
}

TEST_CASE("a node dropped while joining takes a new id and asks for the round again",
          "[rdzv][client][unit]") {
  Client c;
  c.join();
  c.on(FrameReceived{Refused{RefusalKind::Dropped, "node a was lost"}});
  CHECK(c.s.phase == ClientPhase::Joining);
  CHECK(c.has<RenewNodeId>());
  CHECK(c.has<CloseConnection>());
  CHECK(c.has<Connect>());
  CHECK_FALSE(c.has<Deliver>());
  CHECK(
      c.logged("the rendezvous dropped this node: node a was lost; joining the job again as a "
               "new node"));
  c.on(Connected{true});
  CHECK(c.all<SendJoin>().size() == 1);
}

TEST_CASE("a node dropped while running stops its workers with a counted restart",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round(2, 1);
  c.on(FrameReceived{Refused{RefusalKind::Dropped, "node a was lost"}});
  CHECK(c.s.phase == ClientPhase::Idle);
  CHECK(c.has<RenewNodeId>());
  CHECK(c.s.link == ClientLink::Down);
  const auto restart = std::get<Restart>(c.all<Notify>().at(0).notice);
  CHECK(restart.next_round == 3);
  CHECK(restart.counted);
  CHECK(restart.restart_count == 2);
  CHECK(restart.reason ==
        "this node was dropped by the rendezvous and joins again as a new node (a spare if the job "
        "went on without it)");
  // The next round is asked for as a newcomer: a new connection and no claim.
  c.on(NextRound{});
  CHECK(c.has<Connect>());
  c.on(Connected{true});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK_FALSE(c.all<SendJoin>()[0].join.resume);
}

TEST_CASE("a node dropped after its workers succeeded ends instead of rejoining",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(ReportSuccess{});
  c.on(FrameReceived{Refused{RefusalKind::Dropped, "node a was lost"}});
  CHECK(c.s.phase == ClientPhase::Done);
  CHECK_FALSE(c.has<RenewNodeId>());
  CHECK(std::holds_alternative<RendezvousError>(c.all<Notify>().at(0).notice));
}

TEST_CASE("a lost connection warns once and retries with a back-off doubling to 2 s",
          "[rdzv][client][unit]") {
  Client c;
  c.spec.connect_timeout = 60s;
  c.run_round();
  c.on(ConnectionLost{"connection reset"});
  CHECK(
      c.logged("lost the rendezvous server at rdzv.example:29400: connection reset; "
               "reconnecting"));
  CHECK(c.has<CloseConnection>());
  std::vector<Millis> delays{*c.armed(ClientTimer::Retry)};
  for (int i = 0; i < 6; ++i) {
    c.now += delays.back();
    c.on(RetryDue{});
    CHECK(c.has<Connect>());
    c.on(ConnectionLost{"connection refused"});
    CHECK_FALSE(c.logged("lost the rendezvous server"));
    delays.push_back(*c.armed(ClientTimer::Retry));
  }
  CHECK(delays == std::vector<Millis>{100ms, 200ms, 400ms, 800ms, 1600ms, 2000ms, 2000ms});
  CHECK(c.s.phase == ClientPhase::Running);
}

TEST_CASE("a first contact failing for 5 s says so once, with how long it retries",
          "[rdzv][client][unit]") {
  Client c;
  c.spec.connect_timeout = 60s;
  c.on(NextRound{});
  c.now += 4s;
  c.on(ConnectionLost{"connection refused"});
  CHECK_FALSE(c.logged("not reachable yet"));
  c.now += 2s;
  c.on(RetryDue{});
  c.on(ConnectionLost{"connection refused"});
  CHECK(
      c.logged("the rendezvous server at rdzv.example:29400 is not reachable yet (connection "
               "refused); retrying for 60 s in all (--rdzv_conf connect_timeout)"));
  // Once only.
  c.now += 2s;
  c.on(RetryDue{});
  c.on(ConnectionLost{"connection refused"});
  CHECK_FALSE(c.logged("not reachable yet"));
  CHECK(c.s.phase == ClientPhase::Joining);
}

TEST_CASE("a port that takes the connection and never greets counts as unreachable",
          "[rdzv][client][unit]") {
  Client c;
  c.spec.connect_timeout = 25s;
  c.on(NextRound{});
  c.on(Connected{true});  // no secret: the join goes out before the server's hello
  CHECK(c.armed(ClientTimer::Greeting) == 10s);
  c.now += 10s;
  c.on(GreetingDue{});
  CHECK(c.has<CloseConnection>());
  CHECK(c.s.link == ClientLink::Down);
  CHECK(
      c.logged("the rendezvous server at rdzv.example:29400 is not reachable yet (it took the "
               "connection but sent no greeting within 10 s: a port of another service, such as "
               "torchrun's store, or a server that has stalled); retrying for 25 s in all"));
  CHECK(c.armed(ClientTimer::Retry));
  // The silence counts from the connection: two more such links spend connect_timeout, the
  // last one waiting only for what is left of it.
  std::vector<Millis> limits;
  for (int i = 0; i < 2 && c.s.phase != ClientPhase::Done; ++i) {
    c.now += 100ms;
    c.on(RetryDue{});
    c.on(Connected{false});
    limits.push_back(*c.armed(ClientTimer::Greeting));
    c.now += limits.back();
    c.on(GreetingDue{});
  }
  CHECK(limits == std::vector<Millis>{10s, 4800ms});
  CHECK(c.s.phase == ClientPhase::Done);
  const auto error = std::get<RendezvousError>(c.all<Deliver>().at(0).result);
  CHECK(error.kind == RendezvousErrorKind::Connection);
  CHECK_THAT(error.message, Catch::Contains("cannot reach the rendezvous server at "
                                            "rdzv.example:29400 for 25 s (it took the connection "
                                            "but sent no greeting within 5 s"));
}

TEST_CASE("a server that greets in time disarms the greeting limit; a late timer does nothing",
          "[rdzv][client][unit]") {
  Client c;
  c.spec.connect_timeout = 4s;  // shorter than the limit: the limit follows it
  c.on(NextRound{});
  c.on(Connected{false});
  CHECK(c.armed(ClientTimer::Greeting) == 4s);
  c.on(Greeted{});
  bool disarmed = false;
  for (const auto& d : c.all<DisarmClientTimer>()) disarmed |= d.timer == ClientTimer::Greeting;
  CHECK(disarmed);
  CHECK(c.has<SendJoin>());
  c.now += 4s;
  c.on(GreetingDue{});
  CHECK(c.out.empty());
  CHECK(c.s.link == ClientLink::Ready);
}

TEST_CASE("a server unreachable for connect_timeout fails the round naming the endpoint",
          "[rdzv][client][unit]") {
  Client c;
  c.on(NextRound{});
  c.now += 4s;
  c.on(ConnectionLost{"connection refused"});
  CHECK_FALSE(c.logged("lost the rendezvous server"));  // first contact: no warning
  CHECK(c.has<ArmClientTimer>());
  c.now += 6s;
  c.on(RetryDue{});
  c.on(ConnectionLost{"connection refused"});
  CHECK(c.s.phase == ClientPhase::Done);
  const auto error = std::get<RendezvousError>(c.all<Deliver>().at(0).result);
  CHECK(error.kind == RendezvousErrorKind::Connection);
  CHECK(error.message ==
        "cannot reach the rendezvous server at rdzv.example:29400 for 10 s (connection refused); "
        "check --rdzv_endpoint and that the node hosting it (the endpoint's host) or "
        "ddprun-rdzvd is running");
}

TEST_CASE("a TLS failure gives up at once", "[rdzv][client][unit]") {
  Client c;
  c.on(NextRound{});
  c.on(ConnectionLost{"certificate verify failed", true});
  CHECK(c.s.phase == ClientPhase::Done);
  const auto error = std::get<RendezvousError>(c.all<Deliver>().at(0).result);
  CHECK(error.kind == RendezvousErrorKind::State);
  CHECK_THAT(error.message, Catch::StartsWith("certificate verify failed; check --rdzv_conf"));
}

TEST_CASE("a server that cannot be used ends the node with its error", "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(ServerUnusable{RendezvousError{RendezvousErrorKind::State, "bad message"}});
  CHECK(c.s.phase == ClientPhase::Done);
  CHECK(std::get<RendezvousError>(c.all<Notify>().at(0).notice).message == "bad message");
  CHECK(c.has<CloseConnection>());
}

TEST_CASE("a reconnect while running claims the round and says so once greeted",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round(4, 2);
  c.on(ReportSuccess{});
  c.on(ConnectionLost{"connection reset"});
  c.on(RetryDue{});
  c.on(Connected{false});
  CHECK_FALSE(c.has<SendJoin>());
  c.on(Greeted{});
  CHECK(c.logged("reconnected to the rendezvous at rdzv.example:29400"));
  REQUIRE(c.all<SendJoin>().size() == 1);
  const auto claim = c.all<SendJoin>()[0].join.resume;
  REQUIRE(claim);
  CHECK(claim->round == 4);
  CHECK(claim->restart_count == 2);
  CHECK(claim->master_port == 29500);
  CHECK(claim->succeeded);
  CHECK(c.s.backoff == 100ms);
  CHECK_FALSE(c.s.lost_since);
}

TEST_CASE("a failure reported while the link is down goes out once it is ready",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(ConnectionLost{"connection reset"});
  c.on(ReportFailure{WorkersFailed{0, "rank 1 exited with 3", 3, 0}});
  CHECK(c.sent<WorkersFailed>().empty());
  c.on(RetryDue{});
  c.on(Connected{true});
  CHECK(c.all<SendJoin>().size() == 1);
  REQUIRE(c.sent<WorkersFailed>().size() == 1);
  CHECK(c.sent<WorkersFailed>()[0].description == "rank 1 exited with 3");
  // It failed while the server was lost (its host died, and a peer with it, most likely):
  // no node is blamed for it.
  CHECK_FALSE(c.sent<WorkersFailed>()[0].culprit);
  CHECK_FALSE(c.s.unsent_failure);
  // On a ready link a failure is this node's, as it says.
  Client d;
  d.run_round();
  d.on(ReportFailure{WorkersFailed{0, "rank 1 exited with 3", 3, 0}});
  REQUIRE(d.sent<WorkersFailed>().size() == 1);
  CHECK(d.sent<WorkersFailed>()[0].culprit);
}

TEST_CASE("reports outside a running round are dropped", "[rdzv][client][unit]") {
  Client c;
  c.join();
  c.on(ReportFailure{WorkersFailed{0, "x", 1, 0}});
  CHECK(c.out.empty());
  c.on(ReportSuccess{});
  CHECK(c.out.empty());
}

TEST_CASE("a success is sent for the running round", "[rdzv][client][unit]") {
  Client c;
  c.run_round(3);
  c.on(ReportSuccess{});
  REQUIRE(c.sent<WorkersSucceeded>().size() == 1);
  CHECK(c.sent<WorkersSucceeded>()[0].round == 3);
}

TEST_CASE("leaving sends a leave and closes after it is written", "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(LeaveJob{"received SIGTERM"});
  CHECK(c.s.phase == ClientPhase::Done);
  REQUIRE(c.sent<Leave>().size() == 1);
  CHECK(c.sent<Leave>()[0].reason == "received SIGTERM");
  REQUIRE(c.all<CloseConnection>().size() == 1);
  CHECK(c.all<CloseConnection>()[0].after_writes);
  CHECK(c.has<Detach>());
  c.on(NextRound{});
  REQUIRE(c.all<Deliver>().size() == 1);
  CHECK(c.all<Deliver>()[0].posted);
  CHECK(std::get<RendezvousError>(c.all<Deliver>()[0].result).message ==
        "the rendezvous is over for this node");
}

TEST_CASE("a connection that opens after the node gave up is closed", "[rdzv][client][unit]") {
  Client c;
  c.on(NextRound{});
  c.on(LeaveJob{"received SIGINT"});
  c.on(Connected{true});
  CHECK(c.has<CloseConnection>());
  CHECK_FALSE(c.has<SendJoin>());
}

TEST_CASE("heartbeats go out on a ready link and stop when it is down", "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(HeartbeatDue{});
  CHECK(c.sent<Heartbeat>().size() == 1);
  CHECK(c.armed(ClientTimer::Heartbeat));
  c.on(ConnectionLost{"reset"});
  c.on(HeartbeatDue{});
  CHECK(c.out.empty());
}

TEST_CASE("a link that reconnects between rounds sends no heartbeat before its join",
          "[rdzv][client][unit]") {
  Client c;
  c.run_round();
  c.on(FrameReceived{Restart{1, "worker failed", true, 1}});
  REQUIRE(c.s.phase == ClientPhase::Idle);
  // The agent pauses (--restart_backoff); the old link still heartbeats: the server knows it.
  c.on(HeartbeatDue{});
  CHECK(c.sent<Heartbeat>().size() == 1);
  // The server restarts meanwhile: the new one has heard nothing of this node, and would
  // refuse a connection whose first message is no join.
  c.on(ConnectionLost{"the server closed the connection"});
  c.now += 100ms;
  c.on(RetryDue{});
  c.on(Connected{true});
  c.on(Greeted{});
  c.on(HeartbeatDue{});
  CHECK(c.sent<Heartbeat>().empty());
  CHECK(c.armed(ClientTimer::Heartbeat));
  // Leaving now says nothing to a server that never heard of this node.
  {
    Client left = c;
    left.on(LeaveJob{"received SIGINT"});
    CHECK(left.sent<Leave>().empty());
    CHECK(left.has<CloseConnection>());
  }
  // The pause ends: the join goes first, heartbeats after it.
  c.on(NextRound{});
  CHECK(c.has<SendJoin>());
  c.on(HeartbeatDue{});
  CHECK(c.sent<Heartbeat>().size() == 1);
}

TEST_CASE("the waiting line is printed on a change and repeated with the time waited",
          "[rdzv][client][unit]") {
  Client c;
  c.join();
  Waiting w;
  w.joined_count = 1;
  w.min_nodes = 2;
  w.max_nodes = 2;
  w.waited = 3s;
  w.join_timeout = 600s;
  c.on(FrameReceived{w});
  CHECK(c.logged("waiting for nodes: 1/2 joined, 3 s of 600 s"));
  CHECK(c.armed(ClientTimer::Status) == c.spec.status_interval);
  w.waited = 4s;
  c.on(FrameReceived{w});
  CHECK_FALSE(c.has<ClientLog>());  // the same members: no new line
  c.now += 5s;
  c.on(StatusDue{});
  CHECK(c.logged("waiting for nodes: 1/2 joined, 9 s of 600 s"));
  c.on(FrameReceived{RoundReady{0, 0, 2, "x", 1, 0, {}}});
  c.on(StatusDue{});
  CHECK(c.out.empty());
}

TEST_CASE("a node kept out by its health check joins as kept out once the server greeted",
          "[rdzv][client][unit][health]") {
  Client c;
  c.on(KeepOut{"gpu0: ECC errors"});
  CHECK(c.s.phase == ClientPhase::KeptOut);
  CHECK(c.has<Connect>());
  // Without a secret requests could go out at once, but the kept-out join waits for the
  // server's greeting: an older server would place the node.
  c.on(Connected{true});
  CHECK_FALSE(c.has<SendJoin>());
  c.on(Greeted{true});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.kept_out == "gpu0: ECC errors");
  CHECK_FALSE(c.all<SendJoin>()[0].join.resume);
  // A later failed check says its reason again on the open link.
  c.on(KeepOut{"disk full"});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.kept_out == "disk full");
  // The job ends: the agent hears it as a notice (it asked for no round).
  c.on(FrameReceived{Closed{JobOutcomeKind::Succeeded, "all done"}});
  CHECK(c.s.phase == ClientPhase::Done);
  REQUIRE(c.all<Notify>().size() == 1);
  CHECK(std::holds_alternative<Closed>(c.all<Notify>()[0].notice));
  CHECK_FALSE(c.has<Deliver>());
}

TEST_CASE("a kept-out node whose check passes asks for a round with a plain join",
          "[rdzv][client][unit][health]") {
  Client c;
  c.on(KeepOut{"gpu0: ECC errors"});
  c.on(Connected{false});
  c.on(Greeted{true});
  REQUIRE(c.all<SendJoin>().size() == 1);
  c.on(NextRound{});
  CHECK(c.s.phase == ClientPhase::Joining);
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.kept_out.empty());
}

TEST_CASE("a kept-out node reconnects and is dropped like any node, and joins kept out again",
          "[rdzv][client][unit][health]") {
  Client c;
  c.on(KeepOut{"gpu0: ECC errors"});
  c.on(Connected{true});
  c.on(Greeted{true});
  c.on(ConnectionLost{"reset"});
  CHECK(c.s.phase == ClientPhase::KeptOut);
  CHECK(c.armed(ClientTimer::Retry));
  c.on(RetryDue{});
  c.on(Connected{true});
  c.on(Greeted{true});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.kept_out == "gpu0: ECC errors");
  c.on(FrameReceived{Refused{RefusalKind::Dropped, "node a was lost"}});
  CHECK(c.s.phase == ClientPhase::KeptOut);
  CHECK(c.has<RenewNodeId>());
  CHECK(c.has<Connect>());
  CHECK_FALSE(c.has<Notify>());
}

TEST_CASE("a server that cannot hold a kept-out node is not told, and said so once",
          "[rdzv][client][unit][health]") {
  Client c;
  c.on(KeepOut{"gpu0: ECC errors"});
  c.on(Connected{true});
  c.on(Greeted{false});
  CHECK_FALSE(c.has<SendJoin>());
  CHECK(c.has<CloseConnection>());
  CHECK(c.logged("is older than this ddprun"));
  CHECK(c.s.link == ClientLink::Down);
  // The next failed check does not connect again; a passing one joins as usual.
  c.on(KeepOut{"gpu0: ECC errors"});
  CHECK(c.out.empty());
  c.on(NextRound{});
  CHECK(c.has<Connect>());
  CHECK(c.s.phase == ClientPhase::Joining);
  // A failed check after the next round, on the open link: not told, and not said again.
  c.on(Connected{true});
  c.on(Greeted{false});
  c.on(FrameReceived{RoundReady{0, 0, 2, "10.0.0.1", 29500, 0, {"a", "b"}}});
  c.on(FrameReceived{Restart{1, "worker failed", true, 1}});
  c.on(KeepOut{"gpu0: ECC errors"});
  CHECK_FALSE(c.has<SendJoin>());
  CHECK(c.has<CloseConnection>());
  CHECK_FALSE(c.logged("is older than this ddprun"));
  // Upgraded since: the next greeting says so, and a kept-out join goes out again.
  c.on(NextRound{});
  c.on(Connected{true});
  c.on(Greeted{true});
  c.on(FrameReceived{RoundReady{1, 0, 2, "10.0.0.1", 29500, 1, {"a", "b"}}});
  c.on(FrameReceived{Restart{2, "worker failed", true, 2}});
  c.on(KeepOut{"gpu0: ECC errors"});
  REQUIRE(c.all<SendJoin>().size() == 1);
  CHECK(c.all<SendJoin>()[0].join.kept_out == "gpu0: ECC errors");
}

TEST_CASE("keep-out is ignored while the node joins or runs a round",
          "[rdzv][client][unit][health]") {
  Client c;
  c.join();
  c.on(KeepOut{"x"});
  CHECK(c.s.phase == ClientPhase::Joining);
  CHECK(c.out.empty());
}

TEST_CASE("a spare's line says whether the job runs or forms, whatever the join timeout",
          "[rdzv][client][unit][spares]") {
  // --rdzv_conf join_timeout=0: a full forming round's wait list is no running job.
  Waiting w{0, {"a", "b"}, 2, 2, 2, {}, Millis(0), Millis(0), true};
  CHECK(format_waiting(w) ==
        "waiting for a place in the job: the next round is full (2 of at most 2 node(s), those "
        "restarting included)");
  w.job_running = true;
  CHECK(format_waiting(w) == "waiting for a place in the job: it runs with 2 node(s), at most 2");
}
