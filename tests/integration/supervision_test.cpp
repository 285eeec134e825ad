#include <catch2/catch.hpp>

#include "tests/support/subprocess.h"

using namespace ddprun::testing;

TEST_CASE("a group whose workers all exit 0 makes ddprun exit 0", "[agent][integration]") {
  auto r = run_command(
      {DDPRUN_BIN, "--nproc_per_node", "2", "--no_python", FAKE_WORKER_BIN, "print=hello"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[default0]:hello") != std::string::npos);
  CHECK(r.out.find("[default1]:hello") != std::string::npos);
}
