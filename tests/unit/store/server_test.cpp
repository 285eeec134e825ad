// The agent's store server on a real loopback socket: what its limits do to clients that
// never read (docs/operations.md#limits).
#include "store/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "tests/support/polling.h"

using namespace ddprun::store;
using namespace std::chrono_literals;

namespace {

/// A blocking client socket; `receive_buffer` (bytes, 0: the default) is set before connecting,
/// so a client that never reads holds little in its kernel buffer.
class Client {
 public:
  Client(int port, int receive_buffer = 0, const char* from = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (receive_buffer > 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    if (from != nullptr) {  // another loopback address as the source
      sockaddr_in source{};
      source.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &source.sin_addr);
      REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&source), sizeof source) == 0);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~Client() { ::close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send(const Request& request) {
    const std::string bytes = encode_request(Dialect::Legacy, request);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      done += static_cast<std::size_t>(n);
    }
  }

  /// Exactly `n` bytes, or fewer when the connection ends or 10 s pass.
  std::string read(std::size_t n) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    char buf[65536];
    while (out.size() < n && poll_in(deadline)) {
      const ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<std::size_t>(got));
    }
    return out;
  }

  /// True when the server closes the connection within `limit` (what it sent first is skipped).
  bool closed_by_server(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    char buf[65536];
    while (poll_in(deadline)) {
      const ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
      if (got <= 0) return true;
    }
    return false;
  }

 private:
  bool poll_in(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(left.count())) > 0;
  }
  int fd_ = -1;
};

/// A store server on 127.0.0.1 run by its own thread; `on_io` reads its state there.
struct RunningServer {
  boost::asio::io_context io;
  StoreServer server;
  std::thread thread;

  explicit RunningServer(StoreLimits limits) : server(io, limits) {
    REQUIRE_FALSE(server.listen("127.0.0.1", 0));
    thread = std::thread([this] { io.run(); });
  }
  ~RunningServer() {
    boost::asio::post(io, [this] { server.shutdown(); });
    thread.join();
  }
  template <class F>
  auto on_io(F f) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    boost::asio::post(io, [&task] { task(); });
    return result.get();
  }
};

Request request(Op op, std::vector<std::string> keys, std::vector<std::string> values = {}) {
  return Request{op, std::move(keys), std::move(values), 0, 0};
}

}  // namespace

TEST_CASE("watchers that never read are closed, the largest first, at the store's reply budget",
          "[store][unit][security]") {
  StoreLimits limits;
  limits.max_total_queued_reply_bytes = 16 << 20;
  RunningServer store(limits);
  const int port = store.server.port();
  std::vector<std::unique_ptr<Client>> watchers;
  for (int i = 0; i < 10; ++i) {
    watchers.push_back(std::make_unique<Client>(port, 4096));
    watchers.back()->send(request(Op::WatchKey, {"/big"}));
    REQUIRE(watchers.back()->read(1) ==
            encode_u8(static_cast<std::uint8_t>(WatchEvent::Registered)));
  }
  // Three 4 MiB values: each pushed to ten watchers with the old value beside it (up to 8 MiB
  // each), 200 MiB in all for connections that read nothing.
  Client setter(port);
  const std::string value(4 << 20, 'v');
  for (int i = 0; i < 3; ++i) setter.send(request(Op::Set, {"/big"}, {value}));
  setter.send(request(Op::Get, {"/big"}));
  const std::string reply = setter.read(encode_bytes(value).size());
  CHECK(reply == encode_bytes(value));  // the reader is never the one cut off

  // What stays queued is within the budget, however many watchers there were.
  CHECK(store.on_io([&] { return store.server.queued_bytes(); }) <=
        limits.max_total_queued_reply_bytes);
  int closed = 0;
  for (auto& w : watchers) closed += w->closed_by_server(2s) ? 1 : 0;
  CHECK(closed >= 7);
  CHECK(store.on_io([&] { return store.server.connections(); }) ==
        11 - static_cast<std::size_t>(closed));
}

