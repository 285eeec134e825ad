#pragma once
// Waiting for rank 0's store to listen. Pure POSIX, free of libtorch, unit-tested without it.
#include <chrono>
#include <string>

namespace ddprun::sdk {

/// Tries to connect to host:port every `interval` until a connection succeeds (it is then
/// closed) or `limit` passes; true on success. A rank that starts together with rank 0, as
/// standby workers do, otherwise meets a refused connection in c10d's TCPStore client, which
/// then sleeps a whole second before its next try.
bool wait_for_listener(const std::string& host, int port, std::chrono::milliseconds limit,
                       std::chrono::milliseconds interval = std::chrono::milliseconds(5));

}  // namespace ddprun::sdk
