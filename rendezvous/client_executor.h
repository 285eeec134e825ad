#pragma once
// The executor of the rendezvous client's state machine (rdzv_client.h) that the c10d client
// (NetworkRendezvous) and etcd's (EtcdRendezvous) share: the agent's calls become events, and
// the effects rdzv_client_step returns are carried out here, but for the four that need a
// transport (connect, the join, a message, a close), which each backend supplies. Effects are
// dispatched by std::visit over one handler each, so an effect added to ClientEffect does not
// compile until every executor handles it.
#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "rendezvous/client_timers.h"
#include "rendezvous/rdzv_client.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv {

/// A node id: this host, this process and 128 random bits. The server (or etcd's driver)
/// routes the node's messages by it, so no one else may guess it (status never shows it).
std::string new_node_id();

/// The port a join offers for the workers' store: `fixed` (--master_port) when given, else a
/// free port on `addr`, else on any address; 0 when none can be had.
int master_port_for(const std::optional<int>& fixed, const std::string& addr);

class ClientExecutor : public RendezvousHandler {
 public:
  void next_rendezvous(std::function<void(RendezvousResult)> done) final;
  void set_notice_handler(std::function<void(Notice)> handler) final;
  void report_failure(const WorkersFailed& failure) final;
  void report_success() final;
  void keep_out(const std::string& why) final;
  void leave(const std::string& reason) final;

  /// This node's id ("host:pid:random"); a new one after the server dropped it.
  const std::string& node_id() const { return node_id_; }

 protected:
  ClientExecutor(boost::asio::io_context& io, const common::Clock& clock);

  /// Applies `event` to the client's state and carries out the effects, in order: the state is
  /// complete before the first runs, and each step applies its own list (an effect may call back
  /// into the agent, which may call in again).
  void step(const ClientEvent& event);

  /// The transport. connect: open the link (Connected or ConnectionLost follows, by step).
  virtual void connect() = 0;
  /// The join, to be completed with this node's id, address and store port.
  virtual void send_join(Join join) = 0;
  virtual void send(const AgentMessage& message) = 0;
  /// CloseConnection; `after_writes`: once what is queued is out (a leave).
  virtual void close_link(bool after_writes) = 0;
  /// After RenewNodeId gave this node a new id.
  virtual void node_id_renewed() {}
  /// Writes one of the client's log lines (at its level, unless a backend says otherwise).
  virtual void log_line(const ClientLog& line) { log_client_line(line); }

  boost::asio::io_context& io_;
  const common::Clock& clock_;
  ClientSpec spec_;
  ClientState state_;
  std::string node_id_;
  /// False once the executor is being destroyed: asynchronous handlers check it first. A
  /// backend's destructor clears it before it closes anything.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

 private:
  void apply(const ClientEffect& effect);

  std::function<void(RendezvousResult)> done_;
  std::function<void(Notice)> on_notice_;
  bool detached_ = false;  ///< the agent left: its callbacks are gone for good
  ClientTimers timers_;
};

}  // namespace ddprun::rdzv
