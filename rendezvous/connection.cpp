#include "rendezvous/connection.h"

#include <utility>

#include "common/check.h"
#include "common/read_ready.h"
#include "rendezvous/endpoint.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

namespace ddprun::rdzv {

namespace asio = boost::asio;
using boost::system::error_code;

namespace ssl = asio::ssl;

namespace {

constexpr std::size_t kReadChunkBytes = 16384;
using ReadChunk = std::array<char, kReadChunkBytes>;

}  // namespace

struct FramedConnection::TlsStream {
  TlsStream(ConnectionSocket& socket, const TlsRole& role)
      : stream(socket, *role.context), server(role.server) {}
  ssl::stream<ConnectionSocket&> stream;
  bool server;
  /// TLS reads complete into their buffer some time after the socket's bytes arrived (the
  /// stream decrypts first), so each TLS connection keeps its own.
  ReadChunk chunk{};
};

namespace {

/// What a plain connection answers a TLS hello with, before it closes (on_read).
constexpr std::string_view kNoTlsHere = "ddprun: this side has no TLS\n";

/// What a TLS server answers a hello without TLS with, before it closes (start): a TLS alert
/// record (fatal, protocol_version), which the plain client recognises as TLS (looks_like_tls)
/// and reports at once, where a bare close would be retried until connect_timeout.
constexpr std::array<char, 7> kTlsAlert = {21, 3, 3, 0, 2, 2, 70};

/// True when a handshake failed because the peer's bytes were not TLS.
bool not_tls(const error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() &&
         ERR_GET_LIB(static_cast<unsigned long>(ec.value())) == ERR_LIB_SSL &&
         ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_WRONG_VERSION_NUMBER;
}

/// Why a TLS handshake failed, in OpenSSL's words where it gives them.
std::string handshake_error(const error_code& ec) {
  if (ec == asio::error::eof || ec == ssl::error::stream_truncated)
    return "the peer closed the connection during the TLS handshake (does it speak TLS, and "
           "does it accept this side's certificate?)";
  if (not_tls(ec))
    return "the peer answered without TLS (wrong version number): it has no TLS configured; "
           "configure TLS on both sides (docs/operations.md#tls)";
  std::string text = ec.message();
  if (ec.category() == asio::error::get_ssl_category()) {
    // "certificate verify failed (SSL routines)" reads better without the library's name.
    if (auto paren = text.find(" ("); paren != std::string::npos) text.resize(paren);
  }
  return text;
}

/// `socket`'s descriptor, in a socket bound to its io_context's executor.
ConnectionSocket own_socket(asio::ip::tcp::socket socket) {
  // target() points into the executor it is asked of: keep that one, not a temporary.
  const asio::any_io_executor any = socket.get_executor();
  const auto* executor = any.target<asio::io_context::executor_type>();
  DDPRUN_CHECK(executor != nullptr, "FramedConnection: the socket must run on an io_context");
  ConnectionSocket own(executor->context());
  if (!socket.is_open()) return own;
  error_code ec;
  // The family is all the protocol says of a TCP socket; a socket that has no local address
  // any more (it broke) reads as IPv4, which only matters to a later open().
  const auto local = socket.local_endpoint(ec);
  const asio::ip::tcp protocol = ec ? asio::ip::tcp::v4() : local.protocol();
  const int fd = socket.release(ec);
  if (ec) return own;  // released nothing: the connection starts closed and reads an error
  own.assign(protocol, fd, ec);
  if (ec) ::close(fd);
  return own;
}

}  // namespace

FramedConnection::FramedConnection(asio::ip::tcp::socket socket, std::optional<TlsRole> tls)
    : socket_(own_socket(std::move(socket))) {
  error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  peer_ = ec ? "?" : format_endpoint(remote.address().to_string(), remote.port());
  if (tls) {
    tls_ = std::make_unique<TlsStream>(socket_, *tls);
    if (!tls->server) {
      // The server's certificate must name the host the endpoint gave (a name or an address),
      // checked by OpenSSL during its verification so a mismatch is reported as such.
      SSL* ssl = tls_->stream.native_handle();
      error_code parse_ec;
      asio::ip::make_address(tls->host, parse_ec);
      if (parse_ec) {
        ::SSL_set1_host(ssl, tls->host.c_str());
        ::SSL_set_tlsext_host_name(ssl, tls->host.c_str());  // SNI, for names only
      } else {
        ::X509_VERIFY_PARAM_set1_ip_asc(::SSL_get0_param(ssl), tls->host.c_str());
      }
    }
  } else {
    handshaken_ = true;
  }
}

FramedConnection::~FramedConnection() = default;

std::string FramedConnection::client_close_reason(const std::string& why,
                                                  const std::string& tls_ca_option) const {
  if (bytes_received_ == 0 && !tls_)
    return "the server closed the connection without a hello (a program other than ddprun's "
           "rendezvous on that port, such as torchrun's store: give the endpoint another port; "
           "or a server with TLS, to a client without: give " +
           tls_ca_option + ")";
  return why.empty() ? "the server closed the connection" : why;
}

namespace {

/// A pair of handlers as a FramedConnection::Listener.
class HandlerPair final : public FramedConnection::Listener {
 public:
  HandlerPair(FramedConnection::MessageHandler on_message, FramedConnection::CloseHandler on_close)
      : on_message_(std::move(on_message)), on_close_(std::move(on_close)) {}
  void frame_received(std::uint64_t, const nlohmann::json& body) override { on_message_(body); }
  void connection_ended(std::uint64_t, const CloseReason& why) override {
    if (on_close_) on_close_(why);
  }

