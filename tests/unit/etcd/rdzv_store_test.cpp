#include "etcd/rdzv_store.h"

#include <catch2/catch.hpp>
#include <set>

using namespace ddprun;
using namespace ddprun::etcd;
using Catch::Matchers::Contains;
using common::TimePoint;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

/// A job's keys in a pretend etcd: revisions count up, and the driver's passes are applied as
/// the executor applies them (a put of `state` when changed).
struct Keys {
  View view;
  std::int64_t revision = 1;
  TimePoint now = TimePoint{} + seconds(1000);
  TimeAnchor anchor{TimePoint{}, 1'700'000'000'000};
  std::vector<rdzv::Outgoing> delivered;       ///< messages of every pass so far
  std::map<std::string, std::string> notices;  ///< the messages keys put by the last pass

  explicit Keys(const std::string& run_id = "job") { view.prefix = job_prefix(run_id); }

  void put(const std::string& key, const std::string& value) {
    KeyValue kv;
    kv.key = key;
    kv.value = value;
    kv.mod_revision = ++revision;
    auto existing = key == state_key(view.prefix) ? view.state : std::optional<KeyValue>{};
    for (auto* map : {&view.nodes, &view.reports})
      for (const auto& [id, old] : *map)
        if (old.key == key) existing = old;
    kv.create_revision = existing ? existing->create_revision : kv.mod_revision;
    apply_event(view, Event{Event::Type::Put, kv, std::nullopt});
  }
  void remove(const std::string& key) {
    KeyValue kv;
    kv.key = key;
    kv.mod_revision = ++revision;
    apply_event(view, Event{Event::Type::Delete, kv, std::nullopt});
  }

  rdzv::Join join_of(const std::string& id, int min, int max, int max_restarts = 3) {
    rdzv::Join j;
    j.run_id = "job";
    j.node_id = id;
    j.name = "host-" + id;
    j.addr = "10.0.0." + id;
    j.master_port = 29500;
    j.settings.min_nodes = min;
    j.settings.max_nodes = max;
    j.settings.max_restarts = max_restarts;
    return j;
  }
  void join(const std::string& id, int min, int max) {
    put(node_key(view.prefix, id), encode_message(join_of(id, min, max)));
  }
  void leave(const std::string& id) {
    remove(node_key(view.prefix, id));
    remove(report_key(view.prefix, id));
  }

  StoredState current() {
    if (!view.state) return StoredState{rdzv::new_job("job", now), {}, {}};
    auto decoded = decode_state(view.state->value, view.state->key, anchor, now);
    REQUIRE(decoded.ok());
    decoded->messages.clear();
    return *decoded;
  }

  /// One driver pass; its state written when it changed. Returns the pass.
  DriveResult drive_once() {
    DriveResult r = drive(current(), view, now);
    if (r.changed) {
      put(state_key(view.prefix), encode_state(r.next, anchor));
      if (!r.next.messages.empty())
        notices = notices_by_key(view.prefix, r.next.job.phase, r.next.messages);
      for (const auto& m : r.next.messages) delivered.push_back(m);
    }
    return r;
  }

  template <typename M>
  std::vector<M> to(const std::string& id) {
    std::vector<M> out;
    for (const auto& m : delivered)
      if (m.node_id == id)
        if (const auto* msg = std::get_if<M>(&m.message)) out.push_back(*msg);
    return out;
  }
};

}  // namespace

TEST_CASE("two nodes joining a job of two get ranks from the state written to etcd",
          "[etcd][unit]") {
  Keys k;
  k.join("1", 2, 2);
  CHECK(k.drive_once().changed);
  CHECK(k.to<rdzv::RoundReady>("1").empty());
  k.join("2", 2, 2);
  k.drive_once();
  REQUIRE(k.to<rdzv::RoundReady>("1").size() == 1);
  REQUIRE(k.to<rdzv::RoundReady>("2").size() == 1);
  const auto a = k.to<rdzv::RoundReady>("1")[0];
  const auto b = k.to<rdzv::RoundReady>("2")[0];
  CHECK(a.group_world_size == 2);
  CHECK(b.group_world_size == 2);
  CHECK(a.group_rank + b.group_rank == 1);
  CHECK(a.master_addr == b.master_addr);
  CHECK(k.current().job.phase == rdzv::JobPhase::Running);
}

