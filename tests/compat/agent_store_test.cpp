// The agent's TCPStore (store/) with real torch 1.13 clients, and the 2.x dialect as bytes.
#include <signal.h>

#include <catch2/catch.hpp>
#include <regex>
#include <string>

#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

const std::string kScripts = std::string(DDPRUN_SOURCE_DIR) + "/tests/compat/scripts/";
const std::map<std::string, std::string> kPython = {{"PYTHON_EXEC", "/usr/bin/python3"},
                                                    {"PYTHONFAULTHANDLER", "1"}};

void require_torch() {
  auto probe = run_command({"/usr/bin/python3", "-c", "import torch.distributed"}, {},
                           std::chrono::seconds(60));
  INFO("Debian's python3-torch is needed: run scripts/install-deps.sh\n" << probe.err);
  REQUIRE(probe.exit_code == 0);
}

/// The store alone, on a free port of 127.0.0.1.
struct StandaloneStore {
  Subprocess process{{STORE_SERVER_BIN}};
  std::string port;

  StandaloneStore() {
    REQUIRE(process.wait_for_output("\n", std::chrono::seconds(20)));
    std::smatch m;
    const std::string out = process.out_so_far();
    REQUIRE(std::regex_search(out, m, std::regex("port (\\d+)")));
    port = m[1].str();
  }

  /// Stops it; it must still be running (no request may have brought it down).
  void stop() {
    REQUIRE(process_alive(process.pid()));
    process.send(SIGTERM);
    auto r = process.wait(std::chrono::seconds(20));
    INFO(r.err);
    CHECK(r.exit_code == 0);
  }
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("torch 1.13 clients get torch's answers from the agent's store",
          "[python][integration]") {
  require_torch();
  StandaloneStore store;
  auto r = run_command_diagnosed({"/usr/bin/python3", kScripts + "store_ops.py", store.port}, {},
                                 std::chrono::seconds(120));
  INFO(r.out << r.err);
  CHECK(r.out.find("FAILED") == std::string::npos);
  CHECK(count(r.out, ": ok") == 15);
  CHECK(r.exit_code == 0);
  store.stop();
}

#ifdef TORCH_STORE_CLIENT_BIN
TEST_CASE("a libtorch 1.13 client's check and watch work against the agent's store",
          "[python][integration]") {
  StandaloneStore store;
  auto r = run_command_diagnosed({TORCH_STORE_CLIENT_BIN, "127.0.0.1", store.port}, {},
                                 std::chrono::seconds(120));
  INFO(r.out << r.err);
  CHECK(count(r.out, ": ok") == 5);
  CHECK(r.exit_code == 0);
  store.stop();
}
#endif

TEST_CASE("the torch 2.x dialect is served from the protocol note's bytes on the same port",
          "[python][integration]") {
  StandaloneStore store;
  auto r = run_command_diagnosed({"/usr/bin/python3", kScripts + "store_v2_bytes.py", store.port},
                                 {}, std::chrono::seconds(120));
  INFO(r.out << r.err);
  CHECK(r.out.find("FAILED") == std::string::npos);
  CHECK(count(r.out, ": ok") == 18);
  CHECK(r.exit_code == 0);
  // The connections closed for bad requests left a line each.
  store.stop();
  const std::string log = store.process.out_so_far() + store.process.err_so_far();
  CHECK(count(log, "store: closing the connection from") == 3);
}
