#include "rendezvous/connection.h"

#include "rendezvous/endpoint.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

namespace ddprun::rdzv {

namespace asio = boost::asio;
using boost::system::error_code;

FramedConnection::FramedConnection(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {
  error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  peer_ = ec ? "?" : format_endpoint(remote.address().to_string(), remote.port());
}

void FramedConnection::start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  read_more();
}

std::string FramedConnection::local_address() const {
  error_code ec;
  auto local = socket_.local_endpoint(ec);
  return ec ? std::string() : local.address().to_string();
}

void FramedConnection::read_more() {
  socket_.async_read_some(
      asio::buffer(chunk_), [self = shared_from_this()](error_code ec, std::size_t n) {
        if (!self->open_) return;
        if (n > 0) {
          self->bytes_received_ += n;
          const std::size_t before = self->decoder_.buffered_bytes();
          self->decoder_.feed(std::string_view(self->chunk_.data(), n));
          self->account(before);
          while (self->open_) {
            const std::size_t held = self->decoder_.buffered_bytes();
            DecodeResult r = self->decoder_.next();
            self->account(held);
            if (r.status == DecodeStatus::NeedMore) break;
            if (r.status == DecodeStatus::Bad)
              return self->end("bad frame from " + self->peer_ + ": " + r.error);
            self->on_message_(r.body);
          }
          // What stays buffered is an unfinished frame: over the group's cap, its owner
          // decides whom to close (perhaps this connection).
          if (self->open_ && self->budget_ && self->budget_->used > self->budget_->limit &&
              self->budget_->over_limit)
            self->budget_->over_limit();
        }
        if (!self->open_) return;
        if (ec == asio::error::eof) return self->end("");
        if (ec) return self->end(ec.message());
        self->read_more();
      });
}

void FramedConnection::send(const nlohmann::json& body) {
  if (!open_ || close_when_written_) return;
  writes_.push_back(encode_frame(body));
  queued_bytes_ += writes_.back().size();
  if (write_limit_ != 0 && queued_bytes_ > write_limit_) {
    // Ended from the executor, not here: the caller may be walking its own sessions.
    const std::string why = std::to_string(queued_bytes_) + " bytes of replies to " + peer_ +
                            " wait unread, over the limit of " + std::to_string(write_limit_);
    writes_.clear();
    queued_bytes_ = 0;
    close_when_written_ = true;  // nothing more is queued
    asio::post(socket_.get_executor(), [self = shared_from_this(), why] { self->end(why); });
    return;
  }
  write_next();
}

void FramedConnection::write_next() {
  if (writing_ || !open_) return;
  if (writes_.empty()) {
    if (close_when_written_) {
      error_code ignored;
      socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      close();
    }
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(writes_.front()),
                    [self = shared_from_this()](error_code ec, std::size_t) {
                      self->writing_ = false;
                      if (!self->open_) return;
                      if (ec)
                        return self->end("cannot write to " + self->peer_ + ": " + ec.message());
                      self->queued_bytes_ -= self->writes_.front().size();
                      self->writes_.pop_front();
                      self->write_next();
                    });
}

void FramedConnection::close_after_writes() {
  close_when_written_ = true;
  write_next();
}

void FramedConnection::account(std::size_t before) {
  if (!budget_) return;
  const std::size_t after = decoder_.buffered_bytes();
  budget_->used = budget_->used + after - before;  // unsigned wrap-around cancels out
}

void FramedConnection::close() {
  if (!open_) return;
  open_ = false;
  writes_.clear();
  queued_bytes_ = 0;
  if (budget_) budget_->used -= decoder_.buffered_bytes();
  budget_ = nullptr;
  error_code ignored;
  socket_.close(ignored);
  // Handlers may hold their owner (or this connection): drop them to break any cycle. The
  // message handler may be the caller; it is destroyed once the read handler returns.
  on_close_ = nullptr;
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->on_message_ = nullptr; });
}

void FramedConnection::end(const std::string& why) {
  if (!open_) return;
  auto handler = std::move(on_close_);
  on_close_ = nullptr;
  close();
  if (handler) handler(why);
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
