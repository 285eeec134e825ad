#include "rendezvous/server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/v6_only.hpp>

#include "common/strings.h"
#include "rendezvous/endpoint.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using nlohmann::json;

namespace {

/// How long a server waits for a node's messages before it declares the node lost; the
/// connection itself is tuned to fail no later (for a peer that vanished without a FIN).
constexpr std::chrono::milliseconds kServerSocketTimeout{20'000};

/// Pause after a failed accept (e.g. EMFILE) before the next one.
constexpr std::chrono::milliseconds kAcceptRetry{100};

void log_outgoing(const std::string& run_id, const Outgoing& out) {
  if (auto* ready = std::get_if<RoundReady>(&out.message); ready && ready->group_rank == 0) {
    spdlog::info("job '{}': round {} complete with {} node(s): {}; restart count {}", run_id,
                 ready->round, ready->group_world_size, common::join(ready->participants, ", "),
                 ready->restart_count);
  } else if (auto* closed = std::get_if<Closed>(&out.message)) {
    spdlog::debug("job '{}': closing node {}: {}", run_id, out.node_id, closed->message);
  } else if (auto* refused = std::get_if<Refused>(&out.message)) {
    spdlog::warn("job '{}': refused node {}: {}", run_id, out.node_id, refused->message);
  }
}

}  // namespace

RendezvousServer::RendezvousServer(asio::io_context& io, const common::Clock& clock)
    : io_(io), clock_(clock), acceptor_(io), timer_(io), accept_timer_(io) {}

RendezvousServer::~RendezvousServer() {
  error_code ignored;
  acceptor_.close(ignored);
  timer_.cancel();
  accept_timer_.cancel();
  for (auto& [id, s] : sessions_) s.conn->close();
}

std::optional<std::string> RendezvousServer::listen(const std::string& host, int port,
                                                    bool* in_use) {
  if (in_use) *in_use = false;
  std::vector<tcp::endpoint> candidates;
  if (host.empty() || host == "*") {
    candidates.emplace_back(tcp::v6(), static_cast<unsigned short>(port));
    candidates.emplace_back(tcp::v4(), static_cast<unsigned short>(port));
  } else {
    tcp::resolver resolver(io_);
    error_code ec;
    auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec) return "cannot resolve '" + host + "': " + ec.message();
    for (const auto& r : results) candidates.push_back(r.endpoint());
  }
  std::string last = "no address to listen on";
  for (const auto& endpoint : candidates) {
    error_code ec;
    tcp::acceptor acceptor(io_);
    acceptor.open(endpoint.protocol(), ec);
    if (!ec && endpoint.address().is_v6() && endpoint.address().is_unspecified())
      acceptor.set_option(asio::ip::v6_only(false), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      if (ec == asio::error::address_in_use && in_use) *in_use = true;
      last = "cannot listen on " + format_endpoint(endpoint.address().to_string(), port) + ": " +
             ec.message();
      if (ec == asio::error::address_in_use) return last;
      continue;
    }
    port_ = acceptor.local_endpoint().port();
    acceptor_ = std::move(acceptor);
    accept_next();
    return std::nullopt;
  }
  return last;
}

void RendezvousServer::accept_next() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || stopped_) return;
    if (!ec) {
      tune_socket(socket, kServerSocketTimeout);
      const std::uint64_t id = next_session_++;
      auto conn = std::make_shared<FramedConnection>(std::move(socket));
      sessions_[id].conn = conn;
      conn->start([this, id](const json& body) { on_message(id, body); },
                  [this, id](const std::string& why) { on_closed(id, why); });
    } else {
      // E.g. out of file descriptors: pause instead of spinning on the same error.
      spdlog::warn("accepting a rendezvous connection failed: {}; retrying in {} ms", ec.message(),
                   kAcceptRetry.count());
      accept_timer_.expires_after(kAcceptRetry);
      accept_timer_.async_wait([this](error_code wait_ec) {
        if (!wait_ec && !stopped_) accept_next();
      });
      return;
    }
    accept_next();
  });
}

void RendezvousServer::refuse(Session& session, const std::string& message) {
  spdlog::warn("rendezvous connection from {}: {}", session.conn->peer(), message);
  session.conn->send(to_json(ServerMessage{Refused{RefusalKind::Protocol, message}}));
  session.conn->close_after_writes();
}

