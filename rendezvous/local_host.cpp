#include "rendezvous/local_host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/address.hpp>

namespace ddprun::rdzv {

std::string local_host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string fully_qualified_host_name() {
  const std::string host = local_host_name();
  addrinfo hints{};
  hints.ai_flags = AI_CANONNAME;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return host;
  std::string name = found && found->ai_canonname ? found->ai_canonname : host;
  ::freeaddrinfo(found);
  return name;
}

std::string advertised_address(const std::string& connection_local_address) {
  boost::system::error_code ec;
  auto addr = boost::asio::ip::make_address(connection_local_address, ec);
  if (ec || addr.is_loopback() || addr.is_unspecified()) return fully_qualified_host_name();
  if (addr.is_v6() && addr.to_v6().is_v4_mapped())
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, addr.to_v6()).to_string();
  return addr.to_string();
}

bool is_local_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  auto addr = boost::asio::ip::make_address(host, ec);
  if (!ec && addr.is_loopback()) return true;
  // A name is this machine's own; an address is looked for among the interfaces (no lookup).
  if (ec) return host == local_host_name() || host == fully_qualified_host_name();
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    if (i->ifa_addr->sa_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                  sizeof(text));
    else if (i->ifa_addr->sa_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, text,
                  sizeof(text));
    else
      continue;
    auto local = boost::asio::ip::make_address(text, ec);
    // An IPv6 address matches whatever its scope (fe80::1%eth0 is fe80::1 on eth0).
    found =
        !ec && (addr.is_v6() && local.is_v6() ? local.to_v6().to_bytes() == addr.to_v6().to_bytes()
                                              : local == addr);
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace ddprun::rdzv
