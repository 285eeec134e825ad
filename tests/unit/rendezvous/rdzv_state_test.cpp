#include "rendezvous/rdzv_state.h"

#include "rendezvous/admission.h"
#include "rendezvous/job_status.h"
#include "rendezvous/rank_assignment.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {

/// Fake time: a fixed origin that tests move forward by hand.
const TimePoint kStart = TimePoint{} + 1000h;

RdzvSettings nnodes(int min_nodes, int max_nodes, int max_restarts = 3) {
  RdzvSettings settings;
  settings.min_nodes = min_nodes;
  settings.max_nodes = max_nodes;
  settings.nproc_per_node = 2;
  settings.max_restarts = max_restarts;
  return settings;  // timeouts: join 600 s, last call 30 s, close 30 s, keep-alive 5 s x 3
}

std::string id_of(const std::string& name) { return name + ":4242:abcd"; }

Join join_of(const std::string& name, const RdzvSettings& settings,
             std::optional<int> node_rank = std::nullopt) {
  Join join;
  join.run_id = "my_job";
  join.node_id = id_of(name);
  join.name = name;
  join.addr = name;
  join.master_port = 29500;
  join.node_rank = node_rank;
  join.settings = settings;
  return join;
}

RoundClaim claim(int round, int rank, int world_size, int restart_count) {
  RoundClaim c;
  c.round = round;
  c.group_rank = rank;
  c.group_world_size = world_size;
  c.restart_count = restart_count;
  c.master_addr = "10.0.0.1";
  c.master_port = 29500;
  return c;
}

/// One job driven through step() with a clock the test moves.
struct Job {
  JobState state = new_job("my_job", kStart);
  TimePoint now = kStart;
  StepResult last;

  const std::vector<Outgoing>& apply(const Event& event) {
    last = step(state, event, now);
    state = last.state;
    return last.messages;
  }
  const std::vector<Outgoing>& join(const Join& join) {
    return apply(FromNode{join.node_id, join});
  }
  const std::vector<Outgoing>& send(const std::string& name, AgentMessage message) {
    return apply(FromNode{id_of(name), std::move(message)});
  }
  const std::vector<Outgoing>& tick() { return apply(Tick{}); }

  /// Moves time on by `total` as live agents would see it: every node except `silent` sends a
  /// heartbeat every second, and the server ticks. Returns every message sent meanwhile.
  std::vector<Outgoing> pass(std::chrono::seconds total,
                             const std::vector<std::string>& silent = {}) {
    std::vector<Outgoing> all;
    for (std::chrono::seconds done{0}; done < total; ++done) {
      now += 1s;
      std::vector<std::string> alive;
      for (const auto& [id, node] : state.nodes) {
        if (std::find(silent.begin(), silent.end(), node.request.name) == silent.end()) {
          alive.push_back(id.str());
        }
      }
      for (const std::string& id : alive) {
        if (!state.nodes.count(id)) continue;
        const auto& out = apply(FromNode{id, Heartbeat{}});
        all.insert(all.end(), out.begin(), out.end());
      }
      const auto& out = tick();
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  }

  const NodeRecord& node(const std::string& name) const {
    return state.nodes.at(NodeId(id_of(name)));
  }
};

/// The messages of type T addressed to node `name`, in order.
template <typename T>
std::vector<T> to(const std::vector<Outgoing>& messages, const std::string& name) {
  std::vector<T> found;
  for (const Outgoing& out : messages) {
    if (out.node_id != id_of(name)) continue;
    if (const T* message = std::get_if<T>(&out.message)) found.push_back(*message);
  }
  return found;
}

template <typename T>
std::size_t count_of(const std::vector<Outgoing>& messages) {
  std::size_t n = 0;
  for (const Outgoing& out : messages) n += std::holds_alternative<T>(out.message) ? 1 : 0;
  return n;
}

/// A job of `names` whose round 0 completed at max nodes.
Job running_job(const std::vector<std::string>& names, RdzvSettings settings) {
  settings.min_nodes = std::min(settings.min_nodes, static_cast<int>(names.size()));
  settings.max_nodes = static_cast<int>(names.size());
  Job job;
  for (const std::string& name : names) job.join(join_of(name, settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  return job;
}

/// A job of 2:3 nodes running round 0 with `names` (2 of them), completed by the last call.
Job running_under_max(const std::vector<std::string>& names, int max_restarts = 3) {
  Job job;
  for (const std::string& name : names) job.join(join_of(name, nnodes(2, 3, max_restarts)));
  job.pass(30s);
  REQUIRE(job.state.phase == JobPhase::Running);
  return job;
}

}  // namespace

// ---- join, waiting, last call, complete ----------------------------------------------------

TEST_CASE("a node's round claim is copied with its record and takes no room while absent",
          "[rdzv][unit]") {
  Join with_claim = join_of("a", nnodes(2, 2));
  with_claim.resume = claim(4, 1, 2, 1);
  const NodeJoin original = node_join(with_claim);
  REQUIRE(original.resume);
  NodeJoin copy = original;
  REQUIRE(copy.resume);
  CHECK(&*copy.resume != &*original.resume);
  CHECK(copy.resume->group_rank == 1);
  CHECK(copy.resume->master_addr == "10.0.0.1");
  copy = node_join(join_of("b", nnodes(2, 2)));
  CHECK_FALSE(copy.resume);
  CHECK(original.resume->round == 4);
  const Join back = join_message(JobState{}, "a:1:x", original);
  REQUIRE(back.resume);
  CHECK(back.resume->group_world_size == 2);
  CHECK(back.node_id == "a:1:x");
  static_assert(sizeof(Boxed<RoundClaim>) == sizeof(void*));
}

TEST_CASE("the first node to join sets the job's settings and hears that it waits",
          "[rdzv][unit]") {
  Job job;
  const auto& out = job.join(join_of("127.0.0.2", nnodes(2, 2)));
  CHECK(job.state.phase == JobPhase::Joining);
  CHECK(job.state.settings_from == "127.0.0.2");
  CHECK(job.node("127.0.0.2").state == NodeState::Joined);
  const auto waiting = to<Waiting>(out, "127.0.0.2");
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].round == 0);
  CHECK(waiting[0].joined == std::vector<std::string>{"127.0.0.2"});
  CHECK(waiting[0].min_nodes == 2);
  CHECK(waiting[0].max_nodes == 2);
  CHECK(waiting[0].join_timeout == 600s);
  CHECK_FALSE(waiting[0].wait_listed);
}

TEST_CASE("every joined node hears who joined each time the forming round changes",
          "[rdzv][unit]") {
  Job job;
  job.join(join_of("127.0.0.2", nnodes(3, 4)));
  job.now += 12s;
  const auto& out = job.join(join_of("127.0.0.3", nnodes(3, 4)));
  for (const std::string name : {"127.0.0.2", "127.0.0.3"}) {
    const auto waiting = to<Waiting>(out, name);
    REQUIRE(waiting.size() == 1);
    CHECK(waiting[0].joined == std::vector<std::string>{"127.0.0.2", "127.0.0.3"});
    CHECK(waiting[0].waited == 12s);
    CHECK(waiting[0].missing_node_ranks.get().empty());
  }
}

TEST_CASE("waiting nodes that gave --node_rank hear which node ranks are missing", "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(3, 3), 0));
  job.join(join_of("b", nnodes(3, 3), 2));
  // Others hear of a change once the quiet period since the last broadcast is over.
  const auto out = job.pass(1s);
  const auto waiting = to<Waiting>(out, "a");
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].missing_node_ranks == std::vector<int>{1});
}

TEST_CASE("at min nodes the last call starts and its end completes the round", "[rdzv][unit]") {
  Job job;
  job.join(join_of("127.0.0.2", nnodes(2, 4)));
  job.now += 5s;
  job.join(join_of("127.0.0.3", nnodes(2, 4)));
  REQUIRE(job.state.last_call == kStart + 5s + 30s);

  // Round 0 waits the whole last call even though every node that ever came has joined.
  const auto before = job.pass(29s);
  CHECK(count_of<RoundReady>(before) == 0);
  CHECK(job.state.phase == JobPhase::Joining);

  const auto after = job.pass(1s);
  CHECK(job.state.phase == JobPhase::Running);
  const auto first = to<RoundReady>(after, "127.0.0.2");
  const auto second = to<RoundReady>(after, "127.0.0.3");
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  CHECK(first[0].group_world_size == 2);
  CHECK(first[0].group_rank + second[0].group_rank == 1);
}

TEST_CASE("a round completes at once when max nodes joined, with rank 0's address as master",
          "[rdzv][unit]") {
  Job job;
  for (const std::string name : {"127.0.0.3", "127.0.0.2"}) {
    Join join = join_of(name, nnodes(2, 3));
    join.master_port = name == "127.0.0.2" ? 29611 : 29622;
    job.join(join);
  }
  CHECK(job.state.phase == JobPhase::Joining);
  Join third = join_of("127.0.0.4", nnodes(2, 3));
  third.master_port = 29633;
  const auto& out = job.join(third);
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK_FALSE(job.state.last_call.has_value());
  REQUIRE(count_of<RoundReady>(out) == 3);
  const RoundReady ready = to<RoundReady>(out, "127.0.0.4").at(0);
  CHECK(ready.round == 0);
  CHECK(ready.group_rank == 2);
  CHECK(ready.group_world_size == 3);
  CHECK(ready.master_addr == "127.0.0.2");
  CHECK(ready.master_port == 29611);
  CHECK(ready.restart_count == 0);
  CHECK(ready.participants == std::vector<std::string>{"127.0.0.2", "127.0.0.3", "127.0.0.4"});
}

TEST_CASE("a node joining a complete round goes to the wait list", "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  const auto& out = job.join(join_of("c", nnodes(2, 2)));
  CHECK(job.node("c").state == NodeState::WaitListed);
  CHECK(count_of<Restart>(out) == 0);
  const auto waiting = to<Waiting>(out, "c");
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].wait_listed);
  CHECK(job.state.phase == JobPhase::Running);
}

// ---- losing nodes --------------------------------------------------------------------------

TEST_CASE("a participant whose heartbeats stop is lost and the others restart, counted",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b", "c"}, nnodes(2, 3));
  const auto before = job.pass(14s, {"c"});
  CHECK(count_of<Restart>(before) == 0);
  const auto out = job.pass(1s, {"c"});  // 15 s = keep_alive_interval 5 s x 3 attempts
  CHECK_FALSE(job.state.nodes.count(id_of("c")));
  for (const std::string name : {"a", "b"}) {
    const auto restart = to<Restart>(out, name);
    REQUIRE(restart.size() == 1);
    CHECK(restart[0].counted);
    CHECK(restart[0].restart_count == 1);
    CHECK(restart[0].next_round == 1);
    CHECK_THAT(restart[0].reason, Catch::Contains("node c was lost"));
    CHECK(job.node(name).state == NodeState::Stopping);
  }
  CHECK(job.state.restart_count == 1);

  // Every live node rejoined: the re-round completes without waiting the last call.
  job.join(join_of("a", nnodes(2, 3)));
  CHECK(job.state.phase == JobPhase::Joining);
  const auto& ready = job.join(join_of("b", nnodes(2, 3)));
  REQUIRE(job.state.phase == JobPhase::Running);
  const auto got = to<RoundReady>(ready, "b");
  REQUIRE(got.size() == 1);
  CHECK(got[0].round == 1);
  CHECK(got[0].group_world_size == 2);
  CHECK(got[0].restart_count == 1);
}

TEST_CASE("after the server resumes from a stall every node gets a full keep-alive window",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  job.pass(2s);
  // The server was stopped for 20 s: no heartbeat was read, so every node looks silent for
  // longer than the 15 s window. Resumed comes first and nobody is lost.
  job.now += 20s;
  const auto& resumed = job.apply(Resumed{});
  CHECK(count_of<Restart>(resumed) == 0);
  CHECK(job.state.phase == JobPhase::Running);
  CHECK(job.state.nodes.size() == 2);
  CHECK(job.node("a").last_seen == job.now);
  // The heartbeats that waited in the socket buffers arrive; the round goes on.
  const auto after = job.pass(10s);
  CHECK(count_of<Restart>(after) == 0);
  CHECK(job.state.restart_count == 0);
}

TEST_CASE("a node silent for a whole window after the server resumed is still lost",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(1, 2));
  job.now += 20s;
  job.apply(Resumed{});
  const auto before = job.pass(14s, {"b"});
  CHECK(count_of<Restart>(before) == 0);
  const auto out = job.pass(1s, {"b"});  // 15 s of silence while the server ran
  const auto restart = to<Restart>(out, "a");
  REQUIRE(restart.size() == 1);
  CHECK_THAT(restart[0].reason, Catch::Contains("node b was lost: nothing heard from it for 15 s"));
}

TEST_CASE("a stall does not postpone the join timeout", "[rdzv][unit]") {
  Job job;
  RdzvSettings settings = nnodes(2, 2);
  job.join(join_of("a", settings));
  job.now += 700s;  // past the 600 s join timeout, all of it stalled
  const auto& out = job.apply(Resumed{});
  CHECK(job.state.phase == JobPhase::Closed);
  const auto closed = to<Closed>(out, "a");
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].outcome == JobOutcomeKind::TimedOut);
}

TEST_CASE("a participant whose connection drops is lost at once", "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(1, 2));
  const auto& out = job.apply(Disconnected{id_of("b")});
  const auto restart = to<Restart>(out, "a");
  REQUIRE(restart.size() == 1);
  CHECK(restart[0].counted);
  CHECK_THAT(restart[0].reason, Catch::Contains("node b disconnected"));
  CHECK(to<Restart>(out, "b").empty());
}

