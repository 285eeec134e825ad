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

/// True when /usr/bin/python3's torch asks for libuv by default and was built without it
/// (Debian 13's torch 2.6): ddprun then turns its agent store off and sets USE_LIBUV=0
/// (launcher/torch_libuv.h). Told here another way than ddprun's probe: a default TCPStore
/// server on a free port, which such a torch refuses.
inline bool torch_lacks_libuv() {
  auto r = run_command({"/usr/bin/python3", "-c",
                        "from torch.distributed import TCPStore\n"
                        "try:\n"
                        "  s = TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)\n"
                        "  print('has libuv or does not ask for it')\n"
                        "except RuntimeError as e:\n"
                        "  print('lacks libuv' if 'libuv' in str(e) else 'failed: ' + str(e))\n"},
                       {}, std::chrono::seconds(60));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("failed: ") == std::string::npos);
  return r.out.find("lacks libuv") != std::string::npos;
}

/// "True" where workers use the agent's store by default, "False" where torch lacks libuv.
inline std::string default_agent_store() { return torch_lacks_libuv() ? "False" : "True"; }

}  // namespace ddprun::testing
