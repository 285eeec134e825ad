// ddprun-store-bench: light workers against a TCPStore server (bench/README.md, "The agent store
// at scale").
//
// Each light worker is a client that speaks torch's store protocol (store/codec.h) and sends
// what one rank sends at `init_process_group(backend, "env://")` with the agent store
// (TORCHELASTIC_USE_AGENT_STORE=True), and nothing else: no Python, no tensors.
//
//   --dialect legacy  torch 1.13: `ADD init/ 1` on the main connection, then the silent
//                     callback connection (--callback on), the key exchange, then the store-based
//                     barrier (`ADD key 1`, then `ADD key 0` every 10 ms until it reads N).
//   --dialect v2      torch 2.4+: VALIDATE, PING, `ADD init/ 1`, the key exchange; the barrier
//                     only with --barrier on (TORCH_DIST_INIT_BARRIER=1): `ADD key 1`,
//                     `ADD key 0`, the last rank sets `last_worker`, everyone WAITs for it.
//   --exchange nccl   rank 0 sets a 128-byte id, every other rank WAITs for it and GETs it (the
//                     NCCL id broadcast at the first collective).
//   --exchange gloo   Gloo's full mesh: every rank sets `rank_R` and its addresses (136 bytes per
//                     rank), then WAITs and GETs every other rank's: N^2 requests and N^3 bytes,
//                     so only for a few hundred ranks.
//
// Workers bind source addresses 127.1.x.y, --ranks-per-address of them on each (8: a node of
// eight GPUs), so a store's per-address limit sees what it would see in a job. The ranks are
// spread over --procs forked processes (each holds at most its descriptor limit of sockets),
// and at most --connect-window of each process's workers are connecting at once.
//
// Prints one JSON object: from the first connect to the last rank done, the ranks' own times
// (median and slowest), requests and bytes each way. Exit 0 when every rank finished, 1 on an
// error, 2 on the timeout.
//
// --serve runs ddprun's store alone (store/server.h with the agent's limits, the agent's
// descriptor limit, sized for --ranks workers as the agent sizes it once a round forms) on
// 127.0.0.1 and a free port, prints "port N", and serves until SIGTERM.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/open_files.h"
#include "store/codec.h"
#include "store/server.h"

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using ddprun::store::Dialect;
using ddprun::store::Op;
using ddprun::store::Request;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchConfig {
  std::string host = "127.0.0.1";
  int port = 0;
  int ranks = 8;
  int procs = 1;
  std::string dialect = "legacy";
  bool callback = true;
  std::string exchange = "nccl";
  std::string barrier = "auto";  ///< auto: on for legacy (1.13 always runs it), off for v2
  int ranks_per_address = 8;
  int connect_window = 256;
  double timeout_s = 300;
  /// Every key starts with it: a run's keys are its own even on a store that served others.
  std::string prefix;
};

constexpr std::size_t kGlooAddressBytes = 136;  ///< a gloo pair address (sockaddr_storage, seq)
constexpr std::size_t kNcclIdBytes = 128;       ///< ncclUniqueId
constexpr std::chrono::milliseconds kBarrierPoll{10};

/// The requests a worker sends, built field by field (Request has more fields than each op uses).
Request word_request(Op op, std::uint32_t word) {
  Request q;
  q.op = op;
  q.word = word;
  return q;
}
Request key_request(Op op, std::string key) {
  Request q;
  q.op = op;
  q.keys.push_back(std::move(key));
  return q;
}
Request add_request(std::string key, std::int64_t delta) {
  Request q = key_request(Op::Add, std::move(key));
  q.delta = delta;
  return q;
}
Request set_request(std::string key, std::string value) {
  Request q = key_request(Op::Set, std::move(key));
  q.values.push_back(std::move(value));
  return q;
}

/// What a reply looks like, so the worker knows how many bytes to read.
enum class Reply { None, U8, U32, I64, Bytes };

std::int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// Counters of one process's workers.
struct Totals {
  std::uint64_t requests = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t barrier_polls = 0;
  std::uint64_t callback_closed = 0;
  std::vector<double> rank_ms;  ///< each finished rank: connect to done
  std::int64_t last_done_ns = 0;
  std::vector<std::string> errors;
};

/// One light worker: a fixed walk through the phases, one request at a time.
class Worker {
 public:
  enum class Phase { Connect, Validate, Ping, Init, Callback, Gloo, Barrier, Nccl, Done };

