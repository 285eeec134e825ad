#pragma once
// A blocking HTTP client for the metrics tests: raw POSIX sockets, every wait bounded, so a
// test can also play a broken or silent client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

namespace ddprun::testing {

/// One connection to 127.0.0.1:port.
class HttpPeer {
 public:
  explicit HttpPeer(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~HttpPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  HttpPeer(const HttpPeer&) = delete;
  HttpPeer& operator=(const HttpPeer&) = delete;

  bool connected() const { return connected_; }

  /// Writes all of `bytes`; false when the server closed the connection first.
  bool send_bytes(const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  /// Everything the server sends until it closes the connection, at most `limit` long;
  /// `closed` tells whether it did close.
  std::string read_to_end(std::chrono::milliseconds limit, bool* closed = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string out;
    char buf[65536];
    if (closed) *closed = false;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return out;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        if (closed) *closed = true;
        return out;
      }
      out.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct HttpReply {
  int status = 0;  ///< 0: no answer
  std::string head;
  std::string body;
};

inline HttpReply parse_reply(const std::string& raw) {
  HttpReply reply;
  const auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.head = raw.substr(0, end);
  reply.body = raw.substr(end + 4);
  return reply;
}

/// GET `target` with "Connection: close" and `headers` ("Name: value\r\n" each); bounded by
/// `limit`.
inline HttpReply http_get(int port, const std::string& target,
                          std::chrono::milliseconds limit = std::chrono::seconds(10),
                          const std::string& headers = "") {
  HttpPeer peer(port);
  if (!peer.connected()) return {};
  if (!peer.send_bytes("GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                       headers + "\r\n"))
    return {};
  return parse_reply(peer.read_to_end(limit));
}

/// The value of the sample `series` (e.g. `ddprun_rdzv_jobs{phase="running"}`) in exposition
/// text; NaN when it is not there.
inline double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace ddprun::testing
