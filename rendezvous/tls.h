#pragma once
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "common/result.h"

// TLS for rendezvous connections (docs/design.md#tls): the certificate files of one side,
// loaded once at start-up into an OpenSSL context that every connection of that side shares.
// The frames, the hello and the shared-secret handshake run unchanged inside the TLS stream.

namespace boost::asio::ssl {
class context;
}

namespace ddprun::rdzv {

/// PEM files given for one side; "" where not given.
struct TlsFiles {
  std::string ca;    ///< tls_ca: verify the peer's certificate against this CA
  std::string cert;  ///< tls_cert: this side's certificate (chain)
  std::string key;   ///< tls_key: its private key
  bool any() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

/// A loaded TLS configuration, shared by every connection of one side.
using TlsContext = std::shared_ptr<boost::asio::ssl::context>;

/// The server's side: tls_cert and tls_key are required; with tls_ca every client must present
/// a certificate that CA signed. `flag` spells the option for messages ("--tls_" on the daemon,
/// "--rdzv_conf tls_" on an agent). The error names the file and the fix.
common::Result<TlsContext> make_server_tls(const TlsFiles& files, const std::string& flag);

/// The client's side: tls_ca is required (the server's certificate must chain to it and name
/// the endpoint's host); tls_cert and tls_key, both or neither, are shown when the server asks.
common::Result<TlsContext> make_client_tls(const TlsFiles& files, const std::string& flag);

/// How one connection speaks TLS: the context, and for a client the host name (or address) the
/// server's certificate must carry.
struct TlsRole {
  TlsContext context;
  bool server = false;
  std::string host;
};

/// True when `bytes` start like a TLS record (a handshake or an alert): a plain peer of a TLS
/// side, or the other way round, says so instead of "bad frame".
bool looks_like_tls(const std::string& bytes);

}  // namespace ddprun::rdzv