TEST_CASE("a driver pass with nothing new writes nothing", "[etcd][unit]") {
  Keys k;
  k.join("1", 2, 2);
  k.join("2", 2, 2);
  REQUIRE(k.drive_once().changed);
  const auto revision = k.revision;
  CHECK_FALSE(k.drive_once().changed);
  k.now += seconds(30);
  CHECK_FALSE(k.drive_once().changed);
  CHECK(k.revision == revision);
}

TEST_CASE("a node whose key is deleted is lost and the survivors restart counted", "[etcd][unit]") {
  Keys k;
  for (const char* id : {"1", "2", "3"}) k.join(id, 2, 3);
  k.drive_once();
  REQUIRE(k.current().job.phase == rdzv::JobPhase::Running);
  k.leave("3");
  k.drive_once();
  const auto restarts = k.to<rdzv::Restart>("1");
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0].counted);
  CHECK(restarts[0].restart_count == 1);
  CHECK(k.to<rdzv::Restart>("2").size() == 1);
  CHECK(k.current().job.restart_count == 1);
  CHECK(k.current().applied.count("3") == 0);
}

TEST_CASE("a node that leaves is reported as left, not lost, whenever the driver reads",
          "[etcd][unit]") {
  // The leaving agent puts its Leave and deletes its key in one txn (one revision); a driver
  // that reads after the report's lease went sees only the delete, and calls it a loss.
  for (const bool report_kept : {true, false}) {
    Keys k;
    for (const char* id : {"1", "2", "3"}) k.join(id, 2, 3);
    k.drive_once();
    REQUIRE(k.current().job.phase == rdzv::JobPhase::Running);
    k.put(report_key(k.view.prefix, "3"), encode_message(rdzv::Leave{"received SIGTERM"}));
    k.remove(node_key(k.view.prefix, "3"));
    if (!report_kept) k.remove(report_key(k.view.prefix, "3"));
    k.drive_once();
    const auto restarts = k.to<rdzv::Restart>("1");
    REQUIRE(restarts.size() == 1);
    CHECK(restarts[0].reason.get() == (report_kept ? "node host-3 left (received SIGTERM)"
                                                   : "node host-3 disconnected without leaving"));
    CHECK(k.to<rdzv::Restart>("2").size() == 1);
    CHECK(k.current().applied.count("3") == 0);
    // The report, still there until its own lease ends, changes nothing more.
    CHECK_FALSE(k.drive_once().changed);
  }
}

TEST_CASE("a failure report restarts every participant once", "[etcd][unit]") {
  Keys k;
  k.join("1", 2, 2);
  k.join("2", 2, 2);
  k.drive_once();
  rdzv::WorkersFailed failed;
  failed.round = k.current().job.round;
  failed.description = "worker rank 0 exited with code 3";
  failed.exit_code = 3;
  k.put(report_key(k.view.prefix, "2"), encode_message(failed));
  k.drive_once();
  REQUIRE(k.to<rdzv::Restart>("1").size() == 1);
  CHECK_THAT(k.to<rdzv::Restart>("1")[0].reason, Contains("exited with code 3"));
  // The same report seen again (a new driver, a second pass) is not applied twice.
  k.drive_once();
  CHECK(k.to<rdzv::Restart>("1").size() == 1);
  CHECK(k.current().job.restart_count == 1);
}

TEST_CASE("both nodes succeeding close the job", "[etcd][unit]") {
  Keys k;
  k.join("1", 2, 2);
  k.join("2", 2, 2);
  k.drive_once();
  const int round = k.current().job.round;
  k.put(report_key(k.view.prefix, "1"), encode_message(rdzv::WorkersSucceeded{round}));
  k.put(report_key(k.view.prefix, "2"), encode_message(rdzv::WorkersSucceeded{round}));
  k.drive_once();
  REQUIRE(k.to<rdzv::Closed>("1").size() == 1);
  CHECK(k.to<rdzv::Closed>("1")[0].outcome == rdzv::JobOutcomeKind::Succeeded);
  CHECK(k.current().job.phase == rdzv::JobPhase::Closed);
  // Closed -> [erased] once close_timeout has passed: the driver deletes the prefix.
  k.now += seconds(31);
  CHECK(k.drive_once().erase);
}

TEST_CASE("a node key that is not a join is refused naming the key", "[etcd][unit]") {
  Keys k;
  k.put(node_key(k.view.prefix, "1"), "{not json");
  k.join("2", 1, 2);
  k.drive_once();
  const auto refused = k.to<rdzv::Refused>("1");
  REQUIRE(refused.size() == 1);
  CHECK_THAT(refused[0].message, Contains("/ddprun/job/nodes/1"));
  CHECK_THAT(refused[0].message, Contains("not JSON"));
  // A join naming another node under this id is refused too.
  k.put(node_key(k.view.prefix, "3"), encode_message(k.join_of("4", 1, 2)));
  k.drive_once();
  CHECK(k.to<rdzv::Refused>("3").size() == 1);
}

