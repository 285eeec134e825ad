#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

#include "common/result.h"

// Authentication of rendezvous connections with a shared secret (docs/design.md#authentication).
// Pure apart from reading the secret file and drawing nonces: the handshakes are values fed one
// message at a time, so both sides are tested without sockets.
//
//   client                                              server (with a secret)
//   hello{protocol, role, nonce: cn}          ---->
//                                             <----     challenge{nonce: sn}
//   auth{mac: HMAC(secret, client|role|cn|sn)} ---->    checks the mac (constant time)
//                                             <----     hello{protocol, mac: HMAC(.., server|..)}
//   checks the server's mac; then join, status...
//
// The secret never crosses the wire; a recorded exchange cannot be replayed because the server
// draws a fresh nonce per connection, and the client's nonce keeps a fake server from replaying
// an old answer. A server without a secret answers the hello at once, as before: a client with
// a secret refuses such a server, and a server with a secret refuses a client without one.

namespace ddprun::rdzv {

/// The environment variable naming the secret file when no flag does.
inline constexpr const char* kSecretFileVariable = "DDPRUN_RDZV_SECRET_FILE";

/// The shared secret's bytes (the file's content, trailing white space removed).
struct Secret {
  std::string bytes;
};

/// Reads a secret file: it must be a regular file readable by its owner only (mode 600 or
/// 400) and hold at least 16 bytes. The error names the file and the fix.
common::Result<Secret> read_secret_file(const std::string& path);

/// A fresh random nonce (32 bytes from the kernel's generator, getrandom(2), as 64 hex digits).
std::string make_nonce();

/// HMAC-SHA256 (hex) binding the secret to one connection: who proves (`side`: "client" or
/// "server"), the client's role and both nonces.
std::string handshake_mac(const Secret& secret, const std::string& side, const std::string& role,
                          const std::string& client_nonce, const std::string& server_nonce);

/// What a handshake step asks of its caller.
struct HandshakeStep {
  std::optional<nlohmann::json> send;  ///< a message to send now
  bool done = false;                   ///< authenticated (or no secret needed): go on
  std::optional<common::Error> error;  ///< refuse (server) or give up (client) with this
  bool unauthorized = false;           ///< the error is a failed authentication (server)
  bool not_ddprun = false;  ///< (client) the peer's greeting is not ddprun's of this version
};

/// The server's side: feed every message until done or error.
class ServerHandshake {
 public:
  /// `secret` nullopt: no authentication (the hello is answered at once).
  ServerHandshake(std::optional<Secret> secret, std::string server_nonce);
  HandshakeStep on_message(const nlohmann::json& body);
  /// The client's role from its hello ("agent", "status"), once seen.
  const std::string& role() const { return role_; }

 private:
  std::optional<Secret> secret_;
  std::string server_nonce_;
  std::string client_nonce_;
  std::string role_;
  bool challenged_ = false;
};

/// The client's side: send hello(), then feed every message until done or error.
class ClientHandshake {
 public:
  ClientHandshake(std::optional<Secret> secret, std::string role, std::string client_nonce);
  nlohmann::json hello() const;
  HandshakeStep on_message(const nlohmann::json& body);
  /// True when this client has a secret: it must wait for the server's proof before it sends
  /// anything else. Without one it may send its first request right after the hello.
  bool authenticates() const { return secret_.has_value(); }

 private:
  std::optional<Secret> secret_;
  std::string role_;
  std::string client_nonce_;
  std::string server_nonce_;
};

}  // namespace ddprun::rdzv