TEST_CASE("a node lost with no restart left closes the job as failed naming the node",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2, 0));
  const auto& out = job.send("b", Leave{"SIGTERM"});
  CHECK(job.state.phase == JobPhase::Closed);
  const auto closed = to<Closed>(out, "a");
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].outcome == JobOutcomeKind::Failed);
  CHECK_THAT(closed[0].message, Catch::Contains("node b left (SIGTERM)"));
  CHECK_THAT(closed[0].message, Catch::Contains("--max_restarts 0"));
  CHECK(out.at(0).close_after);
}

TEST_CASE("a re-round under min nodes waits for a replacement until the join timeout",
          "[rdzv][unit]") {
  Job job = running_under_max({"a", "b"});
  job.apply(Disconnected{id_of("b")});
  const TimePoint restarted = job.now;
  job.join(join_of("a", nnodes(2, 3)));
  CHECK(job.state.phase == JobPhase::Joining);
  CHECK(job.last.wake_at == restarted + 15s);  // a's keep-alive comes before the join timeout

  SECTION("a replacement completes the round") {
    job.pass(100s);
    const auto& out = job.join(join_of("c", nnodes(2, 3)));
    CHECK(job.state.phase == JobPhase::Running);
    CHECK(to<RoundReady>(out, "c").size() == 1);
  }
  SECTION("without one the job times out naming who joined and how many are missing") {
    const auto out = job.pass(600s);
    CHECK(job.state.phase == JobPhase::Closed);
    const auto closed = to<Closed>(out, "a");
    REQUIRE(closed.size() == 1);
    CHECK(closed[0].outcome == JobOutcomeKind::TimedOut);
    CHECK(closed[0].message ==
          "join timeout: waited 600 s for job 'my_job' (round 1): 1 of min 2 nodes joined (a); "
          "missing: 1 more node");
  }
}

// ---- scale-up and the wait list ------------------------------------------------------------

TEST_CASE("a newcomer while the round runs under max nodes scales up without counting a restart",
          "[rdzv][unit]") {
  Job job = running_under_max({"a", "b"});
  const int rank_a = job.node("a").group_rank;
  const int rank_b = job.node("b").group_rank;
  const auto& out = job.join(join_of("c", nnodes(2, 3)));
  for (const std::string name : {"a", "b"}) {
    const auto restart = to<Restart>(out, name);
    REQUIRE(restart.size() == 1);
    CHECK_FALSE(restart[0].counted);
    CHECK(restart[0].restart_count == 0);
    CHECK_THAT(restart[0].reason, Catch::Contains("scaling up from 2 to 3 nodes"));
  }
  CHECK(job.node("c").state == NodeState::Joined);
  const auto waiting = to<Waiting>(out, "c");
  REQUIRE(waiting.size() == 1);
  CHECK_FALSE(waiting[0].wait_listed);
  CHECK(job.state.restart_count == 0);

  job.join(join_of("b", nnodes(2, 3)));
  CHECK(job.state.phase == JobPhase::Joining);  // a has not rejoined yet
  const auto& ready = job.join(join_of("a", nnodes(2, 3)));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(to<RoundReady>(ready, "a").at(0).group_world_size == 3);
  CHECK(to<RoundReady>(ready, "a").at(0).restart_count == 0);
  CHECK(job.node("a").group_rank == rank_a);
  CHECK(job.node("b").group_rank == rank_b);
  CHECK(job.node("c").group_rank == 2);
}

TEST_CASE("a node wait-listed at max nodes joins the round after a node is lost", "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  job.join(join_of("c", nnodes(2, 2)));
  REQUIRE(job.node("c").state == NodeState::WaitListed);

  const auto& out = job.apply(Disconnected{id_of("a")});
  CHECK(to<Restart>(out, "b").at(0).counted);
  CHECK(job.node("c").state == NodeState::Joined);
  CHECK_FALSE(to<Waiting>(out, "c").at(0).wait_listed);

  const auto& ready = job.join(join_of("b", nnodes(2, 2)));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(to<RoundReady>(ready, "b").at(0).group_rank == 1);  // b keeps its rank
  CHECK(to<RoundReady>(ready, "c").at(0).group_rank == 0);  // c fills the free one
  CHECK(to<RoundReady>(ready, "c").at(0).restart_count == 1);
}

TEST_CASE("no scale-up once a participant's workers succeeded; the newcomer hears the job close",
          "[rdzv][unit]") {
  Job job = running_under_max({"a", "b"});
  job.send("a", WorkersSucceeded{0});
  const auto& out = job.join(join_of("c", nnodes(2, 3)));
  CHECK(count_of<Restart>(out) == 0);
  CHECK(job.node("c").state == NodeState::WaitListed);
  const auto& closed = job.send("b", WorkersSucceeded{0});
  CHECK(to<Closed>(closed, "c").size() == 1);
}

TEST_CASE("a newcomer during a re-round does not take the place of a restarting node",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  job.send("a", WorkersFailed{0, "worker rank 0 exited with code 1", 1, 0});
  const auto& out = job.join(join_of("c", nnodes(2, 2)));
  CHECK(job.node("c").state == NodeState::WaitListed);
  CHECK(to<Waiting>(out, "c").at(0).wait_listed);
  job.join(join_of("a", nnodes(2, 2)));
  job.join(join_of("b", nnodes(2, 2)));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("a").state == NodeState::Running);
  CHECK(job.node("b").state == NodeState::Running);
  CHECK(job.node("c").state == NodeState::WaitListed);
}

TEST_CASE("a participant joining again while its round runs costs a restart", "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  const auto& out = job.join(join_of("a", nnodes(2, 2)));
  CHECK(to<Restart>(out, "a").empty());  // it already asked to join
  const auto restart = to<Restart>(out, "b");
  REQUIRE(restart.size() == 1);
  CHECK(restart[0].counted);
  CHECK(job.state.restart_count == 1);
  CHECK(job.node("a").state == NodeState::Joined);
  const auto& ready = job.join(join_of("b", nnodes(2, 2)));
  CHECK(to<RoundReady>(ready, "a").at(0).restart_count == 1);
}

TEST_CASE("a joined node that goes silent is dropped from the forming round", "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(3, 3)));
  job.join(join_of("b", nnodes(3, 3)));
  const auto out = job.pass(15s, {"b"});
  CHECK_FALSE(job.state.nodes.count(id_of("b")));
  const auto waiting = to<Waiting>(out, "a");
  REQUIRE_FALSE(waiting.empty());
  CHECK(waiting.back().joined == std::vector<std::string>{"a"});
}

TEST_CASE("a restarting node that misses the re-round waits for the next one", "[rdzv][unit]") {
  Job job = running_under_max({"a", "b"});
  job.send("a", WorkersFailed{0, "worker rank 0 exited with code 1", 1, 0});
  job.join(join_of("a", nnodes(2, 3)));
  job.join(join_of("c", nnodes(2, 3)));  // min reached while b still stops: last call
  job.pass(30s);
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("b").state == NodeState::Stopping);
  // b rejoins after the round completed under max: a scale-up round takes it in, not counted.
  const auto& out = job.join(join_of("b", nnodes(2, 3)));
  CHECK(job.node("b").state == NodeState::Joined);
  CHECK_FALSE(to<Restart>(out, "a").at(0).counted);
  CHECK(job.state.restart_count == 1);
}

// ---- worker failures and the end of the job ------------------------------------------------

TEST_CASE("a worker failure restarts every node once even when two nodes report it",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  const auto& out = job.send("a", WorkersFailed{0, "worker rank 1 exited with code 1", 1, 0});
  CHECK(count_of<Restart>(out) == 2);
  const auto restart = to<Restart>(out, "b").at(0);
  CHECK(restart.counted);
  CHECK(restart.restart_count == 1);
  CHECK_THAT(restart.reason, Catch::Contains("worker failure on node a"));

  const auto& echo = job.send("b", WorkersFailed{0, "worker rank 2 exited with code 1", 1, 0});
  CHECK(echo.empty());
  CHECK(job.state.restart_count == 1);
  CHECK(job.state.round == 1);
}

TEST_CASE("a worker failure with no restart left closes the job as failed with its exit status",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2, 1));
  job.send("a", WorkersFailed{0, "worker rank 0 exited with code 3", 3, 0});
  job.join(join_of("a", nnodes(2, 2, 1)));
  job.join(join_of("b", nnodes(2, 2, 1)));
  REQUIRE(job.state.phase == JobPhase::Running);

  const auto& out =
      job.send("b", WorkersFailed{1, "worker rank 3 (local rank 1) was killed by SIGKILL", 0, 9});
  CHECK(job.state.phase == JobPhase::Closed);
  REQUIRE(out.size() == 2);
  for (const std::string name : {"a", "b"}) {
    const auto closed = to<Closed>(out, name);
    REQUIRE(closed.size() == 1);
    CHECK(closed[0].outcome == JobOutcomeKind::Failed);
    CHECK(closed[0].signal == 9);
    CHECK_THAT(closed[0].message,
               Catch::Contains("worker rank 3 (local rank 1) was killed by SIGKILL") &&
                   Catch::Contains("1 of --max_restarts 1 used"));
  }
  CHECK(out[0].close_after);
  CHECK(out[1].close_after);
}

TEST_CASE("the failure's exit code reaches every node when the job closes as failed",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2, 0));
  const auto& out = job.send("a", WorkersFailed{0, "worker rank 0 exited with code 7", 7, 0});
  CHECK(to<Closed>(out, "b").at(0).exit_code == 7);
  CHECK(to<Closed>(out, "a").at(0).exit_code == 7);
}

// ---- failure policy: fatal exit codes, crash loops, a restart window ------------------------

namespace {

/// A worker failure as an agent of this version reports it.
WorkersFailed failure(int round, int rank, int exit_code, const std::string& exception = "",
                      bool progress = false) {
  WorkersFailed f;
  f.round = round;
  f.description =
      "worker rank " + std::to_string(rank) + " exited with code " + std::to_string(exit_code);
  f.exit_code = exit_code;
  f.rank = rank;
  f.exception = exception;
  f.progress = progress;
  return f;
}

/// Both nodes rejoin after a restart; the next round runs.
void rejoin(Job& job, const RdzvSettings& settings) {
  job.join(join_of("a", settings));
  job.join(join_of("b", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
}

}  // namespace

TEST_CASE("an exit code of --fatal_exit_codes closes the job at once, not to be requeued",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 10);
  settings.fatal_exit_codes = {3, 42};
  Job job = running_job({"a", "b"}, settings);
  const auto& out = job.send("a", failure(0, 1, 42));
  CHECK(job.state.phase == JobPhase::Closed);
  CHECK(job.state.restart_count == 0);
  for (const std::string name : {"a", "b"}) {
    const auto closed = to<Closed>(out, name).at(0);
    CHECK(closed.outcome == JobOutcomeKind::Failed);
    CHECK(closed.do_not_requeue);
    CHECK(closed.exit_code == 42);
    CHECK_THAT(closed.message, Catch::Contains("exit code 42 is one of --fatal_exit_codes 3,42"));
  }
}

TEST_CASE("a signal or an exit code outside --fatal_exit_codes restarts as before",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 10);
  settings.fatal_exit_codes = {3};
  Job job = running_job({"a", "b"}, settings);
  WorkersFailed killed = failure(0, 1, 0);
  killed.signal = 3;  // SIGQUIT: the number 3, but a signal
  CHECK(count_of<Restart>(job.send("a", killed)) == 2);
  rejoin(job, settings);
  CHECK(count_of<Restart>(job.send("a", failure(1, 1, 4))) == 2);
  CHECK(job.state.restart_count == 2);
}

TEST_CASE("the same failure --crash_loop_stop times in a row without progress ends the job",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 50);
  settings.crash_loop_limit = 3;
  Job job = running_job({"a", "b"}, settings);
  CHECK(count_of<Restart>(job.send("b", failure(0, 3, 1, "ValueError"))) == 2);
  rejoin(job, settings);
  // Another rank, the same failure: a script that fails on every rank is reported by whichever
  // rank's exit was seen first.
  CHECK(count_of<Restart>(job.send("b", failure(1, 0, 1, "ValueError"))) == 2);
  CHECK(job.state.failure_repeats == 2);
  rejoin(job, settings);
  const auto& out = job.send("b", failure(2, 3, 1, "ValueError"));
  CHECK(job.state.phase == JobPhase::Closed);
  CHECK(job.state.restart_count == 2);
  const auto closed = to<Closed>(out, "a").at(0);
  CHECK(closed.do_not_requeue);
  CHECK(closed.exit_code == 1);
  CHECK_THAT(closed.message, Catch::Contains("worker rank 3 exited with code 1") &&
                                 Catch::Contains("the same failure 3 times in a row") &&
                                 Catch::Contains("--crash_loop_stop 3"));
  // Each failure came from node b: it may be the machine, and the message says what to do.
  CHECK_THAT(closed.message, Catch::Contains("each time on node b (no spare could take its "
                                             "place): if that machine is at fault, leave it out"));
  // What would have counted as progress, and how to turn the stop off.
  CHECK_THAT(closed.message,
             Catch::Contains("--progress_file") && Catch::Contains("--crash_loop_stop 0"));
}

