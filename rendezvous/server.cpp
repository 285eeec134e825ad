#include "rendezvous/server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <set>
#include <string_view>

#include "common/log.h"
#include "common/strings.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/job_status.h"

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

/// A gap this long between two runs of the server's handlers means it was not running
/// (stopped, swapped out, starved): housekeeping runs at least every 250 ms otherwise.
constexpr std::chrono::milliseconds kStallThreshold{1'000};

/// Repeated warnings about the server's resources (descriptors, closed connections) are
/// summed and logged at most this often.
constexpr std::chrono::seconds kResourceLogInterval{10};

/// Replies a connection may leave unread (a few status pages) before it is closed.
constexpr std::size_t kSessionWriteLimit = 4 * kMaxFrameBytes;

long long ms_of(common::Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

void log_outgoing(const std::string& run_id, const Outgoing& out) {
  if (auto* ready = std::get_if<RoundReady>(&out.message); ready && ready->group_rank == 0) {
    spdlog::info("job '{}': round {} complete with {} node(s): {}; restart count {}", run_id,
                 ready->round, ready->group_world_size,
                 common::join(ready->participants.get(), ", "), ready->restart_count);
  } else if (auto* closed = std::get_if<Closed>(&out.message)) {
    spdlog::debug("job '{}': closing node {}: {}", run_id, out.node_id, closed->message);
  } else if (auto* refused = std::get_if<Refused>(&out.message)) {
    spdlog::warn("job '{}': refused node {}: {}", run_id, out.node_id, refused->message);
  }
}

/// Once per step, what an operator follows in the server's log besides the rounds: why a round
/// restarts, a node quarantined or let back, the job's end. Every node hears the same Restart:
/// each reason is logged once.
void log_step(const std::string& run_id, const ServerMetrics::Before& before, const StepResult& r) {
  constexpr std::size_t kMaxReasons = 8;
  std::set<std::string_view> said;
  const std::string* previous = nullptr;
  for (const Outgoing& out : r.messages) {
    const auto* restart = std::get_if<Restart>(&out.message);
    if (restart == nullptr) continue;
    // Every participant's Restart shares one reason: compared by address first, so a round of
    // 16,384 nodes costs no 16,384 string comparisons.
    const std::string& reason = restart->reason.get();
    if (&reason == previous || !said.insert(reason).second) continue;
    previous = &reason;
    if (said.size() > kMaxReasons) break;
    if (restart->quarantine.count() > 0)
      spdlog::warn("job '{}': quarantine: {}", run_id, common::printable(reason));
    else
      spdlog::info("job '{}': restart (round {}, restart count {}): {}", run_id,
                   restart->next_round, restart->restart_count, common::printable(reason));
  }
  if (said.empty() && before.phase == JobPhase::Running && r.state.phase == JobPhase::Joining &&
      r.state.round > before.round)
    spdlog::info("job '{}': restart (round {}, restart count {}): {}", run_id, r.state.round,
                 r.state.restart_count, common::printable(no_node_left(r.removed)));
  if (before.phase != JobPhase::Closed && r.state.phase == JobPhase::Closed && r.state.closed)
    spdlog::info("job '{}': ended: {}", run_id, common::printable(r.state.closed->message));
}

}  // namespace

RendezvousServer::RendezvousServer(asio::io_context& io, const common::Clock& clock,
                                   ServerLimits limits, std::optional<Secret> secret,
                                   TlsContext tls)
    : io_(io),
      clock_(clock),
      acceptor_(io),
      accepts_(
          acceptor_, [this](tcp::socket socket) { on_accepted(std::move(socket)); },
          [this](const error_code& ec) { on_accept_failed(ec); }, kAcceptRetry),
      timer_(io),
      housekeeping_timer_(io),
      shutdown_timer_(io),
      limits_(limits),
      secret_(std::move(secret)),
      tls_(std::move(tls)),
      peer_warnings_(io, "rendezvous connections", 20, kResourceLogInterval) {
  input_budget_.limit = limits_.max_buffered_bytes;
  input_budget_.over_limit = [this] { shed_largest_inputs(); };
  // One descriptor held back: when the process runs out, closing it lets the server accept
  // (and at once close) a connection instead of leaving it queued and retrying forever.
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

RendezvousServer::~RendezvousServer() {
  error_code ignored;
  acceptor_.close(ignored);
  timer_.cancel();
  accepts_.stop();
  housekeeping_timer_.cancel();
  shutdown_timer_.cancel();
  drained_ = nullptr;
  for (auto& [id, s] : sessions_) s.conn->close();
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
}

std::optional<common::Error> RendezvousServer::listen(const std::string& host, int port,
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
    if (ec) return common::Error{"cannot resolve '" + host + "': " + ec.message()};
    for (const auto& r : results) candidates.push_back(r.endpoint());
  }
  std::string last = "no address to listen on";
  for (const auto& endpoint : candidates) {
    error_code ec;
    tcp::acceptor acceptor = common::open_listener(io_, endpoint, ec);
    if (ec) {
      if (ec == asio::error::address_in_use && in_use) *in_use = true;
      last = "cannot listen on " + format_endpoint(endpoint.address().to_string(), port) + ": " +
             ec.message();
      if (ec == asio::error::address_in_use) return common::Error{last};
      continue;
    }
    port_ = acceptor.local_endpoint().port();
    acceptor_ = std::move(acceptor);
    // A quarter of the descriptors for connections still to greet (at least 16): the rest
    // stay free for the ones that did, however many strangers keep connecting.
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
      ungreeted_cap_ = std::max<std::size_t>(16, static_cast<std::size_t>(files.rlim_cur / 4));
    else
      ungreeted_cap_ = 16384;
    awake_at_ = clock_.now();
    accepts_.start();
    arm_housekeeping();
    return std::nullopt;
  }
  return common::Error{last};
}

std::size_t RendezvousServer::RouteHash::operator()(const RouteKey& key) const noexcept {
  const std::size_t run = std::hash<std::string_view>()(key.run_id);
  return run ^ (std::hash<std::string_view>()(key.node_id) + 0x9e3779b97f4a7c15ULL + (run << 6) +
                (run >> 2));
}

void RendezvousServer::on_accepted(tcp::socket socket) {
  note_awake();
  if (metrics_) metrics_->connection_accepted();
  tune_socket(socket, kServerSocketTimeout);
  const std::uint64_t id = next_session_++;
  std::optional<TlsRole> role;
  if (tls_) role = TlsRole{tls_, true, ""};
  auto conn = std::make_shared<FramedConnection>(std::move(socket), std::move(role));
  conn->set_input_budget(&input_budget_);
  conn->set_write_limit(kSessionWriteLimit);
  Session& session = sessions_[id];
  session.conn = conn;
  session.hello = std::make_unique<Hello>(
      Hello{ServerHandshake(secret_, secret_ ? make_nonce() : std::string()), clock_.now()});
  silent_.insert(id);
  conn->start(*this, id);
  if (silent_.size() + greeting_.size() > ungreeted_cap_) evict_oldest_ungreeted();
}

void RendezvousServer::evict_oldest_ungreeted() {
  const std::uint64_t id = silent_.empty() ? *greeting_.begin() : *silent_.begin();
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return forget_ungreeted(id);
  const std::string why = "closed: it had not said hello when more than " +
                          std::to_string(ungreeted_cap_) +
                          " connections were waiting for theirs (the oldest goes first)";
  warn_peer(it->second.conn->peer(), why);
  it->second.conn->close();
  on_closed(id, {CloseKind::ClosedHere, why});
}

void RendezvousServer::on_accept_failed(const error_code& ec) {
  note_awake();
  // Out of descriptors (EMFILE, ENFILE) or another failure: shed the connection that cannot be
  // served (the loop then pauses instead of spinning on the same error).
  if (ec == asio::error::no_descriptors || ec.value() == ENFILE) shed_one_connection();
  const TimePoint now = clock_.now();
  if (!shed_logged_at_ || now - *shed_logged_at_ >= kResourceLogInterval) {
    spdlog::warn(
        "accepting rendezvous connections fails: {}; {} connection(s) closed unserved since the "
        "last warning; raise the open-file limit (ulimit -n) or look for idle connections",
        ec.message(), shed_count_);
    shed_count_ = 0;
    shed_logged_at_ = now;
  }
}

void RendezvousServer::shed_one_connection() {
  if (reserve_fd_ < 0) return;
  ::close(reserve_fd_);
  const int fd =
      ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    ++shed_count_;
  }
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void RendezvousServer::shed_largest_inputs() {
  // Bounded: each pass closes one connection that holds input.
  while (input_budget_.used > input_budget_.limit) {
    auto largest = sessions_.end();
    std::size_t most = 0;
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.conn->buffered_bytes() > most) {
        most = it->second.conn->buffered_bytes();
        largest = it;
      }
    }
    if (largest == sessions_.end()) return;
    const std::uint64_t id = largest->first;
    const std::string why = "closed: it held the largest unfinished message (" +
                            std::to_string(most) +
                            " bytes) when the unparsed input of all connections went over the "
                            "server's limit of " +
                            std::to_string(input_budget_.limit) + " bytes";
    warn_peer(largest->second.conn->peer(), why);
    largest->second.conn->close();
    on_closed(id, {CloseKind::ClosedHere, why});
  }
}