  Worker(asio::io_context& io, const BenchConfig& c, int rank, Totals& totals,
         std::function<void()> on_connected)
      : c_(c),
        rank_(rank),
        dialect_(c.dialect == "v2" ? Dialect::V2 : Dialect::Legacy),
        barrier_(c.barrier == "on" || (c.barrier == "auto" && c.dialect == "legacy")),
        main_(io),
        callback_(io),
        timer_(io),
        totals_(totals),
        on_connected_(std::move(on_connected)) {}

  bool done() const { return phase_ == Phase::Done; }

  void start() {
    started_ = Clock::now();
    connect(main_, [this] {
      on_connected_();
      advance(dialect_ == Dialect::V2 ? Phase::Validate : Phase::Init);
    });
  }

 private:
  /// Binds the socket to this rank's source address, then connects to the server.
  void connect(tcp::socket& socket, std::function<void()> then) {
    error_code ec;
    socket.open(tcp::v4(), ec);
    const auto node = static_cast<unsigned>(rank_ / std::max(1, c_.ranks_per_address)) + 1;
    const asio::ip::address_v4 source((127u << 24) | (1u << 16) | (node & 0xffffu));
    if (!ec) socket.bind(tcp::endpoint(source, 0), ec);
    if (ec) return fail("bind " + source.to_string() + ": " + ec.message());
    const tcp::endpoint server(asio::ip::make_address(c_.host),
                               static_cast<unsigned short>(c_.port));
    socket.async_connect(server, [this, &socket, then = std::move(then)](error_code ec) {
      if (ec) return fail("connect: " + ec.message());
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      then();
    });
  }

  void advance(Phase next) {
    phase_ = next;
    step_ = 0;
    run();
  }

  /// Sends the current phase's next request, or moves on.
  void run() {
    const int n = c_.ranks;
    switch (phase_) {
      case Phase::Connect:
        return;
      case Phase::Validate:
        send(word_request(Op::Validate, ddprun::store::kValidationMagic), Reply::None, Phase::Ping);
        return;
      case Phase::Ping:
        send(word_request(Op::Ping, static_cast<std::uint32_t>(rank_)), Reply::U32, Phase::Init);
        return;
      case Phase::Init:
        send(add_request("init/", 1), Reply::I64,
             dialect_ == Dialect::Legacy && c_.callback ? Phase::Callback : Phase::Gloo);
        return;
      case Phase::Callback:
        // The 1.13 client's second connection: opened, then silent for the worker's life.
        connect(callback_, [this] {
          watch_callback();
          advance(Phase::Gloo);
        });
        return;
      case Phase::Gloo:
        return gloo_step(n);
      case Phase::Barrier:
        return barrier_step(n);
      case Phase::Nccl:
        if (c_.exchange != "nccl") return advance(Phase::Done);
        if (rank_ == 0)
          return send(set_request(c_.prefix + "0", std::string(kNcclIdBytes, 'n')), Reply::None,
                      Phase::Done);
        if (step_ == 0) return send_then(key_request(Op::Wait, c_.prefix + "0"), Reply::U8);
        return send(key_request(Op::Get, c_.prefix + "0"), Reply::Bytes, Phase::Done);
      case Phase::Done:
        finished();
        return;
    }
  }

  /// Gloo's full mesh: step 0 sets rank_R, then 2 steps (WAIT, GET) per rank; then the
  /// addresses: one SET, then 2 steps per other rank.
  void gloo_step(int n) {
    if (c_.exchange != "gloo") return advance(Phase::Barrier);
    const int s = step_;
    const int names_end = 1 + 2 * n;
    if (s == 0)
      return send_then(set_request(c_.prefix + "0/0/rank_" + std::to_string(rank_),
                                   "host" + std::to_string(rank_ / c_.ranks_per_address)),
                       Reply::None);
    if (s < names_end) {
      const std::string key = c_.prefix + "0/0/rank_" + std::to_string((s - 1) / 2);
      if ((s - 1) % 2 == 0) return send_then(key_request(Op::Wait, key), Reply::U8);
      return send_then(key_request(Op::Get, key), Reply::Bytes);
    }
    if (s == names_end)
      return send_then(
          set_request(c_.prefix + "0/0/" + std::to_string(rank_),
                      std::string(kGlooAddressBytes * static_cast<std::size_t>(n), 'a')),
          Reply::None);
    const int peer_step = s - names_end - 1;
    int peer = peer_step / 2;
    if (peer >= rank_) ++peer;  // no exchange with itself
    if (peer >= n) return advance(Phase::Barrier);
    const std::string key = c_.prefix + "0/0/" + std::to_string(peer);
    if (peer_step % 2 == 0) return send_then(key_request(Op::Wait, key), Reply::U8);
    send_then(key_request(Op::Get, key), Reply::Bytes);
  }

