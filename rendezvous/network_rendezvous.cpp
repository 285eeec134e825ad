#include "rendezvous/network_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>

#include "common/strings.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/free_port.h"
#include "rendezvous/local_host.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr Millis kMaxBackoff{2'000};

long long seconds(Millis m) { return static_cast<long long>(m.count() / 1000); }

/// 128 random bits: the id is what the server routes this node's messages by, so no one else
/// may guess it (status never shows it).
std::string new_node_id() {
  return local_host_name() + ":" + std::to_string(::getpid()) + ":" + make_nonce().substr(0, 32);
}

}  // namespace

NetworkRendezvous::NetworkRendezvous(asio::io_context& io, const common::Clock& clock,
                                     NetworkRendezvousOptions options)
    : io_(io),
      clock_(clock),
      opt_(std::move(options)),
      node_id_(new_node_id()),
      retry_timer_(io),
      heartbeat_timer_(io),
      status_timer_(io) {}

NetworkRendezvous::~NetworkRendezvous() {
  *alive_ = false;
  if (conn_) conn_->close();
}

void NetworkRendezvous::set_notice_handler(std::function<void(Notice)> handler) {
  on_notice_ = std::move(handler);
}

void NetworkRendezvous::next_rendezvous(std::function<void(RendezvousResult)> done) {
  if (phase_ == Phase::Done) {
    RendezvousError error{RendezvousErrorKind::Closed, "the rendezvous is over for this node"};
    asio::post(io_, [done = std::move(done), error] { done(error); });
    return;
  }
  done_ = std::move(done);
  phase_ = Phase::Joining;
  round_.reset();
  succeeded_ = false;
  unsent_failure_.reset();
  if (ready_to_send())
    send_join();
  else if (!conn_)
    connect();
  // else: the handshake is under way; after_greeting() sends the join.
}

void NetworkRendezvous::connect() {
  if (connecting_ || conn_ || phase_ == Phase::Done) return;
  connecting_ = true;
  if (!lost_since_) lost_since_ = clock_.now();
  if (opt_.before_connect) opt_.before_connect();
  auto resolver = std::make_shared<tcp::resolver>(io_);
  resolver->async_resolve(
      opt_.endpoint_host, std::to_string(opt_.endpoint_port),
      [this, alive = alive_, resolver](error_code ec, tcp::resolver::results_type results) {
        if (!*alive) return;
        if (ec) {
          connecting_ = false;
          return on_lost("cannot resolve " + opt_.endpoint_host + ": " + ec.message());
        }
        endpoints_.clear();
        for (const auto& r : results) endpoints_.push_back(r.endpoint());
        try_endpoint(0, "no address");
      });
}

void NetworkRendezvous::try_endpoint(size_t index, const std::string& last_error) {
  if (index >= endpoints_.size()) {
    connecting_ = false;
    return on_lost(last_error);
  }
  const tcp::endpoint target = endpoints_[index];
  auto socket = std::make_shared<tcp::socket>(io_);
  error_code ec;
  socket->open(target.protocol(), ec);
  if (!ec && !opt_.local_addr.empty()) {
    auto local = asio::ip::make_address(opt_.local_addr, ec);
    // A --local_addr of the other family: connect without binding.
    if (!ec && local.is_v6() == target.address().is_v6()) socket->bind(tcp::endpoint(local, 0), ec);
    if (ec)
      return try_endpoint(index + 1,
                          "cannot bind --local_addr " + opt_.local_addr + ": " + ec.message());
  }
  if (ec) return try_endpoint(index + 1, ec.message());
  socket->async_connect(target, [this, alive = alive_, socket, index](error_code ec) {
    if (!*alive) return;
    if (ec) return try_endpoint(index + 1, ec.message());
    connecting_ = false;
    tune_socket(*socket, opt_.settings.keep_alive_window());
    std::optional<TlsRole> tls;
    if (opt_.tls) tls = TlsRole{opt_.tls, false, opt_.endpoint_host};
    on_connected(std::make_shared<FramedConnection>(std::move(*socket), std::move(tls)));
  });
}

