#pragma once
// A network namespace joined to this machine by a veth pair, created and removed by the fault
// harness, so that one agent of a job can be cut off and reconnected:
//
//   host (root namespace)                          namespace <name>
//   <host_if>  10.X.Y.1/28 (+ .3, .4, ...)  <---->  <ns_if>  10.X.Y.2/28
//
// The host-side addresses are those of the agents that stay in the root namespace; the one in the
// namespace uses 10.X.Y.2. Setting the namespace's end down cuts that node off both ways while
// the host-side addresses stay local (the host end only loses its carrier).
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace ddprun::fault {

class NetworkNamespace {
 public:
  /// Creates the namespace, the pair and the addresses (`host_addresses` on the host end);
  /// returns why when the kernel or `ip` refuses.
  static std::variant<std::unique_ptr<NetworkNamespace>, std::string> create(
      const std::string& name, const std::string& subnet_prefix, int host_addresses);
  /// Deletes the namespace, which removes the veth pair with it.
  ~NetworkNamespace();
  NetworkNamespace(const NetworkNamespace&) = delete;
  NetworkNamespace& operator=(const NetworkNamespace&) = delete;

  const std::string& name() const { return name_; }
  const std::string& host_if() const { return host_if_; }
  const std::string& ns_if() const { return ns_if_; }
  /// The i-th host-side address (i = 0 is the first one, 10.X.Y.1).
  std::string host_addr(int i) const;
  /// The namespace end's address (10.X.Y.2).
  std::string ns_addr() const { return prefix_ + ".2"; }
  /// argv prefix that runs a command inside the namespace.
  std::vector<std::string> exec_prefix() const;
  /// Cuts the namespace off (false) or reconnects it (true); returns "" or why it failed.
  std::string set_connected(bool connected) const;

 private:
  NetworkNamespace(std::string name, std::string prefix);
  std::string name_, prefix_, host_if_, ns_if_;
  bool created_ = false;
};

/// The `ip` program (iproute2), or "" when none is installed.
std::string ip_program();

}  // namespace ddprun::fault
