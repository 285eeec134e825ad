#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace ddprun::rdzv {

/// The kernel's ephemeral (automatic) port range, as in /proc/sys/net/ipv4/ip_local_port_range:
/// two numbers separated by white space. nullopt when the text is not such a pair.
std::optional<std::pair<int, int>> parse_port_range(const std::string& text);

/// Up to `count` distinct candidate ports outside `ephemeral` (and at or above 10000), in an order
/// drawn from `seed`, none from 29400 to 29599 (the ports torchrun's and ddprun's defaults and
/// examples use, which another job may bind as it starts). A port outside the ephemeral range is
/// never handed to an outgoing connection or to another process's bind(0), so it cannot be taken
/// between the moment ddprun picks it and the moment rank 0 binds its store there, and a worker
/// that connects before the store listens cannot connect to itself.
std::vector<int> port_candidates(std::pair<int, int> ephemeral, unsigned seed, int count);

/// A TCP port that is free on `host` (numeric IPv4/IPv6 or a name): the first of
/// port_candidates() that binds, else whatever binding port 0 gives. The error names the host.
common::Result<int> find_free_port(const std::string& host);

}  // namespace ddprun::rdzv
