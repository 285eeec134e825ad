#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <optional>
#include <string>

#include "common/clock.h"
#include "rendezvous/client_executor.h"
#include "rendezvous/rdzv_state.h"

namespace ddprun::rdzv {

/// Single-node rendezvous (--standalone, or --nnodes 1): this node is group rank 0 of 1 and hosts
/// the workers' store at master_addr and a port that is free when the round completes.
///
/// It is the rendezvous client of a multi-node job (rdzv_client_step, through ClientExecutor)
/// over an in-memory link to the server's step() (rdzv_state.h) on a job of one node, so the
/// agent's calls, the restart budget, the restart reasons and the job's outcome follow the same
/// code as a multi-node job's:
///
///   next_rendezvous/report_* --> rdzv_client_step --> (in memory) server step(), this clock
///   the server's replies, posted as frames --> rdzv_client_step --> done / notice callbacks
///
/// The link cannot break or go silent: no heartbeat. A timer runs the server's deadlines only
/// while this node is kept out by its health check, so the join timeout holds here too: kept
/// out that long, the node ends the job (exit 69) instead of checking forever. Everything the
/// server says reaches the agent later on the event loop, as a networked server's frames would.
class LocalRendezvous final : public ClientExecutor {
 public:
  /// `settings`: --max_restarts and the failure policy (restart window, crash loops, fatal exit
  /// codes); its node counts are set to 1. `clock` dates each message (for --restart_window).
  LocalRendezvous(boost::asio::io_context& io, const common::Clock& clock, std::string backend,
                  std::string run_id, std::string master_addr, std::optional<int> master_port,
                  RdzvSettings settings);
  ~LocalRendezvous() override;

  std::string backend() const override { return backend_; }
  std::string run_id() const override { return spec_.run_id; }

 private:
  void connect() override;
  void send_join(Join join) override;
  void send(const AgentMessage& message) override;
  void close_link(bool after_writes) override;
  /// At debug: a single node's rounds are no news (the agent says what its workers do).
  void log_line(const ClientLog& line) override;

  /// Runs the server's step() on this node's message and posts its replies to this node.
  void to_server(AgentMessage message);
  /// Runs the server's step() on `event`, posts its replies and arms the deadline timer.
  void server_step(const Event& event);
  /// The server's deadlines are due: the node is alive (the link cannot go silent), then Tick.
  void deadline_due();
  /// Steps the client with `event` later on the event loop.
  void post(ClientEvent event);

  std::string backend_;
  std::string master_addr_;
  std::optional<int> master_port_;
  JobState job_;
  boost::asio::steady_timer deadline_timer_;  ///< at the last step's wake_at
  bool link_open_ = false;                    ///< from connect() to close_link()
};

}  // namespace ddprun::rdzv
