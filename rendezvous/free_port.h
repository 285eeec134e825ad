#pragma once
#include <string>
#include <variant>

namespace ddprun::rdzv {

/// Asks the kernel for a TCP port that is free on `host` (numeric IPv4/IPv6 or a name) by
/// binding port 0 and reading it back. Returns the port or an error message.
std::variant<int, std::string> find_free_port(const std::string& host);

}  // namespace ddprun::rdzv
