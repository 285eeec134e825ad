#include "etcd/client.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "rendezvous/endpoint.h"
#include "rendezvous/openssl_loader.h"

namespace ddprun::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using common::Error;

std::string Member::text() const { return rdzv::format_endpoint(host, port); }

common::Result<std::vector<Member>> parse_members(const std::string& endpoints) {
  // The gateway's keys and values are base64, OpenSSL's.
  if (auto error = rdzv::load_openssl("the etcd backend")) return *error;
  std::vector<Member> out;
  std::size_t start = 0;
  while (start <= endpoints.size()) {
    const std::size_t comma = endpoints.find(',', start);
    const std::string entry =
        endpoints.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    // A member's client URL, as etcd's --advertise-client-urls and etcdctl write it.
    std::string address = entry;
    if (address.rfind("https://", 0) == 0)
      return Error{"etcd endpoint \"" + entry + "\": give it as " + address.substr(8) +
                   " with --rdzv_conf tls_ca=FILE (the CA of etcd's certificate): TLS follows "
                   "from tls_ca"};
    if (address.rfind("http://", 0) == 0) address = address.substr(7);
    if (!address.empty() && address.back() == '/') address.pop_back();
    auto parsed = rdzv::parse_endpoint(address, 2379);
    if (!parsed || parsed->second == 0)
      return Error{"etcd endpoint \"" + entry +
                   "\": expected host:port, [ipv6]:port or host (port 2379), separated by commas"};
    out.push_back(Member{parsed->first, parsed->second});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

common::Result<Credentials> read_credentials(const std::string& user,
                                             const std::string& password_file) {
  const std::string what = "--rdzv_conf etcd_password_file=" + password_file;
  if (user.empty()) return Error{"--rdzv_conf etcd_password_file needs etcd_user (the etcd user)"};
  struct stat st {};
  if (::stat(password_file.c_str(), &st) != 0)
    return Error{what + ": " + std::strerror(errno) + "; give a file holding etcd_user's password"};
  if (!S_ISREG(st.st_mode)) return Error{what + ": not a regular file"};
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return Error{what + " is readable by group or others (mode " + mode + "): run chmod 600 " +
                 password_file};
  }
  std::ifstream in(password_file, std::ios::binary);
  if (!in) return Error{what + ": " + std::strerror(errno)};
  std::ostringstream content;
  content << in.rdbuf();
  std::string password = content.str();
  while (!password.empty() && std::isspace(static_cast<unsigned char>(password.back())))
    password.pop_back();
  if (password.empty()) return Error{what + " is empty: write etcd_user's password in it"};
  return Credentials{user, std::move(password)};
}

namespace {

/// A socket error in words a user reads.
std::string describe(const error_code& ec) {
  if (ec == asio::error::connection_refused) return "connection refused";
  if (ec == asio::error::eof || ec == http::error::end_of_stream)
    return "the member closed the connection";
  if (ec == asio::error::connection_reset) return "connection reset";
  if (ec == http::error::partial_message) return "the member closed the stream";
  return ec.message();
}

/// True when the member closed an idle connection (it timed it out, or died): sending on it
/// would fail after the request left, when nobody can tell whether it was applied. A peek that
/// does not block: an idle connection has nothing to read unless the peer closed it.
bool peer_closed(tcp::socket& socket) {
  char byte = 0;
  const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/// gRPC metadata through the gateway: a member without a leader answers "no leader" at once
/// instead of waiting, and ends watch streams when it loses its leader, so the client moves to
/// a member that has one.
constexpr const char* kRequireLeader = "Grpc-Metadata-hasleader";

}  // namespace

/// One connection to one member: a socket, and TLS over it when configured.
struct Client::Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  std::unique_ptr<ssl::stream<tcp::socket&>> tls;
  beast::flat_buffer buffer;
  std::size_t member = 0;

  template <typename F>
  void with(F&& f) {
    if (tls)
      f(*tls);
    else
      f(socket);
  }
  void close() {
    error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }
};

/// One call: the request, its handler, its deadline and the members tried so far.
struct Client::Call {
  Request request;
  ReplyHandler handler;
  Clock::time_point deadline;
  std::size_t tried = 0;  ///< members tried in this sweep
  std::vector<std::string> failures;
  bool reauthenticated = false;
  bool internal_auth = false;              ///< the authenticate call itself: sent without a token
  std::shared_ptr<Connection> connection;  ///< the attempt's, for close()
  std::unique_ptr<asio::steady_timer> timer;
  bool done = false;
};

Client::Client(asio::io_context& io, ClientSettings settings)
    : io_(io), settings_(std::move(settings)), idle_(settings_.members.size()) {}

Client::~Client() = default;

void Client::call(Request request, ReplyHandler handler) {
  auto call = std::make_shared<Call>();
  call->request = std::move(request);
  call->handler = std::move(handler);
  call->deadline = Clock::now() + settings_.request_timeout;
  if (closed_ || settings_.members.empty()) {
    asio::post(io_, [call] { call->handler(Error{"etcd client: closed"}); });
    return;
  }
  in_flight_.insert(call);
  start(call);
}

void Client::start(const std::shared_ptr<Call>& call) {
  if (settings_.credentials && token_.empty() && !call->internal_auth)
    return authenticate_then(call);
  attempt(call);
}

void Client::authenticate_then(const std::shared_ptr<Call>& call) {
  waiting_for_token_.push_back(call);
  if (authenticating_) return;
  authenticating_ = true;
  auto auth = std::make_shared<Call>();
  auth->request = authenticate(settings_.credentials->user, settings_.credentials->password);
  auth->internal_auth = true;
  auth->deadline = Clock::now() + settings_.request_timeout;
  auth->handler = [this, self = shared_from_this()](Reply reply) {
    authenticating_ = false;
    auto waiting = std::move(waiting_for_token_);
    waiting_for_token_.clear();
    std::optional<Error> failed;
    if (!reply) {
      failed = Error{"etcd authentication as " + settings_.credentials->user +
                     " failed: " + reply.error().message};
    } else if (auto decoded = decode_authenticate(*reply); !decoded) {
      failed = decoded.error();
    } else {
      token_ = decoded->token;
    }
    for (const auto& call : waiting) {
      if (call->done) continue;
      if (failed)
        finish(call, *failed);
      else
        attempt(call);
    }
  };
  in_flight_.insert(auth);
  attempt(auth);
}

std::shared_ptr<Client::Connection> Client::take_idle(std::size_t member) {
  auto& pool = idle_[member];
  while (!pool.empty()) {
    auto c = std::move(pool.back());
    pool.pop_back();
    if (c->socket.is_open() && !peer_closed(c->socket)) return c;
    c->close();
  }
  return nullptr;
}

void Client::connect(std::size_t member, Clock::time_point deadline,
                     std::function<void(std::shared_ptr<Connection>, std::string)> done) {
  auto connection = std::make_shared<Connection>(io_);
  connection->member = member;
  const Member& m = settings_.members[member];
  auto resolver = std::make_shared<tcp::resolver>(io_);
  auto timer = std::make_shared<asio::steady_timer>(io_, deadline);
  auto finished = std::make_shared<bool>(false);
  timer->async_wait([resolver, connection, finished](error_code ec) {
    if (ec || *finished) return;
    resolver->cancel();
    connection->close();
  });
  auto complete = [timer, finished, done = std::move(done)](std::shared_ptr<Connection> c,
                                                            std::string why) {
    if (*finished) return;
    *finished = true;
    timer->cancel();
    done(std::move(c), std::move(why));
  };
  resolver->async_resolve(
      m.host, std::to_string(m.port),
      [this, self = shared_from_this(), resolver, connection, complete, timer, member](
          error_code ec, tcp::resolver::results_type results) {
        if (ec)
          return complete(nullptr, timer->expiry() <= Clock::now()
                                       ? "connection timed out"
                                       : "cannot resolve the host: " + describe(ec));
        asio::async_connect(
            connection->socket, results,
            [this, self, connection, complete, timer, member](error_code ec, const tcp::endpoint&) {
              if (ec)
                return complete(nullptr, timer->expiry() <= Clock::now() ? "connection timed out"
                                                                         : describe(ec));
              error_code ignored;
              connection->socket.set_option(tcp::no_delay(true), ignored);
              connection->socket.set_option(asio::socket_base::keep_alive(true), ignored);
              if (!settings_.tls) return complete(connection, "");
              connection->tls =
                  std::make_unique<ssl::stream<tcp::socket&>>(connection->socket, *settings_.tls);
              const std::string& host = settings_.members[member].host;
              SSL* native = connection->tls->native_handle();
              error_code parse_ec;
              asio::ip::make_address(host, parse_ec);
              if (parse_ec) {
                ::SSL_set1_host(native, host.c_str());
                ::SSL_set_tlsext_host_name(native, host.c_str());
              } else {
                ::X509_VERIFY_PARAM_set1_ip_asc(::SSL_get0_param(native), host.c_str());
              }
              connection->tls->async_handshake(
                  ssl::stream_base::client, [connection, complete](error_code ec) {
                    if (!ec) return complete(connection, "");
                    std::string why = "TLS handshake failed: " + ec.message();
                    const long verified = ::SSL_get_verify_result(connection->tls->native_handle());
                    if (verified != X509_V_OK)
                      why += " (" + std::string(::X509_verify_cert_error_string(verified)) + ")";
                    complete(nullptr, why);
                  });
            });
      });
}

void Client::attempt(const std::shared_ptr<Call>& call) {
  if (call->done) return;
  if (closed_) return finish(call, Error{"etcd client: closed"});
  const auto now = Clock::now();
  if (now >= call->deadline) {
    std::string why = "etcd: no answer within " +
                      std::to_string(settings_.request_timeout.count()) + " ms to " +
                      call->request.path;
    for (std::size_t i = 0; i < call->failures.size(); ++i)
      why += (i == 0 ? " (" : "; ") + call->failures[i];
    if (!call->failures.empty()) why += ")";
    return finish(call, Error{why});
  }
  const std::size_t member = current_;
  const auto attempt_time = call->request.attempt_timeout.count() > 0
                                ? std::min(call->request.attempt_timeout, settings_.attempt_timeout)
                                : settings_.attempt_timeout;
  const auto attempt_deadline = std::min(call->deadline, now + attempt_time);

  auto send = [this, self = shared_from_this(), call, member, attempt_deadline](
                  std::shared_ptr<Connection> connection, bool reused) {
    if (call->done) {
      if (connection) connection->close();
      return;
    }
    call->connection = connection;
    call->timer = std::make_unique<asio::steady_timer>(io_, attempt_deadline);
    call->timer->async_wait([call, connection](error_code ec) {
      if (!ec && !call->done) connection->close();
    });
    auto request = std::make_shared<http::request<http::string_body>>(http::verb::post,
                                                                      call->request.path, 11);
    request->set(http::field::host, settings_.members[member].text());
    request->set(http::field::content_type, "application/json");
    if (!token_.empty() && !call->internal_auth) request->set(http::field::authorization, token_);
    request->set(kRequireLeader, "true");
    request->keep_alive(true);
    request->body() = call->request.body;
    request->prepare_payload();
    connection->with([&](auto& stream) {
      http::async_write(
          stream, *request,
          [this, self, call, member, connection, request, reused, &stream](error_code ec,
                                                                           std::size_t) {
            if (call->done) return;
            if (ec) {
              // Nothing was answered; a reused connection the member closed while idle is
              // the usual case, and the request was not read: safe to send elsewhere.
              const bool late = call->timer->expiry() <= Clock::now();
              return on_attempt_failed(call, member, false,
                                       late ? "timed out sending the request" : describe(ec), late);
            }
            auto parser = std::make_shared<http::response_parser<http::string_body>>();
            parser->body_limit(settings_.max_response_bytes);
            http::async_read(
                stream, connection->buffer, *parser,
                [this, self, call, member, connection, parser, reused](error_code ec, std::size_t) {
                  if (call->done) return;
                  if (ec) {
                    // Sent: a put or a txn may have been applied even on a reused connection
                    // (idle ones the member closed were dropped before sending).
                    const bool late = call->timer->expiry() <= Clock::now();
                    std::string why = late ? "no answer within the attempt's time" : describe(ec);
                    // etcd closes a plain connection to its TLS port without a byte.
                    if (!settings_.tls && !reused && !parser->got_some() &&
                        ec == http::error::end_of_stream)
                      why += " without answering (if the member serves TLS, give tls_ca)";
                    return on_attempt_failed(call, member, true, why, late);
                  }
                  call->timer->cancel();
                  auto& response = parser->get();
                  on_answer(call, member, connection, response.result_int(), response.body(),
                            response.keep_alive());
                });
          });
    });
  };

  if (auto idle = take_idle(member)) return send(std::move(idle), true);
  connect(member, attempt_deadline,
          [this, self = shared_from_this(), call, member, send](std::shared_ptr<Connection> c,
                                                                std::string why) {
            if (call->done) {
              if (c) c->close();
              return;
            }
            if (!c)
              return on_attempt_failed(call, member, false, why, why == "connection timed out");
            send(std::move(c), false);
          });
}

void Client::on_attempt_failed(const std::shared_ptr<Call>& call, std::size_t member, bool sent,
                               const std::string& why, bool timed_out) {
  if (closed_) return finish(call, Error{"etcd client: closed"});
  if (call->connection) call->connection->close();
  call->connection.reset();
  if (call->timer) call->timer->cancel();
  const std::string text = settings_.members[member].text() + ": " + why;
  if (timed_out) {
    // A member that holds requests silently (stopped, overloaded): the next call, and every
    // watch stream on it, go to the next member, even when this call cannot be sent again.
    if (current_ == member) current_ = (member + 1) % settings_.members.size();
    leave_member(member, why);
  }
  if (sent && !call->request.idempotent) {
    // It may have been applied: sending it again could apply it twice (a txn would then fail
    // its compare and report the wrong outcome).
    return finish(call, Error{"etcd " + text + " after " + call->request.path +
                              " was sent: outcome unknown; read the keys to learn whether it "
                              "was applied"});
  }
  call->failures.push_back(text);
  // Failover: the next call starts on the next member too, so a dead member costs one attempt.
  if (current_ == member) current_ = (member + 1) % settings_.members.size();
  if (++call->tried >= settings_.members.size()) {
    std::string all =
        "etcd: every member failed (" + std::to_string(settings_.members.size()) + "): ";
    for (std::size_t i = 0; i < call->failures.size(); ++i)
      all += (i == 0 ? "" : "; ") + call->failures[i];
    return finish(call, Error{all + "; check that etcd runs at --rdzv_endpoint"});
  }
  attempt(call);
}

void Client::on_answer(const std::shared_ptr<Call>& call, std::size_t member,
                       std::shared_ptr<Connection> connection, unsigned status,
                       const std::string& body, bool keep_alive) {
  if (keep_alive && idle_[member].size() < settings_.max_idle_per_member && !closed_)
    idle_[member].push_back(connection);
  else
    connection->close();
  call->connection.reset();
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_discarded()) {
    parsed = nlohmann::json::object();
    if (body.find("HTTPS server") != std::string::npos)  // Go's answer on a TLS port
      return finish(call, Error{"etcd " + settings_.members[member].text() +
                                " serves TLS: give tls_ca (and tls_cert, tls_key if it asks "
                                "for client certificates)"});
    if (status == 200)
      return finish(call, Error{"etcd " + settings_.members[member].text() + ": " +
                                call->request.path + " answered with text that is not JSON"});
  }
  if (auto error = error_of(status, parsed)) {
    const std::string text = settings_.members[member].text() + ": " + error->message + " (code " +
                             std::to_string(error->code) + ")";
    if (token_refused(*error) && settings_.credentials && !call->internal_auth &&
        !call->reauthenticated) {
      // Tokens expire and a simple token is known only to the member that issued it.
      call->reauthenticated = true;
      token_.clear();
      return authenticate_then(call);
    }
    const bool not_applied = error->message.find("no leader") != std::string::npos ||
                             error->message.find("not capable") != std::string::npos ||
                             error->message.find("stopped") != std::string::npos;
    if (retry_elsewhere(*error) && (call->request.idempotent || not_applied)) {
      call->failures.push_back(text);
      if (current_ == member) current_ = (member + 1) % settings_.members.size();
      if (++call->tried < settings_.members.size()) return attempt(call);
    }
    return finish(call, Error{"etcd " + text});
  }
  finish(call, std::move(parsed));
}

