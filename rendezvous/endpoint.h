#pragma once
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ddprun::rdzv {

/// The rendezvous port when an endpoint names none (torchrun's), ddprun-rdzvd's and `ddprun
/// status`'s default, and the port of the endpoint derived under SLURM: one constant for all.
inline constexpr int kDefaultPort = 29400;

/// "host:port", "[v6]:port", "host" or "[v6]" cut into its host and the port text, if any.
struct EndpointParts {
  std::string host;
  std::optional<std::string> port;
};

/// Why a text is not an endpoint.
enum class EndpointError {
  MissingBracket,  ///< "[fd00::1" without its ']'
  Malformed,       ///< something after "]" that is not ":port"
  BareIpv6,        ///< more than one ':' outside brackets: an IPv6 address needs them
};

/// Splits an endpoint without judging the host or the port (callers word their own errors).
std::variant<EndpointParts, EndpointError> split_endpoint(const std::string& endpoint);

/// Host and port of an endpoint, `default_port` when it has none; nullopt for malformed text,
/// an empty host or a port outside 0..65535.
std::optional<std::pair<std::string, int>> parse_endpoint(const std::string& endpoint,
                                                          int default_port);

/// "host:port", with an IPv6 address in brackets: "[::1]:29400".
std::string format_endpoint(const std::string& host, int port);

}  // namespace ddprun::rdzv