TEST_CASE("a budget no larger than --crash_loop_stop is spent whole, as under torchrun",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 3);
  settings.crash_loop_limit = 3;
  Job job = running_job({"a", "b"}, settings);
  for (int round = 0; round < 3; ++round) {
    CHECK(count_of<Restart>(job.send("b", failure(round, 1, 7))) == 2);
    rejoin(job, settings);
  }
  const auto& out = job.send("b", failure(3, 1, 7));
  REQUIRE(job.state.phase == JobPhase::Closed);
  const auto closed = to<Closed>(out, "a").at(0);
  // Spent whole, and still a loop a requeue would meet again.
  CHECK(closed.do_not_requeue);
  CHECK_THAT(closed.message, Catch::Contains("no restart left: 3 of --max_restarts 3 used; a "
                                             "crash loop: the same failure 4 times in a row"));
  // A failure that breaks the run before the budget ends: the budget's end alone.
  Job other = running_job({"a", "b"}, settings);
  for (int round = 0; round < 3; ++round) {
    other.send("b", failure(round, 1, round == 2 ? 9 : 7));
    rejoin(other, settings);
  }
  const auto& last = other.send("b", failure(3, 1, 7));
  CHECK_FALSE(to<Closed>(last, "a").at(0).do_not_requeue);
  CHECK_THAT(to<Closed>(last, "a").at(0).message, !Catch::Contains("crash loop"));
}

TEST_CASE("with --restart_window the crash-loop stop holds whatever the budget",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 3);
  settings.crash_loop_limit = 3;
  settings.restart_window = 3600s;
  Job job = running_job({"a", "b"}, settings);
  for (int round = 0; round < 2; ++round) {
    job.send("b", failure(round, 1, 7));
    rejoin(job, settings);
  }
  const auto& out = job.send("b", failure(2, 1, 7));
  REQUIRE(job.state.phase == JobPhase::Closed);
  CHECK(to<Closed>(out, "a").at(0).do_not_requeue);
  CHECK(job.state.restart_count == 2);
}

TEST_CASE("a round after repeated failures starts its join timeout after the nodes' pause",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 50);
  settings.crash_loop_limit = 0;
  settings.join_timeout = 10s;
  settings.restart_backoff = 12s;
  settings.restart_backoff_max = 60s;
  Job job = running_job({"a", "b"}, settings);
  // The first failure: no pause, the join timeout runs at once.
  job.send("b", failure(0, 1, 7));
  CHECK(job.state.pause_count == 1);
  rejoin(job, settings);
  // The same failure again: the agents pause 12 s, then rejoin; 15 s is no join timeout.
  const Restart told = to<Restart>(job.send("b", failure(1, 1, 7)), "a").at(0);
  CHECK(told.repeat);
  CHECK(job.state.pause_count == 2);
  // Every node hears the count and the pause: they pause alike, as long as the server waits.
  CHECK(told.failures_in_a_row == 2);
  CHECK(told.pause == 12s);
  job.pass(5s);
  // Status says when the pause ends, and the join timeout after it.
  const auto forming = describe_job(job.state, job.now)["forming"];
  CHECK(forming["pause_ends_in_s"].get<double>() == Approx(7.0));
  CHECK(forming["join_timeout_in_s"].get<double>() == Approx(17.0));
  job.pass(10s);
  REQUIRE(job.state.phase == JobPhase::Joining);
  const Waiting w = to<Waiting>(job.join(join_of("a", settings)), "a").at(0);
  // Counted from the restart, the pause included in the limit: 15 s of 22 s.
  CHECK(w.waited == 15s);
  CHECK(w.join_timeout == 22s);
  job.join(join_of("b", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  // Once more: a 24 s pause, and nobody comes back after it. The join timeout counts from there.
  job.send("b", failure(2, 1, 7));
  job.pass(33s);
  REQUIRE(job.state.phase == JobPhase::Joining);
  const auto out = job.pass(2s);
  REQUIRE(job.state.phase == JobPhase::Closed);
  const auto closed = to<Closed>(out, "a").at(0);
  CHECK(closed.outcome == JobOutcomeKind::TimedOut);
  CHECK_THAT(closed.message,
             Catch::Contains("waited 10 s") &&
                 Catch::Contains("(round 3, after the nodes' --restart_backoff pause "
                                 "of up to 24 s)"));
  // Another kind of failure starts the count afresh: no pause.
  Job fresh = running_job({"a", "b"}, settings);
  fresh.send("b", failure(0, 1, 7));
  rejoin(fresh, settings);
  fresh.send("b", failure(1, 1, 9));
  CHECK(fresh.state.pause_count == 1);
}

TEST_CASE("a node's --restart_backoff must be a range of a day at most", "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2);
  settings.restart_backoff = 30s;
  settings.restart_backoff_max = 10s;
  CHECK_THAT(check_settings(settings, "b")->message, Catch::Contains("--restart_backoff 30:10"));
  settings.restart_backoff_max = 100'000s;
  CHECK(check_settings(settings, "b"));
  settings.restart_backoff = 0s;
  settings.restart_backoff_max = 0s;
  CHECK_FALSE(check_settings(settings, "b"));
}

namespace {

/// A job of `names` (--crash_loop_stop 3) whose workers fail the same way three times in a row,
/// reported in turn by `reports` (a node and its failing rank): its crash-loop message.
std::string crash_loop_message(const std::vector<std::string>& names,
                               const std::vector<std::pair<std::string, int>>& reports) {
  RdzvSettings settings =
      nnodes(static_cast<int>(names.size()), static_cast<int>(names.size()), 50);
  settings.crash_loop_limit = 3;
  Job job = running_job(names, settings);
  for (int round = 0; round < 2; ++round) {
    job.send(reports[round].first, failure(round, reports[round].second, 1, "ValueError"));
    rejoin(job, settings);
  }
  const auto& out = job.send(reports[2].first, failure(2, reports[2].second, 1, "ValueError"));
  REQUIRE(job.state.phase == JobPhase::Closed);
  const std::string message = to<Closed>(out, names[0]).at(0).message;
  CHECK_THAT(message, Catch::Contains("the same failure 3 times in a row"));
  return message;
}

}  // namespace

TEST_CASE("a crash loop of a one-node job does not blame its machine", "[rdzv][unit][policy]") {
  // Every failure of a one-node job is on its node: a script's fault as likely as the machine's.
  CHECK_THAT(crash_loop_message({"a"}, {{"a", 0}, {"a", 0}, {"a", 0}}),
             !Catch::Contains("each time on node"));
}

TEST_CASE("a crash loop reported by several nodes does not name one machine",
          "[rdzv][unit][policy]") {
  CHECK_THAT(crash_loop_message({"a", "b"}, {{"b", 3}, {"a", 0}, {"b", 3}}),
             !Catch::Contains("each time on node"));
}

TEST_CASE("a restart says whether its failure repeats the last one, for the nodes' back-off",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 50);
  settings.crash_loop_limit = 0;
  Job job = running_job({"a", "b"}, settings);
  CHECK_FALSE(to<Restart>(job.send("b", failure(0, 1, 1, "ValueError")), "a").at(0).repeat);
  rejoin(job, settings);
  CHECK(to<Restart>(job.send("b", failure(1, 1, 1, "ValueError")), "a").at(0).repeat);
  rejoin(job, settings);
  CHECK_FALSE(to<Restart>(job.send("b", failure(2, 1, 7, "ValueError")), "a").at(0).repeat);
  rejoin(job, settings);
  const auto& lost = job.apply(Disconnected{id_of("b")});
  CHECK_FALSE(to<Restart>(lost, "a").at(0).repeat);
}

TEST_CASE("progress, another exit or exception type, or a lost node breaks a crash loop",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 50);
  settings.crash_loop_limit = 2;
  Job job = running_job({"a", "b"}, settings);
  int round = 0;
  const auto fail = [&](WorkersFailed f) {
    f.round = round++;
    const auto& out = job.send("a", f);
    REQUIRE(count_of<Restart>(out) == 2);  // never a crash loop: each differs from the last
    rejoin(job, settings);
  };
  fail(failure(0, 1, 1, "ValueError"));
  fail(failure(0, 1, 1, "ValueError", true));  // progress: this one does not count
  fail(failure(0, 2, 7, "ValueError"));        // another exit code
  fail(failure(0, 2, 7, "KeyError"));          // another exception type
  CHECK(job.state.failure_repeats == 1);
  job.apply(Disconnected{id_of("b")});  // a lost node: the next failure counts afresh
  REQUIRE(job.state.failure_repeats == 0);
  job.join(join_of("b", settings));
  job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  round = job.state.round;
  fail(failure(0, 2, 7, "KeyError"));
  const auto& out = job.send("a", failure(round, 2, 7, "KeyError"));
  CHECK(to<Closed>(out, "a").at(0).do_not_requeue);  // and two in a row stop it
}

TEST_CASE("a failure from an agent that says nothing of progress is never a crash loop",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 5);
  Job job = running_job({"a", "b"}, settings);
  for (int round = 0; round < 5; ++round) {
    CHECK(count_of<Restart>(job.send("a", WorkersFailed{round, "exited with code 1", 1, 0})) == 2);
    rejoin(job, settings);
  }
  const auto closed = to<Closed>(job.send("a", WorkersFailed{5, "exited with code 1", 1, 0}), "a");
  CHECK_FALSE(closed.at(0).do_not_requeue);
  CHECK_THAT(closed.at(0).message, Catch::Contains("5 of --max_restarts 5 used"));
}

TEST_CASE("with --restart_window the budget counts only the restarts of the last window",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(2, 2, 2);
  settings.restart_window = 600s;
  settings.crash_loop_limit = 0;
  Job job = running_job({"a", "b"}, settings);
  CHECK(count_of<Restart>(job.send("a", failure(0, 0, 1))) == 2);
  rejoin(job, settings);
  job.pass(400s);
  CHECK(count_of<Restart>(job.send("a", failure(1, 0, 1))) == 2);
  rejoin(job, settings);
  job.pass(201s);  // the first restart is now 601 s old: one restart in the window
  const auto& out = job.send("a", failure(2, 0, 1));
  REQUIRE(count_of<Restart>(out) == 2);
  CHECK(to<Restart>(out, "a").at(0).restart_count == 3);    // workers still see every restart
  CHECK(to<Restart>(out, "a").at(0).window_restarts == 2);  // the budget's count, for the log
  CHECK(to<Restart>(out, "a").at(0).window == 600s);
  CHECK(job.state.window_restarts.size() == 2);
  rejoin(job, settings);
  const auto& closing = job.send("a", failure(3, 0, 1));
  REQUIRE(job.state.phase == JobPhase::Closed);
  const auto closed = to<Closed>(closing, "b").at(0);
  CHECK_FALSE(closed.do_not_requeue);
  CHECK_THAT(
      closed.message,
      Catch::Contains("2 restarts in the last 600 s (--max_restarts 2, --restart_window 600)"));
}

TEST_CASE("a node's restart count over --max_restarts is possible only with a window",
          "[rdzv][unit][policy]") {
  RdzvSettings settings = nnodes(1, 2, 2);
  Job plain;
  Join late = join_of("a", settings);
  late.restart_count = 5;
  CHECK_THAT(to<Refused>(plain.join(late), "a").at(0).message,
             Catch::Contains("claims restart count 5"));
  settings.restart_window = 60s;
  Job windowed;
  late.settings = settings;
  CHECK(to<Refused>(windowed.join(late), "a").empty());
}

TEST_CASE("nodes must agree on the failure policy", "[rdzv][unit][policy]") {
  RdzvSettings ours = nnodes(2, 2, 3);
  ours.fatal_exit_codes = {3};
  Job job;
  job.join(join_of("a", ours));
  RdzvSettings theirs = ours;
  theirs.fatal_exit_codes = {3, 4};
  auto refused = to<Refused>(job.join(join_of("b", theirs)), "b");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::Mismatch);
  CHECK_THAT(refused[0].message, Catch::Contains("--fatal_exit_codes 3,4") &&
                                     Catch::Contains("runs with --fatal_exit_codes 3"));
  theirs = ours;
  theirs.restart_window = 1500ms;
  CHECK_THAT(to<Refused>(job.join(join_of("b", theirs)), "b").at(0).message,
             Catch::Contains("--restart_window 1.500"));
  theirs = ours;
  theirs.crash_loop_limit = 0;
  CHECK_THAT(to<Refused>(job.join(join_of("b", theirs)), "b").at(0).message,
             Catch::Contains("--crash_loop_stop 0"));
}

TEST_CASE("impossible failure policies are refused naming the value", "[rdzv][unit][policy]") {
  RdzvSettings s = nnodes(1, 1);
  s.crash_loop_limit = 1;
  CHECK_THAT(check_settings(s, "a")->message, Catch::Contains("--crash_loop_stop 1"));
  s = nnodes(1, 1);
  s.restart_window = -1s;
  CHECK_THAT(check_settings(s, "a")->message, Catch::Contains("--restart_window -1"));
  s = nnodes(1, 1);
  s.fatal_exit_codes = {0};
  CHECK_THAT(check_settings(s, "a")->message, Catch::Contains("0 is no failing exit code"));
}

TEST_CASE("the job closes as succeeded when every participant's workers succeeded",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  CHECK(job.send("a", WorkersSucceeded{0}).empty());
  CHECK(job.node("a").state == NodeState::Succeeded);
  const auto& out = job.send("b", WorkersSucceeded{0});
  CHECK(job.state.phase == JobPhase::Closed);
  CHECK(to<Closed>(out, "a").at(0).outcome == JobOutcomeKind::Succeeded);
  CHECK(to<Closed>(out, "b").at(0).outcome == JobOutcomeKind::Succeeded);
}