void RendezvousServer::note_awake() {
  const TimePoint now = clock_.now();
  const bool resumed = awake_at_ && now - *awake_at_ > kStallThreshold;
  const auto gap = awake_at_ ? now - *awake_at_ : common::Duration{};
  awake_at_ = now;
  if (!resumed) return;
  // Nothing ran for a while: the heartbeats of that time may sit unread in the sockets, so
  // silence is no evidence. Every node, and every connection's timeouts, start afresh now;
  // the pending input is read next (docs/design.md#stall-tolerance).
  spdlog::warn(
      "the rendezvous server did not run for {} ms (stopped, swapped out or starved); every node "
      "gets a full keep-alive window from now",
      ms_of(gap));
  for (auto& [id, session] : sessions_)
    if (session.hello) session.hello->opened_at = now;
  for (auto& [id, progress] : partial_) progress.at = now;
  std::vector<std::string> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  for (const std::string& id : ids) apply(id, Resumed{});
}

void RendezvousServer::arm_housekeeping() {
  const auto shortest = std::min(limits_.hello_timeout, limits_.stalled_frame_timeout);
  const auto period =
      std::clamp(shortest / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(250));
  housekeeping_timer_.expires_after(period);
  housekeeping_timer_.async_wait([this](error_code ec) {
    if (ec || stopped_) return;
    housekeeping();
    arm_housekeeping();
  });
}