void Client::finish(const std::shared_ptr<Call>& call, Reply reply) {
  if (call->done) return;
  call->done = true;
  if (call->timer) call->timer->cancel();
  in_flight_.erase(call);
  auto handler = std::move(call->handler);
  handler(std::move(reply));
}

void Client::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& pool : idle_) {
    for (auto& c : pool) c->close();
    pool.clear();
  }
  // Out of in_flight_ now, not when the posted finish() runs: a call's handler may hold what
  // holds this client (a LeaseKeeper renewing), and an io_context that never runs again after
  // close() (the agent's exit) would otherwise leave that cycle behind.
  auto calls = std::exchange(in_flight_, {});
  for (const auto& call : calls) {
    if (call->connection) call->connection->close();
    // finish() may start nothing new: closed_ is set.
    asio::post(io_, [self = shared_from_this(), call] {
      self->finish(call, Error{"etcd client: closed"});
    });
  }
  waiting_for_token_.clear();
  for (auto& w : watches_)
    if (auto watch = w.lock()) watch->cancel();
  watches_.clear();
}

std::shared_ptr<Watch> Client::watch(WatchOptions options,
                                     std::function<void(const WatchResponse&)> on_response,
                                     std::function<void(const common::Error&)> on_end,
                                     std::function<void(const std::string&)> on_notice) {
  auto w = std::make_shared<Watch>(shared_from_this(), std::move(options), std::move(on_response),
                                   std::move(on_end), std::move(on_notice));
  std::erase_if(watches_, [](const std::weak_ptr<Watch>& old) { return old.expired(); });
  watches_.push_back(w);
  w->start();
  return w;
}