TEST_CASE("a closed job refuses late joins until its tombstone expires, then is forgotten",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  job.send("a", WorkersSucceeded{0});
  job.send("b", WorkersSucceeded{0});
  const TimePoint closed_at = job.now;
  CHECK(job.last.wake_at == closed_at + 30s);

  job.now += 29s;
  const auto& out = job.join(join_of("c", nnodes(2, 2)));
  const auto refused = to<Refused>(out, "c");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::Closed);
  CHECK_THAT(refused[0].message, Catch::Contains("job 'my_job' is closed"));
  CHECK(out.at(0).close_after);
  CHECK_FALSE(job.last.erase);

  job.now += 1s;
  job.tick();
  CHECK(job.last.erase);
}

TEST_CASE("the join timeout closes the job naming the joined nodes, the missing ones and the wait",
          "[rdzv][unit]") {
  SECTION("without --node_rank: how many are missing") {
    Job job;
    job.join(join_of("127.0.0.3", nnodes(3, 3)));
    job.join(join_of("127.0.0.2", nnodes(3, 3)));
    CHECK(count_of<Closed>(job.pass(599s)) == 0);
    const auto out = job.pass(1s);
    CHECK(job.state.phase == JobPhase::Closed);
    const auto closed = to<Closed>(out, "127.0.0.2");
    REQUIRE(closed.size() == 1);
    CHECK(closed[0].outcome == JobOutcomeKind::TimedOut);
    CHECK(closed[0].message ==
          "join timeout: waited 600 s for job 'my_job': 2 of min 3 nodes joined (127.0.0.2, "
          "127.0.0.3); missing: 1 more node");
    CHECK(to<Closed>(out, "127.0.0.3").size() == 1);
  }
  SECTION("with --node_rank: which node ranks are missing") {
    Job job;
    job.join(join_of("127.0.0.2", nnodes(3, 3), 0));
    job.join(join_of("127.0.0.3", nnodes(3, 3), 1));
    const auto out = job.pass(600s);
    CHECK(to<Closed>(out, "127.0.0.2").at(0).message ==
          "join timeout: waited 600 s for job 'my_job': 2 of min 3 nodes joined (127.0.0.2, "
          "127.0.0.3); missing: node_rank 2");
  }
  SECTION("the wait as measured, rounded: a late timer is no news") {
    RdzvSettings settings = nnodes(2, 2);
    settings.join_timeout = 3s;
    Job job;
    job.join(join_of("127.0.0.2", settings));
    job.now += 3001ms;  // the timer a little late
    const auto& out = job.tick();
    CHECK_THAT(to<Closed>(out, "127.0.0.2").at(0).message,
               Catch::StartsWith("join timeout: waited 3.0 s for job 'my_job'"));
  }
}

// ---- refusals ------------------------------------------------------------------------------

TEST_CASE("a node started with other settings is refused naming both values and both nodes",
          "[rdzv][unit]") {
  Job job;
  job.join(join_of("127.0.0.2", nnodes(2, 2)));
  RdzvSettings other = nnodes(2, 2);
  std::string expected;
  SECTION("--nproc_per_node") {
    other.nproc_per_node = 4;
    expected =
        "node 127.0.0.3 was started with --nproc_per_node 4, but job 'my_job' runs with "
        "--nproc_per_node 2 (set by node 127.0.0.2): start every node with the same value";
  }
  SECTION("--nnodes") {
    other.max_nodes = 3;
    expected =
        "node 127.0.0.3 was started with --nnodes 2:3, but job 'my_job' runs with --nnodes 2 "
        "(set by node 127.0.0.2): start every node with the same value";
  }
  SECTION("--max_restarts") {
    other.max_restarts = 5;
    expected =
        "node 127.0.0.3 was started with --max_restarts 5, but job 'my_job' runs with "
        "--max_restarts 3 (set by node 127.0.0.2): start every node with the same value";
  }
  const auto& out = job.join(join_of("127.0.0.3", other));
  const auto refused = to<Refused>(out, "127.0.0.3");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::Mismatch);
  CHECK(refused[0].message == expected);
  CHECK(out.at(0).close_after);
  CHECK_FALSE(job.state.nodes.count(id_of("127.0.0.3")));
  CHECK(job.state.phase == JobPhase::Joining);
}

TEST_CASE("a second node with the same --node_rank is refused naming the holder", "[rdzv][unit]") {
  Job job;
  job.join(join_of("127.0.0.2", nnodes(2, 2), 1));
  const auto& out = job.join(join_of("127.0.0.3", nnodes(2, 2), 1));
  const auto refused = to<Refused>(out, "127.0.0.3");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::DuplicateRank);
  CHECK(refused[0].message ==
        "node 127.0.0.3 was started with --node_rank 1, which node 127.0.0.2 already holds in job "
        "'my_job': give every node its own --node_rank");
  CHECK(job.state.nodes.size() == 1);
}

TEST_CASE("a --node_rank beyond the job's maximum node count is refused", "[rdzv][unit]") {
  Job job;
  const auto& out = job.join(join_of("127.0.0.2", nnodes(2, 3), 3));
  const auto refused = to<Refused>(out, "127.0.0.2");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::BadRank);
  CHECK(refused[0].message ==
        "node 127.0.0.2 was started with --node_rank 3, but job 'my_job' has at most 3 nodes "
        "(--nnodes 2:3): use a --node_rank from 0 to 2");
  CHECK(job.state.nodes.empty());
  CHECK(job.state.settings_from.empty());  // a refused node does not set the job's settings
  CHECK(job.last.erase);                   // and leaves no job behind
}

TEST_CASE("a refused second node leaves the job to the first", "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(2, 2)));
  job.join(join_of("b", nnodes(2, 2), 7));
  CHECK_FALSE(job.last.erase);
  CHECK(job.state.nodes.size() == 1);
}

TEST_CASE("a timed-out job's status names its outcome as the wire does", "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(2, 2)));
  job.pass(601s);
  REQUIRE(job.state.phase == JobPhase::Closed);
  const nlohmann::json status = describe_job(job.state, job.now);
  CHECK(status["phase"] == "closed");
  CHECK(status["outcome"] == "timed_out");
  CHECK(to_json(ServerMessage{*job.state.closed})["outcome"] == status["outcome"]);
}

TEST_CASE("a first node with an impossible --nnodes is refused naming the values", "[rdzv][unit]") {
  Job job;
  const auto& out = job.join(join_of("a", nnodes(4, 2)));
  const auto refused = to<Refused>(out, "a");
  REQUIRE(refused.size() == 1);
  CHECK_THAT(refused[0].message, Catch::Contains("the minimum (4) is larger than the maximum (2)"));
}

// ---- ranks ---------------------------------------------------------------------------------

TEST_CASE("a survivor keeps its group rank across rounds and a newcomer fills the free rank",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b", "c"}, nnodes(2, 3));
  REQUIRE(job.node("c").group_rank == 2);
  job.apply(Disconnected{id_of("b")});  // b held rank 1
  job.join(join_of("c", nnodes(2, 3)));
  job.join(join_of("a", nnodes(2, 3)));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("a").group_rank == 0);
  CHECK(job.node("c").group_rank == 1);  // rank 2 no longer fits a world of 2

  job.join(join_of("d", nnodes(2, 3)));  // scale-up
  job.join(join_of("a", nnodes(2, 3)));
  job.join(join_of("c", nnodes(2, 3)));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("a").group_rank == 0);
  CHECK(job.node("c").group_rank == 1);
  CHECK(job.node("d").group_rank == 2);
}

TEST_CASE("previous holders keep ranks that fit and newcomers take the lowest free ones",
          "[rdzv][unit]") {
  NodeTable nodes;
  for (const std::string name : {"n1", "n2", "n3", "n4", "n5"}) {
    nodes[NodeId(name)].request = node_join(join_of(name, nnodes(1, 5)));
  }
  for (const auto& [name, rank] : std::map<std::string, int>{{"n4", 2}, {"n5", 4}, {"n2", 0}})
    nodes[NodeId(name)].previous_rank = rank;
  // The ids in rank order, as the strings they are.
  const auto ranked = [&](const std::vector<std::string>& ids) {
    std::vector<NodeId> held;
    for (const std::string& id : ids) held.emplace_back(id);
    std::vector<const NodeId*> participants;
    for (const NodeId& id : held) participants.push_back(&id);
    std::vector<std::string> by_rank;
    for (const NodeId* id : assign_group_ranks(nodes, participants)) by_rank.push_back(id->str());
    return by_rank;
  };
  CHECK(ranked({"n1", "n2", "n3", "n4", "n5"}) ==
        std::vector<std::string>{"n2", "n1", "n4", "n3", "n5"});

  // n5's rank 4 does not fit a world of 3: it takes the lowest free rank before newcomers.
  CHECK(ranked({"n1", "n5", "n4"}) == std::vector<std::string>{"n5", "n1", "n4"});
}

TEST_CASE("the --node_rank given decides the group rank and so the master address",
          "[rdzv][unit]") {
  Job job;
  job.join(join_of("node1", nnodes(2, 2), 1));
  const auto& out = job.join(join_of("node2", nnodes(2, 2), 0));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("node2").group_rank == 0);
  CHECK(job.node("node1").group_rank == 1);
  CHECK(to<RoundReady>(out, "node1").at(0).master_addr == "node2");
}

TEST_CASE("given --node_rank values with gaps become consecutive group ranks in their order",
          "[rdzv][unit]") {
  Job job;
  job.join(join_of("x", nnodes(2, 4), 3));
  job.join(join_of("y", nnodes(2, 4), 1));
  job.pass(30s);
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("y").group_rank == 0);
  CHECK(job.node("x").group_rank == 1);
}

TEST_CASE("newcomers are ranked in numeric-aware order of their names", "[rdzv][unit]") {
  SECTION("host names") {
    Job job = running_job({"node10", "node2", "node1"}, nnodes(3, 3));
    CHECK(job.node("node1").group_rank == 0);
    CHECK(job.node("node2").group_rank == 1);
    CHECK(job.node("node10").group_rank == 2);
  }
  SECTION("IPv4 addresses") {
    Job job = running_job({"127.0.0.10", "127.0.0.2"}, nnodes(2, 2));
    CHECK(job.node("127.0.0.2").group_rank == 0);
    CHECK(job.node("127.0.0.10").group_rank == 1);
  }
}

TEST_CASE("natural_less compares digit runs as numbers", "[rdzv][unit]") {
  CHECK(natural_less("node2", "node10"));
  CHECK_FALSE(natural_less("node10", "node2"));
  CHECK(natural_less("n10", "n10a"));
  CHECK(natural_less("127.0.0.2", "127.0.0.10"));
  CHECK(natural_less("a99", "b1"));
  CHECK(natural_less("n99999999999999999999", "n100000000000000000000"));  // beyond 64 bits
  CHECK_FALSE(natural_less("node2", "node2"));
  // Equal as numbers but different text still orders one way only.
  CHECK(natural_less("n01", "n1") != natural_less("n1", "n01"));
}

// ---- server restart: adoption --------------------------------------------------------------

TEST_CASE("after a server restart the nodes re-register their round and carry on unrestarted",
          "[rdzv][unit]") {
  Job job;
  Join a = join_of("a", nnodes(2, 2));
  a.resume = claim(4, 0, 2, 1);
  Join b = join_of("b", nnodes(2, 2));
  b.resume = claim(4, 1, 2, 1);
  const auto& first = job.join(a);
  CHECK(first.empty());
  CHECK(job.state.phase == JobPhase::Running);
  CHECK(job.state.adopt_deadline == kStart + 15s);
  job.now += 3s;
  const auto& second = job.join(b);
  CHECK(second.empty());
  CHECK_FALSE(job.state.adopt_deadline.has_value());
  CHECK(job.state.round == 4);
  CHECK(job.state.restart_count == 1);
  CHECK(count_of<Restart>(job.pass(20s)) == 0);

  // The job-wide restart count carried over: the next failure is restart 2.
  const auto& out = job.send("b", WorkersFailed{4, "worker rank 3 exited with code 1", 1, 0});
  CHECK(to<Restart>(out, "a").at(0).restart_count == 2);
}

TEST_CASE("a participant that does not re-register after a server restart is lost",
          "[rdzv][unit]") {
  Job job;
  Join a = join_of("a", nnodes(1, 2));
  a.resume = claim(4, 0, 2, 1);
  job.join(a);
  CHECK(count_of<Restart>(job.pass(14s)) == 0);
  const auto out = job.pass(1s);
  const auto restart = to<Restart>(out, "a");
  REQUIRE(restart.size() == 1);
  CHECK(restart[0].counted);
  CHECK(restart[0].restart_count == 2);
  CHECK(restart[0].next_round == 5);
  CHECK_THAT(restart[0].reason, Catch::Contains("group rank 1 of round 4 did not re-register"));
}