 private:
  FramedConnection::MessageHandler on_message_;
  FramedConnection::CloseHandler on_close_;
};

}  // namespace

void FramedConnection::start(MessageHandler on_message, CloseHandler on_close) {
  Extras& e = extras();
  e.own_listener = std::make_unique<HandlerPair>(std::move(on_message), std::move(on_close));
  start(*e.own_listener, 0);
}

void FramedConnection::start(Listener& listener, std::uint64_t tag) {
  listener_ = &listener;
  tag_ = tag;
  if (!tls_) return read_more();
  tls_->stream.async_handshake(
      tls_->server ? ssl::stream_base::server : ssl::stream_base::client,
      [self = shared_from_this()](error_code ec) {
        if (!self->open_) return;
        if (ec) {
          const bool tls_failed = ec.category() == asio::error::get_ssl_category();
          std::string why = handshake_error(ec);
          // Which check the peer's certificate failed ("hostname mismatch", "unable to get
          // local issuer certificate"), where OpenSSL's reason is only "verify failed".
          const long verified = ::SSL_get_verify_result(self->tls_->stream.native_handle());
          if (tls_failed && verified != X509_V_OK)
            why += " (" + std::string(::X509_verify_cert_error_string(verified)) + ")";
          if (self->tls_->server && not_tls(ec)) {
            error_code ignored;
            self->socket_.write_some(asio::buffer(kTlsAlert), ignored);
          }
          return self->end({tls_failed ? CloseKind::Tls : CloseKind::Io,
                            "TLS handshake with " + self->peer_ + " failed: " + why},
                           self->tls_->server);
        }
        self->handshaken_ = true;
        self->read_more();
        self->write_next();
      });
}

std::string FramedConnection::local_address() const {
  error_code ec;
  auto local = socket_.local_endpoint(ec);
  return ec ? std::string() : local.address().to_string();
}

void FramedConnection::read_more() {
  if (tls_) {
    tls_->stream.async_read_some(asio::buffer(tls_->chunk),
                                 [self = shared_from_this()](error_code ec, std::size_t n) {
                                   self->on_read(ec, std::string_view(self->tls_->chunk.data(), n));
                                 });
    return;
  }
  // Plain connections hold no buffer while idle, and the wait holds only the connection
  // (common/read_ready.h).
  socket_.async_wait(ConnectionSocket::wait_read, [self = shared_from_this()](error_code ec) {
    const bool read = common::read_ready(
        self->socket_, ec,
        [&self](error_code read_ec, std::string_view data) { self->on_read(read_ec, data); });
    if (!read) self->read_more();
  });
}

void FramedConnection::on_read(error_code ec, std::string_view data) {
  if (!open_) return;
  const std::size_t n = data.size();
  if (n > 0) {
    const bool first = bytes_received_ == 0;
    bytes_received_ += n;
    // A TLS record on a plain connection: the other side has TLS configured and this one not.
    // A line of plain text tells it so: its TLS reads it as a record of no TLS version
    // ("wrong version number"), a configuration error it reports at once, where a bare close
    // would look like a server that is restarting, retried until connect_timeout. The linger
    // keeps the unread rest of its hello from resetting the connection before the line is read.
    if (first && !tls_ && looks_like_tls(std::string(data.substr(0, 3)))) {
      error_code ignored;
      socket_.write_some(asio::buffer(kNoTlsHere), ignored);
      return end({CloseKind::Tls, peer_ + " speaks TLS and this side does not: configure TLS on "
                                          "both sides (docs/operations.md#tls)"},
                 true);
    }
    const std::size_t before = decoder_.buffered_bytes();
    decoder_.feed(data);
    account(before);
    while (open_) {
      const std::size_t held = decoder_.buffered_bytes();
      DecodeResult r = decoder_.next();
      account(held);
      if (r.status == DecodeStatus::NeedMore) break;
      if (r.status == DecodeStatus::Bad)
        return end({CloseKind::BadFrame, "bad frame from " + peer_ + ": " + r.error, r.error});
      listener_->frame_received(tag_, r.body);
    }
    // What stays buffered is an unfinished frame: over the group's cap, its owner decides whom
    // to close (perhaps this connection).
    if (open_ && budget_ && budget_->used > budget_->limit && budget_->over_limit)
      budget_->over_limit();
  }
  if (!open_) return;
  // Over TLS a peer that closes without TLS's close_notify ends with stream_truncated: an
  // orderly end all the same between whole frames (frames carry their own length).
  if (ec == asio::error::eof ||
      (ec == ssl::error::stream_truncated && decoder_.buffered_bytes() == 0))
    return end({});
  if (ec && ec.category() == asio::error::get_ssl_category()) {
    // After the handshake, as TLS 1.3 does it: the server refused this side's certificate.
    return end({CloseKind::Tls, "TLS with " + peer_ + " failed: " + handshake_error(ec)});
  }
  if (ec) return end({CloseKind::Io, ec.message()});
  read_more();
}

void FramedConnection::send(const nlohmann::json& body) {
  if (!open_ || close_when_written_ || over_write_limit_) return;
  std::string frame = encode_frame(body);
  if (!tls_ && handshaken_ && !writing_ && !queue_) {
    // Nothing waits before it: the socket takes it now, and only what it does not take is
    // queued. A server answering a round of 16,384 nodes then holds no frame per node while
    // it answers (docs/design.md#rendezvous-at-scale). A failed write is left to write_next's
    // handler, which ends the connection from the executor: never from inside send().
    error_code ec;
    socket_.non_blocking(true, ec);
    const std::size_t n = ec ? 0 : socket_.write_some(asio::buffer(frame), ec);
    if (!ec && n == frame.size()) return;
    frame.erase(0, ec ? 0 : n);
  }
  if (!queue_) queue_ = std::make_unique<WriteQueue>();
  queue_->bytes += frame.size();
  queue_->frames.push_back(std::move(frame));
  if (write_limit_ != 0 && queue_->bytes > write_limit_) {
    // Ended from the executor, not here: the caller may be walking its own sessions.
    const std::string why = std::to_string(queue_->bytes) + " bytes of replies to " + peer_ +
                            " wait unread, over the limit of " + std::to_string(write_limit_);
    drop_queued();
    over_write_limit_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this(), why] {
      self->end({CloseKind::WriteLimit, why});
    });
    return;
  }
  write_next();
}

