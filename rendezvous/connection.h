#pragma once
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "rendezvous/framing.h"

namespace ddprun::rdzv {

/// Unparsed input held by a group of connections (a server's sessions), against one cap: a
/// connection whose read would take the total over `limit` is closed.
struct InputBudget {
  std::size_t limit = 0;
  std::size_t used = 0;
};

/// One TCP connection that carries frames (framing.h) both ways: a read loop that decodes
/// frames and a write queue. Shared by the server's sessions, the agent's client and
/// `ddprun status`. Lives in shared_ptrs: pending handlers keep it alive until they ran.
class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using MessageHandler = std::function<void(const nlohmann::json&)>;
  /// Called once when the connection ends: "" for an orderly close by the peer, else why.
  using CloseHandler = std::function<void(const std::string&)>;

  explicit FramedConnection(boost::asio::ip::tcp::socket socket);

  /// Starts the read loop. Handlers run on the socket's executor.
  void start(MessageHandler on_message, CloseHandler on_close);

  /// Queues one frame. Ignored once closed.
  void send(const nlohmann::json& body);

  /// Closes once every queued frame has been written (bounded by the peer reading them).
  void close_after_writes();

  /// Closes now; pending writes are dropped; the close handler is not called.
  void close();

  bool is_open() const { return open_; }

  /// Counts this connection's unparsed input against `budget` (which must outlive it).
  void set_input_budget(InputBudget* budget) { budget_ = budget; }

  /// Bytes received so far: a server compares it between sweeps to see progress.
  std::uint64_t bytes_received() const { return bytes_received_; }

  /// Bytes of an unfinished frame held now.
  std::size_t buffered_bytes() const { return decoder_.buffered_bytes(); }

  /// "addr:port" of the peer, for logs ("?" when unknown).
  const std::string& peer() const { return peer_; }

  /// The local address of the connection (what this side looks like to the peer).
  std::string local_address() const;

 private:
  void read_more();
  void write_next();
  void end(const std::string& why);
  /// Moves the budget's count by this connection's change in buffered bytes since `before`.
  void account(std::size_t before);

  boost::asio::ip::tcp::socket socket_;
  FrameDecoder decoder_;
  std::array<char, 16384> chunk_{};
  std::deque<std::string> writes_;
  MessageHandler on_message_;
  CloseHandler on_close_;
  std::string peer_;
  bool open_ = true;
  bool writing_ = false;
  bool close_when_written_ = false;
  InputBudget* budget_ = nullptr;
  std::uint64_t bytes_received_ = 0;
};

/// Sets TCP_NODELAY, and makes unacknowledged data (a vanished peer) fail the connection after
/// `user_timeout` (TCP_USER_TIMEOUT) with keep-alive probes so an idle connection notices too.
void tune_socket(boost::asio::ip::tcp::socket& socket, std::chrono::milliseconds user_timeout);

}  // namespace ddprun::rdzv