TEST_CASE("a short keep-alive still gives re-registering nodes their reconnect back-off",
          "[rdzv][unit]") {
  // keep-alive 0.5 s x 3: a window of 1.5 s, shorter than twice the 2 s an agent may wait
  // between two attempts to reach the server, so the adoption window is 4 s. (Job::pass
  // heartbeats once a second: a shorter keep-alive would lose the nodes between two.)
  RdzvSettings settings = nnodes(2, 2);
  settings.keep_alive_interval = Millis(500);
  for (const bool late : {false, true}) {
    Job job;
    Join a = join_of("a", settings);
    a.resume = claim(4, 0, 2, 1);
    Join b = join_of("b", settings);
    b.resume = claim(4, 1, 2, 1);
    job.join(a);
    CHECK(job.state.adopt_deadline == kStart + 4s);
    const auto waited = job.pass(late ? 4s : 3s);
    if (!late) {
      // b's next attempt came 3 s after a's: its round carries on, nobody restarts.
      CHECK(count_of<Restart>(waited) == 0);
      CHECK(job.join(b).empty());
      CHECK_FALSE(job.state.adopt_deadline.has_value());
      CHECK(count_of<Restart>(job.pass(5s)) == 0);
    } else {
      const auto restart = to<Restart>(waited, "a");
      REQUIRE(restart.size() == 1);
      CHECK_THAT(restart[0].reason.get(), Catch::Contains("group rank 1 of round 4 did not "
                                                          "re-register within 4 s"));
    }
  }
}

TEST_CASE("a claim that conflicts with the adopted round starts a new round, not counted",
          "[rdzv][unit]") {
  Job job;
  Join a = join_of("a", nnodes(2, 2));
  a.resume = claim(4, 0, 2, 1);
  job.join(a);
  Join b = join_of("b", nnodes(2, 2));
  b.resume = claim(4, 0, 2, 1);  // the same rank as a
  const auto& out = job.join(b);
  for (const std::string name : {"a", "b"}) {
    const auto restart = to<Restart>(out, name);
    REQUIRE(restart.size() == 1);
    CHECK_FALSE(restart[0].counted);
    CHECK(restart[0].restart_count == 1);
    CHECK(restart[0].next_round == 5);
  }
  CHECK(job.state.restart_count == 1);
  job.join(join_of("a", nnodes(2, 2)));
  const auto& ready = job.join(join_of("b", nnodes(2, 2)));
  CHECK(to<RoundReady>(ready, "a").at(0).round == 5);
}

TEST_CASE("a node re-registering a finished round while the next one forms is told to restart",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  job.apply(Disconnected{id_of("b")});
  REQUIRE(job.state.phase == JobPhase::Joining);
  Join b = join_of("b", nnodes(2, 2));
  b.resume = claim(0, 1, 2, 0);
  const auto& out = job.join(b);
  const auto restart = to<Restart>(out, "b");
  REQUIRE(restart.size() == 1);
  CHECK(restart[0].next_round == 1);
  CHECK_FALSE(restart[0].counted);
}

TEST_CASE("nodes that only waited when the server restarted queue behind the re-registered round",
          "[rdzv][unit]") {
  Job job;
  job.join(join_of("c", nnodes(1, 3)));  // reconnects first, with no round to claim
  Join a = join_of("a", nnodes(1, 3));
  a.resume = claim(4, 0, 2, 1);
  const auto& adopted = job.join(a);
  CHECK(job.state.phase == JobPhase::Running);
  CHECK(job.node("c").state == NodeState::WaitListed);
  CHECK(to<Waiting>(adopted, "c").at(0).wait_listed);
  CHECK(count_of<RoundReady>(job.pass(10s)) == 0);  // c's last call no longer applies

  Join b = join_of("b", nnodes(1, 3));
  b.resume = claim(4, 1, 2, 1);
  const auto& out = job.join(b);
  // Adoption is complete and the job runs under max: c is taken in by a scale-up round.
  const auto restart = to<Restart>(out, "a");
  REQUIRE(restart.size() == 1);
  CHECK_FALSE(restart[0].counted);
  CHECK(restart[0].next_round == 5);
  CHECK(job.node("c").state == NodeState::Joined);
}

TEST_CASE("nodes whose workers had already succeeded when the server restarted close the job",
          "[rdzv][unit]") {
  Job job;
  for (int rank = 0; rank < 2; ++rank) {
    Join join = join_of(rank == 0 ? "a" : "b", nnodes(2, 2));
    join.resume = claim(2, rank, 2, 0);
    join.resume->succeeded = true;
    job.join(join);
  }
  CHECK(job.state.phase == JobPhase::Closed);
  CHECK(to<Closed>(job.last.messages, "a").at(0).outcome == JobOutcomeKind::Succeeded);
}

// ---- robustness and deadlines --------------------------------------------------------------

TEST_CASE("messages from unknown nodes and for other rounds change nothing", "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  CHECK(job.apply(FromNode{"ghost", Heartbeat{}}).empty());
  CHECK(job.apply(FromNode{"ghost", WorkersFailed{0, "x", 1, 0}}).empty());
  CHECK(job.apply(Disconnected{"ghost"}).empty());
  CHECK(job.send("a", WorkersFailed{7, "from a future round", 1, 0}).empty());
  CHECK(job.send("a", WorkersSucceeded{3}).empty());
  CHECK(job.state.phase == JobPhase::Running);
  CHECK(job.state.restart_count == 0);
}

TEST_CASE(
    "a node leaving the forming round is dropped from the others' Waiting and cancels the "
    "last call",
    "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(2, 3)));
  job.join(join_of("b", nnodes(2, 3)));
  REQUIRE(job.state.last_call.has_value());
  job.send("b", Leave{"interrupted"});
  CHECK_FALSE(job.state.last_call.has_value());
  const auto out = job.pass(1s);
  CHECK(to<Waiting>(out, "a").at(0).joined == std::vector<std::string>{"a"});
  CHECK(count_of<RoundReady>(job.pass(60s)) == 0);
}

TEST_CASE("wake_at is the earliest pending deadline", "[rdzv][unit]") {
  RdzvSettings settings = nnodes(2, 3);
  settings.join_timeout = 60s;
  settings.keep_alive_interval = 100s;  // keep-alive window 300 s
  Job job;
  job.join(join_of("a", settings));
  CHECK(job.last.wake_at == kStart + 60s);  // join timeout

  job.now += 10s;
  job.join(join_of("b", settings));
  CHECK(job.last.wake_at == kStart + 40s);  // last call, 30 s after min was reached

  job.now += 30s;
  job.tick();
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.last.wake_at == kStart + 300s);  // a's keep-alive expiry

  job.send("a", Heartbeat{});
  CHECK(job.last.wake_at == kStart + 310s);  // now b's
}

TEST_CASE("status describes the job's nodes with their ranks and last heartbeat", "[rdzv][unit]") {
  Job job = running_job({"b", "a"}, nnodes(2, 2));
  job.now += 2s;
  job.join(join_of("c", nnodes(2, 2)));
  const nlohmann::json status = describe_job(job.state, job.now + 1s);
  CHECK(status["run_id"] == "my_job");
  CHECK(status["phase"] == "running");
  CHECK(status["round"] == 0);
  CHECK(status["settings"]["nproc_per_node"] == 2);
  REQUIRE(status["nodes"].size() == 3);
  CHECK(status["nodes"][0]["name"] == "a");
  CHECK(status["nodes"][0]["group_rank"] == 0);
  CHECK(status["nodes"][0]["last_seen_s"] == 3.0);
  CHECK(status["nodes"][2]["name"] == "c");
  CHECK(status["nodes"][2]["state"] == "wait_listed");
}

TEST_CASE("while a round forms status says who joined and who is awaited and the time left",
          "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  CHECK_FALSE(describe_job(job.state, job.now).contains("forming"));
  job.send("a", WorkersFailed{0, "worker rank 0 exited with code 1", 1, 0});
  job.now += 4s;
  job.join(join_of("a", nnodes(2, 2)));
  job.now += 1s;
  const nlohmann::json forming = describe_job(job.state, job.now)["forming"];
  CHECK(forming["joined"] == 1);
  CHECK(forming["awaited"] == nlohmann::json::array({"b"}));  // told to restart, not back yet
  CHECK(forming["awaited_count"] == 1);
  CHECK(forming["more_needed"] == 1);
  CHECK(forming["join_timeout_in_s"] == 595.0);  // the round opened 5 s ago; 600 s in all
  CHECK_FALSE(forming.contains("last_call_in_s"));
  job.join(join_of("b", nnodes(2, 2)));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK_FALSE(describe_job(job.state, job.now).contains("forming"));
}

TEST_CASE("a forming round above its minimum shows the last call instead of the join timeout",
          "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(1, 3)));
  job.now += 10s;
  const nlohmann::json forming = describe_job(job.state, job.now)["forming"];
  CHECK(forming["joined"] == 1);
  CHECK(forming["more_needed"] == 0);
  CHECK(forming["last_call_in_s"] == 20.0);  // last call 30 s after the minimum joined
  CHECK_FALSE(forming.contains("join_timeout_in_s"));
}

TEST_CASE("waiting broadcasts go out at most once per quiet period, and none is lost",
          "[rdzv][unit]") {
  Job job;
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) names.push_back("n" + std::to_string(i));
  int waiting_sent = 0;
  for (const auto& name : names)
    waiting_sent += count_of<Waiting>(job.join(join_of(name, nnodes(50, 50))));
  // 40 joins in the same instant: the first node's broadcast, then one message per joiner.
  CHECK(waiting_sent == 40);
  CHECK(job.state.waiting_dirty);
  CHECK(job.last.wake_at == kStart + kWaitingQuietPeriod);
  job.now += kWaitingQuietPeriod;
  const auto& owed = job.tick();
  CHECK(count_of<Waiting>(owed) == 40);
  const auto last = to<Waiting>(owed, "n0");
  REQUIRE(last.size() == 1);
  CHECK(last[0].joined_count == 40);
  CHECK(last[0].joined.size() == kMaxNamesInMessage);
  CHECK_FALSE(job.state.waiting_dirty);
}

TEST_CASE("a large job's waiting broadcasts are paced by how many nodes hear them",
          "[rdzv][unit]") {
  // 1,500 listeners: one broadcast per 1.5 s (kWaitingPacePerListener), not one per second.
  Job job;
  const RdzvSettings settings = nnodes(2000, 2000);
  job.join(join_of("n0", settings));
  job.now += 10ms;
  for (int i = 1; i < 1500; ++i) {
    // In the quiet period a join is answered to the joiner alone.
    const auto& out = job.join(join_of("n" + std::to_string(i), settings));
    REQUIRE(out.size() == 1);
  }
  CHECK(job.last.wake_at == kStart + 1500ms);
  job.now = kStart + kWaitingQuietPeriod;
  CHECK(count_of<Waiting>(job.tick()) == 0);  // 1 s is not long enough for 1,500 listeners
  job.now = kStart + 1500ms;
  const auto& owed = job.tick();
  CHECK(count_of<Waiting>(owed) == 1500);
  const auto w = to<Waiting>(owed, "n7");
  REQUIRE(w.size() == 1);
  CHECK(w[0].joined_count == 1500);
  // The first names in numeric-aware order, from the index: n0, n1, ..., n15.
  REQUIRE(w[0].joined.size() == kMaxNamesInMessage);
  CHECK(w[0].joined.get().front() == "n0");
  CHECK(w[0].joined.get().back() == "n15");
  CHECK(job.last.wake_at != kStart + 2500ms);  // nothing owed: no wake for a broadcast
}

TEST_CASE("messages about a large job name a few nodes and count the rest", "[rdzv][unit]") {
  Job job;
  RdzvSettings settings = nnodes(300, 300);
  settings.join_timeout = 60s;
  // 100 of 300 nodes join with --node_rank 100..199: 200 ranks are missing.
  for (int i = 0; i < 100; ++i) job.join(join_of("n" + std::to_string(i), settings, 100 + i));
  const auto& joined = job.join(join_of("n100", settings, 200));
  const auto w = to<Waiting>(joined, "n100");
  REQUIRE(w.size() == 1);
  REQUIRE(w[0].missing_node_ranks.get().size() == kMaxNamesInMessage);
  CHECK(w[0].missing_node_ranks.get().front() == 0);
  CHECK(w[0].missing_node_ranks.get().back() == 15);
  const auto closed = to<Closed>(job.pass(60s), "n3");  // heartbeats, then the join timeout
  REQUIRE(closed.size() == 1);
  CHECK_THAT(closed[0].message, Catch::Contains("101 of min 300 nodes joined (n0, n1, n2,"));
  CHECK_THAT(closed[0].message, Catch::Contains("n15 and 85 more)"));
  CHECK_THAT(closed[0].message, Catch::Contains("missing: node_ranks 0, 1, 2,"));
  CHECK_THAT(closed[0].message, Catch::Contains("15 and 183 more"));
  CHECK(closed[0].message.size() < 600);
}

TEST_CASE("a restarted server keeps the restart count the joining nodes remember", "[rdzv][unit]") {
  Job job;
  Join a = join_of("a", nnodes(2, 2, 3));
  a.restart_count = 2;
  job.join(a);
  Join b = join_of("b", nnodes(2, 2, 3));
  b.restart_count = 1;
  const auto& out = job.join(b);
  REQUIRE(to<RoundReady>(out, "b").size() == 1);
  CHECK(to<RoundReady>(out, "b")[0].restart_count == 2);
}

TEST_CASE("a node dropped for silence hears why and its connection ends", "[rdzv][unit]") {
  Job job;
  job.join(join_of("a", nnodes(3, 3)));
  job.join(join_of("b", nnodes(3, 3)));
  const auto out = job.pass(20s, {"b"});
  const auto refused = to<Refused>(out, "b");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::Dropped);
  CHECK_THAT(refused[0].message, Catch::Contains("node b is no longer part of job 'my_job'"));
  CHECK_THAT(refused[0].message, Catch::Contains("nothing heard from it"));
  bool closes = false;
  for (const auto& o : out)
    if (o.node_id == id_of("b") && std::holds_alternative<Refused>(o.message))
      closes = o.close_after;
  CHECK(closes);
  CHECK_FALSE(job.state.nodes.count(id_of("b")));
}