void FramedConnection::write_next() {
  if (writing_ || !open_ || !handshaken_) return;
  if (!queue_) {
    if (close_when_written_) {
      error_code ignored;
      socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      close();
    }
    return;
  }
  writing_ = true;
  auto handler = [self = shared_from_this()](error_code ec, std::size_t) {
    self->writing_ = false;
    if (!self->open_) return;
    if (ec)
      return self->end({CloseKind::Io, "cannot write to " + self->peer_ + ": " + ec.message()});
    WriteQueue& queue = *self->queue_;
    queue.bytes -= queue.frames.front().size();
    queue.frames.pop_front();
    if (queue.frames.empty()) self->queue_.reset();
    self->write_next();
  };
  const std::string& frame = queue_->frames.front();
  if (tls_)
    asio::async_write(tls_->stream, asio::buffer(frame), std::move(handler));
  else
    asio::async_write(socket_, asio::buffer(frame), std::move(handler));
}

void FramedConnection::drop_queued() {
  if (!queue_) return;
  // The frame being written stays until its write ends: the socket reads from it.
  while (queue_->frames.size() > (writing_ ? 1U : 0U)) {
    queue_->bytes -= queue_->frames.back().size();
    queue_->frames.pop_back();
  }
  if (queue_->frames.empty()) queue_.reset();
}

