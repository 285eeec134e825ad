#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "rendezvous/connection.h"
#include "rendezvous/rdzv_state.h"

namespace ddprun::rdzv {

/// The rendezvous server: one listening socket, any number of jobs (by rdzv_id). Runs embedded
/// in the agent on the endpoint's host or in the daemon ddprun-rdzvd.
///
///   acceptor --> Session (FramedConnection: hello, then Join binds it to (run_id, node_id))
///                   | AgentMessage                      ^ ServerMessage
///                   v                                   |
///                step(JobState, event, now) --> Outgoing messages, wake_at --> one timer
///
/// All on the io_context's thread; the state machine (rdzv_state.h) holds every decision.
class RendezvousServer {
 public:
  RendezvousServer(boost::asio::io_context& io, const common::Clock& clock);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  /// Listens on host:port ("" host: every address, IPv6 and IPv4; port 0: a free port).
  /// Returns why not on failure; `in_use` is set when the address is taken.
  std::optional<std::string> listen(const std::string& host, int port, bool* in_use = nullptr);

  /// The bound port (after listen).
  int port() const { return port_; }

  /// Stops accepting and ends every session once its queued messages are written.
  void shutdown();

  /// Sessions whose queued messages are not all written yet.
  bool has_pending_writes() const;

  /// The jobs as `ddprun status` shows them (one when run_id is set).
  nlohmann::json describe(const std::optional<std::string>& run_id) const;

 private:
  struct Session {
    std::shared_ptr<FramedConnection> conn;
    bool greeted = false;
    std::string run_id;  ///< set by the first Join
    std::string node_id;
  };
  struct Job {
    JobState state;
    std::optional<TimePoint> wake_at;
  };

  void accept_next();
  void on_message(std::uint64_t id, const nlohmann::json& body);
  void on_closed(std::uint64_t id, const std::string& why);
  void refuse(Session& session, const std::string& message);
  void apply(const std::string& run_id, const Event& event);
  void deliver(const std::string& run_id, const Outgoing& out);
  void arm_timer();
  void on_timer();

  boost::asio::io_context& io_;
  const common::Clock& clock_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer timer_;
  boost::asio::steady_timer accept_timer_;
  int port_ = 0;
  std::uint64_t next_session_ = 1;
  std::map<std::uint64_t, Session> sessions_;
  /// (run_id, node_id) -> the session that speaks for that node now.
  std::map<std::pair<std::string, std::string>, std::uint64_t> routes_;
  std::map<std::string, Job> jobs_;
  bool stopped_ = false;
};

}  // namespace ddprun::rdzv