// ---- Watch ---------------------------------------------------------------------------------

/// One watch stream: its connection, the HTTP response parser and the JSON cutter.
struct Watch::Stream {
  Stream(std::size_t max_message) : decoder(max_message) {}
  std::shared_ptr<Client::Connection> connection;
  http::request<http::string_body> request;
  http::response_parser<http::string_body> parser;
  JsonStreamDecoder decoder;
  std::vector<nlohmann::json> pending;  ///< messages cut from the last chunk, not yet handled
  std::string error;                    ///< the decoder's, set in the chunk callback
  std::function<std::size_t(std::uint64_t, beast::string_view, error_code&)> on_chunk;
  std::unique_ptr<asio::steady_timer> created_deadline;  ///< until etcd confirms the watch
  bool closed = false;
};

void Client::leave_member(std::size_t member, const std::string& why) {
  const auto watches = watches_;  // on_broken's notice may open another watch
  for (const auto& weak : watches) {
    auto watch = weak.lock();
    if (!watch || watch->ended_ || watch->member_ != member || !watch->stream_ ||
        watch->stream_->closed)
      continue;
    watch->on_broken("a request to the same member failed: " + why);
  }
}

Watch::Watch(std::shared_ptr<Client> client, WatchOptions options,
             std::function<void(const WatchResponse&)> on_response,
             std::function<void(const common::Error&)> on_end,
             std::function<void(const std::string&)> on_notice)
    : client_(std::move(client)),
      options_(std::move(options)),
      on_response_(std::move(on_response)),
      on_end_(std::move(on_end)),
      on_notice_(std::move(on_notice)),
      next_revision_(options_.start_revision),
      member_(client_->current_),
      retry_timer_(client_->io_) {}