  /// 1.13: ADD +1, then ADD 0 every 10 ms until it reads N. 2.x: ADD +1, ADD 0; the rank that
  /// reads N sets last_worker; every rank WAITs for it.
  void barrier_step(int n) {
    if (!barrier_) return advance(Phase::Nccl);
    const std::string key = c_.prefix + "store_based_barrier_key:1";
    if (step_ == 0) return send_then(add_request(key, 1), Reply::I64);
    if (dialect_ == Dialect::Legacy) {
      if (step_ > 1 && last_i64_ >= n) return advance(Phase::Nccl);
      if (step_ == 1) return send_then(add_request(key, 0), Reply::I64);
      ++totals_.barrier_polls;
      timer_.expires_after(kBarrierPoll);
      timer_.async_wait([this, key](error_code ec) {
        if (ec) return;
        send_then(add_request(key, 0), Reply::I64);
      });
      return;
    }
    const std::string last = key + ":last_worker";
    if (step_ == 1) return send_then(add_request(key, 0), Reply::I64);
    if (step_ == 2 && last_i64_ >= n) return send_then(set_request(last, "1"), Reply::None);
    if (step_ <= 3) return send(key_request(Op::Wait, last), Reply::U8, Phase::Nccl);
  }

  /// A store that closes a 1.13 worker's silent callback connection leaves the worker's watch
  /// thread spinning: counted as an error.
  void watch_callback() {
    callback_.async_read_some(asio::buffer(callback_byte_), [this](error_code ec, std::size_t) {
      if (!ec) return watch_callback();
      if (ec == asio::error::operation_aborted) return;
      ++totals_.callback_closed;
      if (totals_.errors.size() < 8)
        totals_.errors.push_back("rank " + std::to_string(rank_) +
                                 ": the store closed the callback connection: " + ec.message());
    });
  }

  /// Sends `q`; once its reply is read, the same phase goes on with its next step.
  void send_then(const Request& q, Reply reply) { send(q, reply, std::nullopt); }

  /// Sends `q`; once its reply is read, moves to `next` (or the phase's next step).
  void send(const Request& q, Reply reply, std::optional<Phase> next) {
    out_ = ddprun::store::encode_request(dialect_, q);
    ++totals_.requests;
    totals_.bytes_out += out_.size();
    asio::async_write(main_, asio::buffer(out_), [this, reply, next](error_code ec, std::size_t) {
      if (ec) return fail("write: " + ec.message());
      read_reply(reply, next);
    });
  }

  void read_reply(Reply reply, std::optional<Phase> next) {
    auto after = [this, next] {
      if (next) return advance(*next);
      ++step_;
      run();
    };
    const std::size_t fixed = reply == Reply::None  ? 0
                              : reply == Reply::U8  ? 1
                              : reply == Reply::U32 ? 4
                                                    : 8;
    if (fixed == 0) return after();
    in_.resize(fixed);
    asio::async_read(main_, asio::buffer(in_), [this, reply, after](error_code ec, std::size_t n) {
      if (ec) return fail("read: " + ec.message());
      totals_.bytes_in += n;
      if (reply == Reply::I64) std::memcpy(&last_i64_, in_.data(), sizeof(last_i64_));
      if (reply != Reply::Bytes) return after();
      std::uint64_t length = 0;
      std::memcpy(&length, in_.data(), sizeof(length));
      in_.resize(length);
      asio::async_read(main_, asio::buffer(in_), [this, after](error_code ec, std::size_t n) {
        if (ec) return fail("read value: " + ec.message());
        totals_.bytes_in += n;
        after();
      });
    });
  }

  void finished() {
    const auto now = Clock::now();
    totals_.rank_ms.push_back(std::chrono::duration<double, std::milli>(now - started_).count());
    totals_.last_done_ns = std::max(totals_.last_done_ns, ns_of(now));
  }

