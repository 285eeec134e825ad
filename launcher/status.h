#pragma once
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "etcd/client.h"
#include "launcher/cli.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/tls.h"

namespace ddprun::launcher {

/// `ddprun status --rdzv_endpoint host:port [--rdzv_id ID] [--json] [--timeout S]`.
struct StatusRequest {
  std::string host;
  int port = rdzv::kDefaultPort;
  std::optional<std::string> run_id;
  bool json = false;
  std::chrono::milliseconds timeout{5000};
  /// --secret_file (or DDPRUN_RDZV_SECRET_FILE): prove the shared secret to the server.
  std::optional<std::string> secret_file;
  /// --tls_ca, --tls_cert, --tls_key: speak TLS to the server (rendezvous/tls.h).
  rdzv::TlsFiles tls;
  /// --watch: ask again every `interval` and redraw, until Ctrl-C or SIGTERM (or `iterations`
  /// answers, when not 0).
  bool watch = false;
  std::chrono::milliseconds interval{2000};
  int iterations = 0;
  /// --rdzv_backend etcd-v3: read the jobs' `state` keys from these etcd members instead.
  std::vector<etcd::Member> etcd_members;
  /// --rdzv_conf etcd_user=...,etcd_password_file=... (as the agents take them): log in to an
  /// etcd with authentication on; both empty: no login.
  std::string etcd_user;
  std::string etcd_password_file;
};

/// Parses the arguments after "status" (PET_RDZV_ENDPOINT and PET_RDZV_ID as fallbacks).
std::variant<StatusRequest, InfoRequest, UsageError> parse_status_args(
    const std::vector<std::string>& args, const EnvLookup& env);

/// The jobs of a status reply as tables: one header line per job (and, while a round forms, a
/// line with who joined, who is awaited and the time left), one row per node.
std::string format_status(const nlohmann::json& jobs);

/// Asks the rendezvous server and prints its answer; returns ddprun's exit status (0; 1 when
/// the named job is unknown; 69 when the server cannot be reached or answers badly). With
/// --watch it asks again every --interval and redraws (on a terminal: the screen; otherwise:
/// one snapshot after another) until SIGINT or SIGTERM, which end it with 0.
int run_status(const StatusRequest& request);

}  // namespace ddprun::launcher
