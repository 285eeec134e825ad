#include "rendezvous/protocol.h"

#include <catch2/catch.hpp>

#include "rendezvous/framing.h"

using namespace ddprun::rdzv;
using nlohmann::json;

namespace {

template <typename T>
T agent_round_trip(const T& message) {
  auto parsed = parse_agent_message(json::parse(to_json(AgentMessage{message}).dump()));
  INFO((parsed ? std::string() : parsed.error().message));
  REQUIRE(parsed.ok());
  REQUIRE(std::holds_alternative<T>(*parsed));
  return std::get<T>(*parsed);
}

template <typename T>
T server_round_trip(const T& message) {
  auto parsed = parse_server_message(json::parse(to_json(ServerMessage{message}).dump()));
  INFO((parsed ? std::string() : parsed.error().message));
  REQUIRE(parsed.ok());
  REQUIRE(std::holds_alternative<T>(*parsed));
  return std::get<T>(*parsed);
}

std::string agent_error(const json& body) {
  auto parsed = parse_agent_message(body);
  REQUIRE_FALSE(parsed.ok());
  return parsed.error().message;
}

Join sample_join() {
  Join j;
  j.run_id = "my_job";
  j.node_id = "host:12:abc";
  j.name = "127.0.0.2";
  j.addr = "127.0.0.2";
  j.master_port = 23456;
  j.node_rank = 1;
  j.settings.min_nodes = 2;
  j.settings.max_nodes = 3;
  j.settings.nproc_per_node = 4;
  j.settings.max_restarts = 2;
  j.settings.keep_alive_interval = Millis(250);
  return j;
}

}  // namespace