void RendezvousServer::housekeeping() {
  note_awake();
  const TimePoint now = clock_.now();
  std::vector<std::pair<std::uint64_t, std::string>> expired;
  for (auto& [id, session] : sessions_) {
    // Progress is any byte received; it is watched only while part of a frame is held.
    const std::size_t held = session.conn->buffered_bytes();
    TimePoint progress_at = now;
    if (held == 0) {
      partial_.erase(id);
    } else {
      const std::uint64_t bytes = session.conn->bytes_received();
      auto [progress, added] = partial_.try_emplace(id, Progress{bytes, now});
      if (!added && progress->second.bytes != bytes) progress->second = {bytes, now};
      progress_at = progress->second.at;
    }
    if (session.hello && now - session.hello->opened_at >= limits_.hello_timeout) {
      expired.emplace_back(
          id, "no hello within " + std::to_string(limits_.hello_timeout.count()) + " ms");
    } else if (held > 0 && now - progress_at >= limits_.stalled_frame_timeout) {
      expired.emplace_back(id, "part of a frame (" + std::to_string(held) +
                                   " bytes) and no progress for " +
                                   std::to_string(limits_.stalled_frame_timeout.count()) + " ms");
    }
  }
  for (const auto& [id, why] : expired) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;
    warn_peer(it->second.conn->peer(), "closed: " + why);
    it->second.conn->close();
    on_closed(id, {CloseKind::ClosedHere, why});  // a node's connection: the node disconnected
  }
}

void RendezvousServer::warn_peer(const std::string& peer, const std::string& message) {
  peer_warnings_.warn("rendezvous connection from " + peer + ": " + message);
}

void RendezvousServer::refuse(std::uint64_t id, Session& session, const std::string& message,
                              RefusalKind kind) {
  if (metrics_) metrics_->refused(kind);
  warn_peer(session.conn->peer(), message);
  session.conn->send(to_json(ServerMessage{Refused{kind, message}}));
  close_after_writes(id, session);
}