TEST_CASE("the driver is the node with the lowest create revision", "[etcd][unit]") {
  Keys k;
  CHECK_FALSE(driver_of(k.view));
  k.join("b", 2, 2);
  k.join("a", 2, 2);
  CHECK(driver_of(k.view) == "b");
  k.join("b", 2, 2);  // a second join keeps the create revision
  CHECK(driver_of(k.view) == "b");
  k.leave("b");
  CHECK(driver_of(k.view) == "a");
}

TEST_CASE("the state round-trips through its etcd value", "[etcd][unit]") {
  Keys k;
  k.join("1", 1, 3);
  k.join("2", 1, 3);
  k.drive_once();  // Joining with a last call deadline
  const StoredState before = k.current();
  REQUIRE(before.job.last_call);
  const std::string value = encode_state(before, k.anchor);
  auto back = decode_state(value, "/ddprun/job/state", k.anchor, k.now);
  REQUIRE(back.ok());
  CHECK(encode_state(*back, k.anchor) == value);
  CHECK(*back->job.last_call == *before.job.last_call);
  // Read on another host whose steady clock started elsewhere: the same wall-clock deadline.
  TimeAnchor other{TimePoint{} + seconds(5000), k.anchor.wall_ms};
  auto there = decode_state(value, "/ddprun/job/state", other, k.now);
  REQUIRE(there.ok());
  CHECK(*there->job.last_call - *before.job.last_call == seconds(5000));
}