void NetworkRendezvous::on_connected(std::shared_ptr<FramedConnection> conn) {
  if (phase_ == Phase::Done) return conn->close();
  conn_ = conn;
  greeted_ = false;
  conn_->start(
      [this, alive = alive_](const nlohmann::json& body) {
        if (*alive) on_message(body);
      },
      [this, alive = alive_, raw = conn.get()](const std::string& why) {
        if (!*alive || conn_.get() != raw) return;
        // A certificate refused, or TLS on one side only: no retry cures that.
        if (raw->tls_failed())
          return give_up(RendezvousError{RendezvousErrorKind::State,
                                         why + "; check --rdzv_conf tls_ca, tls_cert and tls_key "
                                               "against the server's TLS settings"});
        if (why.empty() && raw->bytes_received() == 0 && !opt_.tls)
          return on_lost(
              "the server closed the connection without a hello (a server with TLS does so "
              "to a client without: give --rdzv_conf tls_ca=FILE)");
        on_lost(why.empty() ? "the server closed the connection" : why);
      });
  handshake_.emplace(opt_.secret, "agent", make_nonce());
  conn_->send(handshake_->hello());
  // Without a secret the join follows the hello at once (one round trip saved); with one,
  // nothing is sent before the server has proved that it holds the secret.
  if (!handshake_->authenticates()) after_greeting();
  schedule_heartbeat();
}

void NetworkRendezvous::after_greeting() {
  if (phase_ == Phase::Joining || phase_ == Phase::Running) send_join();
  if (unsent_failure_) {
    send(*unsent_failure_);
    unsent_failure_.reset();
  }
}

void NetworkRendezvous::send(const AgentMessage& message) {
  if (conn_) conn_->send(to_json(message));
}

void NetworkRendezvous::send_join() {
  Join join;
  join.run_id = opt_.run_id;
  join.node_id = node_id_;
  join.name = opt_.name;
  join.node_rank = opt_.node_rank;
  join.settings = opt_.settings;
  join.restart_count = known_restart_count_;
  if (opt_.master_addr)
    join.addr = *opt_.master_addr;
  else if (!opt_.local_addr.empty())
    join.addr = opt_.local_addr;
  else
    join.addr = advertised_address(conn_->local_address());
  if (opt_.master_port) {
    join.master_port = *opt_.master_port;
  } else {
    auto port = find_free_port(join.addr);
    if (!std::holds_alternative<int>(port)) port = find_free_port("");
    join.master_port = std::holds_alternative<int>(port) ? std::get<int>(port) : 0;
  }
  if (phase_ == Phase::Running && round_) {
    // Re-registering after a lost connection: the workers still run this round.
    join.resume = RoundClaim{round_->round,
                             round_->group_rank,
                             round_->group_world_size,
                             round_->restart_count,
                             round_->master_addr,
                             round_->master_port,
                             succeeded_};
  }
  send(join);
}