Watch::~Watch() = default;

void Watch::start() { open(); }

void Watch::cancel() {
  if (ended_) return;
  end(Error{"etcd watch: cancelled"});
}

void Watch::end(Error error) {
  if (ended_) return;
  ended_ = true;
  retry_timer_.cancel();
  if (stream_) {
    stream_->closed = true;
    if (stream_->connection) stream_->connection->close();
  }
  auto on_end = std::move(on_end_);
  asio::post(client_->io_, [on_end, error] {
    if (on_end) on_end(error);
  });
}

void Watch::renew_token_and_open() {
  if (stream_) {
    stream_->closed = true;
    if (stream_->connection) stream_->connection->close();
  }
  client_->token_.clear();
  // Any call authenticates first; the stream opens with the new token.
  client_->call(member_status(), [self = shared_from_this()](Reply reply) {
    if (self->ended_) return;
    if (self->client_->token_.empty())
      return self->on_broken(reply ? "no token" : reply.error().message);
    self->open();
  });
}

void Watch::open() {
  if (ended_) return;
  if (client_->closed_) return end(Error{"etcd watch: the client was closed"});
  if (client_->settings_.credentials && client_->token_.empty()) {
    // Without a token etcd would cancel the watch as denied.
    client_->call(member_status(), [self = shared_from_this()](Reply reply) {
      if (self->ended_) return;
      if (self->client_->token_.empty())
        return self->on_broken(reply ? "no token" : reply.error().message);
      self->open();
    });
    return;
  }
  auto stream = std::make_shared<Stream>(client_->settings_.max_watch_message_bytes);
  stream_ = stream;
  WatchOptions options = options_;
  options.start_revision = next_revision_;
  const std::size_t member = member_;
  const auto deadline = Clock::now() + client_->settings_.attempt_timeout;
  client_->connect(
      member, deadline,
      [self = shared_from_this(), stream, options, member](std::shared_ptr<Client::Connection> c,
                                                           std::string why) {
        if (stream->closed || self->ended_) {
          if (c) c->close();
          return;
        }
        if (!c) return self->on_broken(why);
        stream->connection = c;
        auto& client = *self->client_;
        // A member that accepts the connection but never answers (stopped, overloaded) must not
        // hold the watch: etcd confirms a watch at once, so no confirmation is a failure.
        stream->created_deadline = std::make_unique<asio::steady_timer>(
            client.io_, Clock::now() + client.settings_.attempt_timeout);
        stream->created_deadline->async_wait([self, stream](error_code ec) {
          if (ec || stream->closed || self->ended_) return;
          self->on_broken("not confirmed within the attempt's time");
        });
        stream->request = {http::verb::post, "/v3/watch", 11};
        stream->request.set(http::field::host, client.settings_.members[member].text());
        stream->request.set(http::field::content_type, "application/json");
        stream->request.set(kRequireLeader, "true");
        if (!client.token_.empty()) stream->request.set(http::field::authorization, client.token_);
        stream->request.keep_alive(true);
        stream->request.body() = watch_create(options).body;
        stream->request.prepare_payload();
        stream->parser.body_limit(boost::none);
        // The stream's bytes go through the decoder as chunks arrive, never into the body. Beast
        // keeps a reference to the callback: it lives in the Stream, beside the parser.
        stream->on_chunk = [raw = stream.get()](std::uint64_t, beast::string_view body,
                                                error_code& ec) -> std::size_t {
          auto objects = raw->decoder.feed(std::string(body.data(), body.size()));
          if (!objects) {
            raw->error = objects.error().message;
            ec = http::error::bad_chunk;
            return body.size();
          }
          for (auto& o : *objects) raw->pending.push_back(std::move(o));
          return body.size();
        };
        stream->parser.on_chunk_body(stream->on_chunk);
        c->with([&](auto& s) {
          http::async_write(s, stream->request, [self, stream, &s](error_code ec, std::size_t) {
            if (stream->closed || self->ended_) return;
            if (ec) return self->on_broken(describe(ec));
            http::async_read_header(
                s, stream->connection->buffer, stream->parser,
                [self, stream, &s](error_code ec, std::size_t) {
                  if (stream->closed || self->ended_) return;
                  if (ec) return self->on_broken(describe(ec));
                  if (stream->parser.get().result_int() != 200) {
                    // An error answer: read it whole (it is small) and report it.
                    return http::async_read(
                        s, stream->connection->buffer, stream->parser,
                        [self, stream](error_code, std::size_t) {
                          if (stream->closed || self->ended_) return;
                          auto body =
                              nlohmann::json::parse(stream->parser.get().body(), nullptr, false);
                          if (body.is_discarded()) body = nlohmann::json::object();
                          auto error = error_of(stream->parser.get().result_int(), body);
                          self->on_broken(error ? error->message : "watch refused");
                        });
                  }
                  self->read_stream(stream);
                });
          });
        });
      });
}

