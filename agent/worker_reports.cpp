#include "agent/worker_reports.h"

#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/datagram_protocol.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "agent/group_cleanup.h"
#include "common/log.h"

namespace ddprun::agent {
namespace asio = boost::asio;
namespace fs = std::filesystem;

common::Result<WorkerReport> parse_worker_report(std::string_view text) {
  auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return common::Error{"a worker report is not a JSON object"};
  if (!json.contains("event") || !json["event"].is_string())
    return common::Error{"a worker report has no \"event\" string"};
  if (!json.contains("local_rank") || !json["local_rank"].is_number_integer())
    return common::Error{"a worker report has no integer \"local_rank\""};
  WorkerReport report;
  report.event = json["event"].get<std::string>();
  report.local_rank = json["local_rank"].get<int>();
  if (json.contains("pid") && json["pid"].is_number_integer())
    report.pid = json["pid"].get<pid_t>();
  json.erase("event");
  json.erase("local_rank");
  json.erase("pid");
  report.fields = std::move(json);
  return report;
}

struct ReportSocket::Impl {
  explicit Impl(asio::io_context& io) : socket(io) {}

  void read() {
    socket.async_receive(asio::buffer(buffer),
                         [this](const boost::system::error_code& ec, size_t n) {
                           if (ec) return;  // closed at the end of the job
                           deliver(std::string_view(buffer.data(), n));
                           read();
                         });
  }

  void deliver(std::string_view text) {
    auto report = parse_worker_report(text);
    if (!report) {
      spdlog::debug("ignoring a malformed worker report ({}): {}", report.error().message,
                    std::string(text.substr(0, 200)));
      return;
    }
    on_report(*report);
  }

  asio::local::datagram_protocol::socket socket;
  std::vector<char> buffer;  ///< kMaxReportBytes once open: a job without reports pays nothing
  std::function<void(const WorkerReport&)> on_report;
  std::string dir;
  std::string path;
};

ReportSocket::ReportSocket(asio::io_context& io) : impl_(std::make_unique<Impl>(io)) {}

ReportSocket::~ReportSocket() {
  close();
  std::error_code ignored;
  if (!impl_->dir.empty()) fs::remove_all(impl_->dir, ignored);
}

std::optional<common::Error> ReportSocket::open(
    std::function<void(const WorkerReport&)> on_report) {
  // Named after this agent, so its watcher removes it should the agent be SIGKILLed.
  std::string tmpl =
      (fs::temp_directory_path() / ("ddprun-sock-" + temp_dir_tag() + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return common::Error{std::string("cannot create a directory for the workers' report socket: ") +
                         std::strerror(errno)};
  impl_->dir = tmpl;
  const std::string path = (fs::path(tmpl) / "agent.sock").string();
  // The kernel takes at most sizeof(sun_path) - 1 bytes (107), and Asio's endpoint throws past
  // it: said instead, and the job runs without reports.
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return common::Error{"cannot open the workers' report socket " + path + ": its path is " +
                         std::to_string(path.size()) + " bytes, over the " +
                         std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                         " a socket's path may have; set TMPDIR to a shorter directory"};
  boost::system::error_code ec;
  impl_->socket.open(asio::local::datagram_protocol(), ec);
  if (!ec) impl_->socket.bind(asio::local::datagram_protocol::endpoint(path), ec);
  if (ec)
    return common::Error{"cannot open the workers' report socket " + path + ": " + ec.message()};
  impl_->path = path;
  impl_->buffer.resize(kMaxReportBytes);
  impl_->on_report = std::move(on_report);
  impl_->read();
  return std::nullopt;
}

const std::string& ReportSocket::path() const { return impl_->path; }

void ReportSocket::drain() {
  if (!impl_->socket.is_open()) return;
  boost::system::error_code ec;
  impl_->socket.non_blocking(true, ec);
  for (int i = 0; i < 1024 && !ec; ++i) {
    const size_t n = impl_->socket.receive(asio::buffer(impl_->buffer), 0, ec);
    if (!ec) impl_->deliver(std::string_view(impl_->buffer.data(), n));
  }
}

void ReportSocket::close() {
  boost::system::error_code ignored;
  impl_->socket.close(ignored);
}

}  // namespace ddprun::agent
