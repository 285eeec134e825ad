#pragma once
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/endpoint.h"
#include "rendezvous/limits.h"
#include "rendezvous/tls.h"

namespace ddprun::rdzv {

/// ddprun-rdzvd's command line.
struct DaemonConfig {
  std::string host;  ///< "" listens on every address (IPv6 and IPv4)
  int port = kDefaultPort;
  ServerLimits limits;
  std::string secret_file;  ///< --secret_file, else $DDPRUN_RDZV_SECRET_FILE; "" for none
  TlsFiles tls;             ///< --tls_cert, --tls_key, --tls_ca; none: plain TCP
  int metrics_port = 0;     ///< --metrics_port: serve GET /metrics there (0: off)
  std::string metrics_host = "127.0.0.1";  ///< --metrics_host
  bool metrics_auth = false;               ///< --metrics_auth: /metrics asks for the secret too
};

/// Parses ddprun-rdzvd's arguments; a message (help text or error) when it should not run.
/// `exit_code` is 0 for --help/--version and 64 for a usage error.
struct DaemonExit {
  int exit_code = 0;
  std::string message;
};
std::variant<DaemonConfig, DaemonExit> parse_daemon_args(const std::vector<std::string>& args);

/// Runs the standalone rendezvous server until SIGTERM or SIGINT; returns the exit status.
int run_daemon(const DaemonConfig& config);

}  // namespace ddprun::rdzv
