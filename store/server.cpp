#include "store/server.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/write.hpp>
#include <chrono>
#include <vector>

#include "common/log.h"
#include "common/read_ready.h"

namespace ddprun::store {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

/// Workers are fork+exec'd on this thread: no descriptor of the store may reach them (Asio
/// opens sockets without close-on-exec), or a worker would hold the port after the agent.
void close_on_exec(int fd) {
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

}  // namespace

StoreServer::StoreServer(asio::io_context& io, StoreLimits limits)
    : io_(io),
      limits_(limits),
      acceptor_(io),
      accepts_(
          acceptor_, [this](tcp::socket socket) { on_accepted(std::move(socket)); },
          [this](const error_code& ec) {
            // Out of descriptors, most often: the loop tries again shortly.
            spdlog::warn("store: cannot accept a connection with {} open: {}{}", sessions_.size(),
                         ec.message(),
                         ec == asio::error::no_descriptors
                             ? " (the open-file limit: raise ddprun's hard limit, ulimit -Hn)"
                             : "");
          }),
      state_(limits.max_parked_bytes),
      close_warnings_(io, "store connections") {}

StoreServer::~StoreServer() { shutdown(); }

std::optional<common::Error> StoreServer::listen(const std::string& host, int port) {
  std::vector<tcp::endpoint> candidates;
  if (host.empty()) {
    // Dual-stack first, as torch's own server does; IPv4 alone where IPv6 is off.
    candidates.emplace_back(tcp::v6(), static_cast<unsigned short>(port));
    candidates.emplace_back(tcp::v4(), static_cast<unsigned short>(port));
  } else {
    error_code ec;
    auto address = asio::ip::make_address(host, ec);
    if (ec) return common::Error{"the store needs an IP address to listen on, not '" + host + "'"};
    candidates.emplace_back(address, static_cast<unsigned short>(port));
  }
  std::string last = "no address to listen on";
  for (const auto& endpoint : candidates) {
    error_code ec;
    tcp::acceptor acceptor = common::open_listener(io_, endpoint, ec);
    if (ec) {
      last = "cannot listen on port " + std::to_string(port) + " of " +
             (host.empty() ? std::string("every address") : host) + ": " + ec.message();
      if (ec == asio::error::address_in_use) return common::Error{last};
      continue;
    }
    port_ = acceptor.local_endpoint().port();
    acceptor_ = std::move(acceptor);
    accepts_.start();
    return std::nullopt;
  }
  return common::Error{last};
}

std::size_t StoreServer::max_connections() const {
  return std::max(limits_.max_connections, room_for_workers_);
}

void StoreServer::expect_workers(std::size_t workers, std::uint64_t open_files) {
  // Two per torch 1.13 worker, and a few for the agent's own tools and a 2.x client's retries.
  constexpr std::size_t kSpare = 64;
  room_for_workers_ = 2 * workers + kSpare;
  // The agent's own descriptors: its pipes to the workers, logs, the rendezvous connection.
  const std::size_t needed = room_for_workers_ + kSpare + 3 * workers / 8;
  if (open_files == 0 || open_files == RLIM_INFINITY || needed <= open_files ||
      open_files_warned_for_ == workers)
    return;
  open_files_warned_for_ = workers;
  spdlog::warn(
      "store: this round's {} workers may hold {} connections to this node's store (two per "
      "torch 1.13 worker), more than its open-file limit of {} allows: workers beyond it wait "
      "in connect until their store timeout. Raise the hard limit ddprun runs under (ulimit "
      "-Hn, LimitNOFILE= in a systemd unit, the limits srun propagates)",
      workers, 2 * workers, open_files);
}

void StoreServer::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  error_code ec;
  acceptor_.close(ec);
  accepts_.stop();
  close_warnings_.stop();
  for (auto& [id, session] : sessions_) session->socket.close(ec);
  // The handlers still queued find their session gone (or stopped_) and return.
  sessions_.clear();
  queued_total_ = 0;
  per_address_.clear();
}

void StoreServer::on_accepted(tcp::socket socket) {
  error_code ignored;
  if (sessions_.size() >= max_connections() && !make_room()) {
    if (!full_logged_)
      spdlog::warn(
          "store: {} connections are open, the limit; refusing more until some close (each "
          "torch 1.13 worker holds two)",
          sessions_.size());
    full_logged_ = true;
    socket.close(ignored);
    return;
  }
  full_logged_ = false;
  const auto remote = socket.remote_endpoint(ignored);
  const std::string address = ignored ? std::string("?") : remote.address().to_string();
  std::size_t& from_address = per_address_[address];
  if (from_address >= limits_.max_connections_per_address) {
    // One host cannot take every connection: the job's other workers keep theirs.
    if (per_address_logged_.insert(address).second)
      spdlog::warn(
          "store: {} connections are open from {}, the limit for one address; refusing more from "
          "it until some close (a program that creates stores in a loop leaks them)",
          from_address, address);
    socket.close(ignored);
    return;
  }
  ++from_address;
  close_on_exec(socket.native_handle());
  socket.set_option(tcp::no_delay(true), ignored);
  auto session = std::make_shared<Session>(std::move(socket));
  session->address = address;
  session->peer = ignored ? std::string("?") : address + ":" + std::to_string(remote.port());
  const ConnId id = next_id_++;
  sessions_.emplace(id, std::move(session));
  read_next(id);
}

