#include "rendezvous/endpoint.h"

#include "common/strings.h"

namespace ddprun::rdzv {

std::variant<EndpointParts, EndpointError> split_endpoint(const std::string& endpoint) {
  EndpointParts parts;
  if (!endpoint.empty() && endpoint.front() == '[') {
    const auto close = endpoint.find(']');
    if (close == std::string::npos) return EndpointError::MissingBracket;
    parts.host = endpoint.substr(1, close - 1);
    const std::string rest = endpoint.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return EndpointError::Malformed;
      parts.port = rest.substr(1);
    }
    return parts;
  }
  const auto colon = endpoint.find(':');
  if (colon != std::string::npos && endpoint.find(':', colon + 1) != std::string::npos)
    return EndpointError::BareIpv6;
  parts.host = endpoint.substr(0, colon);
  if (colon != std::string::npos) parts.port = endpoint.substr(colon + 1);
  return parts;
}

std::optional<std::pair<std::string, int>> parse_endpoint(const std::string& endpoint,
                                                          int default_port) {
  auto split = split_endpoint(endpoint);
  auto* parts = std::get_if<EndpointParts>(&split);
  if (parts == nullptr || parts->host.empty()) return std::nullopt;
  int port = default_port;
  if (parts->port && !parts->port->empty()) {
    auto parsed = common::parse_int(*parts->port);
    if (!parsed || *parsed < 0 || *parsed > 65535) return std::nullopt;
    port = static_cast<int>(*parsed);
  }
  return std::pair{parts->host, port};
}

std::string format_endpoint(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace ddprun::rdzv
