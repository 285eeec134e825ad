#include "rendezvous/limits.h"

#include <cstdio>

#include "rendezvous/protocol.h"

namespace ddprun::rdzv {

namespace {

/// A number of milliseconds as seconds, without trailing zeros: 86400, 0.01.
std::string seconds_text(long long ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(ms) / 1000.0);
  std::string out = text;
  while (out.back() == '0') out.pop_back();
  if (out.back() == '.') out.pop_back();
  return out;
}

/// The value of `limit`'s field in `s`, in the table's unit.
long long value_of(const RdzvSettings& s, const SettingLimit& limit) {
  if (limit.wire_key == "join_timeout_ms") return s.join_timeout.count();
  if (limit.wire_key == "last_call_timeout_ms") return s.last_call_timeout.count();
  if (limit.wire_key == "close_timeout_ms") return s.close_timeout.count();
  if (limit.wire_key == "keep_alive_interval_ms") return s.keep_alive_interval.count();
  return s.keep_alive_max_attempt;
}

}  // namespace

const SettingLimit* find_setting_limit(std::string_view conf_key) {
  for (const SettingLimit& limit : kSettingLimits)
    if (limit.conf_key == conf_key) return &limit;
  return nullptr;
}

std::string describe_range(const SettingLimit& limit) {
  if (limit.seconds) return seconds_text(limit.min) + " to " + seconds_text(limit.max) + " seconds";
  return std::to_string(limit.min) + " to " + std::to_string(limit.max);
}

std::optional<std::string> check_settings(const RdzvSettings& s) {
  if (s.min_nodes < 1 || s.max_nodes < s.min_nodes)
    return std::string("field \"max_nodes\" must be at least min_nodes, which must be at least 1");
  if (s.nproc_per_node < 1) return std::string("field \"nproc_per_node\" must be at least 1");
  if (s.max_restarts < 0) return std::string("field \"max_restarts\" must not be negative");
  for (const SettingLimit& limit : kSettingLimits) {
    const long long value = value_of(s, limit);
    if (value < limit.min || value > limit.max) {
      const std::string unit = limit.seconds ? " ms" : "";
      return "field \"" + std::string(limit.wire_key) + "\" is " + std::to_string(value) + unit +
             ", outside " + std::to_string(limit.min) + unit + " to " + std::to_string(limit.max) +
             unit + " (--rdzv_conf " + std::string(limit.conf_key) + ": " + describe_range(limit) +
             ")";
    }
  }
  return std::nullopt;
}

}  // namespace ddprun::rdzv