  void fail(const std::string& why) {
    if (totals_.errors.size() < 8)
      totals_.errors.push_back("rank " + std::to_string(rank_) + ": " + why);
    // A worker that never connected still frees its place in the connect window.
    if (phase_ == Phase::Connect) on_connected_();
    phase_ = Phase::Done;
  }

  const BenchConfig& c_;
  int rank_;
  Dialect dialect_;
  bool barrier_;
  tcp::socket main_;
  tcp::socket callback_;
  asio::steady_timer timer_;
  Totals& totals_;
  std::function<void()> on_connected_;
  Phase phase_ = Phase::Connect;
  int step_ = 0;
  std::string out_;
  std::string in_;
  std::array<char, 1> callback_byte_{};
  std::int64_t last_i64_ = 0;
  Clock::time_point started_;
};

/// Runs ranks [first, first + count) in this process; returns its report.
json run_part(const BenchConfig& c, int first, int count) {
  asio::io_context io;
  Totals totals;
  std::vector<std::unique_ptr<Worker>> workers;
  workers.reserve(static_cast<std::size_t>(count));
  int next = 0;
  std::function<void()> start_next = [&] {
    if (next >= count) return;
    workers[static_cast<std::size_t>(next++)]->start();
  };
  for (int i = 0; i < count; ++i)
    workers.push_back(std::make_unique<Worker>(io, c, first + i, totals, start_next));
  const std::int64_t first_ns = ns_of(Clock::now());
  for (int i = 0; i < std::min(count, std::max(1, c.connect_window)); ++i) start_next();
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<long long>(c.timeout_s * 1000));
  std::size_t done = 0;
  while (Clock::now() < deadline) {
    io.run_for(std::chrono::milliseconds(50));
    done = static_cast<std::size_t>(
        std::count_if(workers.begin(), workers.end(), [](const auto& w) { return w->done(); }));
    if (done == workers.size()) break;
  }
  return {{"first_ns", first_ns},
          {"last_done_ns", totals.last_done_ns},
          {"done", totals.rank_ms.size()},
          {"ended", done},
          {"requests", totals.requests},
          {"bytes_out", totals.bytes_out},
          {"bytes_in", totals.bytes_in},
          {"barrier_polls", totals.barrier_polls},
          {"callback_closed", totals.callback_closed},
          {"rank_ms", totals.rank_ms},
          {"errors", totals.errors}};
}

/// Reads everything a child writes to `fd` until it closes it or `deadline` passes.
std::optional<std::string> read_all(int fd, Clock::time_point deadline) {
  std::string text;
  char chunk[65536];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000))) <= 0) continue;
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n <= 0) return text;
    text.append(chunk, static_cast<std::size_t>(n));
  }
}

