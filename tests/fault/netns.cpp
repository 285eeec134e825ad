#include "tests/fault/netns.h"

#include <unistd.h>

#include <chrono>

#include "tests/support/subprocess.h"

namespace ddprun::fault {
namespace {

constexpr std::chrono::seconds kIpLimit{20};

/// Runs `ip args...`; returns "" or the command and what it printed.
std::string ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{ip_program()};
  argv.insert(argv.end(), args.begin(), args.end());
  const testing::CommandResult r = testing::run_command(argv, {}, kIpLimit);
  if (r.exit_code == 0) return "";
  std::string line;
  for (const auto& a : argv) line += a + " ";
  return line + "exited " + std::to_string(r.exit_code) + ": " + r.err;
}

}  // namespace

std::string ip_program() {
  for (const char* candidate : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(candidate, X_OK) == 0) return candidate;
  return "";
}

NetworkNamespace::NetworkNamespace(std::string name, std::string prefix)
    : name_(std::move(name)),
      prefix_(std::move(prefix)),
      host_if_("vh" + name_.substr(name_.size() > 12 ? name_.size() - 12 : 0)),
      ns_if_("vn" + name_.substr(name_.size() > 12 ? name_.size() - 12 : 0)) {}

std::variant<std::unique_ptr<NetworkNamespace>, std::string> NetworkNamespace::create(
    const std::string& name, const std::string& subnet_prefix, int host_addresses) {
  if (ip_program().empty()) return std::string("no `ip` program (install iproute2)");
  std::unique_ptr<NetworkNamespace> ns(new NetworkNamespace(name, subnet_prefix));
  if (auto why = ip({"netns", "add", name}); !why.empty()) return why;
  ns->created_ = true;
  const auto in_ns = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"netns", "exec", name, ip_program()});
    return ip(args);
  };
  std::vector<std::vector<std::string>> host_steps{
      {"link", "add", ns->host_if_, "type", "veth", "peer", "name", ns->ns_if_},
      {"link", "set", ns->ns_if_, "netns", name}};
  for (int i = 0; i < host_addresses; ++i)
    host_steps.push_back({"addr", "add", ns->host_addr(i) + "/28", "dev", ns->host_if_});
  host_steps.push_back({"link", "set", ns->host_if_, "up"});
  for (const auto& step : host_steps)
    if (auto why = ip(step); !why.empty()) return why;
  for (const auto& step : std::vector<std::vector<std::string>>{
           {"addr", "add", ns->ns_addr() + "/28", "dev", ns->ns_if_},
           {"link", "set", ns->ns_if_, "up"},
           {"link", "set", "lo", "up"}})
    if (auto why = in_ns(step); !why.empty()) return why;
  return ns;
}

NetworkNamespace::~NetworkNamespace() {
  if (!created_) return;
  // The namespace's end goes with the namespace and takes its peer along. A host end left
  // behind by a half-finished create is removed by name.
  ip({"netns", "del", name_});
  ip({"link", "del", host_if_});
}

std::string NetworkNamespace::host_addr(int i) const {
  // .1, then .3, .4, ...: .2 is the namespace's.
  return prefix_ + "." + std::to_string(i == 0 ? 1 : i + 2);
}

std::vector<std::string> NetworkNamespace::exec_prefix() const {
  return {ip_program(), "netns", "exec", name_};
}

std::string NetworkNamespace::set_connected(bool connected) const {
  return ip({"netns", "exec", name_, ip_program(), "link", "set", "dev", ns_if_,
             connected ? "up" : "down"});
}

}  // namespace ddprun::fault
