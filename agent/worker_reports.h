#pragma once
// What workers report to their agent over DDPRUN_AGENT_SOCKET (a Unix datagram socket, one JSON
// object per datagram): progress heartbeats for the watchdog and milestones ("pg_ready",
// "snapshot_loaded", "first_step") for the event log. The parser is pure; ReportSocket owns
// the socket.
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

/// Largest report a worker may send.
inline constexpr size_t kMaxReportBytes = 64 * 1024;

/// One report: `fields` is the rest of the object, without "event", "local_rank" and "pid".
struct WorkerReport {
  std::string event;  ///< "heartbeat" or a milestone
  int local_rank = 0;
  std::optional<pid_t> pid;  ///< the sender, when it said
  nlohmann::json fields = nlohmann::json::object();
};

/// Parses one datagram; the error names what is wrong with it.
common::Result<WorkerReport> parse_worker_report(std::string_view text);

/// The agent's end of DDPRUN_AGENT_SOCKET, in a private temporary directory.
class ReportSocket {
 public:
  explicit ReportSocket(boost::asio::io_context& io);
  ~ReportSocket();  ///< closes the socket and removes its directory
  ReportSocket(const ReportSocket&) = delete;
  ReportSocket& operator=(const ReportSocket&) = delete;

  /// Binds the socket and delivers each well-formed report to `on_report` from the event loop;
  /// malformed ones are dropped with a debug line.
  std::optional<common::Error> open(std::function<void(const WorkerReport&)> on_report);
  /// The socket's path for workers ("" until open() succeeded).
  const std::string& path() const;
  /// Delivers the reports already queued (a worker's last milestone before its exit).
  void drain();
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
