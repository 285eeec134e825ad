#include "rendezvous/daemon.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cmath>
#include <csignal>

#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/open_files.h"
#include "common/signals.h"
#include "common/strings.h"
#include "common/version.h"
#include "common/warning_limiter.h"
#include "metrics/exposition.h"
#include "metrics/http_server.h"
#include "rendezvous/auth.h"
#include "rendezvous/server.h"
#include "rendezvous/server_metrics.h"
#include "rendezvous/status_page.h"

namespace ddprun::rdzv {

std::variant<DaemonConfig, DaemonExit> parse_daemon_args(const std::vector<std::string>& args) {
  DaemonConfig config;
  CLI::App app{
      "ddprun-rdzvd: the standalone ddprun rendezvous server. It hosts any number of jobs "
      "(by --rdzv_id) and outlives every training node; start agents with "
      "--rdzv_endpoint <this host>:<port>.",
      "ddprun-rdzvd"};
  app.add_option("--port", config.port,
                 "TCP port to listen on (default " + std::to_string(kDefaultPort) + ")")
      ->check(CLI::Range(1, 65535));
  app.add_option("--host", config.host,
                 "address to listen on (default: every IPv6 and IPv4 address)");
  double hello_timeout_s = config.limits.hello_timeout.count() / 1000.0;
  double stalled_frame_timeout_s = config.limits.stalled_frame_timeout.count() / 1000.0;
  app.add_option("--hello_timeout,--hello-timeout", hello_timeout_s,
                 "seconds a new connection has to complete its hello before it is closed "
                 "(default 10)")
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--stalled_frame_timeout,--stalled-frame-timeout", stalled_frame_timeout_s,
                 "seconds a connection may hold part of a frame without sending more before it "
                 "is closed (default 30)")
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--max_buffered_bytes,--max-buffered-bytes", config.limits.max_buffered_bytes,
                 "unparsed input held across all connections; a connection that would go over "
                 "is closed (default 67108864, 64 MiB)")
      ->check(CLI::Range(std::size_t{1} << 20, std::size_t{1} << 40));
  app.add_option("--max_jobs,--max-jobs", config.limits.max_jobs,
                 "jobs held at once; a node of a new job beyond this is refused (default 10000)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}));
  app.add_option("--secret_file,--secret-file", config.secret_file,
                 "a file holding the shared secret every agent and ddprun status must prove "
                 "(mode 600; default: $DDPRUN_RDZV_SECRET_FILE)");
  app.add_option("--tls_cert,--tls-cert", config.tls.cert,
                 "PEM certificate (chain) of this server: every connection speaks TLS "
                 "(with --tls_key)");
  app.add_option("--tls_key,--tls-key", config.tls.key,
                 "PEM private key of --tls_cert (not readable by others)");
  app.add_option("--tls_ca,--tls-ca", config.tls.ca,
                 "PEM CA certificate(s): every client must present a certificate it signed");
  app.add_option("--metrics_port,--metrics-port", config.metrics_port,
                 "serve Prometheus metrics at http://<metrics_host>:<port>/metrics, the status "
                 "page at / and its JSON at /status (default: off)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--metrics_host,--metrics-host", config.metrics_host,
                 "address the metrics endpoint listens on (default 127.0.0.1, this host only)");
  app.add_flag("--metrics_auth,--metrics-auth", config.metrics_auth,
               "with --secret_file: /metrics asks for the secret too, as a bearer token (the "
               "status page and /status always do)");
  app.set_version_flag("--version", common::version_line("ddprun-rdzvd"));
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return DaemonExit{0, app.help()};
  } catch (const CLI::CallForVersion&) {
    return DaemonExit{0, common::version_line("ddprun-rdzvd") + "\n"};
  } catch (const CLI::ParseError& e) {
    return DaemonExit{common::kExitUsage,
                      std::string("ddprun-rdzvd: error: ") + e.what() + ": see --help\n"};
  }
  if (config.secret_file.empty()) {
    if (const char* from_env = std::getenv(kSecretFileVariable)) config.secret_file = from_env;
  }
  if (config.metrics_auth && config.secret_file.empty())
    return DaemonExit{common::kExitUsage,
                      "ddprun-rdzvd: error: --metrics_auth asks for the rendezvous secret on "
                      "/metrics: give --secret_file (or DDPRUN_RDZV_SECRET_FILE) too\n"};
  config.limits.hello_timeout = std::chrono::milliseconds(std::llround(hello_timeout_s * 1000));
  config.limits.stalled_frame_timeout =
      std::chrono::milliseconds(std::llround(stalled_frame_timeout_s * 1000));
  return config;
}