void Watch::read_stream(const std::shared_ptr<Stream>& stream) {
  // A member function rather than a self-capturing lambda: a handler destroyed without running
  // (the io_context ends first) then leaves no cycle behind.
  stream->connection->with([&](auto& s) {
    http::async_read_some(s, stream->connection->buffer, stream->parser,
                          [self = shared_from_this(), stream](error_code ec, std::size_t) {
                            self->on_stream_read(stream, ec);
                          });
  });
}

void Watch::on_stream_read(const std::shared_ptr<Stream>& stream, error_code ec) {
  if (stream->closed || ended_) return;
  auto pending = std::move(stream->pending);
  stream->pending.clear();
  for (const auto& message : pending) {
    on_message(message);
    if (stream->closed || ended_) return;
  }
  if (ec || stream->parser.is_done()) {
    return on_broken(!stream->error.empty() ? stream->error
                     : ec                   ? describe(ec)
                                            : "the stream ended");
  }
  read_stream(stream);
}

void Watch::on_message(const nlohmann::json& message) {
  if (auto error = error_of(200, message)) {
    if (token_refused(*error) && client_->settings_.credentials && !reauthenticated_) {
      reauthenticated_ = true;
      return renew_token_and_open();
    }
    return on_broken(error->message);
  }
  auto decoded = decode_watch(message);
  if (!decoded) return on_broken(decoded.error().message);
  const WatchResponse& r = *decoded;
  if (r.canceled) {
    // An expired token (or one another member issued) shows as a denied watch: renew it once.
    if (r.cancel_reason.find("permission denied") != std::string::npos &&
        client_->settings_.credentials && !reauthenticated_) {
      reauthenticated_ = true;
      return renew_token_and_open();
    }
    if (r.compact_revision != 0) {
      return end(Error{"etcd watch: revision " + std::to_string(next_revision_) +
                       " was compacted (the oldest kept is " + std::to_string(r.compact_revision) +
                       "): read the keys again and watch from the revision of that read"});
    }
    return end(Error{"etcd watch: cancelled by etcd" +
                     (r.cancel_reason.empty() ? std::string() : ": " + r.cancel_reason)});
  }
  if (r.created) {
    if (stream_ && stream_->created_deadline) stream_->created_deadline->cancel();
    backoff_ = std::chrono::milliseconds(50);
    reauthenticated_ = false;
    // A watch from "now" sees every change after the revision it was created at.
    if (next_revision_ == 0) next_revision_ = r.header.revision + 1;
  }
  if (!r.events.empty()) {
    next_revision_ = r.events.back().kv.mod_revision + 1;
  } else if (!r.created && r.header.revision + 1 > next_revision_) {
    next_revision_ = r.header.revision + 1;  // a progress notice: all up to here was sent
  }
  if (on_response_) on_response_(r);
}

