#pragma once
// Reading many mostly idle sockets without a buffer each: wait until a socket is readable, then
// read what is there into one buffer per thread, and hand the bytes over at once, inside the
// handler, so no read is ever pending into that buffer while another socket's bytes sit in it.
// A buffer per connection would cost its size for every idle connection: 16 KiB each was 256 MiB
// for a rendezvous daemon holding 16,384 agents, 64 KiB each 1 GiB for a store serving 8,192
// torch 1.13 workers (docs/design.md#rendezvous-at-scale, #the-agent-store).
#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <string_view>
#include <utility>

namespace ddprun::common {

/// The bytes one read may hand over.
constexpr std::size_t kReadReadyBytes = 64 * 1024;

/// After a wait for `socket` to be readable ended with `wait_ec`: reads what is there into one
/// buffer per thread and calls `on_data(error_code, std::string_view bytes)`, the bytes valid
/// only during the call (on a failed wait: the error and no bytes). Returns false, having called
/// nothing, when there was nothing to read after all: wait again. For an owner whose wait's
/// handler holds only itself (8 bytes less in every pending wait than async_read_ready's, which
/// also holds the socket's address: docs/design.md#rendezvous-at-scale).
template <class Socket, class OnData>
bool read_ready(Socket& socket, boost::system::error_code wait_ec, OnData&& on_data) {
  if (wait_ec) {
    on_data(wait_ec, std::string_view());
    return true;
  }
  static thread_local std::array<char, kReadReadyBytes> chunk{};
  boost::system::error_code read_ec;
  socket.non_blocking(true, read_ec);
  const std::size_t n = read_ec ? 0 : socket.read_some(boost::asio::buffer(chunk), read_ec);
  if (read_ec == boost::asio::error::would_block || read_ec == boost::asio::error::try_again)
    return false;
  on_data(read_ec, std::string_view(chunk.data(), n));
  return true;
}

/// Waits until `socket` is readable, reads what is there, and calls
/// `on_data(error_code, std::string_view bytes)` as read_ready does; a wake with nothing to read
/// waits again. `on_data` must keep the socket's owner alive (a shared_ptr it captures): the
/// wait's handler refers to the socket. `Socket`: a TCP socket on any executor.
template <class Socket, class OnData>
void async_read_ready(Socket& socket, OnData on_data) {
  socket.async_wait(Socket::wait_read,
                    [&socket, on_data = std::move(on_data)](boost::system::error_code ec) mutable {
                      if (!read_ready(socket, ec, on_data))
                        async_read_ready(socket, std::move(on_data));
                    });
}

}  // namespace ddprun::common
