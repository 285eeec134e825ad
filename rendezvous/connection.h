#pragma once
#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "rendezvous/framing.h"
#include "rendezvous/tls.h"

namespace ddprun::rdzv {

/// Unparsed input held by a group of connections (a server's sessions), against one cap.
/// Only what stays buffered after a read (unfinished frames) counts; when the total goes over
/// `limit`, `over_limit` runs and decides whom to close (the server closes the connections
/// holding the most, so a peer sending whole small frames is never the one cut).
struct InputBudget {
  std::size_t limit = 0;
  std::size_t used = 0;
  std::function<void()> over_limit;
};

/// How a connection ended, as its close handler is told.
enum class CloseKind {
  Orderly,     ///< the peer closed it between whole frames
  BadFrame,    ///< the peer sent something that is not a frame (framing.h)
  WriteLimit,  ///< more replies waited unread than set_write_limit allows
  Tls,  ///< TLS failed (a certificate refused, an alert, TLS on one side only): a configuration
        ///< error, which reconnecting does not cure
  Io,   ///< a read, a write or a TLS handshake broke off (reset, refused, timed out)
  ClosedHere,  ///< this side closed it (a limit, a refusal), having said why if it needed saying
};

struct CloseReason {
  CloseKind kind = CloseKind::Orderly;
  /// Why, worded for a user ("bad frame from 10.0.0.5:4000: ..."); "" when Orderly.
  std::string text;
  /// BadFrame: the decoder's reason alone, without the peer.
  std::string detail{};
};

/// The socket a connection holds: bound to its io_context's executor rather than asio's
/// polymorphic any_io_executor, which costs 32 bytes in the socket and 40 in every pending wait
/// (a server holds thousands of both, docs/design.md#rendezvous-at-scale).
using ConnectionSocket =
    boost::asio::basic_stream_socket<boost::asio::ip::tcp, boost::asio::io_context::executor_type>;

/// One TCP connection that carries frames (framing.h) both ways: a read loop that decodes
/// frames and a write queue, over the plain socket or a TLS stream on it (tls.h). Shared by the
/// server's sessions, the agent's client and `ddprun status`. Lives in shared_ptrs: pending
/// handlers keep it alive until they ran.
class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using MessageHandler = std::function<void(const nlohmann::json&)>;
  /// Called once when the connection ends, with how and why.
  using CloseHandler = std::function<void(const CloseReason&)>;

