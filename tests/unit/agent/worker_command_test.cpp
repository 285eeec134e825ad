#include "agent/worker_command.h"

#include <catch2/catch.hpp>

using namespace ddprun::agent;

namespace {
bool never(const std::string&) { return false; }
bool always(const std::string&) { return true; }
using Argv = std::vector<std::string>;
}  // namespace

TEST_CASE("a .py script runs as python3 -u script args", "[agent][unit]") {
  CommandRequest r{"train.py", {"--epochs", "10"}};
  CHECK(build_worker_command(r, always) == Argv{"python3", "-u", "train.py", "--epochs", "10"});
}

TEST_CASE("PYTHON_EXEC replaces the interpreter", "[agent][unit]") {
  CommandRequest r{"train.py", {}};
  r.python_exec = "/opt/py/bin/python";
  CHECK(build_worker_command(r, never) == Argv{"/opt/py/bin/python", "-u", "train.py"});
}

TEST_CASE("the option -m runs a module", "[agent][unit]") {
  CommandRequest r{"pkg.train", {"x"}};
  r.module = true;
  CHECK(build_worker_command(r, always) == Argv{"python3", "-u", "-m", "pkg.train", "x"});
}

TEST_CASE("the option --no_python runs the script itself", "[agent][unit]") {
  CommandRequest r{"train.py", {"a"}};
  r.no_python = true;
  CHECK(build_worker_command(r, never) == Argv{"train.py", "a"});
}

TEST_CASE("an executable that is not a .py file runs directly", "[agent][unit]") {
  CommandRequest r{"./trainer", {"1"}};
  CHECK(build_worker_command(r, always) == Argv{"./trainer", "1"});
  CHECK(build_worker_command(r, never) == Argv{"python3", "-u", "./trainer", "1"});
}

TEST_CASE("programs are found through PATH", "[agent][unit]") {
  CHECK(resolve_executable("sh", "/nonexistent:/bin:/usr/bin").ends_with("/sh"));
  CHECK(resolve_executable("no-such-program-ddprun", "/bin:/usr/bin").empty());
  CHECK(resolve_executable("/bin/sh", "") == "/bin/sh");
}

TEST_CASE("workers are searched for in the agent's PATH, else in /usr/bin:/bin", "[agent][unit]") {
  CHECK(search_path({{"PATH", "/opt/bin"}}) == "/opt/bin");
  CHECK(search_path({}) == "/usr/bin:/bin");
  CHECK(search_path({{"PATH", ""}}) == "/usr/bin:/bin");
}