void RendezvousServer::close_after_writes(std::uint64_t id, Session& session) {
  // The connection's close handler does not run for a close this side asked for, so the
  // session is forgotten here once its last frame is out (or the connection ended otherwise):
  // a refused stranger, or a node done with its job, must not hold memory after its socket.
  session.conn->close_after_writes([this, id, alive = std::weak_ptr<bool>(alive_)] {
    if (alive.lock() && !stopped_) on_closed(id, {CloseKind::ClosedHere, ""});
  });
}

void RendezvousServer::on_message(std::uint64_t id, const json& body) {
  note_awake();
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& session = it->second;
  if (session.hello) {
    // Hello, and with a secret the challenge and its answer: nothing else is read before.
    HandshakeStep hs = session.hello->handshake.on_message(body);
    if (hs.error)
      return refuse(id, session, hs.error->message,
                    hs.unauthorized ? RefusalKind::Unauthorized : RefusalKind::Protocol);
    if (hs.send && hs.done && daemon_) (*hs.send)["daemon"] = true;
    // It holds a node whose health check failed out of rounds (Join::kept_out): an agent says
    // so only to a server that does, as an older one would place the node.
    if (hs.send && hs.done) (*hs.send)["holds_kept_out"] = true;
    if (hs.send) session.conn->send(*hs.send);
    // A hello was accepted: no longer among the first to go when too many wait.
    if (silent_.erase(id) > 0 && !hs.done) greeting_.insert(id);
    if (hs.done) {
      forget_ungreeted(id);
      session.hello.reset();
    }
    return;
  }
  auto parsed = parse_agent_message(body);
  if (!parsed) return refuse(id, session, parsed.error().message);
  AgentMessage& message = *parsed;
  if (auto* query = std::get_if<StatusQuery>(&message)) {
    session.conn->send(to_json(ServerMessage{describe(query->run_id, query->after)}));
    return;
  }
  const bool is_join = std::holds_alternative<Join>(message);
  if (auto* join = std::get_if<Join>(&message)) {
    if (session.bound() && (session.node_id != join->node_id || session.run_id != join->run_id))
      return refuse(id, session,
                    "a connection speaks for one node of one job; node " + session.node_id.str() +
                        " cannot join as " + join->node_id);
    auto job = jobs_.find(join->run_id);
    if (job == jobs_.end() && jobs_.size() >= limits_.max_jobs)
      return refuse(id, session,
                    "this rendezvous server holds " + std::to_string(jobs_.size()) +
                        " jobs, its limit: start job '" + join->run_id +
                        "' later, or raise ddprun-rdzvd --max_jobs");
    if (job == jobs_.end()) {
      job = jobs_
                .emplace(join->run_id, Job{new_job(join->run_id, clock_.now()), std::nullopt,
                                           common::SharedString(join->run_id)})
                .first;
    }
    if (!session.bound()) {
      session.run_id = job->second.run_id;
      session.node_id = NodeId(join->node_id);
    }
    auto route = routes_.find(RouteKey{session.run_id, session.node_id});
    if (route != routes_.end() && (*route)->first != id) {
      // The node reconnected: its old connection no longer speaks for it. The route points at
      // the old session, so it goes with it and comes back pointing at this one.
      const std::uint64_t old_id = (*route)->first;
      routes_.erase(route);
      route = routes_.end();
      if (auto old = sessions_.find(old_id); old != sessions_.end()) {
        old->second.conn->close();
        forget_ungreeted(old->first);
        erase_session(old);
      }
    }
    if (route == routes_.end()) routes_.insert(&*it);
  } else if (!session.bound()) {
    return refuse(id, session, "the first message after hello must be a join or a status query");
  }
  const std::string run_id = session.run_id.str();
  apply(run_id, FromNode{session.node_id.str(), std::move(message)});
  if (is_join) share_node_id(id, run_id);
}

