#include "agent/error_file.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;

TEST_CASE("torch's @record error file gives message, traceback and time", "[agent][unit]") {
  auto r = parse_error_file(R"({"message": {"message": "RuntimeError: boom", "extraInfo":
      {"py_callstack": "Traceback (most recent call last):\n  x\nRuntimeError: boom\n",
       "timestamp": "1700000000"}}})");
  auto* c = std::get_if<ErrorFileContent>(&r);
  REQUIRE(c);
  CHECK(c->message == "RuntimeError: boom");
  CHECK(c->traceback.find("Traceback") == 0);
  CHECK(c->timestamp == 1700000000);
}

TEST_CASE("an error file with a plain message and a top-level timestamp is read", "[agent][unit]") {
  auto r = parse_error_file(R"({"message": "out of memory", "timestamp": 12})");
  auto* c = std::get_if<ErrorFileContent>(&r);
  REQUIRE(c);
  CHECK(c->message == "out of memory");
  CHECK(c->traceback.empty());
  CHECK(c->timestamp == 12);
}

TEST_CASE("a broken error file is reported, not trusted", "[agent][unit]") {
  auto bad = parse_error_file("{\"message\": ");
  REQUIRE(std::holds_alternative<std::string>(bad));
  CHECK(std::get<std::string>(bad) == "not valid JSON");
  auto missing = parse_error_file(R"({"error": "x"})");
  REQUIRE(std::holds_alternative<std::string>(missing));
  CHECK(std::get<std::string>(missing).find("message") != std::string::npos);
}