void Watch::on_broken(const std::string& why) {
  if (ended_) return;
  if (stream_) {
    stream_->closed = true;
    if (stream_->connection) stream_->connection->close();
  }
  const std::size_t n = client_->settings_.members.size();
  const std::string from = client_->settings_.members[member_].text();
  member_ = (member_ + 1) % n;
  if (on_notice_) {
    on_notice_("etcd watch on " + from + " broke (" + why + "); resuming on " +
               client_->settings_.members[member_].text() +
               (next_revision_ != 0 ? " from revision " + std::to_string(next_revision_) : ""));
  }
  retry_timer_.expires_after(backoff_);
  backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(2000));
  retry_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->ended_) return;
    self->open();
  });
}

// ---- LeaseKeeper ---------------------------------------------------------------------------

LeaseKeeper::LeaseKeeper(std::shared_ptr<Client> client, std::int64_t lease,
                         std::chrono::seconds ttl,
                         std::function<void(const common::Error&)> on_lost)
    : client_(std::move(client)),
      lease_(lease),
      ttl_(ttl),
      on_lost_(std::move(on_lost)),
      timer_(client_->io_),
      last_ok_(Clock::now()) {}

void LeaseKeeper::start() { tick(); }

void LeaseKeeper::stop() {
  stopped_ = true;
  timer_.cancel();
}