void RendezvousServer::on_message(std::uint64_t id, const json& body) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& session = it->second;
  if (!session.greeted) {
    if (auto bad = check_hello(body)) return refuse(session, *bad);
    session.greeted = true;
    session.conn->send(make_hello("server"));
    return;
  }
  auto parsed = parse_agent_message(body);
  if (auto* bad = std::get_if<std::string>(&parsed)) return refuse(session, *bad);
  AgentMessage& message = std::get<AgentMessage>(parsed);
  if (auto* query = std::get_if<StatusQuery>(&message)) {
    session.conn->send(to_json(ServerMessage{StatusReply{describe(query->run_id)}}));
    return;
  }
  if (auto* join = std::get_if<Join>(&message)) {
    if (!session.node_id.empty() &&
        (session.node_id != join->node_id || session.run_id != join->run_id))
      return refuse(session, "a connection speaks for one node of one job; node " +
                                 session.node_id + " cannot join as " + join->node_id);
    session.run_id = join->run_id;
    session.node_id = join->node_id;
    auto [route, fresh] = routes_.try_emplace({join->run_id, join->node_id}, id);
    if (!fresh && route->second != id) {
      // The node reconnected: its old connection no longer speaks for it.
      if (auto old = sessions_.find(route->second); old != sessions_.end()) {
        old->second.conn->close();
        sessions_.erase(old);
      }
      route->second = id;
    }
    if (!jobs_.count(join->run_id)) jobs_[join->run_id].state = new_job(join->run_id, clock_.now());
  } else if (session.node_id.empty()) {
    return refuse(session, "the first message after hello must be a join or a status query");
  }
  apply(session.run_id, FromNode{session.node_id, std::move(message)});
}

void RendezvousServer::on_closed(std::uint64_t id, const std::string& why) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  const std::string run_id = it->second.run_id;
  const std::string node_id = it->second.node_id;
  sessions_.erase(it);
  if (node_id.empty()) return;
  auto route = routes_.find({run_id, node_id});
  if (route == routes_.end() || route->second != id) return;
  routes_.erase(route);
  spdlog::debug("job '{}': node {} disconnected{}", run_id, node_id, why.empty() ? "" : ": " + why);
  if (jobs_.count(run_id)) apply(run_id, Disconnected{node_id});
}

void RendezvousServer::apply(const std::string& run_id, const Event& event) {
  auto job = jobs_.find(run_id);
  if (job == jobs_.end()) return;
  StepResult r = step(std::move(job->second.state), event, clock_.now());
  job->second.state = std::move(r.state);
  job->second.wake_at = r.wake_at;
  for (const Outgoing& out : r.messages) deliver(run_id, out);
  if (r.erase) {
    spdlog::debug("job '{}': forgotten", run_id);
    jobs_.erase(run_id);
  }
  arm_timer();
}

void RendezvousServer::deliver(const std::string& run_id, const Outgoing& out) {
  log_outgoing(run_id, out);
  auto route = routes_.find({run_id, out.node_id});
  if (route == routes_.end()) return;
  auto session = sessions_.find(route->second);
  if (session == sessions_.end()) return;
  session->second.conn->send(to_json(out.message));
  if (out.close_after) {
    // The node is done with this job: its disconnect is no longer news.
    routes_.erase(route);
    session->second.conn->close_after_writes();
  }
}

void RendezvousServer::arm_timer() {
  std::optional<TimePoint> earliest;
  for (const auto& [id, job] : jobs_)
    if (job.wake_at && (!earliest || *job.wake_at < *earliest)) earliest = job.wake_at;
  timer_.cancel();
  if (!earliest || stopped_) return;
  timer_.expires_at(*earliest);
  timer_.async_wait([this](error_code ec) {
    if (!ec) on_timer();
  });
}

void RendezvousServer::on_timer() {
  const TimePoint now = clock_.now();
  std::vector<std::string> due;
  for (const auto& [id, job] : jobs_)
    if (job.wake_at && *job.wake_at <= now) due.push_back(id);
  for (const std::string& id : due) apply(id, Tick{});
  arm_timer();
}

void RendezvousServer::shutdown() {
  stopped_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  timer_.cancel();
  accept_timer_.cancel();
  for (auto& [id, s] : sessions_) s.conn->close_after_writes();
}

bool RendezvousServer::has_pending_writes() const {
  for (const auto& [id, s] : sessions_)
    if (s.conn->is_open()) return true;
  return false;
}

json RendezvousServer::describe(const std::optional<std::string>& run_id) const {
  json jobs = json::array();
  const TimePoint now = clock_.now();
  for (const auto& [id, job] : jobs_)
    if (!run_id || *run_id == id) jobs.push_back(describe_job(job.state, now));
  return jobs;
}

}  // namespace ddprun::rdzv
