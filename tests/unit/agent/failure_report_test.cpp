#include "agent/failure_report.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;

namespace {

ProcessFailure failure(int rank, ExitStatus status, pid_t pid) {
  ProcessFailure f;
  f.global_rank = rank;
  f.local_rank = rank;
  f.pid = pid;
  f.status = status;
  f.time = std::chrono::system_clock::now();
  f.error_file = "/logs/attempt_0/" + std::to_string(rank) + "/error.json";
  return f;
}

}  // namespace

TEST_CASE("the report names the script, the root cause and its traceback", "[agent][unit]") {
  ProcessFailure root = failure(1, {0, 11}, 4242);
  root.error = ErrorFileContent{"RuntimeError: boom", "Traceback:\n  line 3\nRuntimeError: boom\n",
                                1700000000};
  std::string report =
      format_failure_report("train.py", "node7", {root, failure(0, {2, 0}, 17)}, 1, 1);
  CHECK(report.find("train.py FAILED") != std::string::npos);
  CHECK(report.find("host      : node7") != std::string::npos);
  CHECK(report.find("rank      : 1 (local_rank: 1)") != std::string::npos);
  CHECK(report.find("exitcode  : -11 (pid: 4242)") != std::string::npos);
  CHECK(report.find("SIGSEGV") != std::string::npos);
  CHECK(report.find("  traceback : Traceback:\n    line 3") != std::string::npos);
  CHECK(report.find("Restarts  : 1 of 1 used") != std::string::npos);
  // The root cause comes after the other failures, as in torchrun's summary.
  CHECK(report.find("Root Cause") < report.find("pid: 4242"));
  CHECK(report.find("pid: 17") < report.find("Root Cause"));
}

TEST_CASE("a failure without an error file says how to get a traceback", "[agent][unit]") {
  std::string report = format_failure_report("t.py", "h", {failure(0, {1, 0}, 5)}, 0, 0);
  CHECK(report.find("<NO_OTHER_FAILURES>") != std::string::npos);
  CHECK(report.find("error_file: <N/A>") != std::string::npos);
  CHECK(report.find("elastic/errors.html") != std::string::npos);
}

TEST_CASE("an unreadable error file is named in the report", "[agent][unit]") {
  ProcessFailure f = failure(0, {1, 0}, 5);
  f.error_file_problem = "not valid JSON";
  std::string report = format_failure_report("t.py", "h", {f}, 0, 0);
  CHECK(report.find("unreadable: not valid JSON") != std::string::npos);
}

TEST_CASE("exits are described for humans", "[agent][unit]") {
  CHECK(describe_exit({3, 0}) == "exit code 3");
  CHECK(describe_exit({0, 9}) == "signal SIGKILL (9)");
}

TEST_CASE("a worker that never started shows no pid and no error file", "[agent][unit]") {
  ProcessFailure f = failure(0, {127, 0}, -1);
  f.error_file.clear();
  f.error = ErrorFileContent{"exec ./x: Exec format error", "", std::nullopt};
  std::string report = format_failure_report("x", "h", {f}, 0, 0);
  CHECK(report.find("exitcode  : 127 (never started)") != std::string::npos);
  CHECK(report.find("error_file: <N/A>") != std::string::npos);
  CHECK(report.find("traceback : exec ./x: Exec format error") != std::string::npos);
}

TEST_CASE("the report counts the output lost to failed log writes", "[agent][unit]") {
  const auto root = failure(0, {1, 0}, 10);
  CHECK(format_failure_report("t.py", "n", {root}, 0, 0).find("Log writes") == std::string::npos);
  const std::string report = format_failure_report("t.py", "n", {root}, 0, 0, LogLoss{2, 4096});
  CHECK(report.find("Log writes: failed for 2 file(s), 4096 bytes of output lost") !=
        std::string::npos);
}

TEST_CASE("the interpreter hint names the interpreter and its origin and how to change it",
          "[agent][unit]") {
  const std::string hint =
      interpreter_hint("/home/u/.pyenv/shims/python3", "the first python3 on PATH", true);
  CHECK(hint ==
        "The workers ran /home/u/.pyenv/shims/python3 (the first python3 on PATH), which cannot "
        "import torch. Choose the interpreter that has torch: set PYTHON_EXEC=/path/to/python, "
        "or activate its virtual environment (source venv/bin/activate) before ddprun.\n");
  CHECK_THAT(interpreter_hint("/opt/py", "PYTHON_EXEC", false),
             Catch::Matchers::Contains("/opt/py (PYTHON_EXEC), which could not run"));
}
