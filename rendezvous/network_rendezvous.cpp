#include "rendezvous/network_rendezvous.h"

#include <chrono>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/log.h"
#include "common/strings.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/local_host.h"

namespace ddprun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

/// How long one connection attempt may go unanswered: a host that drops the SYN (a firewall, a
/// wrong address) would otherwise hold it for the kernel's two minutes, past connect_timeout
/// and without the client's notice that the server is not reachable yet.
constexpr std::chrono::seconds kConnectAttemptLimit{5};

}  // namespace

NetworkRendezvous::NetworkRendezvous(asio::io_context& io, const common::Clock& clock,
                                     NetworkRendezvousOptions options)
    : ClientExecutor(io, clock), opt_(std::move(options)) {
  spec_.run_id = opt_.run_id;
  spec_.endpoint = format_endpoint(opt_.endpoint_host, opt_.endpoint_port);
  spec_.name = opt_.name;
  spec_.node_rank = opt_.node_rank;
  spec_.settings = opt_.settings;
  spec_.connect_timeout = opt_.connect_timeout;
  spec_.status_interval = opt_.status_interval;
}

NetworkRendezvous::~NetworkRendezvous() {
  *alive_ = false;
  if (conn_) conn_->close();
}

void NetworkRendezvous::close_link(bool after_writes) {
  greeted_ = false;
  handshake_.reset();
  if (!conn_) return;
  if (after_writes) return conn_->close_after_writes();  // when_flushed waits on it
  conn_->close();
  conn_.reset();
}

void NetworkRendezvous::connect() {
  if (opt_.before_connect) opt_.before_connect();
  auto resolver = std::make_shared<tcp::resolver>(io_);
  resolver->async_resolve(
      opt_.endpoint_host, std::to_string(opt_.endpoint_port),
      [this, alive = alive_, resolver](error_code ec, tcp::resolver::results_type results) {
        if (!*alive) return;
        if (ec)
          return step(ConnectionLost{"cannot resolve " + opt_.endpoint_host + ": " + ec.message()});
        endpoints_.clear();
        for (const auto& r : results) endpoints_.push_back(r.endpoint());
        try_endpoint(0, "no address");
      });
}

void NetworkRendezvous::try_endpoint(size_t index, const std::string& last_error) {
  if (index >= endpoints_.size()) return step(ConnectionLost{last_error});
  const tcp::endpoint target = endpoints_[index];
  auto socket = std::make_shared<tcp::socket>(io_);
  error_code ec;
  socket->open(target.protocol(), ec);
  if (!ec && !opt_.local_addr.empty()) {
    error_code not_address;
    auto local = asio::ip::make_address(opt_.local_addr, not_address);
    // A --local_addr that is a host name (torchrun's takes one: it only names the node) or of
    // the other family: connect without binding. The launch plan checked that an address
    // belongs to this machine.
    if (!not_address && local.is_v6() == target.address().is_v6())
      socket->bind(tcp::endpoint(local, 0), ec);
    if (ec)
      return try_endpoint(index + 1,
                          "cannot bind --local_addr " + opt_.local_addr + ": " + ec.message());
  }
  if (ec) return try_endpoint(index + 1, ec.message());
  auto limit = std::make_shared<asio::steady_timer>(io_, kConnectAttemptLimit);
  auto unanswered = std::make_shared<bool>(false);
  limit->async_wait([socket, unanswered](error_code ec) {
    if (ec) return;  // cancelled: the attempt ended first
    *unanswered = true;
    socket->close(ec);  // ends the attempt with operation_aborted
  });
  socket->async_connect(
      target, [this, alive = alive_, socket, index, limit, unanswered](error_code ec) {
        limit->cancel();
        if (!*alive) return;
        if (*unanswered)
          return try_endpoint(
              index + 1, "no answer within " + std::to_string(kConnectAttemptLimit.count()) + " s");
        if (ec) return try_endpoint(index + 1, ec.message());
        tune_socket(*socket, opt_.settings.keep_alive_window());
        std::optional<TlsRole> tls;
        if (opt_.tls) tls = TlsRole{opt_.tls, false, opt_.endpoint_host};
        on_connected(std::make_shared<FramedConnection>(std::move(*socket), std::move(tls)));
      });
}

void NetworkRendezvous::on_connected(std::shared_ptr<FramedConnection> conn) {
  if (state_.phase == ClientPhase::Done) return conn->close();  // gave up or left meanwhile
  conn_ = conn;
  greeted_ = false;
  conn_->start(
      [this, alive = alive_](const nlohmann::json& body) {
        if (*alive) on_message(body);
      },
      [this, alive = alive_, raw = conn.get()](const CloseReason& why) {
        if (!*alive || conn_.get() != raw) return;
        if (why.kind == CloseKind::Tls) return step(ConnectionLost{why.text, true});
        step(ConnectionLost{raw->client_close_reason(why.text, "--rdzv_conf tls_ca=FILE")});
      });
  handshake_.emplace(opt_.secret, "agent", make_nonce());
  conn_->send(handshake_->hello());
  step(Connected{!handshake_->authenticates()});
}

void NetworkRendezvous::send(const AgentMessage& message) {
  if (conn_) conn_->send(to_json(message));
}

void NetworkRendezvous::send_join(Join join) {
  if (!conn_) return;
  join.node_id = node_id_;
  if (opt_.master_addr)
    join.addr = *opt_.master_addr;
  else if (!opt_.local_addr.empty())
    join.addr = opt_.local_addr;
  else
    join.addr = advertised_address(conn_->local_address());
  join.master_port = master_port_for(opt_.master_port, join.addr);
  send(join);
}

void NetworkRendezvous::on_message(const nlohmann::json& body) {
  ++frames_received_;
  if (!greeted_) {
    if (!handshake_) return;
    HandshakeStep hs = handshake_->on_message(body);
    if (hs.error) {
      // A refusal instead of a hello says why (the protocol differs, the secret is wrong).
      return step(ServerUnusable{RendezvousError{
          RendezvousErrorKind::State,
          hs.not_ddprun ? "the server at " + spec_.endpoint + " is " + hs.error->message
                        : hs.error->message}});
    }
    if (hs.send) conn_->send(*hs.send);
    if (!hs.done) return;
    greeted_ = true;
    handshake_.reset();
    // The server's hello (the last message of the handshake) says whether it is the daemon.
    const auto daemon = body.find("daemon");
    served_by_daemon_ = daemon != body.end() && daemon->is_boolean() && daemon->get<bool>();
    const auto holds = body.find("holds_kept_out");
    return step(Greeted{holds != body.end() && holds->is_boolean() && holds->get<bool>()});
  }
  auto parsed = parse_server_message(body);
  if (!parsed)
    return step(ServerUnusable{
        RendezvousError{RendezvousErrorKind::State,
                        "bad message from the rendezvous server: " + parsed.error().message}});
  step(FrameReceived{*std::move(parsed)});
}

void NetworkRendezvous::when_flushed(std::function<void()> done) {
  if (!conn_ || !conn_->is_open()) {
    boost::asio::post(io_, std::move(done));
    return;
  }
  conn_->close_after_writes(std::move(done));
}

}  // namespace ddprun::rdzv