void RendezvousServer::share_node_id(std::uint64_t id, const std::string& run_id) {
  auto session = sessions_.find(id);
  auto job = jobs_.find(run_id);
  if (session == sessions_.end() || job == jobs_.end()) return;
  const NodeTable& nodes = job->second.state.nodes;
  auto node = nodes.find(session->second.node_id.view());
  // Equal ids: the route's hash, which reads the session's, stays the same.
  if (node != nodes.end() && !node->first.shares_with(session->second.node_id))
    session->second.node_id = node->first;
}

void RendezvousServer::erase_session(Sessions::iterator it) {
  partial_.erase(it->first);
  sessions_.erase(it);
}

void RendezvousServer::on_closed(std::uint64_t id, const CloseReason& why) {
  note_awake();
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  const std::string run_id = it->second.run_id.str();
  const std::string node_id = it->second.node_id.str();
  // A bad frame, the write limit or a TLS failure: say so (a peer that just closed is no news).
  switch (why.kind) {
    case CloseKind::BadFrame:
      if (metrics_) metrics_->bad_frame();
      warn_peer(it->second.conn->peer(), "bad frame: " + why.detail);
      break;
    case CloseKind::Tls:
    case CloseKind::WriteLimit:
      warn_peer(it->second.conn->peer(), "closed: " + why.text);
      break;
    case CloseKind::Orderly:
    case CloseKind::Io:
    case CloseKind::ClosedHere:
      break;
  }
  forget_ungreeted(id);
  // The route points at the session: it goes first.
  auto route = node_id.empty() ? routes_.end() : routes_.find(RouteKey{run_id, node_id});
  const bool spoke_for_node = route != routes_.end() && (*route)->first == id;
  if (spoke_for_node) routes_.erase(route);
  erase_session(it);
  if (!spoke_for_node) return;
  spdlog::debug("job '{}': node {} disconnected{}", run_id, node_id,
                why.text.empty() ? "" : ": " + why.text);
  if (jobs_.count(run_id)) apply(run_id, Disconnected{node_id});
}

void RendezvousServer::apply(const std::string& run_id, const Event& event) {
  auto job = jobs_.find(run_id);
  if (job == jobs_.end()) return;
  const TimePoint now = clock_.now();
  const ServerMetrics::Before before = [&] {
    const JobState& s = job->second.state;
    return ServerMetrics::Before{s.phase, s.round, s.round_started, s.restart_count,
                                 s.nodes.size()};
  }();
  StepResult r = step(std::move(job->second.state), event, now);
  log_step(run_id, before, r);
  // Metrics and history come from what step() returned, never from inside it (it stays pure).
  if (metrics_) metrics_->stepped(before, event, r, now);
  if (history_) history_->stepped(before, run_id, event, r, now);
  job->second.state = std::move(r.state);
  // The deadline index holds each job's wake_at once, so the timer finds the earliest in
  // O(log jobs) however many jobs the server holds.
  if (job->second.wake_at) deadlines_.erase({*job->second.wake_at, run_id});
  job->second.wake_at = r.erase ? std::nullopt : r.wake_at;
  if (job->second.wake_at) deadlines_.insert({*job->second.wake_at, run_id});
  for (Outgoing& out : r.messages) {
    deliver(run_id, out);
    // Each message is freed once sent (a socket that takes it holds no copy), so a round of
    // 16,384 nodes is not held twice while it is answered.
    out = Outgoing{};
  }
  if (r.erase) {
    spdlog::debug("job '{}': forgotten", run_id);
    jobs_.erase(run_id);
  }
  arm_timer();
}

void RendezvousServer::deliver(const std::string& run_id, const Outgoing& out) {
  log_outgoing(run_id, out);
  auto route = routes_.find(RouteKey{run_id, out.node_id});
  if (route == routes_.end()) return;
  auto session = sessions_.find((*route)->first);
  if (session == sessions_.end()) return;
  session->second.conn->send(to_json(out.message));
  if (out.close_after) {
    // The node is done with this job: its disconnect is no longer news.
    routes_.erase(route);
    close_after_writes(session->first, session->second);
  }
}

void RendezvousServer::arm_timer() {
  const std::optional<TimePoint> earliest =
      deadlines_.empty() || stopped_ ? std::nullopt
                                     : std::optional<TimePoint>(deadlines_.begin()->first);
  if (earliest == armed_at_) return;  // already set for that time (or for none)
  armed_at_ = earliest;
  timer_.cancel();
  if (!earliest) return;
  timer_.expires_at(*earliest);
  timer_.async_wait([this](error_code ec) {
    if (!ec) on_timer();
  });
}

