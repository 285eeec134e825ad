#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// The workers' TCPStore wire protocol, both dialects (docs/design.md#the-agent-store). Pure: no
// sockets, no clock. A request is an opcode byte and its fields, integers little-endian, strings
// a u64 length and raw bytes; there is no frame, so decoding works on whatever bytes arrived.

namespace ddprun::store {

/// Which client speaks on a connection, fixed by its first bytes (detect_dialect).
enum class Dialect {
  Legacy,  ///< torch 1.13 (and the 2.0-2.3 builds without a validation handshake)
  V2,      ///< torch 2.4+: VALIDATE first, opcodes shifted by one, PING
};

/// What a request asks, whatever the dialect numbers it.
enum class Op {
  Validate,
  Set,
  CompareSet,
  Get,
  Add,
  Check,
  Wait,
  NumKeys,
  WatchKey,
  DeleteKey,
  Append,
  MultiGet,
  MultiSet,
  CancelWait,
  Ping,
  QueuePush,
  QueuePop,
  QueueLen,
  ListKeys,
};

/// The name of `op` in log lines.
const char* op_name(Op op);

/// Size limits on what a client may send; going over closes that connection.
struct StoreLimits {
  std::size_t max_key_bytes = 8 * 1024;               ///< one key
  std::size_t max_value_bytes = 64 * 1024 * 1024;     ///< one value
  std::size_t max_keys_per_request = 128 * 1024;      ///< CHECK, WAIT, MULTI_GET, MULTI_SET
  std::size_t max_request_bytes = 256 * 1024 * 1024;  ///< one request, all fields together
  std::size_t max_connections = 4096;                 ///< open at once, all clients together
  /// Replies queued for one connection that does not read them.
  std::size_t max_queued_reply_bytes = 256 * 1024 * 1024;
  /// Replies queued for all connections together, each counted for every connection it waits
  /// for: over it, the connections holding the most are closed until it is met again.
  std::size_t max_total_queued_reply_bytes = 512 * 1024 * 1024;
  /// Parked WAITs and watches of all connections together (StoreState::parked_bytes): a WAIT
  /// or WATCH_KEY that would go over closes its connection.
  std::size_t max_parked_bytes = 64 * 1024 * 1024;
  /// Connections from one address: one host (a script that leaks stores in a loop, or a
  /// hostile one) cannot take every connection from the job's other workers.
  std::size_t max_connections_per_address = 1024;
};

/// One decoded request: the fields each op uses, in wire order.
struct Request {
  Op op = Op::Set;
  std::vector<std::string> keys;    ///< the key(s)
  std::vector<std::string> values;  ///< SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: expected, desired
  std::int64_t delta = 0;           ///< ADD
  std::uint32_t word = 0;           ///< VALIDATE: the magic; PING: the nonce

  bool operator==(const Request&) const = default;
};

/// Outcome of a decode step.
enum class DecodeStatus { Complete, NeedMore, Bad };

/// One request, or why there is none yet, or why the stream is unusable.
struct Decoded {
  DecodeStatus status = DecodeStatus::NeedMore;
  Request request;       ///< set when Complete
  std::size_t used = 0;  ///< bytes the request took, when Complete
  std::string error;     ///< names the bad field, when Bad
  /// When NeedMore: decoding cannot progress before the input holds this many bytes (the end
  /// of the field it stopped in), so a caller feeding a big request in pieces decodes it again
  /// only when a piece completes a field, not at every read.
  std::size_t need = 0;
};

/// The validation magic of the 2.x dialect (`00 CE F7 85 3C` opens every 2.x connection).
constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

/// The dialect found at the start of a connection.
struct Detected {
  DecodeStatus status = DecodeStatus::NeedMore;  ///< never Bad
  Dialect dialect = Dialect::Legacy;
  std::size_t used = 0;  ///< V2: the VALIDATE consumed (5); Legacy: 0, the bytes are a request
};

/// Tells the dialects apart from a connection's first bytes: a 2.x client always starts with
/// VALIDATE and its magic; a 1.13 client with an opcode, where SET is 0 and a key length follows.
Detected detect_dialect(std::string_view bytes);

/// Decodes the first request in `bytes` in `dialect`. Linear in the request's size: an
/// unfinished request is only measured (its length fields walked, nothing copied).
Decoded decode_request(Dialect dialect, std::string_view bytes, const StoreLimits& limits);

/// Reply encoders: the same layouts in both dialects.
std::string encode_u8(std::uint8_t value);
std::string encode_u32(std::uint32_t value);
std::string encode_i64(std::int64_t value);
/// `u64 length` and the bytes.
std::string encode_bytes(std::string_view value);

/// A 1.13 watch push on the callback connection: `u8 kind, str key, bytes old, bytes new`.
enum class WatchEvent : std::uint8_t { Updated = 0, Created = 1, Deleted = 2, Registered = 3 };
std::string encode_watch_push(WatchEvent event, std::string_view key, std::string_view old_value,
                              std::string_view new_value);

/// Request encoders for tests and benches (a client's bytes).
std::string encode_request(Dialect dialect, const Request& request);

}  // namespace ddprun::store