TEST_CASE("one address cannot take every connection of the store", "[store][unit][security]") {
  StoreLimits limits;
  limits.max_connections_per_address = 4;
  RunningServer store(limits);
  const int port = store.server.port();
  std::vector<std::unique_ptr<Client>> hog;
  for (int i = 0; i < 6; ++i) hog.push_back(std::make_unique<Client>(port, 0, "127.0.0.2"));
  // The fifth and sixth from 127.0.0.2 are closed; the first four stay open.
  CHECK(hog[4]->closed_by_server(2s));
  CHECK(hog[5]->closed_by_server(2s));
  CHECK(store.on_io([&] { return store.server.connections(); }) == 4);
  // A worker from another address is served.
  Client worker(port, 0, "127.0.0.3");
  worker.send(request(Op::Add, {"/n"}));
  CHECK(worker.read(8) == encode_i64(0));
  // Once the hog's connections close, it may connect again.
  hog.clear();
  bool served = false;
  for (int tries = 0; tries < 100 && !served; ++tries) {
    Client again(port, 0, "127.0.0.2");
    served = !again.closed_by_server(20ms);
  }
  CHECK(served);
}

TEST_CASE("at the connection limit a flood of idle connections replaces itself and workers get in",
          "[store][unit][security]") {
  StoreLimits limits;
  limits.max_connections = 8;
  RunningServer store(limits);
  const int port = store.server.port();
  // An old worker: a connection that spoke, and a silent one (a torch 1.13 callback).
  Client worker(port);
  worker.send(request(Op::Add, {"/n"}));
  REQUIRE(worker.read(8) == encode_i64(0));
  Client callback(port);
  // Twenty idle connections from elsewhere, more than the limit holds.
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(std::make_unique<Client>(port, 0, "127.0.0.2"));
  // A new worker still gets in and is answered.
  Client late(port);
  late.send(request(Op::Add, {"/n"}));
  CHECK(late.read(8) == encode_i64(0));
  // The old worker's connections, the silent one included, are still served.
  worker.send(request(Op::Add, {"/n"}));
  CHECK(worker.read(8) == encode_i64(0));
  callback.send(request(Op::Add, {"/n"}));
  CHECK(callback.read(8) == encode_i64(0));
  CHECK(store.on_io([&] { return store.server.connections(); }) <= 8);
}

TEST_CASE(
    "a round with more workers than the connection limit keeps every worker's two connections",
    "[store][unit]") {
  StoreLimits limits;
  limits.max_connections = 8;
  RunningServer store(limits);
  const int port = store.server.port();
  // What the agent does once a round of 40 workers has formed: room for 2 x 40 and a margin.
  store.on_io([&] {
    store.server.expect_workers(40, 0);
    return 0;
  });
  CHECK(store.on_io([&] { return store.server.max_connections(); }) >= 80);
  // 40 torch 1.13 workers from 5 nodes: a connection that speaks and a silent callback each.
  std::vector<std::unique_ptr<Client>> mains, callbacks;
  for (int w = 0; w < 40; ++w) {
    const std::string from = "127.0.1." + std::to_string(1 + w / 8);
    mains.push_back(std::make_unique<Client>(port, 0, from.c_str()));
    mains.back()->send(request(Op::Add, {"/n"}));
    REQUIRE(mains.back()->read(8).size() == 8);
    callbacks.push_back(std::make_unique<Client>(port, 0, from.c_str()));
  }
  // The last connections may still wait in the accept queue.
  CHECK(ddprun::testing::wait_until(
      [&] { return store.on_io([&] { return store.server.connections(); }) == 80; }, 5s));
  // No callback connection was closed to make room: each is still served.
  int served = 0;
  for (auto& callback : callbacks) {
    callback->send(request(Op::Add, {"/m"}));
    served += callback->read(8).size() == 8 ? 1 : 0;
  }
  CHECK(served == 40);
  // Without the round's size, the limit of 8 holds: a store that knows no round stays small.
  RunningServer small(limits);
  CHECK(small.on_io([&] { return small.server.max_connections(); }) == 8);
}