void FramedConnection::close_after_writes(std::function<void()> closed) {
  if (!open_) {
    if (closed) asio::post(socket_.get_executor(), std::move(closed));
    return;
  }
  if (closed) extras().closed_after_writes = std::move(closed);
  close_when_written_ = true;
  write_next();
}

void FramedConnection::account(std::size_t before) {
  if (!budget_) return;
  const std::size_t after = decoder_.buffered_bytes();
  budget_->used = budget_->used + after - before;  // unsigned wrap-around cancels out
}

void FramedConnection::close() { shut(false); }

void FramedConnection::shut(bool linger) {
  if (!open_) return;
  open_ = false;
  drop_queued();
  if (budget_) budget_->used -= decoder_.buffered_bytes();
  budget_ = nullptr;
  error_code ignored;
  if (linger)
    linger_then_close();
  else
    socket_.close(ignored);
  // Handlers may hold their owner (or this connection): drop them to break any cycle. The
  // message handler may be the caller; it is destroyed once the read handler returns.
  listener_ = nullptr;
  if (extras_ && extras_->own_listener)
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->extras_->own_listener.reset(); });
  // Drained: whoever waits for the queued frames to go out (a shutting-down server) hears it
  // from the executor, so it may erase its own sessions then.
  if (extras_ && extras_->closed_after_writes)
    asio::post(socket_.get_executor(), std::exchange(extras_->closed_after_writes, nullptr));
}

void FramedConnection::end(CloseReason reason, bool linger) {
  if (!open_) return;
  Listener* listener = listener_;  // shut() forgets it, and frees an owned one only later
  shut(linger);
  if (listener) listener->connection_ended(tag_, reason);
}

void FramedConnection::linger_then_close() {
  // TLS 1.3 clients finish their side of the handshake before the server checks their
  // certificate, so their first frames may already be on the way when the server refuses
  // them. Closing with those bytes unread would reset the connection, and the reset can
  // overtake the alert that tells the client why. Instead: send FIN, read and drop what still
  // comes until the peer closes, for at most kLingerTime and kLingerBytes, then close.
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  auto timer = std::make_shared<asio::steady_timer>(socket_.get_executor());
  timer->expires_after(kLingerTime);
  timer->async_wait([self = shared_from_this()](error_code) {
    error_code ignored_too;
    self->socket_.close(ignored_too);
  });
  drain(std::move(timer), std::make_shared<ReadChunk>(), 0);
}

void FramedConnection::drain(std::shared_ptr<boost::asio::steady_timer> timer,
                             std::shared_ptr<std::array<char, 16384>> sink, std::size_t drained) {
  socket_.async_read_some(asio::buffer(*sink), [self = shared_from_this(), timer, sink, drained](
                                                   error_code ec, std::size_t n) {
    if (ec || drained + n > kLingerBytes) {
      timer->cancel();  // its handler closes the socket
      return;
    }
    self->drain(timer, sink, drained + n);
  });
}

void tune_socket(asio::ip::tcp::socket& socket, std::chrono::milliseconds user_timeout) {
  error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  socket.set_option(asio::socket_base::keep_alive(true), ignored);
  const int fd = socket.native_handle();
  const unsigned timeout = static_cast<unsigned>(user_timeout.count());
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof(timeout));
  const int idle = std::max(1, static_cast<int>(user_timeout.count() / 3000));
  const int count = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

}  // namespace ddprun::rdzv
