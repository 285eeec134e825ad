#include "ddprun/sdk/agent_report.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace ddprun::sdk;

TEST_CASE("a report is one JSON object with the event, the local rank, the pid and integer fields",
          "[sdk][unit]") {
  auto body = nlohmann::json::parse(format_report("snapshot_loaded", 3, 4242, {{"epoch", 7}}));
  CHECK(body["event"] == "snapshot_loaded");
  CHECK(body["local_rank"] == 3);
  CHECK(body["pid"] == 4242);
  CHECK(body["epoch"] == 7);
  // A field cannot replace the event, the rank or the pid the agent relies on.
  auto guarded =
      nlohmann::json::parse(format_report("a\"b", 1, 7, {{"local_rank", 9}, {"pid", 8}}));
  CHECK(guarded["event"] == "a\"b");
  CHECK(guarded["local_rank"] == 1);
  CHECK(guarded["pid"] == 7);
}