TEST_CASE("status never shows the ids that nodes speak with", "[rdzv][unit]") {
  Job job = running_job({"a", "b"}, nnodes(2, 2));
  const std::string status = describe_job(job.state, job.now).dump();
  CHECK(status.find(id_of("a")) == std::string::npos);
  CHECK(status.find(id_of("b")) == std::string::npos);
}

namespace {

/// Nodes a and b in the running round 0 of an elastic 2:3 job (the last call ended it).
Job elastic_job_of_two(int max_restarts = 3) {
  Job job;
  job.join(join_of("a", nnodes(2, 3, max_restarts)));
  job.join(join_of("b", nnodes(2, 3, max_restarts)));
  job.pass(31s);
  REQUIRE(job.state.phase == JobPhase::Running);
  return job;
}

}  // namespace

TEST_CASE("a newcomer to a running job cannot set its restart count", "[rdzv][unit]") {
  Job job = elastic_job_of_two();
  Join stranger = join_of("c", nnodes(2, 3, 3));
  stranger.restart_count = 3;
  job.join(stranger);
  CHECK(job.state.restart_count == 0);
  // An impossible count is refused outright.
  Join liar = join_of("d", nnodes(2, 3, 3));
  liar.restart_count = 2147483647;
  const auto refused = to<Refused>(job.join(liar), "d");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].message ==
        "node d claims restart count 2147483647, impossible with --max_restarts 3");
}

TEST_CASE("a claim from a node the running round does not know stops that node alone",
          "[rdzv][unit]") {
  Job job = elastic_job_of_two();
  // A made-up (or stale) claim on another round, with a restart count to spend.
  Join stranger = join_of("s", nnodes(2, 3, 3));
  stranger.restart_count = 3;
  stranger.resume = claim(7, 0, 2, 3);
  const auto& out = job.join(stranger);
  const auto told = to<Restart>(out, "s");
  REQUIRE(told.size() == 1);
  CHECK_FALSE(told[0].counted);
  CHECK_THAT(told[0].reason, Catch::Contains("runs round 0 without it"));
  // Nobody of the round is disturbed and the budget is untouched.
  CHECK(to<Restart>(out, "a").empty());
  CHECK(to<Restart>(out, "b").empty());
  CHECK(job.state.phase == JobPhase::Running);
  CHECK(job.state.round == 0);
  CHECK(job.state.restart_count == 0);
  CHECK(job.node("a").group_rank == 0);
  CHECK(job.node("s").state == NodeState::Stopping);
}

TEST_CASE("a claim of a restart count over --max_restarts is refused", "[rdzv][unit]") {
  Job job;
  Join liar = join_of("x", nnodes(2, 2, 3));
  liar.resume = claim(0, 0, 2, 2147483647);
  const auto refused = to<Refused>(job.join(liar), "x");
  REQUIRE(refused.size() == 1);
  CHECK_THAT(refused[0].message, Catch::Contains("restart count 2147483647"));
  CHECK_THAT(refused[0].message, Catch::Contains("--max_restarts 3"));
  CHECK(job.state.restart_count == 0);
}

TEST_CASE("a newcomer cannot take a group rank a live node holds", "[rdzv][unit]") {
  Job job = elastic_job_of_two();
  REQUIRE(job.node("a").group_rank == 0);
  const auto refused = to<Refused>(job.join(join_of("x", nnodes(2, 3), 0)), "x");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::DuplicateRank);
  CHECK_THAT(refused[0].message, Catch::Contains("node a holds group rank 0"));
  CHECK(job.node("a").group_rank == 0);
  CHECK(job.state.phase == JobPhase::Running);
  // A free rank is fine: node_rank 2 scales the job up.
  CHECK(to<Refused>(job.join(join_of("y", nnodes(2, 3), 2)), "y").empty());
}

namespace {

/// The messages of type T addressed to the node speaking with `node_id`, in order.
template <typename T>
std::vector<T> to_id(const std::vector<Outgoing>& messages, const std::string& node_id) {
  std::vector<T> found;
  for (const Outgoing& out : messages) {
    if (out.node_id != node_id) continue;
    if (const T* message = std::get_if<T>(&out.message)) found.push_back(*message);
  }
  return found;
}

/// Node `name` as it joins again after the server dropped it: a new id, its old settings.
Join rejoin_of(const std::string& name, const RdzvSettings& settings,
               std::optional<int> node_rank = std::nullopt) {
  Join join = join_of(name, settings, node_rank);
  join.node_id = name + ":4242:new";
  return join;
}

}  // namespace

TEST_CASE("a node dropped while alive rejoins with a new id and the next round forms with it",
          "[rdzv][unit]") {
  const RdzvSettings settings = nnodes(2, 2, 3);
  Job job = running_job({"a", "b"}, settings);
  // b is cut off for the keep-alive window: dropped (it hears why), a restarts, counted.
  const auto drop = job.pass(15s, {"b"});
  REQUIRE(to<Refused>(drop, "b").size() == 1);
  CHECK(to<Refused>(drop, "b")[0].kind == RefusalKind::Dropped);
  REQUIRE(to<Restart>(drop, "a").size() == 1);
  CHECK(to<Restart>(drop, "a")[0].counted);
  CHECK(job.state.restart_count == 1);

  // The partition heals. b's old id is dead: a re-registration with it is refused again and
  // changes nothing, and its heartbeats are ignored.
  Join stale = join_of("b", settings);
  stale.resume = claim(0, 1, 2, 0);
  const auto& refused_again = job.join(stale);
  const auto again = to<Refused>(refused_again, "b");
  REQUIRE(again.size() == 1);
  CHECK(again[0].kind == RefusalKind::Dropped);
  CHECK_THAT(again[0].message, Catch::Contains("joins again as a new node"));
  CHECK(refused_again.at(0).close_after);
  job.send("b", Heartbeat{});
  CHECK_FALSE(job.state.nodes.count(id_of("b")));
  CHECK(job.state.phase == JobPhase::Joining);

  // b joins with a new id, as a newcomer; a's restart completes round 1 with both, and the
  // count stays at the one restart the loss cost.
  job.join(rejoin_of("b", settings));
  CHECK(job.state.nodes.at(NodeId("b:4242:new")).state == NodeState::Joined);
  const auto& ready = job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  const auto for_b = to_id<RoundReady>(ready, "b:4242:new");
  const auto for_a = to<RoundReady>(ready, "a");
  REQUIRE(for_b.size() == 1);
  REQUIRE(for_a.size() == 1);
  CHECK(for_b[0].round == 1);
  CHECK(for_b[0].group_world_size == 2);
  CHECK(for_b[0].restart_count == 1);
  CHECK(for_a[0].group_rank == 0);  // the survivor keeps its rank
  CHECK(for_b[0].group_rank == 1);
  CHECK(job.state.restart_count == 1);

  // Status shows b by name, never by either of its ids.
  const std::string status = describe_job(job.state, job.now).dump();
  CHECK(status.find(id_of("b")) == std::string::npos);
  CHECK(status.find("b:4242:new") == std::string::npos);
  CHECK(status.find("\"b\"") != std::string::npos);
}

TEST_CASE("a dropped node with a --node_rank takes its rank back as a newcomer; a stranger cannot",
          "[rdzv][unit]") {
  const RdzvSettings settings = nnodes(2, 2, 3);
  Job job;
  job.join(join_of("a", settings, 0));
  job.join(join_of("b", settings, 1));
  REQUIRE(job.state.phase == JobPhase::Running);
  job.pass(15s, {"b"});
  REQUIRE_FALSE(job.state.nodes.count(id_of("b")));
  // a, restarting, still holds group rank 0: a newcomer cannot take it.
  const auto refused = to<Refused>(job.join(join_of("x", settings, 0)), "x");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::DuplicateRank);
  // Rank 1 is free again: b's new id takes it, and the round forms.
  CHECK(to_id<Refused>(job.join(rejoin_of("b", settings, 1)), "b:4242:new").empty());
  const auto& ready = job.join(join_of("a", settings, 0));
  REQUIRE(job.state.phase == JobPhase::Running);
  REQUIRE(to_id<RoundReady>(ready, "b:4242:new").size() == 1);
  CHECK(to_id<RoundReady>(ready, "b:4242:new")[0].group_rank == 1);
  CHECK(job.state.restart_count == 1);
}

TEST_CASE("a rejoining dropped node cannot raise the restart count", "[rdzv][unit]") {
  const RdzvSettings settings = nnodes(2, 2, 3);
  Job job = running_job({"a", "b"}, settings);
  job.pass(15s, {"b"});
  REQUIRE(job.state.restart_count == 1);
  Join back = rejoin_of("b", settings);
  back.restart_count = 3;  // within --max_restarts, but a newcomer's count is not adopted
  job.join(back);
  job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.state.restart_count == 1);
}

