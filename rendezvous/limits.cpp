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

}  // namespace

long long setting_value(const RdzvSettings& s, const SettingLimit& limit) {
  if (limit.wire_key == "join_timeout_ms") return s.join_timeout.count();
  if (limit.wire_key == "last_call_timeout_ms") return s.last_call_timeout.count();
  if (limit.wire_key == "close_timeout_ms") return s.close_timeout.count();
  if (limit.wire_key == "keep_alive_interval_ms") return s.keep_alive_interval.count();
  return s.keep_alive_max_attempt;
}

std::string conf_value_text(const SettingLimit& limit, long long value) {
  return limit.seconds ? seconds_text(value) : std::to_string(value);
}

const SettingLimit* find_setting_limit(std::string_view conf_key) {
  for (const SettingLimit& limit : kSettingLimits)
    if (limit.conf_key == conf_key) return &limit;
  return nullptr;
}

std::string describe_range(const SettingLimit& limit) {
  if (limit.seconds) return seconds_text(limit.min) + " to " + seconds_text(limit.max) + " seconds";
  return std::to_string(limit.min) + " to " + std::to_string(limit.max);
}

}  // namespace ddprun::rdzv
