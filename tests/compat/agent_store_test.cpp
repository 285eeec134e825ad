// The agent's TCPStore (store/) with real torch 1.13 clients, the 2.x dialect as bytes, and
// Gloo jobs whose workers meet through it (TORCHELASTIC_USE_AGENT_STORE=True).
#include <signal.h>

#include <catch2/catch.hpp>
#include <regex>
#include <string>

#include "tests/compat/compat_support.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

const std::string kScripts = std::string(DDPRUN_SOURCE_DIR) + "/tests/compat/scripts/";

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

TEST_CASE("torch's Python clients get torch's answers from the agent's store",
          "[python][integration]") {
  require_torch();
  StandaloneStore store;
  // A torch without libuv makes its clients only with use_libuv=False (Debian 13's 2.6).
  const std::map<std::string, std::string> env =
      torch_lacks_libuv() ? std::map<std::string, std::string>{{"USE_LIBUV", "0"}}
                          : std::map<std::string, std::string>{};
  auto r = run_command_diagnosed({"/usr/bin/python3", kScripts + "store_ops.py", store.port}, env,
                                 std::chrono::seconds(120));
  INFO(r.out << r.err);
  CHECK(r.out.find("FAILED") == std::string::npos);
  CHECK(count(r.out, ": ok") == 15);
  CHECK(r.exit_code == 0);
  store.stop();
}

#ifdef TORCH_STORE_CLIENT_BIN
TEST_CASE("a libtorch client's check and watch work against the agent's store",
          "[python][integration]") {
  StandaloneStore store;
  auto r = run_command_diagnosed({TORCH_STORE_CLIENT_BIN, "127.0.0.1", store.port}, {},
                                 std::chrono::seconds(120));
  INFO(r.out << r.err);
  // libtorch 2.x has no watchKey: check() alone (its two answers) is compared there.
  const bool has_watch = r.out.find("watchKey: not in this libtorch") == std::string::npos;
  CHECK(count(r.out, ": ok") == (has_watch ? 5 : 2));
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

TEST_CASE("eight Gloo ranks meet through the agent's store and again after a group restart",
          "[python][integration]") {
  require_torch();
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "8", "--max_restarts", "1",
       "--standby_workers=off", kScripts + "store_gloo.py", "--fail_rank", "3"},
      kPython, std::chrono::seconds(240));
  INFO((r.timed_out ? "ddprun did not finish in time and was killed\n" : "") << r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // 0+1+...+7 = 28 in both attempts, every rank through the agent's store (rank 0's where
  // torch lacks libuv).
  const std::string store = default_agent_store();
  for (int attempt = 0; attempt < 2; ++attempt)
    for (int rank = 0; rank < 8; ++rank)
      CHECK(r.out.find("rank " + std::to_string(rank) + " attempt " + std::to_string(attempt) +
                       " store " + store + " sum 28") != std::string::npos);
}

TEST_CASE("where torch lacks libuv a Gloo job trains with the defaults and ddprun says so",
          "[python][integration]") {
  require_torch();
  const bool lacks_libuv = torch_lacks_libuv();
  auto r = run_command_diagnosed(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", kScripts + "store_gloo.py"}, kPython,
      std::chrono::seconds(240));
  INFO("torch lacks libuv: " << lacks_libuv << "\n" << r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank)
    CHECK(r.out.find("rank " + std::to_string(rank) + " attempt 0 store " +
                     (lacks_libuv ? "False" : "True") + " sum 1") != std::string::npos);
  CHECK(count(r.err, "built without libuv") == (lacks_libuv ? 1 : 0));
  if (lacks_libuv)
    CHECK(r.err.find("ddprun turns its agent store off (worker rank 0 hosts the store) and sets "
                     "USE_LIBUV=0 for the workers") != std::string::npos);
}

TEST_CASE("two static nodes meet through node 0's store at --master_port",
          "[python][integration]") {
  require_torch();
  // A free port for --master_port (the store) and the one above (the rendezvous).
  auto probe = run_command({"/usr/bin/python3", "-c",
                            "import socket\n"
                            "for p in range(29650, 29900, 2):\n"
                            "  try:\n"
                            "    a=socket.socket(); a.bind(('127.0.0.1',p))\n"
                            "    b=socket.socket(); b.bind(('127.0.0.1',p+1))\n"
                            "    print(p); break\n"
                            "  except OSError: pass\n"});
  REQUIRE(probe.exit_code == 0);
  const std::string port = probe.out.substr(0, probe.out.find('\n'));
  REQUIRE(!port.empty());
  auto node = [&](const std::string& rank) {
    return std::vector<std::string>{DDPRUN_BIN,
                                    "--nnodes",
                                    "2",
                                    "--node_rank",
                                    rank,
                                    "--nproc_per_node",
                                    "2",
                                    "--master_addr",
                                    "127.0.0.1",
                                    "--master_port",
                                    port,
                                    "--standby_workers=off",
                                    kScripts + "store_gloo.py"};
  };
  Subprocess node1(node("1"), kPython);
  auto r0 = run_command_diagnosed(node("0"), kPython, std::chrono::seconds(180));
  auto r1 = node1.wait(std::chrono::seconds(60));
  INFO(r0.out << r0.err << r1.out << r1.err);
  REQUIRE(r0.exit_code == 0);
  REQUIRE(r1.exit_code == 0);
  const std::string store = default_agent_store();
  for (int rank = 0; rank < 4; ++rank)
    CHECK((r0.out + r1.out)
              .find("rank " + std::to_string(rank) + " attempt 0 store " + store + " sum 6") !=
          std::string::npos);
}

TEST_CASE("with --agent_store off worker rank 0 hosts the store as before",
          "[python][integration]") {
  require_torch();
  auto r =
      run_command_diagnosed({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--agent_store",
                             "off", "--standby_workers=off", kScripts + "store_gloo.py"},
                            kPython, std::chrono::seconds(120));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("rank 1 attempt 0 store False sum 1") != std::string::npos);
}
