#pragma once
// A rendezvous peer that speaks raw bytes, for tests that play a broken or hostile client:
// blocking POSIX sockets, every wait bounded.
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ddprun::testing {

class RawPeer {
 public:
  /// Connects to 127.0.0.1:port (REQUIREs success).
  explicit RawPeer(int port);
  ~RawPeer();
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  /// Writes all of `bytes`; false when the server closed the connection first.
  bool send_bytes(const std::string& bytes);
  /// Writes one frame: a 4-byte big-endian length and `body`.
  bool send_body(const std::string& body);
  bool send_json(const nlohmann::json& body) { return send_body(body.dump()); }

  /// The next frame's body as JSON, or nullopt when the connection ends or `limit` passes.
  std::optional<nlohmann::json> read_frame(std::chrono::milliseconds limit);

  /// True when the server closes the connection within `limit` (frames before are skipped).
  bool closed_by_server(std::chrono::milliseconds limit);

  /// Makes close() reset the connection (SO_LINGER 0) instead of leaving a TIME_WAIT behind:
  /// for tests that open tens of thousands of connections from one address.
  void reset_on_close();

  /// Sends a hello with this build's protocol version and reads the server's.
  bool greet(const std::string& role = "agent");

 private:
  /// Reads into buffer_ until it holds `n` bytes; false on end of stream or time-out.
  bool fill(std::size_t n, std::chrono::steady_clock::time_point deadline);

  int fd_ = -1;
  std::string buffer_;
  bool eof_ = false;
};

/// A frame header announcing `size` bytes.
std::string frame_header(std::uint32_t size);

/// `ddprun status --rdzv_endpoint 127.0.0.1:port` answers (exit 0 or 1 with a job list).
bool status_answers(int port);

}  // namespace ddprun::testing
