// N rendezvous clients (rdzv_client.h) wired to the server's step() (rdzv_state.h) in memory:
// no sockets, no sleeps, time moved by hand. The network between them can partition a node,
// lose what crosses a partition, and break connections on either side, so whole scenarios
// (a lost node, a partition healed in time or too late, the job ending meanwhile) play out
// deterministically. Each node's "agent" asks for the next round whenever told to restart.
#include <catch2/catch.hpp>
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "rendezvous/rdzv_client.h"
#include "rendezvous/rdzv_state.h"

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {

const TimePoint kStart = TimePoint{} + 1000h;

RdzvSettings nnodes(int min_nodes, int max_nodes, int max_restarts) {
  RdzvSettings settings;
  settings.min_nodes = min_nodes;
  settings.max_nodes = max_nodes;
  settings.max_restarts = max_restarts;
  return settings;  // join 600 s, last call 30 s, close 30 s, keep-alive 5 s x 3
}

/// One node: its client machine, its id, its side of the network and what its agent saw.
struct Node {
  std::string name;
  ClientSpec spec;
  ClientState state;
  std::string id;
  int ids_used = 0;
  bool open = false;           ///< a connection joins it to the server
  bool partitioned = false;    ///< nothing crosses between it and the server
  bool reset_on_heal = false;  ///< the server closed the connection during the partition
  bool dead = false;           ///< the agent process is gone
  int connection = 0;          ///< counts connections opened and closed by the client
  std::optional<TimePoint> retry_at, heartbeat_at, status_at, greeting_at;
  std::vector<RendezvousResult> results;
  std::vector<Notice> notices;
  std::vector<Join> joins_sent;
  std::vector<std::string> log;

  const RendezvousInfo& last_round() const { return std::get<RendezvousInfo>(results.back()); }
  bool logged(const std::string& text) const {
    for (const auto& line : log)
      if (line.find(text) != std::string::npos) return true;
    return false;
  }
  template <class T>
  std::vector<T> notices_of() const {
    std::vector<T> found;
    for (const auto& n : notices)
      if (const auto* t = std::get_if<T>(&n)) found.push_back(*t);
    return found;
  }
};

/// The server's job and the nodes, with a clock the test moves.
struct Loopback {
  JobState job = new_job("job", kStart);
  TimePoint now = kStart;
  std::optional<TimePoint> server_wake;
  std::vector<Node> nodes;
  /// An event for a client; `connection`: only for that connection (a close the client has
  /// already forgotten is never reported, as the executor ignores a stale connection).
  struct Pending {
    size_t node;
    ClientEvent event;
    int connection = -1;
  };
  std::deque<Pending> inbox;  ///< events for clients, in order

  Loopback(const std::vector<std::string>& names, const RdzvSettings& settings) {
    for (const auto& name : names) {
      Node node;
      node.name = name;
      node.spec.run_id = "job";
      node.spec.endpoint = "rdzv:29400";
      node.spec.name = name;
      node.spec.settings = settings;
      node.spec.connect_timeout = 60s;
      node.id = name + "#0";
      nodes.push_back(std::move(node));
    }
  }

  Node& node(const std::string& name) {
    for (auto& n : nodes)
      if (n.name == name) return n;
    FAIL("no node " << name);
    return nodes.front();
  }
  size_t index(const std::string& name) { return static_cast<size_t>(&node(name) - &nodes[0]); }

  // ---- what the agents do ----

  void start_all() {
    for (size_t i = 0; i < nodes.size(); ++i) inbox.push_back({i, NextRound{}});
    settle();
  }
  void to_client(const std::string& name, ClientEvent event) {
    inbox.push_back({index(name), std::move(event)});
    settle();
  }
  void fail(const std::string& name, const std::string& what) {
    to_client(name, ReportFailure{WorkersFailed{node(name).last_round().round, what, 1, 0}});
  }
  void succeed(const std::string& name) { to_client(name, ReportSuccess{}); }

  // ---- what the network does ----

  void partition(const std::string& name) { node(name).partitioned = true; }
  void heal(const std::string& name) {
    Node& n = node(name);
    n.partitioned = false;
    if (n.reset_on_heal) {
      n.reset_on_heal = false;
      inbox.push_back({index(name), ConnectionLost{"connection reset by peer"}, n.connection});
    }
    settle();
  }
  /// The node's side of the connection breaks (its TCP keep-alive gave up); the server's side
  /// has not noticed.
  void reset_client_side(const std::string& name) {
    node(name).open = false;
    to_client(name, ConnectionLost{"connection timed out"});
  }
  /// The server process restarts: it forgets every job and every connection breaks.
  void restart_server() {
    job = new_job("job", now);
    server_wake.reset();
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = nodes[i];
      if (!n.open) continue;
      n.open = false;
      inbox.push_back({i, ConnectionLost{"connection reset by peer"}, n.connection});
    }
    settle();
  }
  /// The node's agent dies; the server sees its connection close (unless partitioned).
  void kill(const std::string& name) {
    Node& n = node(name);
    n.dead = true;
    n.retry_at.reset();
    n.heartbeat_at.reset();
    n.status_at.reset();
    n.greeting_at.reset();
    if (n.open && !n.partitioned) server_step(Disconnected{n.id});
    n.open = false;
    settle();
  }

  /// Moves time on by `total`, firing every timer that falls due on the way.
  void advance(Millis total) {
    const TimePoint end = now + total;
    for (int guard = 0; guard < 100'000; ++guard) {
      TimePoint next = end;
      if (server_wake) next = std::min(next, *server_wake);
      for (const auto& n : nodes) {
        for (const auto& at : {n.retry_at, n.heartbeat_at, n.status_at, n.greeting_at})
          if (at) next = std::min(next, *at);
      }
      now = std::max(now, next);
      if (server_wake && *server_wake <= now) server_step(Tick{});
      for (size_t i = 0; i < nodes.size(); ++i) {
        Node& n = nodes[i];
        auto fire = [&](std::optional<TimePoint>& at, ClientEvent event) {
          if (!at || *at > now) return;
          at.reset();
          inbox.push_back({i, std::move(event)});
        };
        fire(n.retry_at, RetryDue{});
        fire(n.heartbeat_at, HeartbeatDue{});
        fire(n.status_at, StatusDue{});
        fire(n.greeting_at, GreetingDue{});
      }
      settle();
      if (now >= end) return;
    }
    FAIL("time did not advance");
  }

  // ---- wiring ----

  void settle() {
    for (int guard = 0; guard < 100'000 && !inbox.empty(); ++guard) {
      Pending p = std::move(inbox.front());
      inbox.pop_front();
      const size_t i = p.node;
      if (nodes[i].dead || (p.connection >= 0 && p.connection != nodes[i].connection)) continue;
      for (const ClientEffect& effect :
           rdzv_client_step(nodes[i].state, p.event, now, nodes[i].spec))
        apply(i, effect);
    }
    REQUIRE(inbox.empty());
  }

  void apply(size_t i, const ClientEffect& effect) {
    Node& n = nodes[i];
    if (std::holds_alternative<Connect>(effect)) {
      if (n.partitioned) {
        inbox.push_back({i, ConnectionLost{"connection timed out"}});
        return;
      }
      n.open = true;
      ++n.connection;
      inbox.push_back({i, Connected{true}});
      inbox.push_back({i, Greeted{}});
    } else if (const auto* join = std::get_if<SendJoin>(&effect)) {
      Join j = join->join;
      j.node_id = n.id;
      j.addr = n.name;
      j.master_port = 29500;
      n.joins_sent.push_back(j);
      to_server(i, j);
    } else if (const auto* send = std::get_if<Send>(&effect)) {
      to_server(i, send->message);
    } else if (const auto* deliver = std::get_if<Deliver>(&effect)) {
      n.results.push_back(deliver->result);
      // A quarantine is over: the agent checks itself and asks for a round again.
      if (const auto* error = std::get_if<RendezvousError>(&deliver->result);
          error && error->kind == RendezvousErrorKind::Rejoin)
        inbox.push_back({i, NextRound{}});
    } else if (const auto* notify = std::get_if<Notify>(&effect)) {
      n.notices.push_back(notify->notice);
      // The agent stops its workers and asks for the next round.
      if (std::holds_alternative<Restart>(notify->notice)) inbox.push_back({i, NextRound{}});
    } else if (std::holds_alternative<CloseConnection>(effect)) {
      if (n.open && !n.partitioned) server_step(Disconnected{n.id});
      n.open = false;
      ++n.connection;
    } else if (std::holds_alternative<RenewNodeId>(effect)) {
      n.id = n.name + "#" + std::to_string(++n.ids_used);
    } else if (const auto* arm = std::get_if<ArmClientTimer>(&effect)) {
      timer(n, arm->timer) = now + arm->after;
    } else if (const auto* disarm = std::get_if<DisarmClientTimer>(&effect)) {
      timer(n, disarm->timer).reset();
    } else if (const auto* line = std::get_if<ClientLog>(&effect)) {
      n.log.push_back(line->text);
    }
  }

  static std::optional<TimePoint>& timer(Node& n, ClientTimer t) {
    if (t == ClientTimer::Retry) return n.retry_at;
    if (t == ClientTimer::Heartbeat) return n.heartbeat_at;
    if (t == ClientTimer::Greeting) return n.greeting_at;
    return n.status_at;
  }

  void to_server(size_t i, AgentMessage message) {
    Node& n = nodes[i];
    if (!n.open || n.partitioned) return;  // lost on the way
    server_step(FromNode{n.id, std::move(message)});
  }

  void server_step(const Event& event) {
    StepResult r = step(std::move(job), event, now);
    job = std::move(r.state);
    server_wake = r.wake_at;
    for (Outgoing& out : r.messages) {
      for (size_t i = 0; i < nodes.size(); ++i) {
        Node& n = nodes[i];
        if (n.id != out.node_id || !n.open || n.dead) continue;
        if (n.partitioned) {
          // Lost in the partition; a closing message still closes the server's side.
          if (out.close_after) {
            n.open = false;
            n.reset_on_heal = true;
          }
          continue;
        }
        inbox.push_back({i, FrameReceived{out.message}});
        if (out.close_after) {
          n.open = false;
          inbox.push_back({i, ConnectionLost{"the server closed the connection"}, n.connection});
        }
      }
    }
  }
};

}  // namespace

