#include "tests/support/raw_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>

#include "rendezvous/framing.h"
#include "rendezvous/protocol.h"

namespace ddprun::testing {

using Clock = std::chrono::steady_clock;

std::string frame_header(std::uint32_t size) {
  return {static_cast<char>(size >> 24), static_cast<char>((size >> 16) & 0xff),
          static_cast<char>((size >> 8) & 0xff), static_cast<char>(size & 0xff)};
}

RawPeer::RawPeer(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd_ >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
}

RawPeer::~RawPeer() {
  if (fd_ >= 0) ::close(fd_);
}

bool RawPeer::send_bytes(const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

bool RawPeer::send_body(const std::string& body) {
  return send_bytes(frame_header(static_cast<std::uint32_t>(body.size())) + body);
}

bool RawPeer::fill(std::size_t n, Clock::time_point deadline) {
  char chunk[65536];
  while (buffer_.size() < n && !eof_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t got = ::recv(fd_, chunk, sizeof chunk, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      eof_ = true;
      break;
    }
    buffer_.append(chunk, static_cast<std::size_t>(got));
  }
  return buffer_.size() >= n;
}

std::optional<nlohmann::json> RawPeer::read_frame(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  if (!fill(4, deadline)) return std::nullopt;
  std::uint32_t size = 0;
  for (int i = 0; i < 4; ++i) size = (size << 8) | static_cast<unsigned char>(buffer_[i]);
  if (!fill(4 + size, deadline)) return std::nullopt;
  const std::string body = buffer_.substr(4, size);
  buffer_.erase(0, 4 + size);
  return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
}

bool RawPeer::closed_by_server(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!eof_) {
    buffer_.clear();
    if (!fill(1, deadline) && !eof_) return false;
  }
  return true;
}

void RawPeer::reset_on_close() {
  linger no_linger{1, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &no_linger, sizeof no_linger);
}

bool RawPeer::greet(const std::string& role) {
  if (!send_json(rdzv::make_hello(role))) return false;
  auto hello = read_frame(std::chrono::seconds(10));
  return hello && !rdzv::check_hello(*hello);
}

bool status_answers(int port) {
  RawPeer peer(port);
  if (!peer.greet("status")) return false;
  if (!peer.send_json(rdzv::to_json(rdzv::AgentMessage{rdzv::StatusQuery{}}))) return false;
  auto reply = peer.read_frame(std::chrono::seconds(10));
  return reply && reply->value("type", "") == "status_reply";
}

}  // namespace ddprun::testing