/// The longest a daemon takes to end after SIGTERM: sessions whose peer does not read the last
/// messages are closed then.
constexpr std::chrono::milliseconds kShutdownDeadline{2'000};

int run_daemon(const DaemonConfig& config) {
  auto logger = spdlog::stderr_logger_st("ddprun-rdzvd");
  logger->set_pattern("[ddprun-rdzvd] %^%l%$: %v");
  if (const char* level = std::getenv("LOGLEVEL"); level && common::to_lower(level) == "debug")
    logger->set_level(spdlog::level::debug);
  spdlog::set_default_logger(logger);
  // Every agent holds a connection open for the whole job: a daemon for a thousand nodes needs
  // more descriptors than the usual soft limit of 1024.
  if (const auto files = common::raise_open_file_limit(); files.soft < files.hard)
    spdlog::warn("cannot raise the open-file limit from {} to {}: at most about {} agents",
                 files.soft, files.hard, files.soft);

  std::optional<Secret> secret;
  if (!config.secret_file.empty()) {
    auto read = read_secret_file(config.secret_file);
    if (!read) {
      spdlog::error("{}", read.error().message);
      return common::kExitUsage;
    }
    secret = *std::move(read);
  }
  TlsContext tls;
  if (config.tls.any()) {
    auto made = make_server_tls(config.tls, "--tls_");
    if (!made) {
      spdlog::error("{}", made.error().message);
      return common::kExitUsage;
    }
    tls = *std::move(made);
  }
  boost::asio::io_context io;
  common::SteadyClock clock;
  ServerMetrics server_metrics;  // outlives the server, which counts into it
  RendezvousServer server(io, clock, config.limits, secret, tls);
  if (auto why = server.listen(config.host, config.port)) {
    spdlog::error("{}; is another ddprun-rdzvd or agent using the port? pick another --port",
                  why->message);
    return common::kExitRendezvous;
  }
  // The metrics endpoint shares the io_context: a scrape reads the server's state between two
  // of its handlers, never concurrently.
  server.set_metrics(&server_metrics);
  JobHistory history;  // outlives the server, which records into it
  server.set_history(&history);
  server.set_daemon(true);
  const TimePoint started = clock.now();
  // The status document (docs/operations.md#status-document): what the server holds, when.
  auto document = [&server, &clock, started] {
    nlohmann::json doc = server.status_document(kMaxJobsInStatusDocument);
    doc["schema_version"] = kStatusSchemaVersion;
    doc["generator"] = common::version_line("ddprun-rdzvd");
    doc["time_unix_s"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    doc["uptime_s"] = std::chrono::duration<double>(clock.now() - started).count();
    return doc;
  };
  // A wrong secret on the metrics port is counted and logged (at most 5 lines each 10 s), like
  // one on the rendezvous port: someone is guessing, or a dashboard has an old secret.
  common::WarningLimiter http_warnings(io, "requests with a wrong secret on the metrics port", 5);
  StatusPageOptions page_options{secret, config.metrics_auth, {}};
  page_options.wrong_secret = [&server_metrics, &http_warnings](const metrics::HttpRequest& r) {
    server_metrics.http_auth_failure();
    http_warnings.warn(
        "metrics port: refused " + common::printable(r.method) + " " +
        common::printable(r.target.substr(0, 200)) + " from " +
        (r.peer_address.empty() ? "?" : format_endpoint(r.peer_address, r.peer_port)) +
        ": wrong secret (401)");
  };
  metrics::HttpServer metrics_http(
      io, status_page_handler(metrics::metrics_handler(server_metrics.registry(),
                                                       [&server] { server.refresh_metrics(); }),
                              document, std::move(page_options)));
  if (config.metrics_port != 0) {
    if (auto why = metrics_http.listen(config.metrics_host, config.metrics_port)) {
      spdlog::error("{}; pick another --metrics_port", why->message);
      return common::kExitUsage;
    }
    spdlog::info("serving metrics on http://{}/metrics and the status page on http://{}/{}",
                 format_endpoint(config.metrics_host, metrics_http.port()),
                 format_endpoint(config.metrics_host, metrics_http.port()),
                 secret ? " (the page asks for the rendezvous secret)" : "");
  }
  const char* tls_note = !tls                    ? ""
                         : config.tls.ca.empty() ? ", TLS"
                                                 : ", TLS with client certificates";
  spdlog::info("listening on {}:{} (rendezvous protocol {}{}{})",
               config.host.empty() ? "*" : config.host, server.port(), kProtocolVersion,
               secret ? ", shared secret required" : "", tls_note);
  // Client certificates authenticate peers as the secret does.
  if (!secret && config.tls.ca.empty())
    spdlog::warn(
        "no --secret_file: anyone who can reach this port can read, join and end its jobs; "
        "use it on trusted networks only (docs/operations.md#security)");
  std::signal(SIGPIPE, SIG_IGN);
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  int received = 0;
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    received = sig;
    spdlog::info("received {}: shutting down; agents will reconnect to a restarted daemon",
                 common::signal_name(sig));
    // Shutdown is cancellation: the server stops accepting, writes what it queued (a "closed"
    // for the nodes) and ends its sessions, within kShutdownDeadline; run() returns then.
    server.shutdown(kShutdownDeadline);
    metrics_http.shutdown();
  });
  io.run();
  return received == 0 ? common::kExitInternal : common::kExitSuccess;
}

}  // namespace ddprun::rdzv