TEST_CASE("loopback: three nodes join and complete a round", "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b", "c"}, nnodes(3, 3, 1));
  lb.start_all();
  std::vector<int> ranks;
  for (const auto& n : lb.nodes) {
    REQUIRE(n.results.size() == 1);
    CHECK(n.last_round().round == 0);
    CHECK(n.last_round().group_world_size == 3);
    CHECK(n.last_round().master_addr == "a");
    ranks.push_back(n.last_round().group_rank);
    CHECK(n.state.phase == ClientPhase::Running);
  }
  CHECK(ranks == std::vector<int>{0, 1, 2});
  // Heartbeats keep everyone in the job.
  lb.advance(60s);
  CHECK(lb.job.phase == JobPhase::Running);
  CHECK(lb.job.round == 0);
}

TEST_CASE("loopback: a worker failure restarts every node into the next round",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b", "c"}, nnodes(3, 3, 1));
  lb.start_all();
  lb.fail("b", "worker rank 2 exited with 1");
  for (const auto& n : lb.nodes) {
    REQUIRE(n.notices_of<Restart>().size() == 1);
    const Restart restart = n.notices_of<Restart>()[0];
    CHECK(restart.counted);
    CHECK(restart.reason == "worker failure on node b: worker rank 2 exited with 1");
    REQUIRE(n.results.size() == 2);
    CHECK(n.last_round().round == 1);
    CHECK(n.last_round().restart_count == 1);
  }
  // The budget is used up: the next failure closes the job on every node.
  lb.fail("c", "worker rank 5 exited with 1");
  for (const auto& n : lb.nodes) {
    REQUIRE(n.notices_of<Closed>().size() == 1);
    CHECK(n.notices_of<Closed>()[0].outcome == JobOutcomeKind::Failed);
    CHECK(n.state.phase == ClientPhase::Done);
  }
}

