#include "rendezvous/auth.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <set>

#include "rendezvous/framing.h"
#include "rendezvous/protocol.h"
#include "tests/support/subprocess.h"

using namespace ddprun::rdzv;
using nlohmann::json;

namespace {

const Secret kSecret{"0123456789abcdef0123456789abcdef"};
const Secret kOther{"fedcba9876543210fedcba9876543210"};

std::string write_secret(const std::string& path, const std::string& content, mode_t mode) {
  std::ofstream(path) << content;
  ::chmod(path.c_str(), mode);
  return path;
}

/// Runs a client and a server handshake against each other, message by message; returns the
/// client's and the server's final steps.
std::pair<HandshakeStep, HandshakeStep> run(ClientHandshake& client, ServerHandshake& server) {
  std::optional<json> to_server = client.hello();
  HandshakeStep c, s;
  for (int i = 0; i < 4 && to_server; ++i) {
    s = server.on_message(*to_server);
    to_server.reset();
    if (s.error) {
      c = client.on_message(
          to_json(ServerMessage{Refused{RefusalKind::Unauthorized, s.error->message}}));
      break;
    }
    if (!s.send) break;
    c = client.on_message(*s.send);
    if (c.error || c.done) break;
    to_server = c.send;
  }
  return {c, s};
}

}  // namespace

TEST_CASE("a client and a server with the same secret authenticate each other", "[rdzv][unit]") {
  ClientHandshake client(kSecret, "agent", make_nonce());
  ServerHandshake server(kSecret, make_nonce());
  auto [c, s] = run(client, server);
  CHECK(s.done);
  CHECK_FALSE(s.error);
  CHECK(c.done);
  CHECK_FALSE(c.error);
  CHECK(server.role() == "agent");
}

TEST_CASE("a wrong secret is refused on both sides", "[rdzv][unit]") {
  ClientHandshake client(kOther, "agent", make_nonce());
  ServerHandshake server(kSecret, make_nonce());
  auto [c, s] = run(client, server);
  REQUIRE(s.error);
  CHECK(s.unauthorized);
  CHECK_THAT(s.error->message, Catch::StartsWith("authentication failed: wrong secret"));
  REQUIRE(c.error);
  CHECK_THAT(c.error->message, Catch::StartsWith("authentication failed: wrong secret"));
}

TEST_CASE("a client without the secret learns that the server needs one", "[rdzv][unit]") {
  ClientHandshake client(std::nullopt, "status", make_nonce());
  ServerHandshake server(kSecret, make_nonce());
  auto [c, s] = run(client, server);
  CHECK_FALSE(s.done);
  REQUIRE(c.error);
  CHECK_THAT(c.error->message,
             Catch::Contains("requires a shared secret") && Catch::Contains("secret_file"));
  // A hello with no nonce at all (an older client) is refused outright.
  ServerHandshake strict(kSecret, make_nonce());
  HandshakeStep old = strict.on_message(make_hello("agent"));
  REQUIRE(old.error);
  CHECK(old.unauthorized);
}

TEST_CASE("a client with a secret refuses a server that cannot prove it holds it", "[rdzv][unit]") {
  ClientHandshake client(kSecret, "agent", make_nonce());
  ServerHandshake open_server(std::nullopt, "");
  auto [c, s] = run(client, open_server);
  CHECK(s.done);
  REQUIRE(c.error);
  CHECK_THAT(c.error->message, Catch::Contains("did not prove that it holds the secret"));
}

TEST_CASE("without secrets the hello is answered at once, as before", "[rdzv][unit]") {
  ClientHandshake client(std::nullopt, "agent", make_nonce());
  ServerHandshake server(std::nullopt, "");
  CHECK_FALSE(client.authenticates());
  auto [c, s] = run(client, server);
  CHECK(s.done);
  CHECK(c.done);
}

TEST_CASE("a recorded answer does not open another connection", "[rdzv][unit]") {
  // An eavesdropper replays a client's answer to a new connection: the server's nonce differs.
  const std::string client_nonce = make_nonce();
  ClientHandshake client(kSecret, "agent", client_nonce);
  ServerHandshake first(kSecret, make_nonce());
  HandshakeStep challenge = first.on_message(client.hello());
  REQUIRE(challenge.send);
  HandshakeStep answer = client.on_message(*challenge.send);
  REQUIRE(answer.send);
  CHECK(first.on_message(*answer.send).done);

  ServerHandshake second(kSecret, make_nonce());
  REQUIRE(second.on_message(client.hello()).send);
  HandshakeStep replayed = second.on_message(*answer.send);
  REQUIRE(replayed.error);
  CHECK_THAT(replayed.error->message, Catch::StartsWith("authentication failed: wrong secret"));
}

TEST_CASE("a macs binds the side, the role and both nonces", "[rdzv][unit]") {
  const std::string base = handshake_mac(kSecret, "client", "agent", "a", "b");
  CHECK(base.size() == 64);
  CHECK(base != handshake_mac(kSecret, "server", "agent", "a", "b"));
  CHECK(base != handshake_mac(kSecret, "client", "status", "a", "b"));
  CHECK(base != handshake_mac(kSecret, "client", "agent", "ab", ""));
  CHECK(base != handshake_mac(kOther, "client", "agent", "a", "b"));
  CHECK(make_nonce() != make_nonce());
}

TEST_CASE("a secret file readable by others, missing or short is refused with the fix",
          "[rdzv][unit]") {
  ddprun::testing::TempDir dir;
  const std::string good = write_secret(dir.path() + "/good", kSecret.bytes + "\n", 0600);
  auto read = read_secret_file(good);
  REQUIRE(read.ok());
  CHECK(read->bytes == kSecret.bytes);

  const std::string open = write_secret(dir.path() + "/open", kSecret.bytes, 0644);
  auto bad = read_secret_file(open);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "secret file " + open +
                                   " is readable by group or others (mode 644): run "
                                   "chmod 600 " +
                                   open);

  const std::string shorty = write_secret(dir.path() + "/short", "abc", 0600);
  CHECK_THAT(read_secret_file(shorty).error().message,
             Catch::Contains("holds 3 bytes; at least 16") && Catch::Contains("openssl rand"));
  // Trailing whitespace is not part of the secret: a file of spaces holds none.
  const std::string blank = write_secret(dir.path() + "/blank", std::string(40, ' ') + "\n", 0600);
  CHECK_THAT(read_secret_file(blank).error().message,
             Catch::Contains("holds 0 bytes before its trailing whitespace (41 in all); at least "
                             "16 are needed"));
  CHECK_THAT(read_secret_file(dir.path() + "/none").error().message,
             Catch::Contains("No such file"));
}

TEST_CASE("nonces are 64 hex digits and differ from call to call", "[rdzv][unit]") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string nonce = make_nonce();
    CHECK(nonce.size() == 64);
    CHECK(nonce.find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(nonce);
  }
  CHECK(seen.size() == 100);
}