void NetworkRendezvous::on_message(const nlohmann::json& body) {
  ++frames_received_;
  if (!greeted_) {
    HandshakeStep hs = handshake_->on_message(body);
    if (hs.error) {
      // A refusal instead of a hello says why (the protocol differs, the secret is wrong).
      return give_up(RendezvousError{
          RendezvousErrorKind::State,
          hs.not_ddprun
              ? "the server at " + format_endpoint(opt_.endpoint_host, opt_.endpoint_port) +
                    " is " + *hs.error
              : *hs.error});
    }
    if (hs.send) conn_->send(*hs.send);
    if (!hs.done) return;
    greeted_ = true;
    // Reachable again only once the server greeted: a connection that a server closes at once
    // (TLS expected, out of descriptors) keeps counting towards connect_timeout.
    if (lost_since_ && round_)
      spdlog::info("reconnected to the rendezvous at {}",
                   format_endpoint(opt_.endpoint_host, opt_.endpoint_port));
    lost_since_.reset();
    backoff_ = Millis(100);
    if (handshake_->authenticates()) after_greeting();
    handshake_.reset();
    return;
  }
  auto parsed = parse_server_message(body);
  if (auto* bad = std::get_if<std::string>(&parsed))
    return give_up(RendezvousError{RendezvousErrorKind::State,
                                   "bad message from the rendezvous server: " + *bad});
  ServerMessage& message = std::get<ServerMessage>(parsed);
  if (auto* waiting = std::get_if<Waiting>(&message)) {
    last_waiting_ = *waiting;
    last_waiting_at_ = clock_.now();
    const std::string line = format_waiting(*waiting);
    // Print on a change of membership (the line without its time), else every interval.
    const std::string key = line.substr(0, line.rfind(", "));
    if (key != last_status_line_) {
      last_status_line_ = key;
      spdlog::info("{}", line);
      schedule_status();
    }
  } else if (auto* ready = std::get_if<RoundReady>(&message)) {
    if (phase_ != Phase::Joining) {
      spdlog::debug("ignoring round {} from the server: not joining", ready->round);
      return;
    }
    phase_ = Phase::Running;
    round_ = *ready;
    known_restart_count_ = ready->restart_count;
    status_timer_.cancel();
    last_status_line_.clear();
    RendezvousInfo info;
    info.group_rank = ready->group_rank;
    info.group_world_size = ready->group_world_size;
    info.master_addr = ready->master_addr;
    info.master_port = ready->master_port;
    info.restart_count = ready->restart_count;
    info.round = ready->round;
    spdlog::info("rendezvous round {} complete: group rank {} of {} nodes ({}), master {}:{}",
                 ready->round, ready->group_rank, ready->group_world_size,
                 common::join(ready->participants, ", "), ready->master_addr, ready->master_port);
    auto done = std::move(done_);
    done_ = nullptr;
    if (done) done(info);
  } else if (auto* restart = std::get_if<Restart>(&message)) {
    if (phase_ != Phase::Running) return;
    phase_ = Phase::Idle;
    known_restart_count_ = std::max(known_restart_count_, restart->restart_count);
    notify(*restart);
  } else if (auto* closed = std::get_if<Closed>(&message)) {
    const Phase was = phase_;
    phase_ = Phase::Done;
    if (was == Phase::Joining)
      return fail_round(RendezvousError{closed->outcome == JobOutcomeKind::TimedOut
                                            ? RendezvousErrorKind::Timeout
                                            : RendezvousErrorKind::Closed,
                                        closed->message});
    notify(*closed);
  } else if (auto* refused = std::get_if<Refused>(&message)) {
    // A node whose workers already succeeded does not rejoin: as a newcomer it would make the
    // job scale up and run again. It ends with the refusal, as any refused node does.
    if (refused->kind == RefusalKind::Dropped && phase_ != Phase::Done && !succeeded_)
      return rejoin_as_new_node(refused->message);
    const Phase was = phase_;
    phase_ = Phase::Done;
    RendezvousError error{refused->kind == RefusalKind::Closed ? RendezvousErrorKind::Closed
                                                               : RendezvousErrorKind::State,
                          refused->message};
    if (was == Phase::Joining) return fail_round(error);
    notify(error);
  }
}

void NetworkRendezvous::on_lost(const std::string& why) {
  if (conn_) {
    conn_->close();
    conn_.reset();
  }
  greeted_ = false;
  heartbeat_timer_.cancel();
  if (phase_ == Phase::Done) return;
  const auto now = clock_.now();
  if (!lost_since_) {
    lost_since_ = now;
    spdlog::warn("lost the rendezvous server at {}: {}; reconnecting",
                 format_endpoint(opt_.endpoint_host, opt_.endpoint_port), why);
  }
  if (now - *lost_since_ >= opt_.connect_timeout) return give_up(why);
  retry_timer_.expires_after(backoff_);
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  retry_timer_.async_wait([this, alive = alive_](error_code ec) {
    if (!ec && *alive) connect();
  });
}