TEST_CASE("a node dropped while the round forms rejoins with a new id and costs no restart",
          "[rdzv][unit]") {
  const RdzvSettings settings = nnodes(3, 3, 3);
  Job job;
  job.join(join_of("a", settings));
  job.join(join_of("b", settings));
  const auto drop = job.pass(15s, {"b"});
  REQUIRE(to<Refused>(drop, "b").size() == 1);
  CHECK(to<Refused>(job.join(join_of("b", settings)), "b").size() == 1);  // the old id: no
  job.join(rejoin_of("b", settings));
  const auto& ready = job.join(join_of("c", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(to_id<RoundReady>(ready, "b:4242:new").size() == 1);
  CHECK(job.state.restart_count == 0);
}

TEST_CASE("a node whose loss ends the job hears the job's end, and so does its old id later",
          "[rdzv][unit]") {
  const RdzvSettings settings = nnodes(2, 2, 0);
  Job job = running_job({"a", "b"}, settings);
  const auto drop = job.pass(15s, {"b"});
  REQUIRE(job.state.phase == JobPhase::Closed);
  CHECK(to<Refused>(drop, "b").empty());
  const auto closed = to<Closed>(drop, "b");
  REQUIRE(closed.size() == 1);
  CHECK(closed[0].outcome == JobOutcomeKind::Failed);
  CHECK_THAT(closed[0].message, Catch::Contains("node b was lost"));
  REQUIRE(to<Closed>(drop, "a").size() == 1);
  // The partition heals and b re-registers with its old id: the job's end again, not a
  // refusal, so b exits with the job's result like a.
  Join stale = join_of("b", settings);
  stale.resume = claim(0, 1, 2, 0);
  const auto& late = job.join(stale);
  const auto again = to<Closed>(late, "b");
  REQUIRE(again.size() == 1);
  CHECK(again[0].outcome == JobOutcomeKind::Failed);
  CHECK(late.at(0).close_after);
}

TEST_CASE("a job remembers a bounded number of dropped ids", "[rdzv][unit]") {
  const RdzvSettings settings = nnodes(1, 1, 0);
  Job job;
  job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  // Newcomers wait-listed behind the running round, silent: each is dropped.
  for (std::size_t i = 0; i < kMaxDroppedIds + 10; ++i) {
    Join w = join_of("w" + std::to_string(i), settings);
    job.join(w);
    job.pass(15s, {w.name});
  }
  CHECK(job.state.dropped_ids.size() == kMaxDroppedIds);
  CHECK(job.state.dropped_ids.front() == id_of("w10"));
  CHECK(job.state.phase == JobPhase::Running);
}

// ---- spares and quarantine ------------------------------------------------------------------

namespace {

/// Settings of a job with quarantine on: two failures in a row, 30 s doubling to 100 s.
RdzvSettings quarantining(int min_nodes, int max_nodes, int max_restarts = 20) {
  RdzvSettings settings = nnodes(min_nodes, max_nodes, max_restarts);
  settings.crash_loop_limit = 0;  // these failures repeat on purpose
  settings.quarantine_after = 2;
  settings.quarantine_cooldown = 30s;
  settings.quarantine_cooldown_max = 100s;
  return settings;
}

/// `names` join (in that order) until a round runs.
void rejoin_all(Job& job, const std::vector<std::string>& names, const RdzvSettings& settings) {
  for (const std::string& name : names) job.join(join_of(name, settings));
  REQUIRE(job.state.phase == JobPhase::Running);
}

/// b's workers fail in round 0 and, after everyone rejoined, in round 1: with a spare and
/// --quarantine_after 2, b is quarantined.
void b_fails_twice(Job& job, const RdzvSettings& settings) {
  job.send("b", failure(0, 1, 1));
  rejoin_all(job, {"a", "b"}, settings);
  job.send("b", failure(1, 1, 1));
}

/// Nodes a, b running at max 2, and c waiting as a spare.
Job with_spare(const RdzvSettings& settings) {
  Job job = running_job({"a", "b"}, settings);
  const auto& out = job.join(join_of("c", settings));
  REQUIRE(job.node("c").state == NodeState::WaitListed);
  REQUIRE(to<Waiting>(out, "c").at(0).wait_listed);
  return job;
}

}  // namespace

TEST_CASE(
    "a spare waits while the round is full and takes a lost node's place; survivors keep "
    "their group ranks",
    "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2);
  Job job = with_spare(settings);
  const int rank_a = job.node("a").group_rank;
  const int rank_b = job.node("b").group_rank;
  // A failure with the round full: the spare stays a spare, both places are kept.
  job.send("b", failure(0, 1, 1));
  CHECK(job.node("c").state == NodeState::WaitListed);
  rejoin_all(job, {"a", "b"}, settings);
  CHECK(job.node("c").state == NodeState::WaitListed);
  // b's agent is lost: c takes its place, and a its group rank.
  const auto& out = job.apply(Disconnected{id_of("b")});
  CHECK(job.node("c").state == NodeState::Joined);
  CHECK(to<Restart>(out, "a").at(0).counted);
  const auto& round = job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(to<RoundReady>(round, "a").at(0).group_rank == rank_a);
  CHECK(to<RoundReady>(round, "c").at(0).group_rank == rank_b);
}

TEST_CASE("a node whose workers fail twice in a row is quarantined and a spare takes its place",
          "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2);
  Job job = with_spare(settings);
  const int rank_a = job.node("a").group_rank;
  const int rank_b = job.node("b").group_rank;
  job.send("b", failure(0, 1, 1));
  CHECK(job.state.standing.at("b/b").failures_in_a_row == 1);
  rejoin_all(job, {"a", "b"}, settings);
  const auto& out = job.send("b", failure(1, 1, 1));
  // b sits out; everyone's workers stop (a counted restart), c joins the forming round.
  CHECK(job.node("b").state == NodeState::Quarantined);
  CHECK(job.node("c").state == NodeState::Joined);
  CHECK(job.state.restart_count == 2);
  const Restart told_b = to<Restart>(out, "b").at(0);
  CHECK(told_b.quarantine == 30s);
  CHECK(told_b.counted);
  CHECK_THAT(told_b.reason, Catch::Contains("node b is quarantined for 30 s") &&
                                Catch::Contains("2 group failures in a row") &&
                                Catch::Contains("--quarantine_after 2"));
  CHECK_THAT(to<Restart>(out, "a").at(0).reason, Catch::Contains("node b is quarantined"));
  CHECK(to<Restart>(out, "a").at(0).quarantine == 0s);
  // b's agent stops its workers and joins again: it hears why it waits, and for how long.
  job.now += 2s;
  const auto& waits = job.join(join_of("b", settings));
  const Waiting w = to<Waiting>(waits, "b").at(0);
  CHECK(w.quarantine_left == 28s);
  CHECK_THAT(w.quarantined, Catch::Contains("2 group failures in a row"));
  CHECK(job.node("b").state == NodeState::Quarantined);
  // a rejoins: the round is a and c; a keeps its rank, c gets b's.
  const auto& round = job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(to<RoundReady>(round, "a").at(0).group_rank == rank_a);
  CHECK(to<RoundReady>(round, "c").at(0).group_rank == rank_b);
  CHECK(to<RoundReady>(round, "b").empty());
  // Status shows it.
  const auto status = describe_job(job.state, job.now);
  bool listed = false;
  for (const auto& node : status["nodes"])
    if (node["name"] == "b") listed = node["state"] == "quarantined";
  CHECK(listed);
}

TEST_CASE("a node that keeps failing is quarantined before its failures make a crash loop",
          "[rdzv][unit][spares]") {
  RdzvSettings settings = quarantining(2, 2);
  settings.crash_loop_limit = 3;
  Job job = running_job({"a", "b"}, settings);
  SECTION("a spare that came after its second failure takes its place at the third") {
    b_fails_twice(job, settings);
    CHECK(job.node("b").state == NodeState::Stopping);  // no spare yet: no quarantine
    rejoin_all(job, {"a", "b"}, settings);
  }
  SECTION("--quarantine_after equal to --crash_loop_stop, a spare there from the start") {
    settings.quarantine_after = 3;
    job = with_spare(settings);
    b_fails_twice(job, settings);
    rejoin_all(job, {"a", "b"}, settings);
  }
  if (job.state.nodes.count(id_of("c")) == 0) job.join(join_of("c", settings));
  REQUIRE(job.node("c").state == NodeState::WaitListed);
  REQUIRE(job.state.failure_repeats == 2);
  // The third failure in a row of the same kind, each on b: b sits out, c takes its place.
  const auto& out = job.send("b", failure(job.state.round, 1, 1));
  CHECK(job.state.phase == JobPhase::Joining);
  CHECK(job.node("b").state == NodeState::Quarantined);
  CHECK(job.node("c").state == NodeState::Joined);
  CHECK(to<Closed>(out, "a").empty());
  CHECK(to<Restart>(out, "b").at(0).quarantine == 30s);
  // b's failures count as one repeat: the spare failing the same way twice more points at the
  // script, and ends the job without blaming a machine.
  CHECK(job.state.failure_repeats == 1);
  rejoin_all(job, {"a"}, settings);
  job.send("c", failure(job.state.round, 1, 1));
  REQUIRE(job.state.phase == JobPhase::Joining);
  rejoin_all(job, {"a", "c"}, settings);
  const auto& next = job.send("c", failure(job.state.round, 1, 1));
  REQUIRE(job.state.phase == JobPhase::Closed);
  const auto closed = to<Closed>(next, "a").at(0);
  CHECK(closed.do_not_requeue);
  CHECK_THAT(closed.message, Catch::Contains("the same failure 3 times in a row") &&
                                 !Catch::Contains("each time on node"));
}

TEST_CASE("a crash loop the budget ends during a quarantine still says not to requeue",
          "[rdzv][unit][spares]") {
  RdzvSettings settings = quarantining(2, 2, 3);
  settings.crash_loop_limit = 3;
  Job job = with_spare(settings);
  job.join(join_of("d", settings));  // a second spare
  b_fails_twice(job, settings);      // b quarantined: restart 2 of 3
  REQUIRE(job.node("b").state == NodeState::Quarantined);
  rejoin_all(job, {"a"}, settings);
  job.send("c", failure(job.state.round, 1, 1));  // restart 3 of 3
  rejoin_all(job, {"a", "c"}, settings);
  // c's second failure would quarantine it, but no restart is left: the budget ends the job.
  const auto& out = job.send("c", failure(job.state.round, 1, 1));
  REQUIRE(job.state.phase == JobPhase::Closed);
  CHECK(job.node("c").state != NodeState::Quarantined);
  const auto closed = to<Closed>(out, "a").at(0);
  CHECK(closed.do_not_requeue);
  CHECK_THAT(closed.message, Catch::Contains("no restart left: 3 of --max_restarts 3 used; a "
                                             "crash loop") &&
                                 !Catch::Contains("quarantined"));
  // Every failure on b, a spare that came after the second, no restart left for a quarantine:
  // the message says why the spare did not take b's place.
  RdzvSettings small = quarantining(2, 2, 2);
  small.crash_loop_limit = 3;
  Job one = running_job({"a", "b"}, small);
  b_fails_twice(one, small);
  rejoin_all(one, {"a", "b"}, small);
  one.join(join_of("c", small));
  const auto& last = one.send("b", failure(2, 1, 1));
  REQUIRE(one.state.phase == JobPhase::Closed);
  CHECK_THAT(to<Closed>(last, "a").at(0).message,
             Catch::Contains("each time on node b (no restart was left to quarantine it)"));
}

TEST_CASE("a quarantine the budget has no restart for is not announced as the job ends",
          "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2, 1);
  Job job = with_spare(settings);
  job.send("b", failure(0, 1, 1));
  rejoin_all(job, {"a", "b"}, settings);
  const auto& out = job.send("b", failure(1, 1, 1));
  REQUIRE(job.state.phase == JobPhase::Closed);
  CHECK(job.node("b").state != NodeState::Quarantined);
  CHECK_THAT(to<Closed>(out, "a").at(0).message,
             Catch::Contains("no restart left") && !Catch::Contains("quarantined"));
}

TEST_CASE("a crash loop on one node says why no spare took its place", "[rdzv][unit][spares]") {
  RdzvSettings settings = quarantining(2, 2);
  settings.crash_loop_limit = 3;
  settings.quarantine_after = 5;
  Job job = with_spare(settings);
  b_fails_twice(job, settings);
  rejoin_all(job, {"a", "b"}, settings);
  const auto& out = job.send("b", failure(2, 1, 1));
  REQUIRE(job.state.phase == JobPhase::Closed);
  const std::string message = to<Closed>(out, "a").at(0).message;
  CHECK_THAT(message, Catch::Contains("each time on node b (--crash_loop_stop 3 came before "
                                      "--quarantine_after 5, which would have let the job go on"));
  CHECK_THAT(message, !Catch::Contains("no spare could take its place"));
}

TEST_CASE("a quarantined node back in an elastic job is quarantined again, not a crash loop",
          "[rdzv][unit][spares]") {
  RdzvSettings settings = quarantining(2, 3);
  settings.crash_loop_limit = 3;
  settings.last_call_timeout = 1s;
  Job job = running_job({"a", "b", "c"}, settings);
  job.send("b", failure(0, 1, 1));
  rejoin_all(job, {"a", "b", "c"}, settings);
  job.send("b", failure(1, 1, 1));
  REQUIRE(job.node("b").state == NodeState::Quarantined);
  // The job goes on with a and c (the last call) until b's cooldown is over.
  job.join(join_of("b", settings));
  job.join(join_of("a", settings));
  job.join(join_of("c", settings));
  job.pass(1s);
  REQUIRE(job.state.phase == JobPhase::Running);
  job.pass(29s);
  REQUIRE(job.state.nodes.count(id_of("b")) == 0);
  // b comes back: the job scales up to three (a crash loop counts afresh), and b's first
  // failure with no progress puts it back at once, for twice as long.
  job.join(join_of("b", settings));
  CHECK(job.node("b").state == NodeState::Joined);
  rejoin_all(job, {"a", "c"}, settings);
  CHECK(job.state.failure_repeats == 0);
  const auto& again = job.send("b", failure(job.state.round, 1, 1));
  CHECK(job.state.phase == JobPhase::Joining);
  const Restart told = to<Restart>(again, "b").at(0);
  CHECK(told.quarantine == 60s);
  CHECK_THAT(told.reason, Catch::Contains("failed again, with no progress, after its last"));
  CHECK_THAT(to<Restart>(again, "a").at(0).reason,
             Catch::Contains("(it failed again after its last quarantine, with no progress)"));
  // A failure after progress is a failure like any other: no quarantine at once.
  rejoin_all(job, {"a", "c"}, settings);
  job.pass(60s);
  job.join(join_of("b", settings));
  rejoin_all(job, {"a", "c"}, settings);
  job.send("b", failure(job.state.round, 1, 1, "", true));
  CHECK(job.node("b").state == NodeState::Stopping);
}

TEST_CASE(
    "a watchdog kill of a worker that was only waiting blames no node: counted as a restart, "
    "no node's run of failures changes",
    "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2);
  Job job = with_spare(settings);
  job.send("b", failure(0, 1, 1));
  REQUIRE(job.state.standing.at("b/b").failures_in_a_row == 1);
  rejoin_all(job, {"a", "b"}, settings);
  // A hang: a's watchdog fired first, on a worker that was asleep in the collective.
  WorkersFailed hang = failure(1, 0, 0);
  hang.signal = 9;  // SIGKILL
  hang.culprit = false;
  const auto& out = job.send("a", hang);
  CHECK(job.state.restart_count == 2);
  CHECK(to<Restart>(out, "b").at(0).counted);
  CHECK_THAT(to<Restart>(out, "b").at(0).reason,
             Catch::Contains("no node is blamed: its worker was waiting"));
  CHECK(job.state.standing.count("a/a") == 0);
  CHECK(job.state.standing.at("b/b").failures_in_a_row == 1);
  rejoin_all(job, {"a", "b"}, settings);
  // Twice in a row, still nobody is quarantined.
  hang.round = job.state.round;
  job.send("b", hang);
  CHECK(job.node("b").state == NodeState::Stopping);
  CHECK(job.node("c").state == NodeState::WaitListed);
  rejoin_all(job, {"a", "b"}, settings);
  // b's own failure next is its second in a row: the hangs between did not end its run.
  job.send("b", failure(job.state.round, 1, 1));
  CHECK(job.node("b").state == NodeState::Quarantined);
}

TEST_CASE(
    "a quarantine ends after its cooldown: the node joins again as a spare, and the next "
    "cooldown is twice as long, at most the maximum",
    "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2);
  Job job = with_spare(settings);
  b_fails_twice(job, settings);
  job.join(join_of("b", settings));
  rejoin_all(job, {"a"}, settings);
  // The cooldown passes: b is forgotten and told to join again (not counted).
  const auto out = job.pass(30s);
  const auto released = to<Restart>(out, "b");
  REQUIRE(released.size() == 1);
  CHECK_FALSE(released[0].counted);
  CHECK_THAT(released[0].reason, Catch::Contains("its quarantine is over"));
  CHECK(job.state.nodes.count(id_of("b")) == 0);
  CHECK(job.state.phase == JobPhase::Running);  // the round a, c goes on
  // It joins as a newcomer: a spare, the round being full.
  job.join(join_of("b", settings));
  CHECK(job.node("b").state == NodeState::WaitListed);
  // c is lost: b takes its place (the loss's restart ends b's watch after its quarantine); b
  // fails twice more: quarantined for 60 s, then 100 s.
  job.apply(Disconnected{id_of("c")});
  rejoin_all(job, {"a"}, settings);
  job.join(join_of("c", settings));  // c's agent, restarted, is the spare now
  int round = job.state.round;
  CHECK(to<Restart>(job.send("b", failure(round, 1, 1)), "b").at(0).quarantine == 0s);
  rejoin_all(job, {"a", "b"}, settings);
  round = job.state.round;
  CHECK(to<Restart>(job.send("b", failure(round, 1, 1)), "b").at(0).quarantine == 60s);
  CHECK(job.state.standing.at("b/b").quarantines == 2);
  job.join(join_of("b", settings));
  rejoin_all(job, {"a"}, settings);
  job.pass(60s);
  job.join(join_of("b", settings));
  job.apply(Disconnected{id_of("c")});
  rejoin_all(job, {"a"}, settings);
  round = job.state.round;
  job.send("b", failure(round, 1, 1));
  rejoin_all(job, {"a", "b"}, settings);
  round = job.state.round;
  job.join(join_of("c", settings));  // a spare again, so a quarantine can apply
  CHECK(to<Restart>(job.send("b", failure(round, 1, 1)), "b").at(0).quarantine == 100s);
}

TEST_CASE(
    "no quarantine that would end the job: without a spare at the minimum, the budget "
    "decides",
    "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2, 3);
  Job job = running_job({"a", "b"}, settings);
  for (int round = 0; round < 3; ++round) {
    const auto& out = job.send("b", failure(round, 1, 1));
    CHECK(count_of<Restart>(out) == 2);
    CHECK(to<Restart>(out, "b").at(0).quarantine == 0s);
    rejoin_all(job, {"a", "b"}, settings);
  }
  CHECK(job.state.standing.at("b/b").failures_in_a_row == 3);
  const auto& out = job.send("b", failure(3, 1, 1));
  CHECK(job.state.phase == JobPhase::Closed);
  CHECK_THAT(to<Closed>(out, "a").at(0).message, Catch::Contains("no restart left"));
}

TEST_CASE(
    "above the elastic minimum a quarantined node's round runs smaller, and its return "
    "scales the job up again",
    "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(1, 2);
  Job job = running_job({"a", "b"}, settings);
  job.send("b", failure(0, 1, 1));
  rejoin_all(job, {"a", "b"}, settings);
  job.send("b", failure(1, 1, 1));
  REQUIRE(job.node("b").state == NodeState::Quarantined);
  job.join(join_of("b", settings));
  job.join(join_of("a", settings));
  // Every node of the job that may join has: the round of one runs without a last call.
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("a").group_rank == 0);
  const auto out = job.pass(30s);
  REQUIRE(to<Restart>(out, "b").size() == 1);
  // b comes back: a scale-up round (not counted) with both.
  const int restarts = job.state.restart_count;
  const auto& scaled = job.join(join_of("b", settings));
  CHECK_FALSE(to<Restart>(scaled, "a").at(0).counted);
  CHECK(job.state.restart_count == restarts);
}

TEST_CASE("another node's failure in between starts the count afresh", "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2);
  Job job = with_spare(settings);
  job.send("b", failure(0, 1, 1));
  rejoin_all(job, {"a", "b"}, settings);
  job.send("a", failure(1, 0, 1));
  CHECK(job.state.standing.at("a/a").failures_in_a_row == 1);
  CHECK(job.state.standing.count("b/b") == 0);
  rejoin_all(job, {"a", "b"}, settings);
  const auto& out = job.send("b", failure(2, 1, 1));
  CHECK(to<Restart>(out, "b").at(0).quarantine == 0s);
  CHECK(job.node("b").state == NodeState::Stopping);
}

TEST_CASE(
    "a restarted agent on a quarantined host is quarantined too; a round short of its "
    "minimum ends the quarantine early",
    "[rdzv][unit][spares]") {
  const RdzvSettings settings = quarantining(2, 2);
  Job job = with_spare(settings);
  b_fails_twice(job, settings);
  // b's agent dies and another starts on the same host (same address): a new node id.
  job.apply(Disconnected{id_of("b")});
  Join again = join_of("b", settings);
  again.node_id = "b:5555:ef01";
  const auto& out = job.join(again);
  CHECK(job.state.nodes.at(NodeId("b:5555:ef01")).state == NodeState::Quarantined);
  REQUIRE(out.size() == 1);
  CHECK_FALSE(std::get<Waiting>(out[0].message).quarantined.empty());
  rejoin_all(job, {"a"}, settings);  // a and c run
  // c is lost: a alone is short of the minimum of 2, so b's quarantine ends at once.
  const auto& lost = job.apply(Disconnected{id_of("c")});
  bool released = false;
  for (const Outgoing& o : lost)
    if (o.node_id == "b:5555:ef01")
      if (const auto* r = std::get_if<Restart>(&o.message))
        released = r->reason.get().find("the job needs it") != std::string::npos;
  CHECK(released);
  CHECK(job.state.nodes.count("b:5555:ef01") == 0);
  again.settings = settings;
  job.join(again);
  rejoin_all(job, {"a"}, settings);
}

TEST_CASE("every node must agree on --quarantine_after and --quarantine_cooldown",
          "[rdzv][unit][spares]") {
  RdzvSettings settings = quarantining(2, 2);
  Job job;
  job.join(join_of("a", settings));
  RdzvSettings other = settings;
  other.quarantine_after = 3;
  auto refused = to<Refused>(job.join(join_of("b", other)), "b");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == RefusalKind::Mismatch);
  CHECK_THAT(refused[0].message,
             Catch::Contains("--quarantine_after 3") && Catch::Contains("--quarantine_after 2"));
  other = settings;
  other.quarantine_cooldown_max = 600s;
  refused = to<Refused>(job.join(join_of("b", other)), "b");
  REQUIRE(refused.size() == 1);
  CHECK_THAT(refused[0].message, Catch::Contains("--quarantine_cooldown 30:600"));
  other = settings;
  other.quarantine_cooldown = 200s;
  CHECK_THAT(check_settings(other, "b")->message, Catch::Contains("--quarantine_cooldown 200:100"));
}

