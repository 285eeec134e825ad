#include "rendezvous/daemon.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>

#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/signals.h"
#include "common/strings.h"
#include "rendezvous/server.h"

namespace ddprun::rdzv {

std::variant<DaemonConfig, DaemonExit> parse_daemon_args(const std::vector<std::string>& args) {
  DaemonConfig config;
  CLI::App app{
      "ddprun-rdzvd: the standalone ddprun rendezvous server. It hosts any number of jobs "
      "(by --rdzv_id) and outlives every training node; start agents with "
      "--rdzv_endpoint <this host>:<port>.",
      "ddprun-rdzvd"};
  app.add_option("--port", config.port, "TCP port to listen on (default 29400)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--host", config.host,
                 "address to listen on (default: every IPv6 and IPv4 address)");
  app.set_version_flag("--version", "ddprun-rdzvd " DDPRUN_VERSION);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return DaemonExit{0, app.help()};
  } catch (const CLI::CallForVersion&) {
    return DaemonExit{0, "ddprun-rdzvd " DDPRUN_VERSION "\n"};
  } catch (const CLI::ParseError& e) {
    return DaemonExit{common::kExitUsage,
                      std::string("ddprun-rdzvd: error: ") + e.what() + ": see --help\n"};
  }
  return config;
}

namespace {

/// Every agent holds a connection open for the whole job, so a daemon for a thousand nodes needs
/// more descriptors than the usual soft limit of 1024: take what the hard limit allows.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t was = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("cannot raise the open-file limit from {} to {}: at most about {} agents", was,
                 limit.rlim_max, was);
  }
}

}  // namespace

int run_daemon(const DaemonConfig& config) {
  auto logger = spdlog::stderr_logger_st("ddprun-rdzvd");
  logger->set_pattern("[ddprun-rdzvd] %^%l%$: %v");
  if (const char* level = std::getenv("LOGLEVEL"); level && common::to_lower(level) == "debug")
    logger->set_level(spdlog::level::debug);
  spdlog::set_default_logger(logger);
  raise_open_file_limit();

  boost::asio::io_context io;
  common::SteadyClock clock;
  RendezvousServer server(io, clock);
  if (auto why = server.listen(config.host, config.port)) {
    spdlog::error("{}; is another ddprun-rdzvd or agent using the port? pick another --port", *why);
    return common::kExitRendezvous;
  }
  spdlog::info("listening on {}:{} (rendezvous protocol {})",
               config.host.empty() ? "*" : config.host, server.port(), kProtocolVersion);
  std::signal(SIGPIPE, SIG_IGN);
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  int received = 0;
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    received = sig;
    spdlog::info("received {}: shutting down; agents will reconnect to a restarted daemon",
                 common::signal_name(sig));
    server.shutdown();
    io.stop();
  });
  io.run();
  return received == 0 ? common::kExitInternal : common::kExitSuccess;
}

}  // namespace ddprun::rdzv
