#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "rendezvous/limits.h"

// Wire framing for the TCP rendezvous protocol (see docs/design.md). Pure: no sockets, no clock.
// A frame is a 4-byte big-endian unsigned body length followed by the body, a UTF-8 JSON object.

namespace ddprun::rdzv {

/// Size of the big-endian length prefix in front of every body.
constexpr std::size_t kFrameHeaderBytes = 4;

/// Version of the rendezvous protocol this ddprun speaks; peers must match exactly.
constexpr int kProtocolVersion = 1;

/// Serialises `body` as one frame; a body over kMaxFrameBytes is a programming error (asserts).
std::string encode_frame(const nlohmann::json& body);

/// Outcome of FrameDecoder::next().
enum class DecodeStatus { Complete, NeedMore, Bad };

/// One decoded frame, or why there is none yet, or why the stream is broken.
struct DecodeResult {
  /// Complete: `body` holds a JSON object; NeedMore: feed more bytes; Bad: close the connection.
  DecodeStatus status = DecodeStatus::NeedMore;
  /// The parsed body, set only when status is Complete.
  nlohmann::json body;
  /// What was wrong with the stream, set only when status is Bad.
  std::string error;
};

/// Reassembles frames from a byte stream fed in arbitrary pieces; once Bad it stays Bad.
class FrameDecoder {
 public:
  /// Appends bytes read from the connection; ignored once the decoder is Bad.
  void feed(std::string_view bytes);

  /// Returns the next complete frame, NeedMore, or Bad (sticky) for an unusable stream.
  DecodeResult next();

  /// Bytes fed but not yet returned as frames.
  std::size_t buffered_bytes() const { return held_ ? held_->bytes.size() : 0; }

 private:
  DecodeResult fail(std::string error);

  /// What a decoder holds between two reads: the start of an unfinished frame, or why the
  /// stream went bad.
  struct Held {
    std::string bytes;
    std::optional<std::string> bad;
  };
  /// Null between whole frames: a server holds one decoder per connection, and 16,384 idle
  /// ones held 40 bytes each (docs/design.md#rendezvous-at-scale).
  std::unique_ptr<Held> held_;
};

/// A peer's value as a message may quote it: a string escaped and cut at kMaxQuotedChars (with
/// its length), a number or literal as written, an array or object by its size only. Never
/// recursive and never longer than about 100 characters, whatever the peer sent.
std::string quote_peer_value(const nlohmann::json& value);

/// Checks a peer's `{"type":"hello","protocol":N,...}`; returns nullopt if compatible, else why
/// not.
std::optional<common::Error> check_hello(const nlohmann::json& hello);

}  // namespace ddprun::rdzv
