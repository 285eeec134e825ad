#include "agent/event_log.h"

#include <catch2/catch.hpp>
#include <sstream>

#include "tests/support/subprocess.h"

using namespace ddprun::agent;
using ddprun::testing::read_file;
using ddprun::testing::TempDir;

TEST_CASE("the event log appends one JSON object per event with time, node and fields",
          "[agent][unit]") {
  TempDir dir;
  const std::string path = dir.path() + "/events.jsonl";
  {
    EventLog log;
    REQUIRE_FALSE(log.open(path, "node7"));
    const auto at = std::chrono::steady_clock::time_point(std::chrono::milliseconds(1500));
    log.write("failure_detected", {{"rank", 3}, {"event", "not overridden"}}, at);
    log.write("job_end", {{"exit_code", 0}}, at + std::chrono::milliseconds(250));
  }
  EventLog again;
  REQUIRE_FALSE(again.open(path, "node7"));
  again.write("appended", {}, std::chrono::steady_clock::time_point{});
  std::istringstream lines(read_file(path));
  std::vector<nlohmann::json> events;
  for (std::string line; std::getline(lines, line);) events.push_back(nlohmann::json::parse(line));
  REQUIRE(events.size() == 3);
  CHECK(events[0]["event"] == "failure_detected");
  CHECK(events[0]["rank"] == 3);
  CHECK(events[0]["node"] == "node7");
  CHECK(events[0]["t"].get<double>() == Approx(1.5));
  CHECK(events[0]["time"].get<double>() > 1.7e9);
  CHECK(events[1]["t"].get<double>() == Approx(1.75));
  CHECK(events[2]["event"] == "appended");
}

TEST_CASE("an event log that cannot be opened says which path, and a closed log writes nothing",
          "[agent][unit]") {
  EventLog log;
  auto why = log.open("/nonexistent-dir/x/events.jsonl", "n");
  REQUIRE(why);
  CHECK(why->message.find("/nonexistent-dir/x/events.jsonl") != std::string::npos);
  CHECK_FALSE(log.enabled());
  log.write("ignored", {}, std::chrono::steady_clock::now());
}