void NetworkRendezvous::rejoin_as_new_node(const std::string& why) {
  const Phase was = phase_;
  // A participant running its workers cost the job a restart (the server counted it when it
  // dropped the node); its next round brings the job's count.
  const bool counted = was == Phase::Running;
  const int next_round = round_ ? round_->round + 1 : 0;
  node_id_ = new_node_id();
  round_.reset();
  succeeded_ = false;
  unsent_failure_.reset();
  // The server closes this connection; the next one speaks for the new id.
  if (conn_) {
    conn_->close();
    conn_.reset();
  }
  greeted_ = false;
  handshake_.reset();
  heartbeat_timer_.cancel();
  spdlog::warn("the rendezvous dropped this node: {}; joining the job again as a new node", why);
  if (was == Phase::Joining) return connect();  // the same request for a round, with the new id
  // Running -> Idle: the workers stop (Restart), then next_rendezvous() joins with the new id.
  // Idle: a Restart already came; the join that follows it uses the new id.
  phase_ = Phase::Idle;
  if (was == Phase::Running)
    notify(Restart{next_round, "this node was dropped by the rendezvous and joins again", counted,
                   known_restart_count_ + (counted ? 1 : 0)});
}

void NetworkRendezvous::give_up(const std::string& why) {
  give_up(RendezvousError{
      RendezvousErrorKind::Connection,
      "cannot reach the rendezvous server at " +
          format_endpoint(opt_.endpoint_host, opt_.endpoint_port) + " for " +
          std::to_string(seconds(opt_.connect_timeout)) + " s (" + why +
          "); check --rdzv_endpoint and that the node hosting it (the endpoint's host) or "
          "ddprun-rdzvd is running"});
}

void NetworkRendezvous::give_up(RendezvousError error) {
  const Phase was = phase_;
  phase_ = Phase::Done;
  if (conn_) {
    conn_->close();
    conn_.reset();
  }
  retry_timer_.cancel();
  heartbeat_timer_.cancel();
  status_timer_.cancel();
  if (was == Phase::Joining) return fail_round(error);
  notify(error);
}

void NetworkRendezvous::fail_round(RendezvousError error) {
  status_timer_.cancel();
  auto done = std::move(done_);
  done_ = nullptr;
  if (done) done(error);
}

void NetworkRendezvous::notify(Notice notice) {
  if (on_notice_) on_notice_(std::move(notice));
}

void NetworkRendezvous::report_failure(const WorkersFailed& failure) {
  if (phase_ != Phase::Running) return;
  if (ready_to_send())
    send(failure);
  else
    unsent_failure_ = failure;
}

void NetworkRendezvous::report_success() {
  if (phase_ != Phase::Running || !round_) return;
  succeeded_ = true;
  // Not yet authenticated: the join after the handshake claims the round as succeeded.
  if (ready_to_send()) send(WorkersSucceeded{round_->round});
}

void NetworkRendezvous::leave(const std::string& reason) {
  if (conn_ && phase_ != Phase::Done) {
    if (ready_to_send()) send(Leave{reason});
    conn_->close_after_writes();
  }
  phase_ = Phase::Done;
  done_ = nullptr;
  on_notice_ = nullptr;
  retry_timer_.cancel();
  heartbeat_timer_.cancel();
  status_timer_.cancel();
}

void NetworkRendezvous::when_flushed(std::function<void()> done) {
  if (!conn_ || !conn_->is_open()) {
    boost::asio::post(io_, std::move(done));
    return;
  }
  conn_->close_after_writes(std::move(done));
}

void NetworkRendezvous::schedule_heartbeat() {
  heartbeat_timer_.expires_after(opt_.settings.keep_alive_interval);
  heartbeat_timer_.async_wait([this, alive = alive_](error_code ec) {
    if (ec || !*alive || !conn_ || phase_ == Phase::Done) return;
    if (ready_to_send()) send(Heartbeat{});
    schedule_heartbeat();
  });
}

void NetworkRendezvous::schedule_status() {
  status_timer_.expires_after(opt_.status_interval);
  status_timer_.async_wait([this, alive = alive_](error_code ec) {
    if (ec || !*alive || phase_ != Phase::Joining || !last_waiting_) return;
    Waiting now = *last_waiting_;
    now.waited += std::chrono::duration_cast<Millis>(clock_.now() - last_waiting_at_);
    spdlog::info("{}", format_waiting(now));
    schedule_status();
  });
}

}  // namespace ddprun::rdzv
