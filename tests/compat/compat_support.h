#pragma once
// What the Python compatibility tests share: the interpreter they run, and the check that
// Debian's torch is there (a clear failure naming the fix instead of a confusing one).
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <string>

#include "tests/support/subprocess.h"

namespace ddprun::testing {

/// PYTHONFAULTHANDLER: a worker that hangs prints its stacks when the test gives up on it.
inline const std::map<std::string, std::string> kPython = {{"PYTHON_EXEC", "/usr/bin/python3"},
                                                           {"PYTHONFAULTHANDLER", "1"}};

inline void require_torch() {
  auto probe = run_command({"/usr/bin/python3", "-c", "import torch.distributed"}, {},
                           std::chrono::seconds(60));
  INFO("Debian's python3-torch is needed: run scripts/install-deps.sh\n" << probe.err);
  REQUIRE(probe.exit_code == 0);
}

}  // namespace ddprun::testing
