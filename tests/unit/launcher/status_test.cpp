#include "launcher/status.h"

#include <catch2/catch.hpp>

using namespace ddprun::launcher;
using nlohmann::json;

namespace {

std::optional<std::string> no_env(const std::string&) { return std::nullopt; }

}  // namespace

TEST_CASE("ddprun status takes an endpoint, a job and --json", "[launcher][unit]") {
  auto parsed =
      parse_status_args({"--rdzv_endpoint", "[::1]:29555", "--rdzv_id", "j", "--json"}, no_env);
  REQUIRE(std::holds_alternative<StatusRequest>(parsed));
  const auto& r = std::get<StatusRequest>(parsed);
  CHECK(r.host == "::1");
  CHECK(r.port == 29555);
  CHECK(r.run_id == "j");
  CHECK(r.json);
  auto defaulted = parse_status_args({"--rdzv-endpoint", "head"}, no_env);
  REQUIRE(std::holds_alternative<StatusRequest>(defaulted));
  CHECK(std::get<StatusRequest>(defaulted).port == 29400);
  CHECK_FALSE(std::get<StatusRequest>(defaulted).run_id);
}

TEST_CASE("ddprun status reads PET_RDZV_ENDPOINT and refuses a missing or bad endpoint",
          "[launcher][unit]") {
  auto from_env = parse_status_args({}, [](const std::string& name) -> std::optional<std::string> {
    if (name == "PET_RDZV_ENDPOINT") return "10.0.0.1:29401";
    return std::nullopt;
  });
  REQUIRE(std::holds_alternative<StatusRequest>(from_env));
  CHECK(std::get<StatusRequest>(from_env).host == "10.0.0.1");
  auto missing = parse_status_args({}, no_env);
  REQUIRE(std::holds_alternative<UsageError>(missing));
  CHECK(std::get<UsageError>(missing).message.find("--rdzv_endpoint") != std::string::npos);
  auto bad = parse_status_args({"--rdzv_endpoint", "fd00::1:29400"}, no_env);
  REQUIRE(std::holds_alternative<UsageError>(bad));
  CHECK(std::get<UsageError>(bad).message.find("fd00::1:29400") != std::string::npos);
}

TEST_CASE("the status table shows each job's round and each node's rank, state and heartbeat",
          "[launcher][unit]") {
  json jobs = json::array(
      {{{"run_id", "my_job"},
        {"phase", "running"},
        {"round", 2},
        {"restart_count", 1},
        {"settings",
         {{"min_nodes", 2}, {"max_nodes", 3}, {"nproc_per_node", 4}, {"max_restarts", 3}}},
        {"nodes",
         {{{"name", "node10"}, {"state", "running"}, {"group_rank", 0}, {"last_seen_s", 0.25}},
          {{"name", "node2"},
           {"state", "wait_listed"},
           {"group_rank", -1},
           {"node_rank", 1},
           {"last_seen_s", 3.0}},
          {{"name", "node3"},
           {"state", "quarantined"},
           {"group_rank", -1},
           {"quarantine_left_s", 41.6},
           {"quarantined", "its workers caused 2 group failures in a row"},
           {"last_seen_s", 1.0}}}}}});
  const std::string table = format_status(jobs);
  CHECK(table.find("job my_job: running, round 2, restarts 1 of 3, --nnodes 2:3, "
                   "--nproc_per_node 4") != std::string::npos);
  INFO(table);
  // A wait-listed node of a running job is a spare; a quarantined one says how long it waits.
  CHECK(table.find("GROUP_RANK NODE   STATE                   NODE_RANK LAST HEARD") !=
        std::string::npos);
  CHECK(table.find("0          node10 running                 -         0.2 s ago") !=
        std::string::npos);
  CHECK(table.find("-          node2  spare                   1         3.0 s ago") !=
        std::string::npos);
  CHECK(table.find("-          node3  quarantined (42 s left) -         1.0 s ago") !=
        std::string::npos);
}

TEST_CASE("while the nodes pause before a round the status line says so", "[launcher][unit]") {
  json jobs = json::array({{{"run_id", "j"},
                            {"phase", "joining"},
                            {"round", 2},
                            {"restart_count", 2},
                            {"settings", {{"min_nodes", 2}, {"max_nodes", 2}, {"max_restarts", 5}}},
                            {"forming",
                             {{"joined", 0},
                              {"awaited", {"node1", "node2"}},
                              {"awaited_count", 2},
                              {"more_needed", 2},
                              {"pause_ends_in_s", 8.04},
                              {"join_timeout_in_s", 18.04}}},
                            {"nodes", json::array()}}});
  const std::string table = format_status(jobs);
  INFO(table);
  CHECK(table.find("2 more needed; the nodes' --restart_backoff pause ends in 8.0 s; join "
                   "timeout in 18.0 s") != std::string::npos);
}

TEST_CASE("a closed job's table says each node ended, in the state it ended in",
          "[launcher][unit]") {
  json jobs = json::array(
      {{{"run_id", "j"},
        {"phase", "closed"},
        {"round", 2},
        {"restart_count", 2},
        {"message", "worker failure on node1: ...; no restart left"},
        {"settings", {{"min_nodes", 2}, {"max_nodes", 2}, {"max_restarts", 2}}},
        {"nodes",
         {{{"name", "node1"}, {"state", "running"}, {"group_rank", 0}, {"last_seen_s", 7.0}},
          {{"name", "node3"},
           {"state", "wait_listed"},
           {"group_rank", -1},
           {"last_seen_s", 7.0}}}}}});
  const std::string table = format_status(jobs);
  INFO(table);
  CHECK(table.find("node1 ended (running) ") != std::string::npos);
  CHECK(table.find("node3 ended (spare) ") != std::string::npos);
}

