#include "metrics/http_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace ddprun::metrics {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using boost::system::error_code;

/// One connection: read a request (bounded in size and time), answer it, and read the next
/// while the client keeps the connection alive.
class HttpServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer& server, std::uint64_t id)
      : stream_(std::move(socket)),
        buffer_(server.limits_.max_request_bytes),
        server_(server),
        alive_(server.alive_),
        id_(id) {
    // Read once: a connection's client does not change between its requests.
    error_code ec;
    const auto from = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      peer_address_ = from.address().to_string();
      peer_port_ = from.port();
    }
  }

  void start() { read_next(); }

  /// Since when it waits for a request (its first, or the next on a kept-alive connection);
  /// nullopt while a request is answered.
  std::optional<std::chrono::steady_clock::time_point> waiting_since() const {
    return waiting_since_;
  }

  /// Ends the session now: pending reads and writes complete with operation_aborted.
  void close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

 private:
  void read_next() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.limits_.max_request_bytes));
    parser_->body_limit(0);  // a GET has no body; one with a body is a bad request
    // The deadline covers the whole request: a client sending a byte a minute is closed.
    stream_.expires_after(server_.limits_.io_timeout);
    waiting_since_ = std::chrono::steady_clock::now();
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(error_code ec) {
    if (!alive_.lock()) return;
    waiting_since_.reset();
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::eof ||
        ec == asio::error::connection_reset) {
      return end();
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
      return respond(431, "request header fields too large\n", false);
    if (ec == http::error::body_limit) {
      // A request with a body: a POST or PUT is told what this server takes, as one without.
      const http::verb method = parser_->get().method();
      if (method != http::verb::get && method != http::verb::head)
        return respond(405, "only GET and HEAD\n", false);
    }
    if (ec) return respond(400, "bad request\n", false);  // garbage, or a GET with a body
    const auto& req = parser_->get();
    const HttpRequest request{std::string(req.method_string()), std::string(req.target()),
                              std::string(req[http::field::authorization]), peer_address_,
                              peer_port_};
    HttpResponse answer = server_.handler_(request);
    respond(answer.status, std::move(answer.body), req.keep_alive(), answer.content_type,
            req.method() == http::verb::head, answer.headers);
  }

  void respond(int status, std::string body, bool keep_alive,
               const std::string& content_type = "text/plain; charset=utf-8", bool head = false,
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    response_ = {};
    response_.version(11);
    response_.result(static_cast<unsigned>(status));
    response_.set(http::field::server, "ddprun");
    response_.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers) response_.set(name, value);
    // Every handler here serves GET and HEAD only; RFC 9110 asks a 405 to say so.
    if (status == 405) response_.set(http::field::allow, "GET, HEAD");
    response_.keep_alive(keep_alive);
    response_.body() = std::move(body);
    response_.prepare_payload();  // Content-Length of the body, also for HEAD
    if (head) response_.body().clear();
    keep_alive_ = keep_alive;
    // A client that does not read its response is closed at the deadline too.
    stream_.expires_after(server_.limits_.io_timeout);
    http::async_write(stream_, response_, [self = shared_from_this()](error_code ec, std::size_t) {
      if (!self->alive_.lock()) return;
      if (ec || !self->keep_alive_) return self->end();
      self->read_next();
    });
  }

  void end() {
    close();
    server_.forget(id_);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::response<http::string_body> response_;
  bool keep_alive_ = false;
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
  HttpServer& server_;
  std::weak_ptr<bool> alive_;
  std::uint64_t id_;
  std::string peer_address_;
  int peer_port_ = 0;
};

HttpServer::HttpServer(asio::io_context& io, Handler handler, HttpLimits limits)
    : io_(io),
      handler_(std::move(handler)),
      limits_(limits),
      acceptor_(io),
      // A failed accept (out of descriptors): the loop pauses and tries again.
      accepts_(
          acceptor_, [this](tcp::socket socket) { on_accepted(std::move(socket)); },
          [](const error_code&) {}) {}

HttpServer::~HttpServer() { shutdown(); }

std::optional<common::Error> HttpServer::listen(const std::string& host, int port) {
  tcp::resolver resolver(io_);
  error_code ec;
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec) return common::Error{"cannot resolve metrics host '" + host + "': " + ec.message()};
  std::string last = "no address to listen on for metrics";
  for (const auto& r : results) {
    tcp::acceptor acceptor = common::open_listener(io_, r.endpoint(), ec);
    if (ec) {
      last =
          "cannot listen for metrics on " + host + ":" + std::to_string(port) + ": " + ec.message();
      continue;
    }
    port_ = acceptor.local_endpoint().port();
    acceptor_ = std::move(acceptor);
    accepts_.start();
    return std::nullopt;
  }
  return common::Error{last};
}

void HttpServer::on_accepted(tcp::socket socket) {
  if (sessions_.size() >= limits_.max_sessions) {
    // At the limit, the connection that has waited longest for a request (a kept-alive client
    // between scrapes, or one that never sent one) makes room: idle connections cannot lock
    // out a scrape. When every session is busy answering, this one is not served.
    auto oldest = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
      if (it->second->waiting_since() &&
          (oldest == sessions_.end() ||
           *it->second->waiting_since() < *oldest->second->waiting_since()))
        oldest = it;
    if (oldest == sessions_.end()) {
      error_code ignored;
      socket.close(ignored);
      return;
    }
    oldest->second->close();  // its read completes aborted and finds it forgotten
    sessions_.erase(oldest);
  }
  const std::uint64_t id = next_session_++;
  auto session = std::make_shared<Session>(std::move(socket), *this, id);
  sessions_[id] = session;
  session->start();
}

void HttpServer::forget(std::uint64_t id) { sessions_.erase(id); }

void HttpServer::shutdown() {
  stopped_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  accepts_.stop();
  auto sessions = std::move(sessions_);
  sessions_.clear();
  for (auto& [id, session] : sessions) session->close();
}

}  // namespace ddprun::metrics
