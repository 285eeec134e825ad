// Test helper: the agent's store (store/server.h) alone, on 127.0.0.1 and a free port, for
// tests with real torch clients. Prints "port N", then serves until SIGTERM or SIGINT.
// Usage: store_server [max_key_bytes]
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "store/server.h"

int main(int argc, char** argv) {
  boost::asio::io_context io;
  ddprun::store::StoreLimits limits;
  if (argc > 1) limits.max_key_bytes = std::strtoul(argv[1], nullptr, 10);
  ddprun::store::StoreServer server(io, limits);
  if (auto why = server.listen("127.0.0.1", 0)) {
    std::fprintf(stderr, "%s\n", why->message.c_str());
    return 1;
  }
  std::printf("port %d\n", server.port());
  std::fflush(stdout);
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&server](const boost::system::error_code&, int) { server.shutdown(); });
  io.run();
  return 0;
}
