#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/auth.h"
#include "rendezvous/client_executor.h"
#include "rendezvous/connection.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/rdzv_client.h"
#include "rendezvous/rendezvous_handler.h"
#include "rendezvous/tls.h"

namespace ddprun::rdzv {

/// Everything a node tells the rendezvous server about itself.
struct NetworkRendezvousOptions {
  std::string backend = "c10d";
  std::string run_id;
  std::string endpoint_host;
  int endpoint_port = kDefaultPort;
  std::string name;        ///< shown to users and used to order ranks (addr or host name)
  std::string local_addr;  ///< --local_addr: the client binds to it, and it is MASTER_ADDR
  std::optional<int> node_rank;
  std::optional<int> master_port;          ///< --master_port: fixed instead of a free port
  std::optional<std::string> master_addr;  ///< static backend: fixed MASTER_ADDR for workers
  RdzvSettings settings;
  /// How long the server may stay unreachable (first contact or after a loss) before the node
  /// gives up with an error naming the endpoint.
  Millis connect_timeout{60'000};
  /// How often the "waiting for nodes" line is repeated while nothing changes.
  Millis status_interval{5'000};
  /// Called before each connection attempt; may start hosting the server at the endpoint
  /// (embedded server). Empty when this node never hosts.
  std::function<void()> before_connect;
  /// The shared secret (--rdzv_conf secret_file): prove it to the server and check its proof.
  std::optional<Secret> secret;
  /// TLS (--rdzv_conf tls_ca, tls_cert, tls_key; make_client_tls): the server's certificate
  /// must chain to tls_ca and name endpoint_host. Null: plain TCP.
  TlsContext tls;
};

/// The agent's side of the TCP rendezvous: joins rounds at the server, keeps the connection
/// alive with heartbeats, reports how the workers did and turns the server's pushes into
/// RendezvousResult and Notice callbacks. What to do is decided by rdzv_client_step()
/// (rdzv_client.h); this class keeps the sockets, the handshake and the timers and applies the
/// effects, like the server's apply() (server.cpp).
///
///   next_rendezvous/report_* --> FramedConnection --> server
///   server pushes (waiting, round, restart, closed, refused) --> done / notice callbacks
///   connection lost --> reconnect with back-off (re-register the running round) or give up
class NetworkRendezvous final : public ClientExecutor {
 public:
  NetworkRendezvous(boost::asio::io_context& io, const common::Clock& clock,
                    NetworkRendezvousOptions options);
  ~NetworkRendezvous() override;

  std::string backend() const override { return opt_.backend; }
  std::string run_id() const override { return opt_.run_id; }

  /// Once the job is over: closes the connection after what is queued (a leave) is written,
  /// and runs `done` (posted) when it has closed, or at once when there is none. Bounded by the
  /// server reading; the caller keeps a deadline.
  void when_flushed(std::function<void()> done);

  /// Frames received from the server so far, hellos included (bench/ counts messages per round).
  std::uint64_t frames_received() const { return frames_received_; }

  /// The server this node last greeted is the standalone daemon (its hello says so): when it
  /// goes away, this node waits for it to come back instead of hosting the rendezvous on its
  /// port, which a restarted daemon (systemd) then could not take.
  bool served_by_daemon() const { return served_by_daemon_; }

 private:
  void connect() override;
  void send_join(Join join) override;
  void send(const AgentMessage& message) override;
  void close_link(bool after_writes) override;
  void try_endpoint(size_t index, const std::string& last_error);
  void on_connected(std::shared_ptr<FramedConnection> conn);
  void on_message(const nlohmann::json& body);

  NetworkRendezvousOptions opt_;
  std::shared_ptr<FramedConnection> conn_;
  std::vector<boost::asio::ip::tcp::endpoint> endpoints_;  ///< of the endpoint, being tried
  std::optional<ClientHandshake> handshake_;
  bool greeted_ = false;
  bool served_by_daemon_ = false;
  std::uint64_t frames_received_ = 0;
};

}  // namespace ddprun::rdzv
