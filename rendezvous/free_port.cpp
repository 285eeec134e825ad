#include "rendezvous/free_port.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace ddprun::rdzv {

namespace {

constexpr int kLowestCandidate = 10000;
constexpr int kHighestPort = 65535;
/// The ports torchrun's and ddprun's defaults and examples use (29400 for the rendezvous, 29500
/// for the master, their neighbours): another job on the node may bind one as it starts.
constexpr int kDefaultPortsLow = 29400;
constexpr int kDefaultPortsHigh = 29599;
constexpr int kCandidates = 32;

/// Binds `port` on `host`; returns the port actually bound (port 0 asks the kernel) or an error.
common::Result<int> try_bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const char* node = host.empty() ? nullptr : host.c_str();
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(node, service.c_str(), &hints, &found); rc != 0)
    return common::Error{"cannot resolve '" + host + "': " + ::gai_strerror(rc)};
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      int got = bound.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                    : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      ::close(fd);
      ::freeaddrinfo(found);
      return got;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return common::Error{"cannot bind a free port on '" + host + "': " + last_error};
}

std::pair<int, int> ephemeral_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  std::stringstream text;
  text << in.rdbuf();
  return parse_port_range(text.str()).value_or(std::pair{32768, 60999});
}

}  // namespace

std::optional<std::pair<int, int>> parse_port_range(const std::string& text) {
  std::istringstream in(text);
  int low = 0;
  int high = 0;
  std::string rest;
  if (!(in >> low >> high) || (in >> rest)) return std::nullopt;
  if (low < 1 || high > kHighestPort || low > high) return std::nullopt;
  return std::pair{low, high};
}

std::vector<int> port_candidates(std::pair<int, int> ephemeral, unsigned seed, int count) {
  std::vector<std::pair<int, int>> spans;
  if (ephemeral.first > kLowestCandidate) spans.emplace_back(kLowestCandidate, ephemeral.first - 1);
  const int above = std::max(ephemeral.second + 1, kLowestCandidate);
  if (above <= kHighestPort) spans.emplace_back(above, kHighestPort);
  long total = 0;
  for (auto [lo, hi] : spans) total += hi - lo + 1;
  std::vector<int> out;
  if (total == 0) return out;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<long> pick(0, total - 1);
  for (int tries = 0; tries < count * 4 && static_cast<int>(out.size()) < count; ++tries) {
    long index = pick(gen);
    int port = 0;
    for (auto [lo, hi] : spans) {
      if (index <= hi - lo) {
        port = lo + static_cast<int>(index);
        break;
      }
      index -= hi - lo + 1;
    }
    if (port >= kDefaultPortsLow && port <= kDefaultPortsHigh) continue;
    if (std::find(out.begin(), out.end(), port) == out.end()) out.push_back(port);
  }
  return out;
}

common::Result<int> find_free_port(const std::string& host) {
  for (int port : port_candidates(ephemeral_range(), std::random_device{}(), kCandidates)) {
    auto bound = try_bind(host, port);
    if (bound) return bound;
  }
  return try_bind(host, 0);
}

}  // namespace ddprun::rdzv