TEST_CASE("loopback: every node succeeding closes the job as succeeded", "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b"}, nnodes(2, 2, 0));
  lb.start_all();
  lb.succeed("a");
  CHECK(lb.node("a").notices.empty());
  lb.succeed("b");
  for (const auto& n : lb.nodes)
    CHECK(n.notices_of<Closed>().at(0).outcome == JobOutcomeKind::Succeeded);
}

TEST_CASE("loopback: a node lost restarts the others who go on with min nodes",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b", "c"}, nnodes(2, 3, 2));
  lb.start_all();
  lb.kill("c");
  // Round 1 needs no last call: min nodes rejoined and nobody else is stopping.
  for (const char* name : {"a", "b"}) {
    const Node& n = lb.node(name);
    REQUIRE(n.notices_of<Restart>().size() == 1);
    CHECK(n.notices_of<Restart>()[0].reason == "node c disconnected without leaving");
    CHECK(n.notices_of<Restart>()[0].counted);
    REQUIRE(n.results.size() == 2);
    CHECK(n.last_round().round == 1);
    CHECK(n.last_round().group_world_size == 2);
    CHECK(n.last_round().restart_count == 1);
  }
}

TEST_CASE("loopback: a partition shorter than the keep-alive window reconnects with a claim",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b"}, nnodes(2, 2, 1));
  lb.start_all();
  lb.partition("b");
  lb.reset_client_side("b");
  CHECK(
      lb.node("b").logged("lost the rendezvous server at rdzv:29400: connection timed out; "
                          "reconnecting"));
  lb.advance(8s);  // b's retries fail while the partition lasts
  CHECK(lb.node("b").state.link == ClientLink::Down);
  lb.heal("b");
  lb.advance(3s);  // the next retry gets through
  const Node& b = lb.node("b");
  CHECK(b.logged("reconnected to the rendezvous at rdzv:29400"));
  REQUIRE(b.joins_sent.size() == 2);
  const auto claim = b.joins_sent.back().resume;
  REQUIRE(claim);
  CHECK(claim->round == 0);
  CHECK(claim->group_rank == b.last_round().group_rank);
  CHECK(b.joins_sent.back().node_id == "b#0");
  // The server adopted the claim: nobody restarted, the round runs on.
  lb.advance(60s);
  for (const auto& n : lb.nodes) {
    CHECK(n.notices.empty());
    CHECK(n.results.size() == 1);
  }
  CHECK(lb.job.phase == JobPhase::Running);
  CHECK(lb.job.round == 0);
}