TEST_CASE("the failure policy's state round-trips through the etcd value", "[etcd][unit]") {
  Keys k;
  k.join("1", 1, 3);
  k.drive_once();
  StoredState state = k.current();
  state.job.settings.restart_window = milliseconds(600'000);
  state.job.settings.fatal_exit_codes = {3, 42};
  state.job.window_restarts = {k.now - seconds(30), k.now - seconds(2)};
  state.job.repeated_failure = "3/1/0/ValueError";
  state.job.failure_repeats = 2;
  state.job.pause_count = 4;
  state.job.settings.restart_backoff = milliseconds(2'000);
  state.job.settings.restart_backoff_max = milliseconds(90'000);
  auto back = decode_state(encode_state(state, k.anchor), "/ddprun/job/state", k.anchor, k.now);
  REQUIRE(back.ok());
  CHECK(back->job.settings.restart_window == milliseconds(600'000));
  CHECK(back->job.settings.crash_loop_limit == 3);
  CHECK(back->job.settings.fatal_exit_codes == std::vector<int>{3, 42});
  CHECK(back->job.window_restarts == state.job.window_restarts);
  CHECK(back->job.repeated_failure == "3/1/0/ValueError");
  CHECK(back->job.failure_repeats == 2);
  CHECK(back->job.pause_count == 4);
  CHECK(back->job.settings.restart_backoff == milliseconds(2'000));
  CHECK(back->job.settings.restart_backoff_max == milliseconds(90'000));
}

TEST_CASE("quarantine's settings and standing round-trip through the etcd value",
          "[etcd][unit][spares]") {
  Keys k;
  k.join("1", 1, 3);
  k.drive_once();
  StoredState state = k.current();
  state.job.settings.quarantine_after = 2;
  state.job.settings.quarantine_cooldown = milliseconds(30'000);
  state.job.settings.quarantine_cooldown_max = milliseconds(600'000);
  state.job.nodes.begin()->second.state = ddprun::rdzv::NodeState::Quarantined;
  state.job.standing["host-b/10.0.0.2"] = {0, 2, k.now + seconds(45), "its workers failed"};
  state.job.standing["host-c/10.0.0.3"] = {1, 0, std::nullopt, ""};
  state.job.standing["host-c/10.0.0.3"].relapse_armed = true;
  auto back = decode_state(encode_state(state, k.anchor), "/ddprun/job/state", k.anchor, k.now);
  REQUIRE(back.ok());
  CHECK(back->job.settings.quarantine_after == 2);
  CHECK(back->job.settings.quarantine_cooldown == milliseconds(30'000));
  CHECK(back->job.settings.quarantine_cooldown_max == milliseconds(600'000));
  CHECK(back->job.nodes.begin()->second.state == ddprun::rdzv::NodeState::Quarantined);
  REQUIRE(back->job.standing.size() == 2);
  const ddprun::rdzv::NodeStanding& b = back->job.standing.at("host-b/10.0.0.2");
  CHECK(b.quarantines == 2);
  CHECK(b.until == k.now + seconds(45));
  CHECK(b.why == "its workers failed");
  CHECK(back->job.standing.at("host-c/10.0.0.3").failures_in_a_row == 1);
  CHECK_FALSE(back->job.standing.at("host-c/10.0.0.3").until);
  CHECK(back->job.standing.at("host-c/10.0.0.3").relapse_armed);
  CHECK_FALSE(b.relapse_armed);
}

TEST_CASE("a malformed state value is an error naming the key", "[etcd][unit]") {
  Keys k;
  const std::string key = "/ddprun/job/state";
  const auto error = [&](const std::string& value) {
    auto r = decode_state(value, key, k.anchor, k.now);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Contains(key));
    return r.error().message;
  };
  CHECK_THAT(error("not json"), Contains("not JSON"));
  CHECK_THAT(error("[1,2]"), Contains("state must be an object"));
  // An older ddprun's state (format 1 knows no kept-out node): refused by name.
  CHECK_THAT(error(R"({"format":1})"),
             Contains("format 1, this ddprun reads format 2 (every node must run the same "
                      "ddprun)"));
  k.join("1", 2, 2);
  k.drive_once();
  auto j = nlohmann::json::parse(k.view.state->value);
  j["job"]["phase"] = "dancing";
  CHECK_THAT(error(j.dump()), Contains("job.phase has the unknown value \"dancing\""));
  j = nlohmann::json::parse(k.view.state->value);
  j["job"]["round"] = "7";
  CHECK_THAT(error(j.dump()), Contains("job.round must be an integer"));
  j = nlohmann::json::parse(k.view.state->value);
  j["job"]["settings"]["crash_loop_limit"] = "3";
  CHECK_THAT(error(j.dump()),
             Contains("job.settings field \"crash_loop_limit\" must be an integer"));
  j["job"]["settings"]["crash_loop_limit"] = 1;
  CHECK_THAT(error(j.dump()), Contains("job.settings are no job's: node host-1 was started with "
                                       "--crash_loop_stop 1: it must be 0 (off) or 2 or more"));
  j = nlohmann::json::parse(k.view.state->value);
  j["job"]["round_started_ms"] = 1;
  CHECK_THAT(error(j.dump()), Contains("more than ten years from now"));
  j = nlohmann::json::parse(k.view.state->value);
  j["job"]["nodes"]["1"]["join"] = {{"type", "join"}};
  CHECK_THAT(error(j.dump()), Contains("job.nodes[1].join"));
  CHECK_THAT(error(std::string(kMaxStateBytes + 1, ' ')), Contains("more than"));
}

TEST_CASE("keys outside the job's layout do not change the view", "[etcd][unit]") {
  Keys k;
  k.put("/ddprun/job/other", "x");
  k.put("/ddprun/jobs/nodes/1", "x");
  CHECK(k.view.nodes.empty());
  CHECK_FALSE(k.view.state);
}

TEST_CASE("a closed job left in etcd past its close timeout does not refuse a new job",
          "[etcd][unit]") {
  Keys k;
  k.join("1", 1, 1);
  k.drive_once();
  const int round = k.current().job.round;
  k.put(report_key(k.view.prefix, "1"), encode_message(rdzv::WorkersSucceeded{round}));
  k.drive_once();
  REQUIRE(k.current().job.phase == rdzv::JobPhase::Closed);
  // Every node went away without deleting the keys; later a new node uses the run id.
  k.leave("1");
  k.now += seconds(60);
  k.join("2", 1, 1);
  k.drive_once();
  CHECK(k.to<rdzv::Refused>("2").empty());
  REQUIRE(k.to<rdzv::RoundReady>("2").size() == 1);
  CHECK(k.to<rdzv::RoundReady>("2")[0].restart_count == 0);
}

TEST_CASE("a node reads only its own messages and the phase from its messages key",
          "[etcd][unit]") {
  Keys k;
  k.join("1", 2, 2);
  k.join("2", 2, 2);
  k.drive_once();
  const std::string key = messages_key(k.view.prefix, "2");
  REQUIRE(k.notices.count(key) == 1);
  const std::string value = k.notices[key];
  auto notices = decode_notices(value, key, "2");
  REQUIRE(notices.ok());
  CHECK(notices->phase == rdzv::JobPhase::Running);
  REQUIRE(notices->messages.size() == 1);
  CHECK(std::holds_alternative<rdzv::RoundReady>(notices->messages[0]));
  CHECK(decode_notices(value, key, "3")->messages.empty());
  auto j = nlohmann::json::parse(value);
  j["messages"][0]["message"] = {{"type", "round"}};
  auto bad = decode_notices(j.dump(), key, j["messages"][0]["node"].get<std::string>());
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Contains(key));
  CHECK_THAT(decode_notices("{}", key, "1").error().message, Contains("state.format is missing"));
  CHECK_THAT(decode_notices("{}", key, "1").error().message,
             Contains("etcdctl del --prefix /ddprun/job/)"));
  // The state value holds no messages: nodes other than the driver never decode it.
  CHECK_FALSE(nlohmann::json::parse(k.view.state->value).contains("messages"));
}

TEST_CASE("a node's messages key is the same on every host and is one of kMessageKeys",
          "[etcd][unit]") {
  // FNV-1a of "a" is 0xe40c292c; 0x2c is 44.
  CHECK(messages_key("/ddprun/j/", "a") == "/ddprun/j/messages/44");
  std::set<std::string> keys;
  for (int i = 0; i < 1000; ++i)
    keys.insert(messages_key("/ddprun/j/", "host:1:" + std::to_string(i)));
  CHECK(keys.size() == static_cast<std::size_t>(kMessageKeys));
  // The driver's watch range holds the joins and reports, neither `state` nor messages.
  const std::string p = "/ddprun/j/";
  for (const std::string& inside : {node_key(p, "x"), report_key(p, "x")}) {
    CHECK(inside >= nodes_dir(p));
    CHECK(inside < reports_end(p));
  }
  for (const std::string& outside : {state_key(p), messages_key(p, "x")})
    CHECK_FALSE((outside >= nodes_dir(p) && outside < reports_end(p)));
}

TEST_CASE("a round of 200 nodes puts each node's message only in its own messages key",
          "[etcd][unit]") {
  Keys k;
  for (int i = 1; i <= 200; ++i) k.join(std::to_string(i), 200, 200);
  k.drive_once();
  REQUIRE(k.to<rdzv::RoundReady>("200").size() == 1);
  // At most kMessageKeys puts besides `state` (etcd's --max-txn-ops is 128 by default).
  CHECK(k.notices.size() <= static_cast<std::size_t>(kMessageKeys));
  std::size_t messages = 0;
  for (const auto& [key, value] : k.notices) {
    const auto j = nlohmann::json::parse(value);
    for (const auto& m : j["messages"]) {
      const std::string id = m["node"].get<std::string>();
      CHECK(messages_key(k.view.prefix, id) == key);
      ++messages;
    }
  }
  CHECK(messages == k.delivered.size());
  for (int i = 1; i <= 200; ++i) {
    const std::string id = std::to_string(i);
    const std::string key = messages_key(k.view.prefix, id);
    auto notices = decode_notices(k.notices[key], key, id);
    REQUIRE(notices.ok());
    // Its Waiting (the join's answer) and its RoundReady, in the order step() sent them.
    REQUIRE_FALSE(notices->messages.empty());
    CHECK(std::holds_alternative<rdzv::RoundReady>(notices->messages.back()));
  }
}

TEST_CASE(
    "the join that would take a job past what one etcd key holds is refused, naming the daemon",
    "[etcd][unit]") {
  Keys k;
  const int most = static_cast<int>(kMaxNodesOnEtcd);
  for (int i = 1; i <= most + 1; ++i) k.join(std::to_string(i), most + 100, 4096);
  k.drive_once();
  // The first kMaxNodesOnEtcd wait for the round; the one after them is refused.
  const auto refused = k.to<rdzv::Refused>(std::to_string(most + 1));
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].kind == rdzv::RefusalKind::Mismatch);
  CHECK_THAT(refused[0].message, Contains("cannot join job 'job': it holds 1800 nodes"));
  CHECK_THAT(refused[0].message, Contains("ddprun-rdzvd"));
  CHECK(k.to<rdzv::Refused>("1").empty());
  CHECK(k.to<rdzv::Refused>(std::to_string(most)).empty());
  CHECK(k.current().job.nodes.size() == kMaxNodesOnEtcd);
  // What stays fits one etcd value.
  CHECK(encode_state(k.current(), k.anchor).size() <= kMaxStateBytes);
}
