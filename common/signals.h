#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::common {

/// "SIGTERM" for 15; "SIG<n>" for numbers without a name.
std::string signal_name(int signum);
/// Accepts "SIGTERM", "TERM", "sigterm" or "15"; nullopt when unknown.
std::optional<int> parse_signal(std::string_view text);

}  // namespace ddprun::common
