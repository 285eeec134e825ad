#include "ddprun/sdk/agent_report.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace ddprun::sdk;

TEST_CASE("a report is one JSON object with the event, the local rank and integer fields",
          "[sdk][unit]") {
  auto body = nlohmann::json::parse(format_report("snapshot_loaded", 3, {{"epoch", 7}}));
  CHECK(body["event"] == "snapshot_loaded");
  CHECK(body["local_rank"] == 3);
  CHECK(body["epoch"] == 7);
  // A field cannot replace the event or the rank the agent relies on.
  auto guarded = nlohmann::json::parse(format_report("a\"b", 1, {{"local_rank", 9}}));
  CHECK(guarded["event"] == "a\"b");
  CHECK(guarded["local_rank"] == 1);
}
