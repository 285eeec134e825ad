#include "ddprun/sdk/connect_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace ddprun::sdk {
namespace {

bool connects_once(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

}  // namespace

bool wait_for_listener(const std::string& host, int port, std::chrono::milliseconds limit,
                       std::chrono::milliseconds interval) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (connects_once(host, port)) return true;
    if (std::chrono::steady_clock::now() + interval > deadline) return false;
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace ddprun::sdk