TEST_CASE("loopback: a node dropped during a partition stops its workers and rejoins as new",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b", "c"}, nnodes(2, 3, 3));
  lb.start_all();
  lb.partition("c");
  lb.advance(20s);  // longer than the keep-alive window (15 s): the server drops c
  for (const char* name : {"a", "b"}) {
    REQUIRE(lb.node(name).notices_of<Restart>().size() == 1);
    CHECK_THAT(lb.node(name).notices_of<Restart>()[0].reason,
               Catch::Contains("node c was lost: nothing heard from it"));
  }
  // c, alive behind the partition, has heard nothing yet: its workers still run round 0.
  CHECK(lb.node("c").notices.empty());
  CHECK(lb.node("c").state.phase == ClientPhase::Running);
  lb.heal("c");
  lb.advance(5s);
  const Node& c = lb.node("c");
  // Its claim under the old id was refused for good ...
  CHECK(c.joins_sent.at(1).node_id == "c#0");
  CHECK(c.joins_sent.at(1).resume);
  CHECK(c.logged("the rendezvous dropped this node"));
  // ... so it stopped its workers (a counted restart) and joined as a new node.
  REQUIRE(c.notices_of<Restart>().size() == 1);
  CHECK(c.notices_of<Restart>()[0].reason ==
        "this node was dropped by the rendezvous and joins again as a new node (a spare if the job "
        "went on without it)");
  CHECK(c.notices_of<Restart>()[0].counted);
  CHECK(c.id == "c#1");
  CHECK_FALSE(c.joins_sent.back().resume);
  // a and b went on in round 1 without it; the newcomer makes the job scale up (not counted)
  // and the three of them run round 2.
  for (const char* name : {"a", "b"}) {
    const Node& n = lb.node(name);
    REQUIRE(n.notices_of<Restart>().size() == 2);
    CHECK_FALSE(n.notices_of<Restart>()[1].counted);
  }
  for (const auto& n : lb.nodes) {
    CHECK(n.last_round().round == 2);
    CHECK(n.last_round().group_world_size == 3);
    CHECK(n.last_round().restart_count == 1);
  }
  CHECK(lb.node("c").results.size() == 2);
}

TEST_CASE("loopback: the job ending while a node is partitioned ends that node too",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b"}, nnodes(2, 2, 0));
  lb.start_all();
  lb.partition("b");
  lb.advance(20s);  // b is dropped; with no restart left the job fails
  REQUIRE(lb.node("a").notices_of<Closed>().size() == 1);
  CHECK(lb.node("a").notices_of<Closed>()[0].outcome == JobOutcomeKind::Failed);
  CHECK(lb.job.phase == JobPhase::Closed);
  lb.heal("b");
  lb.advance(5s);
  const Node& b = lb.node("b");
  // b hears the job's end when it reconnects, and does not join again.
  REQUIRE(b.notices.size() == 1);
  REQUIRE(b.notices_of<Closed>().size() == 1);
  CHECK(b.notices_of<Closed>()[0].outcome == JobOutcomeKind::Failed);
  CHECK(b.state.phase == ClientPhase::Done);
  CHECK(b.id == "b#0");
  CHECK(b.results.size() == 1);
}

