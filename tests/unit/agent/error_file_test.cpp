#include "agent/error_file.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace ddprun::agent;

TEST_CASE("torch's @record error file gives message, traceback and time", "[agent][unit]") {
  auto r = parse_error_file(R"({"message": {"message": "RuntimeError: boom", "extraInfo":
      {"py_callstack": "Traceback (most recent call last):\n  x\nRuntimeError: boom\n",
       "timestamp": "1700000000"}}})");
  REQUIRE(r.ok());
  const ErrorFileContent* c = &*r;
  CHECK(c->message == "RuntimeError: boom");
  CHECK(c->traceback.find("Traceback") == 0);
  CHECK(c->timestamp == 1700000000);
}

TEST_CASE("an error file with a plain message and a top-level timestamp is read", "[agent][unit]") {
  auto r = parse_error_file(R"({"message": "out of memory", "timestamp": 12})");
  REQUIRE(r.ok());
  const ErrorFileContent* c = &*r;
  CHECK(c->message == "out of memory");
  CHECK(c->traceback.empty());
  CHECK(c->timestamp == 12);
}

TEST_CASE("a broken error file is reported, not trusted", "[agent][unit]") {
  auto bad = parse_error_file("{\"message\": ");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "not valid JSON");
  auto missing = parse_error_file(R"({"error": "x"})");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("message") != std::string::npos);
}

TEST_CASE("the error file for a launcher's parent carries the root cause's exit code",
          "[agent][unit]") {
  const std::string child =
      R"({"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "tb",)"
      R"( "timestamp": "1700000000"}}})";
  auto parent = error_file_for_parent(child, -9);
  REQUIRE(parent.has_value());
  auto parsed = nlohmann::json::parse(*parent);
  CHECK(parsed["message"]["errorCode"] == -9);
  CHECK(parsed["message"]["message"] == "ValueError: x");
  CHECK(parsed["message"]["extraInfo"]["py_callstack"] == "tb");
  // A plain-string message (the newer format) is copied as it is.
  auto plain = error_file_for_parent(R"({"message": "boom", "timestamp": 1})", 1);
  REQUIRE(plain.has_value());
  CHECK(nlohmann::json::parse(*plain) ==
        nlohmann::json::parse(R"({"message": "boom", "timestamp": 1})"));
  CHECK_FALSE(error_file_for_parent("not json", 1).has_value());
}

TEST_CASE("the exception type is read from torch's message, dotted names whole", "[agent][unit]") {
  const auto type_of = [](const std::string& message) {
    ErrorFileContent content;
    content.message = message;
    return exception_type(content);
  };
  CHECK(type_of("ValueError: bad value") == "ValueError");
  CHECK(type_of("torch.cuda.OutOfMemoryError: CUDA out of memory") ==
        "torch.cuda.OutOfMemoryError");
  CHECK(type_of("_Private2: x") == "_Private2");
  CHECK(type_of("no type here") == "");
  CHECK(type_of("Segmentation fault: core dumped at 0x0") == "");
  CHECK(type_of(": empty") == "");
  CHECK(type_of("a.: trailing dot") == "");
  CHECK(type_of("2fast: starts with a digit") == "");
  CHECK(type_of(std::string(300, 'E') + ": too long") == "");
  // C++'s, as the SDK's record writes it (it read "std" before).
  CHECK(type_of("std::runtime_error: injected failure") == "std::runtime_error");
  CHECK(type_of("c10::Error: x") == "c10::Error");
  CHECK(type_of("::x: leading") == "");
  CHECK(type_of("a::: trailing") == "");
}