void RendezvousServer::on_timer() {
  armed_at_.reset();
  note_awake();
  const TimePoint now = clock_.now();
  std::vector<std::string> due;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it)
    due.push_back(it->second);
  for (const std::string& id : due) apply(id, Tick{});
  arm_timer();
}

void RendezvousServer::shutdown(std::chrono::milliseconds deadline, std::function<void()> drained) {
  stopped_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  timer_.cancel();
  accepts_.stop();
  housekeeping_timer_.cancel();
  peer_warnings_.stop();
  drained_ = std::move(drained);
  draining_ = 0;
  // Every open session ends once its replies (a "closed" for the other nodes) are written and
  // says so; the server counts them down. Closed sessions have nothing left to write.
  std::vector<std::shared_ptr<FramedConnection>> open_conns;
  for (auto& [id, s] : sessions_)
    if (s.conn->is_open()) open_conns.push_back(s.conn);
  draining_ = open_conns.size();
  if (draining_ == 0) {
    if (drained_) asio::post(io_, std::move(drained_));
    drained_ = nullptr;
    return;
  }
  for (const auto& conn : open_conns)
    conn->close_after_writes([this, alive = std::weak_ptr<bool>(alive_)] {
      if (alive.lock()) session_drained();
    });
  // A peer that does not read its replies cannot hold the shutdown: its session is closed at
  // the deadline, which drains it.
  shutdown_timer_.expires_after(deadline);
  shutdown_timer_.async_wait([this](error_code ec) {
    if (ec) return;
    for (auto& [id, s] : sessions_) s.conn->close();
  });
}

void RendezvousServer::session_drained() {
  if (draining_ == 0 || --draining_ > 0) return;
  shutdown_timer_.cancel();
  if (drained_) drained_();
  drained_ = nullptr;
}

void RendezvousServer::refresh_metrics() const {
  if (!metrics_) return;
  std::map<std::string, std::size_t> nodes_by_job;
  std::map<JobPhase, std::size_t> jobs_by_phase;
  std::map<NodeState, std::size_t> nodes_by_state;
  for (const auto& [id, job] : jobs_) {
    ++jobs_by_phase[job.state.phase];
    // A closed job's table is kept for its tombstone (close_timeout): none of it is live.
    if (job.state.phase == JobPhase::Closed) continue;
    nodes_by_job.emplace_hint(nodes_by_job.end(), id, job.state.nodes.size());
    for (const auto& [node_id, node] : job.state.nodes) ++nodes_by_state[node.state];
  }
  metrics_->set_gauges(nodes_by_job, jobs_by_phase, sessions_.size(), nodes_by_state);
}

StatusReply RendezvousServer::describe(const std::optional<std::string>& run_id,
                                       const std::optional<std::string>& after) const {
  StatusReply reply{json::array(), std::nullopt};
  const TimePoint now = clock_.now();
  auto it = run_id ? jobs_.find(*run_id) : after ? jobs_.upper_bound(*after) : jobs_.begin();
  std::size_t bytes = 0;
  for (; it != jobs_.end(); ++it) {
    if (run_id && it->first != *run_id) break;
    if (bytes >= kStatusPageBytes) {
      reply.next = std::prev(it)->first;
      break;
    }
    json job = describe_job(it->second.state, now);
    bytes += job.dump().size();
    reply.jobs.push_back(std::move(job));
  }
  return reply;
}

json RendezvousServer::status_document(std::size_t max_jobs) const {
  const TimePoint now = clock_.now();
  json jobs = json::array();
  for (const auto& [run_id, job] : jobs_) {
    if (jobs.size() >= max_jobs) break;
    json described = describe_job(job.state, now);
    if (history_) {
      if (const JobHistory::Job* h = history_->find(run_id))
        described["history"] = describe_history(*h, now);
    }
    jobs.push_back(std::move(described));
  }
  return {
      {"jobs", std::move(jobs)}, {"job_count", jobs_.size()}, {"connections", sessions_.size()}};
}

}  // namespace ddprun::rdzv