int run_bench(const BenchConfig& c) {
  ddprun::common::raise_open_file_limit();
  const int k = std::max(1, std::min(c.procs, c.ranks));
  std::vector<pid_t> children;
  std::vector<int> fds;
  for (int part = 0, first = 0; part < k; ++part) {
    const int count = c.ranks / k + (part < c.ranks % k ? 1 : 0);
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(pipe_fds[0]);
      const std::string report = run_part(c, first, count).dump();
      for (std::size_t at = 0; at < report.size();) {
        const ssize_t n = ::write(pipe_fds[1], report.data() + at, report.size() - at);
        if (n <= 0) break;
        at += static_cast<std::size_t>(n);
      }
      ::_exit(0);
    }
    ::close(pipe_fds[1]);
    children.push_back(pid);
    fds.push_back(pipe_fds[0]);
    first += count;
  }
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<long long>(c.timeout_s * 1000 + 5000));
  json out{{"ranks", c.ranks},       {"procs", k},
           {"dialect", c.dialect},   {"callback", c.dialect == "legacy" && c.callback},
           {"exchange", c.exchange}, {"ranks_per_address", c.ranks_per_address}};
  std::int64_t first_ns = 0, last_ns = 0;
  std::uint64_t done = 0, requests = 0, bytes_out = 0, bytes_in = 0, polls = 0, closed = 0;
  std::vector<double> rank_ms;
  std::vector<std::string> errors;
  bool timed_out = false;
  for (int fd : fds) {
    const auto text = read_all(fd, deadline);
    const json part = text ? json::parse(*text, nullptr, false) : json();
    if (!part.is_object()) {
      timed_out = true;
      continue;
    }
    const auto part_first = part.at("first_ns").get<std::int64_t>();
    first_ns = first_ns == 0 ? part_first : std::min(first_ns, part_first);
    last_ns = std::max(last_ns, part.at("last_done_ns").get<std::int64_t>());
    done += part.at("done").get<std::uint64_t>();
    requests += part.at("requests").get<std::uint64_t>();
    bytes_out += part.at("bytes_out").get<std::uint64_t>();
    bytes_in += part.at("bytes_in").get<std::uint64_t>();
    polls += part.at("barrier_polls").get<std::uint64_t>();
    closed += part.at("callback_closed").get<std::uint64_t>();
    for (const auto& ms : part.at("rank_ms")) rank_ms.push_back(ms.get<double>());
    for (const auto& e : part.at("errors"))
      if (errors.size() < 8) errors.push_back(e.get<std::string>());
  }
  for (pid_t pid : children) ::kill(pid, SIGKILL);
  for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
  for (int fd : fds) ::close(fd);
  std::sort(rank_ms.begin(), rank_ms.end());
  out["done"] = done;
  // Only when every rank finished: a time to "last done" means nothing otherwise.
  if (done == static_cast<std::uint64_t>(c.ranks))
    out["first_connect_to_last_done_ms"] = static_cast<double>(last_ns - first_ns) / 1e6;
  out["rank_ms_median"] = rank_ms.empty() ? 0.0 : rank_ms[rank_ms.size() / 2];
  out["rank_ms_max"] = rank_ms.empty() ? 0.0 : rank_ms.back();
  out["requests_per_rank"] = static_cast<double>(requests) / std::max(1, c.ranks);
  out["bytes_out_per_rank"] = static_cast<double>(bytes_out) / std::max(1, c.ranks);
  out["bytes_in_per_rank"] = static_cast<double>(bytes_in) / std::max(1, c.ranks);
  out["barrier_polls"] = polls;
  out["callback_closed"] = closed;
  if (!errors.empty()) out["errors"] = errors;
  std::cout << out.dump() << std::endl;
  if (closed > 0) return 1;
  if (timed_out || done != static_cast<std::uint64_t>(c.ranks)) return errors.empty() ? 2 : 1;
  return 0;
}

/// ddprun's store alone, as the agent runs it.
int serve(int workers) {
  const auto files = ddprun::common::raise_open_file_limit();
  asio::io_context io;
  ddprun::store::StoreServer server(io);
  // What the agent does once the round has formed.
  server.expect_workers(static_cast<std::size_t>(workers), files.soft);
  if (auto why = server.listen("127.0.0.1", 0)) {
    std::fprintf(stderr, "%s\n", why->message.c_str());
    return 1;
  }
  std::printf("port %d\n", server.port());
  std::fflush(stdout);
  asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&server](const error_code&, int) { server.shutdown(); });
  io.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddprun-store-bench: light workers' init_process_group against a TCPStore server"};
  BenchConfig c;
  bool serve_mode = false;
  app.add_flag("--serve", serve_mode, "run ddprun's store alone and print its port");
  app.add_option("--host", c.host, "the store's address");
  app.add_option("--port", c.port, "the store's port");
  app.add_option("--ranks", c.ranks, "light workers")->check(CLI::Range(1, 1 << 20));
  app.add_option("--procs", c.procs, "processes the workers are spread over")
      ->check(CLI::Range(1, 256));
  app.add_option("--dialect", c.dialect, "legacy (torch 1.13) or v2 (torch 2.4+)")
      ->check(CLI::IsMember({"legacy", "v2"}));
  app.add_option("--callback", c.callback, "legacy: open the 1.13 callback connection (on|off)");
  app.add_option("--exchange", c.exchange, "nccl (one id) or gloo (full mesh)")
      ->check(CLI::IsMember({"nccl", "gloo"}));
  app.add_option("--barrier", c.barrier, "the store-based barrier: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--ranks-per-address", c.ranks_per_address, "workers per source address")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--connect-window", c.connect_window, "workers connecting at once per process")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--timeout", c.timeout_s, "seconds before giving up");
  CLI11_PARSE(app, argc, argv);
  if (serve_mode) return serve(c.ranks);
  c.prefix = "//worker/attempt_" + std::to_string(::getpid()) + "/default_pg/";
  if (c.port <= 0) {
    std::cerr << "ddprun-store-bench: --port is required (the store's port)\n";
    return 1;
  }
  return run_bench(c);
}