// ---- nodes kept out by their health check -------------------------------------------------

namespace {

/// A join of a node whose --health_check failed with `why`.
Join kept_out_join(const std::string& name, const RdzvSettings& settings,
                   const std::string& why = "gpu0: ECC errors") {
  Join join = join_of(name, settings);
  join.kept_out = why;
  return join;
}

/// The status document's entry for node `name` (null when it is not listed).
nlohmann::json status_of(const Job& job, const std::string& name) {
  const nlohmann::json status = describe_job(job.state, job.now);
  for (const auto& node : status["nodes"])
    if (node["name"] == name) return node;
  return nullptr;
}

}  // namespace

TEST_CASE("a node kept out by its health check is listed but never placed, and hears the end",
          "[rdzv][unit][health]") {
  const RdzvSettings settings = nnodes(1, 3);
  Job job;
  job.join(join_of("a", settings));
  const auto& joined = job.join(kept_out_join("b", settings));
  CHECK(job.node("b").state == NodeState::KeptOut);
  CHECK(joined.empty());  // no Waiting: it is in no round
  // The last call completes the round with a alone, although b is known and under max.
  job.pass(30s);
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("a").group_rank == 0);
  CHECK(job.node("b").group_rank == -1);
  CHECK(job.node("b").state == NodeState::KeptOut);
  const nlohmann::json listed = status_of(job, "b");
  CHECK(listed["state"] == "kept_out");
  CHECK(listed["kept_out"] == "gpu0: ECC errors");
  CHECK(describe_job(job.state, job.now)["kept_out"] == 1);
  // Another failed check says a new reason; still no scale-up.
  CHECK(job.join(kept_out_join("b", settings, "disk full")).empty());
  CHECK(status_of(job, "b")["kept_out"] == "disk full");
  // Silence for the keep-alive window drops it like any node.
  job.pass(20s, {"b"});
  CHECK(job.state.nodes.count(NodeId(id_of("b"))) == 0);
  job.join(kept_out_join("b2", settings));
  const auto& end = job.send("a", WorkersSucceeded{0});
  REQUIRE(job.state.phase == JobPhase::Closed);
  REQUIRE(to<Closed>(end, "b2").size() == 1);
  CHECK(to<Closed>(end, "b2")[0].outcome == JobOutcomeKind::Succeeded);
  // A kept-out join to the closed job hears its end, not a refusal.
  const auto& late = job.join(kept_out_join("c", settings));
  CHECK(to<Closed>(late, "c").size() == 1);
  CHECK(to<Refused>(late, "c").empty());
  CHECK(to<Refused>(job.join(join_of("d", settings)), "d").size() == 1);
}

TEST_CASE("a node whose check fails as it rejoins gives its place to a spare at once",
          "[rdzv][unit][health]") {
  const RdzvSettings settings = nnodes(2, 2);
  Job job = running_job({"a", "b"}, settings);
  job.join(join_of("c", settings));
  REQUIRE(job.node("c").state == NodeState::WaitListed);
  const int rank_b = job.node("b").group_rank;
  job.send("a", failure(0, 0, 1));
  job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Joining);  // b's place is kept for it
  const auto& out = job.join(kept_out_join("b", settings));
  // b is kept out; c took its place and the round formed without waiting for a last call.
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("b").state == NodeState::KeptOut);
  CHECK(to<RoundReady>(out, "c").at(0).group_rank == rank_b);
  CHECK(to<RoundReady>(out, "b").empty());
  // Its check passes: it joins as a newcomer, a spare of the full round.
  job.join(join_of("b", settings));
  CHECK(job.node("b").state == NodeState::WaitListed);
}

TEST_CASE("a kept-out node whose check passes joins as a newcomer and scales the job up",
          "[rdzv][unit][health]") {
  const RdzvSettings settings = nnodes(1, 2);
  Job job;
  job.join(join_of("a", settings));
  job.join(kept_out_join("b", settings));
  job.pass(30s);
  REQUIRE(job.state.phase == JobPhase::Running);
  const auto& out = job.join(join_of("b", settings));
  // Under max with a newcomer: a scale-up round (not counted) with both.
  CHECK(to<Restart>(out, "a").size() == 1);
  CHECK_FALSE(to<Restart>(out, "a").at(0).counted);
  job.join(join_of("a", settings));
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("b").state == NodeState::Running);
}

TEST_CASE("a join timeout names the nodes kept out by their health check, and tells them",
          "[rdzv][unit][health]") {
  const RdzvSettings settings = nnodes(2, 2);
  Job job;
  job.join(join_of("a", settings));
  job.join(kept_out_join("b", settings));
  const auto out = job.pass(601s);
  REQUIRE(job.state.phase == JobPhase::Closed);
  const std::vector<Closed> told = to<Closed>(out, "b");
  REQUIRE(told.size() == 1);
  CHECK(told[0].outcome == JobOutcomeKind::TimedOut);
  CHECK_THAT(told[0].message, Catch::Contains("1 of min 2 nodes joined (a)") &&
                                  Catch::Contains("kept out by their health check: b (gpu0: "
                                                  "ECC errors)"));
}

TEST_CASE("a kept-out node that leaves a round ending the job still hears how",
          "[rdzv][unit][health]") {
  // b runs the last round the budget allows; its check then fails while the job thinks it
  // runs: its place goes as if it had left, which ends the job, and b hears the end.
  const RdzvSettings settings = nnodes(2, 2, 0);
  Job job = running_job({"a", "b"}, settings);
  const auto& out = job.join(kept_out_join("b", settings));
  REQUIRE(job.state.phase == JobPhase::Closed);
  CHECK(to<Closed>(out, "b").size() == 1);
  CHECK(to<Closed>(out, "a").size() == 1);
}

TEST_CASE("a kept-out node is not wait-listed when a restarted server takes a round back",
          "[rdzv][unit][health]") {
  const RdzvSettings settings = nnodes(2, 3);
  Job job;  // a fresh server: the kept-out node reconnects first
  job.join(kept_out_join("c", settings));
  Join a = join_of("a", settings);
  a.resume = claim(0, 0, 2, 0);
  job.join(a);
  Join b = join_of("b", settings);
  b.resume = claim(0, 1, 2, 0);
  b.resume->master_addr = a.resume->master_addr;
  job.join(b);
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK_FALSE(job.state.adopt_deadline);
  // No scale-up round took it in: it asked for no round.
  CHECK(job.node("c").state == NodeState::KeptOut);
  CHECK(job.state.round == 0);
}

TEST_CASE("a kept-out node keeps no --node_rank from others and is not refused for one",
          "[rdzv][unit][health]") {
  const RdzvSettings settings = nnodes(2, 3);
  Job job;
  job.join(join_of("a", settings, 0));
  job.join(join_of("b", settings, 1));
  job.join(join_of("c", settings, 2));
  REQUIRE(job.state.phase == JobPhase::Running);
  job.send("b", failure(0, 2, 1));
  job.join(join_of("a", settings, 0));
  job.join(join_of("c", settings, 2));
  // b's check fails as it rejoins: the round forms with a and c, and c takes group rank 1.
  Join kept = kept_out_join("b", settings);
  kept.node_rank = 1;
  job.join(kept);
  REQUIRE(job.state.phase == JobPhase::Running);
  CHECK(job.node("c").group_rank == 1);
  // Its next failed check is held as before, not refused for the rank c holds now.
  const auto& again = job.join(kept);
  CHECK(to<Refused>(again, "b").empty());
  CHECK(job.node("b").state == NodeState::KeptOut);
  // In a forming round, a replacement started with a kept-out node's --node_rank takes it.
  Job forming;
  const RdzvSettings two = nnodes(2, 2);
  forming.join(join_of("a", two, 0));
  Join broken = kept_out_join("b", two);
  broken.node_rank = 1;
  forming.join(broken);
  const auto& out = forming.join(join_of("d", two, 1));
  CHECK(to<Refused>(out, "d").empty());
  REQUIRE(forming.state.phase == JobPhase::Running);
  CHECK(forming.node("d").group_rank == 1);
}
