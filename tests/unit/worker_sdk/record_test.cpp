#include "ddprun/sdk/record.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>

#include "agent/error_file.h"
#include "tests/support/subprocess.h"

using namespace ddprun;

TEST_CASE("an uncaught exception becomes an error file the agent can read", "[sdk][unit]") {
  testing::TempDir dir;
  const std::string file = dir.path() + "/error.json";
  const auto before = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int rc =
      sdk::record([]() -> int { throw std::invalid_argument("bad learning rate -1"); }, file);
  CHECK(rc == 1);
  auto parsed = agent::parse_error_file(testing::read_file(file));
  REQUIRE(parsed.ok());
  const agent::ErrorFileContent* content = &*parsed;
  CHECK(content->message == "std::invalid_argument: bad learning rate -1");
  CHECK(content->traceback.find("std::invalid_argument: bad learning rate -1") !=
        std::string::npos);
  REQUIRE(content->timestamp);
  CHECK(*content->timestamp >= before);
  CHECK(*content->timestamp <= before + 60);
}

TEST_CASE("a body that returns normally writes no error file and keeps its exit code",
          "[sdk][unit]") {
  testing::TempDir dir;
  const std::string file = dir.path() + "/error.json";
  CHECK(sdk::record([] { return 7; }, file) == 7);
  CHECK(testing::read_file(file).empty());
}

TEST_CASE("the error file has @record's nesting", "[sdk][unit]") {
  CHECK(sdk::error_file_json("E: x", "stack", 12) ==
        R"({"message":{"extraInfo":{"py_callstack":"stack","timestamp":"12"},"message":"E: x"}})");
}