TEST_CASE("while a round forms the status table says who joined and who is awaited",
          "[launcher][unit]") {
  json jobs = json::array(
      {{{"run_id", "j"},
        {"phase", "joining"},
        {"round", 3},
        {"restart_count", 1},
        {"settings", {{"min_nodes", 3}, {"max_nodes", 3}, {"max_restarts", 3}}},
        {"forming",
         {{"joined", 1},
          {"awaited", {"node2"}},
          {"awaited_count", 1},
          {"more_needed", 2},
          {"join_timeout_in_s", 597.94}}},
        {"nodes",
         {{{"name", "node1"}, {"state", "joined"}, {"group_rank", -1}, {"last_seen_s", 0.5}},
          {{"name", "node2"}, {"state", "stopping"}, {"group_rank", -1}, {"last_seen_s", 1.0}}}}}});
  const std::string table = format_status(jobs);
  CHECK(table.find("  round 3 forming: 1 joined (node1); awaited: node2; 2 more needed; join "
                   "timeout in 597.9 s\n") != std::string::npos);
  CHECK(table.find("no node left") == std::string::npos);
  // Every node gone: the job is abandoned unless they come back.
  json abandoned = jobs;
  abandoned[0]["nodes"] = json::array();
  abandoned[0]["forming"]["joined"] = 0;
  CHECK(format_status(abandoned).find(
            "; join timeout in 597.9 s; no node left: every node of the job has gone; it ends at "
            "the join timeout unless they come back\n") != std::string::npos);
  // Without "forming" (a running job, or an older server) there is no such line.
  jobs[0].erase("forming");
  CHECK(format_status(jobs).find("forming") == std::string::npos);
}

TEST_CASE("ddprun status --watch takes an interval and a number of iterations",
          "[launcher][unit]") {
  auto parsed = parse_status_args(
      {"--rdzv_endpoint", "h:1", "--watch", "--interval", "0.5", "--iterations", "3"}, no_env);
  REQUIRE(std::holds_alternative<StatusRequest>(parsed));
  const auto& r = std::get<StatusRequest>(parsed);
  CHECK(r.watch);
  CHECK(r.interval == std::chrono::milliseconds(500));
  CHECK(r.iterations == 3);
  CHECK(std::holds_alternative<UsageError>(
      parse_status_args({"--rdzv_endpoint", "h:1", "--iterations", "3"}, no_env)));
  CHECK(std::holds_alternative<UsageError>(
      parse_status_args({"--rdzv_endpoint", "h:1", "--watch", "--interval", "0.01"}, no_env)));
}

TEST_CASE("ddprun status --rdzv_backend etcd-v3 takes every etcd member", "[launcher][unit]") {
  auto parsed = parse_status_args(
      {"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1:2379,e2,e3:2381", "--rdzv_id", "j"},
      no_env);
  REQUIRE(std::holds_alternative<StatusRequest>(parsed));
  const auto& request = std::get<StatusRequest>(parsed);
  REQUIRE(request.etcd_members.size() == 3);
  CHECK(request.etcd_members[1].text() == "e2:2379");
  CHECK(request.run_id == "j");
  // The c10d default keeps one endpoint; a list is not one.
  CHECK(std::get<StatusRequest>(parse_status_args({"--rdzv_endpoint", "h:1"}, no_env))
            .etcd_members.empty());
  auto bad = parse_status_args({"--rdzv_backend", "zk", "--rdzv_endpoint", "h:1"}, no_env);
  REQUIRE(std::holds_alternative<UsageError>(bad));
  CHECK(std::get<UsageError>(bad).message ==
        "ddprun status --rdzv_backend zk: expected c10d or etcd-v3");
  auto secret = parse_status_args(
      {"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1", "--secret_file", "/s"}, no_env);
  REQUIRE(std::holds_alternative<UsageError>(secret));
}

TEST_CASE("ddprun status takes the agents' rdzv_conf for etcd's login and TLS",
          "[launcher][unit]") {
  auto parsed = parse_status_args(
      {"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1", "--rdzv_conf",
       "join_timeout=60, etcd_user=ann,etcd_password_file=/p,tls_ca=/ca.pem", "--tls_cert", "/c"},
      no_env);
  REQUIRE(std::holds_alternative<StatusRequest>(parsed));
  const auto& request = std::get<StatusRequest>(parsed);
  CHECK(request.etcd_user == "ann");
  CHECK(request.etcd_password_file == "/p");
  CHECK(request.tls.ca == "/ca.pem");
  CHECK(request.tls.cert == "/c");
  const auto error_of = [](std::vector<std::string> args) {
    auto r = parse_status_args(args, no_env);
    REQUIRE(std::holds_alternative<UsageError>(r));
    return std::get<UsageError>(r).message;
  };
  CHECK(error_of({"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1", "--rdzv_conf",
                  "etcd_user=ann"}) ==
        "ddprun status --rdzv_conf: etcd_user and etcd_password_file go together (the etcd user "
        "and a file holding its password)");
  CHECK(error_of({"--rdzv_endpoint", "h:1", "--rdzv_conf", "etcd_user=ann"}) ==
        "ddprun status --rdzv_conf: etcd_user is for --rdzv_backend etcd-v3 only");
  CHECK(error_of({"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1", "--rdzv_conf", "x"}) ==
        "ddprun status --rdzv_conf: malformed pair 'x'; expected key=value,key2=value2");
}