bool StoreServer::make_room() {
  // The newest connection that has not sent a byte goes. A torch 1.13 worker's callback
  // connection is silent too, but the job's are as old as its workers; what a flood of idle
  // connections opened since is newer, so the flood replaces itself and every new connection
  // (a worker's first bytes come at once) gets in.
  for (auto it = sessions_.rbegin(); it != sessions_.rend(); ++it) {
    if (it->second->heard) continue;
    if (!idle_closed_logged_)
      spdlog::warn(
          "store: {} connections are open, the limit; closing the newest that never sent a "
          "request ({}) for each new one",
          sessions_.size(), it->second->peer);
    idle_closed_logged_ = true;
    close(it->first, "");
    return true;
  }
  return false;
}

void StoreServer::read_next(ConnId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& s = *it->second;
  // No idle timeout: a 1.13 callback connection may stay silent for the whole job. No buffer
  // while idle either: 16,384 torch 1.13 workers hold 32,768 connections.
  common::async_read_ready(s.socket,
                           [this, id, keep = it->second](error_code ec, std::string_view data) {
                             if (stopped_) return;
                             auto it = sessions_.find(id);
                             if (it == sessions_.end()) return;
                             if (!data.empty()) {
                               it->second->heard = true;
                               it->second->input.append(data);
                               consume(id);
                               if (sessions_.count(id) == 0) return;
                             }
                             if (ec) return close(id, "");
                             read_next(id);
                           });
}

void StoreServer::consume(ConnId id) {
  // Requests are taken from the front of the input at `done`; what they used is erased once,
  // at the end, so many small requests in one read cost one move of the rest, not one each.
  std::size_t done = 0;
  // Session::need counts from the start of what is kept: it is set only by the request at
  // `done`, and cleared by every request that completes.
  auto keep_rest = [&](Session& s) {
    s.input.erase(0, done);
    // A big request's buffer goes with it: an idle connection holds no input capacity.
    if (s.input.empty() && s.input.capacity() > 4096) std::string().swap(s.input);
  };
  for (;;) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    Session& s = *it->second;
    std::string_view input = std::string_view(s.input).substr(done);
    if (!s.dialect) {
      const Detected d = detect_dialect(input);
      if (d.status == DecodeStatus::NeedMore) return keep_rest(s);
      s.dialect = d.dialect;
      done += d.used;
      spdlog::debug("store: {} speaks the torch {} dialect", s.peer,
                    d.dialect == Dialect::V2 ? "2.x" : "1.13");
      continue;
    }
    // A request still arriving is decoded again only once the field it stopped in is whole.
    if (input.size() < s.need) return keep_rest(s);
    const Decoded decoded = decode_request(*s.dialect, input, limits_);
    if (decoded.status == DecodeStatus::NeedMore) {
      s.need = decoded.need;
      return keep_rest(s);
    }
    if (decoded.status == DecodeStatus::Bad) return close(id, decoded.error);
    done += decoded.used;
    s.need = 0;
    const Effects effects = state_.apply(id, decoded.request);
    deliver(effects, id);
    if (effects.close)
      return close(id, std::string(op_name(decoded.request.op)) + ": " + *effects.close);
  }
}

void StoreServer::deliver(const Effects& effects, ConnId) {
  for (const auto& [to, bytes] : effects.sends) send(to, bytes);
}

void StoreServer::send(ConnId id, SharedBytes bytes) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& s = *it->second;
  if (s.queued_bytes + bytes->size() > limits_.max_queued_reply_bytes)
    return close(id, "more than " + std::to_string(limits_.max_queued_reply_bytes) +
                         " bytes of replies wait for it to read them");
  s.queued_bytes += bytes->size();
  queued_total_ += bytes->size();
  s.output.push_back(std::move(bytes));
  if (s.output.size() == 1) write_next(id);
  if (queued_total_ > limits_.max_total_queued_reply_bytes) shed_largest_queues();
}

void StoreServer::shed_largest_queues() {
  // Bounded: each pass closes one connection that holds queued replies.
  while (queued_total_ > limits_.max_total_queued_reply_bytes) {
    auto largest = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
      if (largest == sessions_.end() || it->second->queued_bytes > largest->second->queued_bytes)
        largest = it;
    if (largest == sessions_.end() || largest->second->queued_bytes == 0) return;
    close(largest->first,
          std::to_string(largest->second->queued_bytes) +
              " bytes of replies wait for it to read them, the most of any connection, and "
              "all connections' replies went over the store's limit of " +
              std::to_string(limits_.max_total_queued_reply_bytes) + " bytes");
  }
}

void StoreServer::write_next(ConnId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& s = *it->second;
  asio::async_write(s.socket, asio::buffer(*s.output.front()),
                    [this, id, keep = it->second](error_code ec, std::size_t) {
                      if (stopped_) return;
                      auto it = sessions_.find(id);
                      if (it == sessions_.end()) return;
                      if (ec) return close(id, "");
                      Session& s = *it->second;
                      s.queued_bytes -= s.output.front()->size();
                      queued_total_ -= s.output.front()->size();
                      s.output.pop_front();
                      if (!s.output.empty()) write_next(id);
                    });
}

void StoreServer::close(ConnId id, const std::string& why) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (!why.empty())
    close_warnings_.warn("store: closing the connection from " + it->second->peer + ": " + why);
  error_code ignored;
  it->second->socket.close(ignored);
  queued_total_ -= it->second->queued_bytes;
  if (auto a = per_address_.find(it->second->address);
      a != per_address_.end() && --a->second == 0) {
    per_address_.erase(a);
    per_address_logged_.erase(it->second->address);
  }
  // The socket's pending handlers keep the session's buffers; they find its id gone.
  sessions_.erase(it);
  state_.disconnect(id);
}

}  // namespace ddprun::store