  /// Who hears a connection's frames and its end, with the tag it was started with: a server
  /// that owns thousands of connections passes itself and each connection's id, so that no
  /// connection holds handlers of its own (64 bytes each, docs/design.md#rendezvous-at-scale).
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void frame_received(std::uint64_t tag, const nlohmann::json& body) = 0;
    /// Once per connection, as CloseHandler.
    virtual void connection_ended(std::uint64_t tag, const CloseReason& why) = 0;
  };

  /// With `tls`, start() first runs the TLS handshake in that role; frames sent before it
  /// completes wait in the queue. `socket` must run on an io_context (its descriptor moves
  /// into a ConnectionSocket).
  explicit FramedConnection(boost::asio::ip::tcp::socket socket,
                            std::optional<TlsRole> tls = std::nullopt);
  ~FramedConnection();

  /// Starts the read loop (after the TLS handshake, with TLS). Handlers run on the socket's
  /// executor; a failed handshake closes the connection with the reason.
  void start(MessageHandler on_message, CloseHandler on_close);
  /// The same, telling `listener` (which must outlive the connection's handlers) with `tag`.
  void start(Listener& listener, std::uint64_t tag);

  /// Queues one frame. Ignored once closed.
  void send(const nlohmann::json& body);

  /// Closes once every queued frame has been written (bounded by the peer reading them: a
  /// caller that must not wait for ever closes it after a deadline). `closed`, if given, runs
  /// once the connection has closed, however it closed (posted, never from inside this call);
  /// at once (posted) if it is closed already.
  void close_after_writes(std::function<void()> closed = {});

  /// Closes now; pending writes are dropped; the close handler is not called (the `closed`
  /// callback of close_after_writes is).
  void close();

  bool is_open() const { return open_; }

  /// Counts this connection's unparsed input against `budget` (which must outlive it).
  void set_input_budget(InputBudget* budget) { budget_ = budget; }

  /// Bytes received so far: a server compares it between sweeps to see progress.
  std::uint64_t bytes_received() const { return bytes_received_; }

  /// Why this client connection to a ddprun server ended, worded for the user: closed or reset
  /// before a single byte came back on a plain connection (a TLS server resets a client whose
  /// hello it did not read), it most likely met a server with TLS, and `tls_ca_option` says how
  /// to give its CA; otherwise `why`, or that the server closed it.
  std::string client_close_reason(const std::string& why, const std::string& tls_ca_option) const;

  /// Bytes of an unfinished frame held now.
  std::size_t buffered_bytes() const { return decoder_.buffered_bytes(); }

  /// Closes the connection when more than `bytes` of frames wait to be written: a peer that
  /// does not read its replies cannot make this side hold them without bound. 0: no limit.
  void set_write_limit(std::size_t bytes) {
    write_limit_ = static_cast<std::uint32_t>(std::min<std::size_t>(bytes, UINT32_MAX));
  }

  /// "addr:port" of the peer, for logs ("?" when unknown).
  const std::string& peer() const { return peer_; }

  /// The local address of the connection (what this side looks like to the peer).
  std::string local_address() const;

 private:
  struct TlsStream;
  void read_more();
  void on_read(boost::system::error_code ec, std::string_view data);
  void write_next();
  /// Drops the frames waiting to be written, except one being written.
  void drop_queued();
  /// Ends the connection and tells the close handler how and why. `linger`: as shut().
  void end(CloseReason reason, bool linger = false);
  /// Closes; with `linger` the socket is closed only after linger_then_close().
  void shut(bool linger);
  /// After a refused TLS handshake on the server's side: drains the peer's input, bounded,
  /// before closing, so the peer reads the TLS alert instead of a reset.
  void linger_then_close();
  /// Reads and drops into `sink` (what arrives after a refusal is never looked at).
  void drain(std::shared_ptr<boost::asio::steady_timer> timer,
             std::shared_ptr<std::array<char, 16384>> sink, std::size_t drained);
  static constexpr std::chrono::milliseconds kLingerTime{1000};
  static constexpr std::size_t kLingerBytes = 1 << 20;
  /// Moves the budget's count by this connection's change in buffered bytes since `before`.
  void account(std::size_t before);

  ConnectionSocket socket_;
  std::unique_ptr<TlsStream> tls_;  ///< over socket_, with TLS
  FrameDecoder decoder_;
  /// Frames waiting to be written, the first one being written while writing_.
  struct WriteQueue {
    std::list<std::string> frames;
    std::size_t bytes = 0;  ///< in `frames`
  };
  /// Null while nothing waits, as on most connections of a server most of the time.
  std::unique_ptr<WriteQueue> queue_;
  Listener* listener_ = nullptr;  ///< null once the connection is shut
  std::uint64_t tag_ = 0;
  /// What few connections hold: a client's own handlers (start(MessageHandler, CloseHandler),
  /// which listener_ points to) and close_after_writes's `closed`. A server's sessions have
  /// neither until they are closed (docs/design.md#rendezvous-at-scale).
  struct Extras {
    std::unique_ptr<Listener> own_listener;
    std::function<void()> closed_after_writes;
  };
  std::unique_ptr<Extras> extras_;
  Extras& extras() {
    if (!extras_) extras_ = std::make_unique<Extras>();
    return *extras_;
  }
  std::string peer_;
  // Flags in one byte, beside write_limit_ (a server holds thousands of connections).
  bool handshaken_ : 1 = false;  ///< frames may be written (always, without TLS)
  bool open_ : 1 = true;
  bool writing_ : 1 = false;
  bool close_when_written_ : 1 = false;
  /// Over the write limit: nothing more is queued, and the connection ends (posted) telling
  /// its listener; a write still under way must not close it quietly before.
  bool over_write_limit_ : 1 = false;
  std::uint32_t write_limit_ = 0;  ///< set_write_limit's, at most 4 GiB
  InputBudget* budget_ = nullptr;
  std::uint64_t bytes_received_ = 0;
};

/// Sets TCP_NODELAY, and makes unacknowledged data (a vanished peer) fail the connection after
/// `user_timeout` (TCP_USER_TIMEOUT) with keep-alive probes so an idle connection notices too.
void tune_socket(boost::asio::ip::tcp::socket& socket, std::chrono::milliseconds user_timeout);

}  // namespace ddprun::rdzv