TEST_CASE("loopback: a node that leaves restarts the others without waiting for silence",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b", "c"}, nnodes(2, 3, 1));
  lb.start_all();
  lb.to_client("c", LeaveJob{"received SIGTERM"});
  CHECK(lb.node("c").state.phase == ClientPhase::Done);
  CHECK(lb.node("a").notices_of<Restart>().at(0).reason == "node c left (received SIGTERM)");
  lb.advance(31s);
  CHECK(lb.node("a").last_round().group_world_size == 2);
}

TEST_CASE("loopback: after a server restart the nodes' claims rebuild the running round",
          "[rdzv][loopback][unit]") {
  Loopback lb({"a", "b", "c"}, nnodes(3, 3, 2));
  lb.start_all();
  lb.fail("a", "worker rank 0 exited with 1");  // round 1, restart count 1
  lb.restart_server();
  lb.advance(5s);
  for (const auto& n : lb.nodes) {
    CHECK(n.logged("reconnected to the rendezvous at rdzv:29400"));
    REQUIRE(n.joins_sent.back().resume);
    CHECK(n.joins_sent.back().resume->round == 1);
    CHECK(n.notices.size() == 1);  // the failure's restart only
    CHECK(n.results.size() == 2);
  }
  CHECK(lb.job.phase == JobPhase::Running);
  CHECK(lb.job.round == 1);
  CHECK(lb.job.restart_count == 1);
  // The rebuilt job goes on: a failure now is counted from where the job was.
  lb.fail("b", "worker rank 1 exited with 1");
  CHECK(lb.node("c").last_round().restart_count == 2);
}

TEST_CASE(
    "loopback: a node that keeps failing is quarantined, a spare takes its place, and it "
    "comes back as a spare",
    "[rdzv][loopback][unit][spares]") {
  RdzvSettings settings = nnodes(2, 2, 10);
  settings.quarantine_after = 2;
  settings.quarantine_cooldown = 30s;
  settings.quarantine_cooldown_max = 60s;
  Loopback lb({"a", "b", "c"}, settings);
  lb.to_client("a", NextRound{});
  lb.to_client("b", NextRound{});
  REQUIRE(lb.job.phase == JobPhase::Running);
  lb.to_client("c", NextRound{});  // the spare
  // The running round's size, with no deadline (it was "1 node(s) ... 0 s of 0 s": the wait
  // list's size).
  CHECK(lb.node("c").logged("waiting for a place in the job: it runs with 2 node(s), at most 2"));
  CHECK_FALSE(lb.node("c").logged(" s of "));
  const int rank_a = lb.node("a").last_round().group_rank;
  lb.fail("b", "worker rank 1 exited with 1");
  // As the round forms again, its places are a's and b's, restarting into it (it said "0
  // node(s)" then, the nodes joined so far).
  CHECK(
      lb.node("c").logged("waiting for a place in the job: the next round is full (2 of at "
                          "most 2 node(s), those restarting included)"));
  lb.fail("b", "worker rank 1 exited with 1");
  const auto quarantined = lb.node("b").notices_of<Restart>();
  REQUIRE(quarantined.size() == 2);
  CHECK(quarantined[1].quarantine == 30s);
  CHECK(lb.node("b").logged("this node is quarantined"));
  // Said once, as the job forms again: no node count that would go stale.
  CHECK_FALSE(lb.node("b").logged("the job runs with"));
  // The round runs with a (its rank kept) and c (b's).
  REQUIRE(lb.job.phase == JobPhase::Running);
  CHECK(lb.node("a").last_round().group_rank == rank_a);
  CHECK(lb.node("c").last_round().group_rank == 1 - rank_a);
  CHECK(lb.node("c").last_round().restart_count == 2);
  // Heartbeats keep everyone in; after the cooldown b joins again and waits as a spare.
  lb.advance(31s);
  const Node& b = lb.node("b");
  REQUIRE_FALSE(b.results.empty());
  const auto* rejoin = std::get_if<RendezvousError>(&b.results.back());
  REQUIRE(rejoin != nullptr);
  CHECK(rejoin->kind == RendezvousErrorKind::Rejoin);
  CHECK(b.state.phase == ClientPhase::Joining);
  CHECK(lb.job.nodes.at(NodeId(b.id)).state == NodeState::WaitListed);
  CHECK(lb.job.phase == JobPhase::Running);
}
