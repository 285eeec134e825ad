// libFuzzer target: an --event_log file as `ddprun events summarize` reads it: every line
// parsed (or skipped as not an event), the recoveries cut into phases, both outputs written.
// Whatever the bytes, nothing throws, and no control character reaches the table.
#include <cstddef>
#include <cstdint>
#include <string>

#include "launcher/events.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ddprun::launcher;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const EventSummary summary = summarize_events(text);
  if (summary.malformed_lines > summary.lines) __builtin_trap();
  const std::string table = format_summary(summary);
  for (const char c : table)
    if (c == '\x1b' || (static_cast<unsigned char>(c) < 0x20 && c != '\n')) __builtin_trap();
  summary_json(summary).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
