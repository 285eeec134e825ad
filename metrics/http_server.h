#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/accept_loop.h"
#include "common/result.h"

namespace ddprun::metrics {

/// One request as a handler sees it: the method, the target and the one header a handler reads
/// (GET needs no body).
struct HttpRequest {
  std::string method;             ///< "GET", "HEAD", ...
  std::string target;             ///< "/metrics", "/metrics?x=1", ...
  std::string authorization;      ///< the Authorization header ("" when absent)
  std::string peer_address = {};  ///< the client's address ("" when unknown), for a log line
  int peer_port = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  /// More response headers (name, value): WWW-Authenticate, Cache-Control, ...
  std::vector<std::pair<std::string, std::string>> headers = {};
};

/// What one client may cost the server: a scrape endpoint faces whoever can reach its port.
struct HttpLimits {
  /// The request line and headers together; a larger request is answered 431 and closed.
  std::size_t max_request_bytes = 8 * 1024;
  /// Time to send a whole request (and to read a whole response): a silent or slow client is
  /// closed then, so it holds one descriptor for that long at most.
  std::chrono::milliseconds io_timeout{10'000};
  /// Connections served at once; one accepted beyond takes the place of the one that has
  /// waited longest for a request (it is closed), or is closed if every session is busy.
  std::size_t max_sessions = 64;
};

/// A small HTTP/1.1 server (Boost.Beast) for the metrics endpoint of the daemon and the agent,
/// shaped like the rendezvous server (rendezvous/server.h):
///
///   acceptor --> Session (beast::tcp_stream: read request with a deadline, handler, write)
///                   ^ registry of sessions: shutdown() closes them all
///
/// All on the io_context's thread. Requests carry no body; keep-alive is honoured.
class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer(boost::asio::io_context& io, Handler handler, HttpLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Listens on host:port (port 0: a free port); why not on failure.
  std::optional<common::Error> listen(const std::string& host, int port);

  /// The bound port (after listen).
  int port() const { return port_; }

  /// Shutdown is cancellation: closes the acceptor and every session; nothing of the server is
  /// left pending on the io_context afterwards.
  void shutdown();

  /// Connections open now.
  std::size_t sessions() const { return sessions_.size(); }

 private:
  class Session;
  void on_accepted(boost::asio::ip::tcp::socket socket);
  void forget(std::uint64_t id);

  boost::asio::io_context& io_;
  Handler handler_;
  HttpLimits limits_;
  boost::asio::ip::tcp::acceptor acceptor_;
  common::AcceptLoop accepts_;
  int port_ = 0;
  bool stopped_ = false;
  std::uint64_t next_session_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Session>> sessions_;
  /// Expires with the server: a session's handlers may run after it is gone.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

/// "text/plain; version=0.0.4; charset=utf-8": Prometheus's text exposition format.
inline constexpr const char* kPrometheusTextType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace ddprun::metrics
