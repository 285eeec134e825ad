#pragma once
#include <array>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

// Every limit of the rendezvous in one table: the server (daemon or embedded in an agent), the
// client and the command line read them from here, so a value the command line accepts is one
// the server accepts (docs/operations.md#security lists them for operators).

namespace ddprun::rdzv {

struct RdzvSettings;

// ---- frames and messages ------------------------------------------------------------------

/// Largest body a frame may carry; a larger announced length means a broken or hostile peer.
inline constexpr std::size_t kMaxFrameBytes = 1 << 20;

/// Deepest nesting of arrays and objects a frame body may have: ddprun's messages use 3, and a
/// deeper body is refused before it is parsed (deep values make recursive code overflow).
inline constexpr int kMaxJsonDepth = 32;

/// Longest text of a peer's value that a message ever quotes (escaped characters).
inline constexpr std::size_t kMaxQuotedChars = 64;

/// Longest run id, node id, node name or address in a message, in bytes (--rdzv_id too).
inline constexpr std::size_t kMaxIdentifierBytes = 256;

/// Longest free text in a message (a failure description, a reason), in bytes.
inline constexpr std::size_t kMaxTextBytes = 4096;

/// A status reply carries jobs up to about this many bytes, then says where to go on: replies
/// stay far under kMaxFrameBytes however many jobs a server holds.
inline constexpr std::size_t kStatusPageBytes = 64 * 1024;

// ---- per-job settings (--rdzv_conf), checked by the command line and by admission.h -------

/// One numeric --rdzv_conf setting: its name on the command line (seconds, or a count), its
/// field in a join's settings (milliseconds, or the count), and the range the server accepts.
struct SettingLimit {
  std::string_view conf_key;
  std::string_view wire_key;
  bool seconds;   ///< a duration: given in seconds, sent and bounded in milliseconds
  long long min;  ///< milliseconds for a duration
  long long max;
};

inline constexpr long long kDayMs = 24LL * 3600 * 1000;

/// The table. keep_alive_interval x keep_alive_max_attempt stays below 32-bit milliseconds.
inline constexpr std::array<SettingLimit, 5> kSettingLimits{{
    {"join_timeout", "join_timeout_ms", true, 0, kDayMs},
    {"last_call_timeout", "last_call_timeout_ms", true, 0, kDayMs},
    {"close_timeout", "close_timeout_ms", true, 0, kDayMs},
    {"keep_alive_interval", "keep_alive_interval_ms", true, 10, 3600LL * 1000},
    {"keep_alive_max_attempt", "keep_alive_max_attempt", false, 1, 100},
}};

/// The limit of --rdzv_conf key `conf_key`; nullptr for keys without one.
const SettingLimit* find_setting_limit(std::string_view conf_key);

/// The allowed range of `limit` as a user writes it: "0 to 86400 seconds", "1 to 100".
std::string describe_range(const SettingLimit& limit);

/// The value of `limit`'s field in `settings`, in the table's unit (milliseconds or a count).
long long setting_value(const RdzvSettings& settings, const SettingLimit& limit);

/// A value of `limit` as --rdzv_conf takes it: seconds for a duration ("0.001"), else the count.
std::string conf_value_text(const SettingLimit& limit, long long value);

// ---- connections and the daemon's resources -----------------------------------------------

/// Limits of one rendezvous server; the daemon's flags set them, an embedded server keeps the
/// defaults.
struct ServerLimits {
  /// A connection that has not completed its hello by then is closed.
  std::chrono::milliseconds hello_timeout{10'000};
  /// A connection holding part of a frame with no byte of progress for this long is closed.
  std::chrono::milliseconds stalled_frame_timeout{30'000};
  /// Unparsed input buffered across all connections; a connection whose read would go over is
  /// closed.
  std::size_t max_buffered_bytes = 64u << 20;
  /// Jobs a server holds at once; a join for a new job beyond it is refused.
  std::size_t max_jobs = 10'000;
};

}  // namespace ddprun::rdzv
