#pragma once
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "common/accept_loop.h"
#include "common/result.h"
#include "common/warning_limiter.h"
#include "store/codec.h"
#include "store/store_state.h"

namespace ddprun::store {

/// The workers' TCPStore, hosted by the agent (TORCHELASTIC_USE_AGENT_STORE=True): bound before
/// any worker starts, alive across restarts of the group, speaking torch 1.13's and 2.x's
/// dialects on one port.
///
///   acceptor --> Session (one socket; its dialect fixed by its first bytes)
///                   | bytes --> decode_request --> Request
///                   v
///                StoreState::apply(conn, request) --> Effects: bytes to any session, or close
///
/// All on the io_context's thread. Idle connections are not timed out: torch 1.13 keeps a silent
/// callback connection open for the life of each worker. Only at the connection limit does the
/// newest connection that never sent a byte make room for a new one (make_room). A malformed
/// request closes its own connection only. Shutdown is cancellation: close the acceptor and
/// every socket.
class StoreServer {
 public:
  explicit StoreServer(boost::asio::io_context& io, StoreLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// Listens on host:port ("" host: every address, IPv6 and IPv4; port 0: a free port).
  std::optional<common::Error> listen(const std::string& host, int port);

  /// The bound port (after listen).
  int port() const { return port_; }

  /// The agent joins a new rendezvous round: the last group's keys go (StoreState::clear).
  void clear() { state_.clear(); }

  /// A round of `workers` workers formed: the store makes room for two connections each (a
  /// torch 1.13 worker holds two) beyond StoreLimits::max_connections. When `open_files` is
  /// not 0 (this node's store serves the round: pass this process's open-file limit) and the
  /// limit cannot hold them, it says so once per size.
  void expect_workers(std::size_t workers, std::uint64_t open_files);

  /// The most connections open at once now.
  std::size_t max_connections() const;

  /// Stops accepting and closes every connection; nothing stays pending on the io_context.
  void shutdown();

  /// Open connections.
  std::size_t connections() const { return sessions_.size(); }

  /// Bytes of replies queued for all connections (StoreLimits::max_total_queued_reply_bytes).
  std::size_t queued_bytes() const { return queued_total_; }

 private:
  struct Session {
    explicit Session(boost::asio::ip::tcp::socket s) : socket(std::move(s)) {}
    boost::asio::ip::tcp::socket socket;
    std::string peer;
    std::string address;  ///< the peer's address, as per_address_ counts it
    std::optional<Dialect> dialect;
    std::string input;     ///< bytes read, not yet a whole request
    std::size_t need = 0;  ///< input's size before decoding can progress
    bool heard = false;    ///< it has sent at least one byte
    /// Replies queued; the front one is being written (a list: an empty deque takes 576 bytes).
    std::list<SharedBytes> output;
    std::size_t queued_bytes = 0;
  };

  void on_accepted(boost::asio::ip::tcp::socket socket);
  void read_next(ConnId id);
  /// Decodes and applies every whole request in the session's input.
  void consume(ConnId id);
  void deliver(const Effects& effects, ConnId from);
  void send(ConnId id, SharedBytes bytes);
  /// Over the total reply budget: closes the connections holding the most queued replies.
  void shed_largest_queues();
  /// At the connection limit: closes the newest connection that never sent a byte; false
  /// when every connection has.
  bool make_room();
  void write_next(ConnId id);
  void close(ConnId id, const std::string& why);

  boost::asio::io_context& io_;
  StoreLimits limits_;
  boost::asio::ip::tcp::acceptor acceptor_;
  common::AcceptLoop accepts_;
  StoreState state_;
  /// Shared with the socket's pending handlers, which keep its buffers alive after a close.
  std::map<ConnId, std::shared_ptr<Session>> sessions_;
  ConnId next_id_ = 1;
  std::size_t queued_total_ = 0;  ///< Session::queued_bytes, summed
  /// Open connections by peer address (StoreLimits::max_connections_per_address), and the
  /// addresses already warned about.
  std::map<std::string, std::size_t> per_address_;
  std::set<std::string> per_address_logged_;
  /// Room for the last round's workers (expect_workers); 0 before the first.
  std::size_t room_for_workers_ = 0;
  std::size_t open_files_warned_for_ = 0;
  int port_ = 0;
  bool stopped_ = false;
  bool full_logged_ = false;
  bool idle_closed_logged_ = false;
  /// Connections closed for what they sent (close's `why`): a stranger's flood of garbage
  /// must not flood the job's console.
  common::WarningLimiter close_warnings_;
};

}  // namespace ddprun::store