void LeaseKeeper::tick() {
  if (stopped_) return;
  Request renew = lease_keepalive(lease_);
  // A member that holds the keep-alive silently must not outlast the lease: a third of the TTL
  // per attempt leaves time to renew on another member.
  renew.attempt_timeout = std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(ttl_) / 3,
      std::chrono::milliseconds(500));
  client_->call(std::move(renew), [self = shared_from_this()](Reply reply) {
    if (self->stopped_) return;
    std::optional<std::string> lost;
    if (reply) {
      auto decoded = decode_lease_keepalive(*reply);
      if (decoded && decoded->ttl > 0) {
        self->last_ok_ = Clock::now();
        ++self->renewals_;
      } else if (decoded) {
        self->gone_ = true;
        lost = "etcd lease " + std::to_string(self->lease_) + " expired or was revoked";
      } else {
        lost = decoded.error().message;
      }
    } else if (Clock::now() - self->last_ok_ >= self->ttl_) {
      lost = "etcd lease " + std::to_string(self->lease_) + " not renewed for its TTL (" +
             std::to_string(self->ttl_.count()) + " s): " + reply.error().message;
    }
    if (lost) {
      self->stopped_ = true;
      if (self->on_lost_) self->on_lost_(Error{*lost});
      return;
    }
    // A renewal that failed (every member tried, or no leader during an election) is tried
    // again soon: waiting another third of the TTL could let the lease run out.
    const auto third = std::max<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(self->ttl_) / 3,
        std::chrono::milliseconds(100));
    self->timer_.expires_after(reply ? third : std::min(third, std::chrono::milliseconds(200)));
    self->timer_.async_wait([self](error_code ec) {
      if (!ec) self->tick();
    });
  });
}

}  // namespace ddprun::etcd