TEST_CASE("a join survives the trip through JSON with its settings and resume claim",
          "[rdzv][unit]") {
  Join j = sample_join();
  j.resume = RoundClaim{3, 1, 2, 1, "127.0.0.1", 29501, true};
  j.restart_count = 3;
  Join back = agent_round_trip(j);
  CHECK(back.restart_count == 3);
  CHECK(back.run_id == "my_job");
  CHECK(back.node_id == "host:12:abc");
  CHECK(back.node_rank == 1);
  CHECK(back.master_port == 23456);
  CHECK(back.settings.max_nodes == 3);
  CHECK(back.settings.nproc_per_node == 4);
  CHECK(back.settings.keep_alive_interval == Millis(250));
  CHECK(back.settings.restart_window == Millis(0));
  CHECK(back.settings.crash_loop_limit == 3);
  j.settings.restart_window = Millis(600'000);
  j.settings.crash_loop_limit = 0;
  j.settings.fatal_exit_codes = {3, 42};
  const RdzvSettings policy = agent_round_trip(j).settings;
  CHECK(policy.restart_window == Millis(600'000));
  CHECK(policy.crash_loop_limit == 0);
  CHECK(policy.fatal_exit_codes == std::vector<int>{3, 42});
  // --restart_backoff: the flag's defaults from a peer that does not send it.
  CHECK(back.settings.restart_backoff == Millis(1'000));
  CHECK(back.settings.restart_backoff_max == Millis(30'000));
  j.settings.restart_backoff = Millis(2'500);
  j.settings.restart_backoff_max = Millis(120'000);
  const RdzvSettings backoff = agent_round_trip(j).settings;
  CHECK(backoff.restart_backoff == Millis(2'500));
  CHECK(backoff.restart_backoff_max == Millis(120'000));
  auto older = to_json(AgentMessage{j});
  older["settings"].erase("restart_backoff_ms");
  older["settings"].erase("restart_backoff_max_ms");
  const RdzvSettings from_older = std::get<Join>(*parse_agent_message(older)).settings;
  CHECK(from_older.restart_backoff == Millis(1'000));
  CHECK(from_older.restart_backoff_max == Millis(30'000));
  REQUIRE(back.resume);
  CHECK(back.resume->round == 3);
  CHECK(back.resume->master_port == 29501);
  CHECK(back.resume->succeeded);
  j.node_rank.reset();
  j.resume.reset();
  back = agent_round_trip(j);
  CHECK_FALSE(back.node_rank);
  CHECK_FALSE(back.resume);
  // kept_out travels only when set: a server that predates it never sees the field.
  CHECK(back.kept_out.empty());
  CHECK_FALSE(to_json(AgentMessage{j}).contains("kept_out"));
  j.kept_out = "gpu0: ECC errors";
  CHECK(agent_round_trip(j).kept_out == "gpu0: ECC errors");
}

TEST_CASE("every other agent message survives the trip through JSON", "[rdzv][unit]") {
  agent_round_trip(Heartbeat{});
  WorkersFailed f = agent_round_trip(WorkersFailed{4, "rank 3 exited with 1", 1, 0});
  CHECK(f.round == 4);
  CHECK(f.description == "rank 3 exited with 1");
  WorkersFailed policy{4, "rank 3 exited with 1", 1, 0, 3, "ValueError", false, false};
  WorkersFailed p = agent_round_trip(policy);
  CHECK(p.rank == 3);
  CHECK(p.exception == "ValueError");
  CHECK_FALSE(p.progress);
  CHECK_FALSE(p.culprit);
  // An older agent's report has none of the failure policy's fields: never a crash loop.
  auto old = parse_agent_message(json{{"type", "workers_failed"},
                                      {"round", 1},
                                      {"description", "d"},
                                      {"exit_code", 1},
                                      {"signal", 0}});
  const auto& from_old = std::get<WorkersFailed>(*old);
  CHECK(from_old.rank == -1);
  CHECK(from_old.progress);
  CHECK(from_old.culprit);  // and its node is blamed, as before
  CHECK(agent_round_trip(WorkersSucceeded{7}).round == 7);
  CHECK(agent_round_trip(Leave{"received SIGTERM"}).reason == "received SIGTERM");
  CHECK(agent_round_trip(StatusQuery{"j", std::nullopt}).run_id == "j");
  CHECK_FALSE(agent_round_trip(StatusQuery{}).run_id);
}

TEST_CASE("every server message survives the trip through JSON", "[rdzv][unit]") {
  Waiting w = server_round_trip(
      Waiting{1, {"a", "b"}, 2, 3, 4, std::vector<int>{2}, Millis(12000), Millis(600000), false});
  CHECK(w.joined == std::vector<std::string>{"a", "b"});
  CHECK(w.joined_count == 2);
  CHECK(w.missing_node_ranks == std::vector<int>{2});
  CHECK(w.waited == Millis(12000));
  CHECK_FALSE(w.job_running);
  Waiting spare{3, {"a"}, 1, 1, 1, {}, Millis(0), Millis(0), true};
  spare.job_running = true;
  CHECK(server_round_trip(spare).job_running);
  // A forming round with --rdzv_conf join_timeout=0 is not a running one.
  spare.round = 0;
  spare.job_running = false;
  CHECK_FALSE(server_round_trip(spare).job_running);
  // An older server's Waiting has no job_running: a spare's had join_timeout 0.
  auto old = to_json(ServerMessage{Waiting{3, {"a"}, 1, 1, 1, {}, Millis(0), Millis(0), true}});
  old.erase("job_running");
  CHECK(std::get<Waiting>(*parse_server_message(old)).job_running);
  RoundReady r = server_round_trip(
      RoundReady{2, 1, 3, "10.0.0.1", 29500, 1, std::vector<std::string>{"a", "b", "c"}});
  CHECK(r.group_rank == 1);
  CHECK(r.master_addr == "10.0.0.1");
  CHECK(r.participants == std::vector<std::string>{"a", "b", "c"});
  Restart s = server_round_trip(Restart{3, "node b lost", true, 2});
  CHECK(s.counted);
  CHECK(s.restart_count == 2);
  CHECK(s.window == Millis(0));
  Restart windowed{4, "crash", true, 9};
  windowed.window_restarts = 2;
  windowed.window = Millis(3600000);
  Restart w2 = server_round_trip(windowed);
  CHECK(w2.window_restarts == 2);
  CHECK(w2.window == Millis(3600000));
  // The rendezvous's back-off count and pause travel together, only when set.
  CHECK_FALSE(s.failures_in_a_row);
  CHECK_FALSE(to_json(ServerMessage{Restart{3, "crash", true, 2}}).contains("pause_ms"));
  Restart paused{5, "crash", true, 4};
  paused.failures_in_a_row = 3;
  paused.pause = Millis(2'000);
  Restart p2 = server_round_trip(paused);
  CHECK(p2.failures_in_a_row == 3);
  CHECK(p2.pause == Millis(2'000));
  auto too_long = to_json(ServerMessage{paused});
  too_long["pause_ms"] = 86'400'001;
  CHECK_FALSE(parse_server_message(too_long).ok());
  too_long["pause_ms"] = -1;
  CHECK_FALSE(parse_server_message(too_long).ok());
  Closed c = server_round_trip(Closed{JobOutcomeKind::TimedOut, "join timeout", 0, 0});
  CHECK(c.outcome == JobOutcomeKind::TimedOut);
  CHECK_FALSE(c.do_not_requeue);
  CHECK(
      server_round_trip(Closed{JobOutcomeKind::Failed, "a crash loop", 1, 0, true}).do_not_requeue);
  Refused f = server_round_trip(Refused{RefusalKind::DuplicateRank, "taken"});
  CHECK(f.kind == RefusalKind::DuplicateRank);
  StatusReply st = server_round_trip(StatusReply{json::array({{{"run_id", "j"}}}), std::nullopt});
  CHECK(st.jobs[0]["run_id"] == "j");
}

TEST_CASE("malformed agent messages are refused with the field named", "[rdzv][unit]") {
  CHECK(agent_error(json::array()) == "message is not a JSON object");
  CHECK(agent_error({{"type", 3}}) == "message has no string \"type\"");
  CHECK(agent_error({{"type", "dance"}}) == "unknown message type \"dance\"");
  json j = to_json(AgentMessage{sample_join()});
  j.erase("run_id");
  CHECK(agent_error(j) == "join has no \"run_id\" field");
  j = to_json(AgentMessage{sample_join()});
  j["master_port"] = "29500";
  CHECK(agent_error(j) == "join field \"master_port\" must be an integer");
  j = to_json(AgentMessage{sample_join()});
  j["master_port"] = 70000;
  CHECK(agent_error(j).find("master_port") != std::string::npos);
  j = to_json(AgentMessage{sample_join()});
  j["settings"]["nproc_per_node"] = 1e30;
  CHECK(agent_error(j).find("nproc_per_node") != std::string::npos);
  CHECK(agent_error({{"type", "workers_failed"}, {"round", 1}}).find("description") !=
        std::string::npos);
}

TEST_CASE("malformed server messages are refused with the field named", "[rdzv][unit]") {
  auto error = [](const json& body) {
    auto parsed = parse_server_message(body);
    REQUIRE_FALSE(parsed.ok());
    return parsed.error().message;
  };
  json r = to_json(ServerMessage{RoundReady{0, 3, 2, "a", 1, 0, {}}});
  CHECK(error(r).find("group_rank") != std::string::npos);
  json c = to_json(ServerMessage{Closed{}});
  c["outcome"] = "exploded";
  CHECK(error(c) == "closed field \"outcome\" has an unknown value \"exploded\"");
  CHECK(error({{"type", "status_reply"}, {"jobs", 1}}).find("jobs") != std::string::npos);
}

TEST_CASE("the hello carries this build's protocol version", "[rdzv][unit]") {
  CHECK_FALSE(check_hello(make_hello("agent")));
  json old = make_hello("agent");
  old["protocol"] = kProtocolVersion + 1;
  CHECK(check_hello(old));
}

TEST_CASE("identifiers over the limit or with control characters are refused, not echoed",
          "[rdzv][unit]") {
  json j = to_json(AgentMessage{sample_join()});
  j["run_id"] = std::string(1 << 20, 'r');
  const std::string long_id = agent_error(j);
  CHECK(long_id == "join field \"run_id\" is 1048576 bytes long, over the limit of 256");
  j = to_json(AgentMessage{sample_join()});
  j["name"] = "node\x1b[2J";
  CHECK(agent_error(j) == "join field \"name\" must not contain control characters");
  CHECK(agent_error({{"type", std::string(5000, 't')}}).size() < 120);
}

TEST_CASE("values of the right type are read as sent: whether a job takes them is admission's",
          "[rdzv][unit]") {
  // Impossible --nnodes, a negative --node_rank, a timeout off the limits table and an
  // impossible claim all parse; admission.h refuses them in the user's words.
  json j = to_json(AgentMessage{sample_join()});
  j["settings"]["min_nodes"] = 5;
  j["settings"]["join_timeout_ms"] = 2'000'000'000;
  j["node_rank"] = -1;
  j["resume"] = {{"round", -1},         {"group_rank", 7},           {"group_world_size", 2},
                 {"restart_count", -3}, {"master_addr", "10.0.0.1"}, {"master_port", 1},
                 {"succeeded", false}};
  auto parsed = parse_agent_message(j);
  INFO((parsed ? std::string() : parsed.error().message));
  REQUIRE(parsed.ok());
  const Join join = std::get<Join>(*parsed);
  CHECK(join.settings.min_nodes == 5);
  CHECK(join.settings.join_timeout.count() == 2'000'000'000);
  CHECK(join.node_rank == -1);
  REQUIRE(join.resume);
  CHECK(join.resume->group_rank == 7);
}

TEST_CASE("a status query and its reply carry the paging cursor", "[rdzv][unit]") {
  CHECK(agent_round_trip(StatusQuery{std::nullopt, "job-41"}).after == "job-41");
  CHECK_FALSE(agent_round_trip(StatusQuery{}).after);
  StatusReply page = server_round_trip(StatusReply{json::array(), "job-99"});
  CHECK(page.next == "job-99");
  CHECK_FALSE(server_round_trip(StatusReply{json::array(), std::nullopt}).next);
}
