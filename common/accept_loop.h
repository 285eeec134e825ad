#pragma once
// The accept loop of every server in ddprun (the rendezvous server, the agent's store, the
// metrics and status HTTP server): accept a connection, hand its socket to the owner, accept the
// next. A failed accept (out of descriptors, most often) goes to the owner, which decides what to
// shed and what to log, and accepting pauses for `retry` instead of spinning on the same error.
#include <fcntl.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <utility>

namespace ddprun::common {

/// A listening acceptor on `endpoint`: close-on-exec (no worker inherits it), with address reuse,
/// and serving IPv4 too on the unspecified IPv6 address. `ec` says why not.
inline boost::asio::ip::tcp::acceptor open_listener(boost::asio::io_context& io,
                                                    const boost::asio::ip::tcp::endpoint& endpoint,
                                                    boost::system::error_code& ec) {
  boost::asio::ip::tcp::acceptor acceptor(io);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
  if (!ec && endpoint.address().is_v6() && endpoint.address().is_unspecified())
    acceptor.set_option(boost::asio::ip::v6_only(false), ec);
  if (!ec) acceptor.set_option(boost::asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(boost::asio::socket_base::max_listen_connections, ec);
  return acceptor;
}

class AcceptLoop {
 public:
  using SocketHandler = std::function<void(boost::asio::ip::tcp::socket)>;
  using ErrorHandler = std::function<void(const boost::system::error_code&)>;

  /// `acceptor` must outlive the loop; it may be opened (or moved into) after the loop exists.
  AcceptLoop(boost::asio::ip::tcp::acceptor& acceptor, SocketHandler on_socket,
             ErrorHandler on_error,
             std::chrono::milliseconds retry = std::chrono::milliseconds(100))
      : acceptor_(acceptor),
        retry_timer_(acceptor.get_executor()),
        on_socket_(std::move(on_socket)),
        on_error_(std::move(on_error)),
        retry_(retry) {}
  AcceptLoop(const AcceptLoop&) = delete;
  AcceptLoop& operator=(const AcceptLoop&) = delete;

  /// Starts accepting on the (listening) acceptor.
  void start() {
    stopped_ = false;
    accept_next();
  }

  /// No handler runs after this; closing the acceptor is the owner's part.
  void stop() {
    stopped_ = true;
    retry_timer_.cancel();
  }

 private:
  void accept_next() {
    acceptor_.async_accept([this, alive = std::weak_ptr<bool>(alive_)](
                               boost::system::error_code ec, boost::asio::ip::tcp::socket socket) {
      if (!alive.lock() || stopped_ || ec == boost::asio::error::operation_aborted) return;
      if (!ec) {
        on_socket_(std::move(socket));
        if (!alive.lock() || stopped_) return;
        // The connections already waiting in the kernel's queue, up to kBurst, are taken now:
        // a server busy answering thousands of clients would otherwise take one per pass of
        // its loop, and the queue would overflow (the kernel then resets the connections it
        // drops, which clients see after their connect succeeded).
        for (int taken = 1; taken < kBurst; ++taken) {
          boost::system::error_code more_ec;
          acceptor_.non_blocking(true, more_ec);
          if (more_ec) break;
          boost::asio::ip::tcp::socket next = acceptor_.accept(more_ec);
          if (more_ec == boost::asio::error::would_block ||
              more_ec == boost::asio::error::try_again)
            break;
          if (more_ec) return retry_after(more_ec, alive);
          on_socket_(std::move(next));
          if (!alive.lock() || stopped_) return;
        }
        // The next accept waits its turn behind the handlers already due (reads of the
        // connections accepted so far): a stream of new connections cannot starve them.
        if (!stopped_)
          boost::asio::post(acceptor_.get_executor(), [this, alive] {
            if (alive.lock() && !stopped_) accept_next();
          });
        return;
      }
      retry_after(ec, alive);
    });
  }

  /// A failed accept goes to the owner; accepting resumes after `retry_`.
  void retry_after(const boost::system::error_code& ec, const std::weak_ptr<bool>& alive) {
    on_error_(ec);
    retry_timer_.expires_after(retry_);
    retry_timer_.async_wait([this, alive](const boost::system::error_code& wait_ec) {
      if (alive.lock() && !wait_ec && !stopped_) accept_next();
    });
  }

  /// Connections taken from the kernel's queue in one pass of the loop, at most.
  static constexpr int kBurst = 32;

  boost::asio::ip::tcp::acceptor& acceptor_;
  boost::asio::steady_timer retry_timer_;
  SocketHandler on_socket_;
  ErrorHandler on_error_;
  std::chrono::milliseconds retry_;
  bool stopped_ = false;
  /// Expires with the loop: a completion queued before it was destroyed does nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ddprun::common
