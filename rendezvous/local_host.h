#pragma once
#include <string>

namespace ddprun::rdzv {

/// gethostname(), or "unknown".
std::string local_host_name();

/// The host's fully qualified name as the resolver gives it (the plain host name if none).
std::string fully_qualified_host_name();

/// The address a node publishes as MASTER_ADDR when it has no --local_addr: the local address
/// of its rendezvous connection (the interface that reaches the server), unless that is a
/// loopback address, which other hosts could not use; then the fully qualified host name.
std::string advertised_address(const std::string& connection_local_address);

/// Whether `host` names this machine: "localhost", a loopback address, the host name or fully
/// qualified name, or an address of one of its interfaces (torchrun's is_host test).
bool is_local_host(const std::string& host);

}  // namespace ddprun::rdzv
