#pragma once
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "common/accept_loop.h"
#include "common/clock.h"
#include "common/result.h"
#include "common/shared_string.h"
#include "common/warning_limiter.h"
#include "rendezvous/auth.h"
#include "rendezvous/connection.h"
#include "rendezvous/job_history.h"
#include "rendezvous/limits.h"
#include "rendezvous/rdzv_state.h"
#include "rendezvous/server_metrics.h"

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
class RendezvousServer : private FramedConnection::Listener {
 public:
  /// With `secret`, every connection must prove it holds it before anything else (auth.h);
  /// with `tls` (make_server_tls), every connection speaks TLS (tls.h).
  RendezvousServer(boost::asio::io_context& io, const common::Clock& clock,
                   ServerLimits limits = {}, std::optional<Secret> secret = std::nullopt,
                   TlsContext tls = nullptr);
  ~RendezvousServer() override;
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  /// Listens on host:port ("" host: every address, IPv6 and IPv4; port 0: a free port).
  /// Returns why not on failure; `in_use` is set when the address is taken.
  std::optional<common::Error> listen(const std::string& host, int port, bool* in_use = nullptr);

  /// The bound port (after listen).
  int port() const { return port_; }

  /// Shutdown is cancellation: stops accepting, cancels the timers and ends every session once
  /// its queued messages are written; `drained` runs (posted) when every session has ended, at
  /// the latest after `deadline` (sessions whose peer does not read are closed then). Nothing
  /// of the server is left pending on the io_context afterwards, so run() may return.
  void shutdown(std::chrono::milliseconds deadline, std::function<void()> drained = {});

  /// Counts into `metrics` from now on (ddprun-rdzvd --metrics_port); nullptr: none. It must
  /// outlive the server.
  void set_metrics(ServerMetrics* metrics) { metrics_ = metrics; }

  /// The server is the standalone daemon: its hello says so, and agents that greeted it never
  /// take its port over when it goes away (NetworkRendezvous::served_by_daemon).
  void set_daemon(bool daemon) { daemon_ = daemon; }

  /// Records each job's history into `history` from now on (the daemon's status page);
  /// nullptr: none. It must outlive the server.
  void set_history(JobHistory* history) { history_ = history; }

  /// Sets the gauges of the metrics (jobs, nodes, connections) from the state now: called at
  /// scrape time, O(jobs).
  void refresh_metrics() const;

  /// The jobs as `ddprun status` shows them (one when run_id is set), from the first run id
  /// after `after`, about kStatusPageBytes of them; `next` is set when more follow.
  StatusReply describe(const std::optional<std::string>& run_id,
                       const std::optional<std::string>& after = std::nullopt) const;

  /// The jobs of the status document (status_page.h): {"jobs": the first `max_jobs` by run id,
  /// each as describe() shows it with its "history" (job_history.h), "job_count", "connections"}.
  nlohmann::json status_document(std::size_t max_jobs) const;

 private:
  /// What a session holds until its hello (and proof) is done.
  struct Hello {
    ServerHandshake handshake;
    TimePoint opened_at;  ///< for the hello timeout
  };
  /// One connection, by its key in sessions_ (a server holds thousands: nothing here that most
  /// sessions do not need, docs/design.md#rendezvous-at-scale).
  struct Session {
    std::shared_ptr<FramedConnection> conn;
    std::unique_ptr<Hello> hello;  ///< until the hello is done; null once greeted
    /// The job and node it speaks for, set by the first Join; empty until then (neither id is
    /// ever empty). No copies of their own: the run id is its Job's, and the node id the one
    /// its job's node table holds once a join was admitted (a copy of each cost a node of
    /// 16,384 a heap block, docs/design.md#rendezvous-at-scale).
    common::SharedString run_id;
    NodeId node_id;

    bool bound() const { return !node_id.empty(); }
  };
  struct Job {
    JobState state;
    std::optional<TimePoint> wake_at;
    common::SharedString run_id;  ///< state.run_id, shared by the job's sessions
  };

  void on_accepted(boost::asio::ip::tcp::socket socket);
  void on_accept_failed(const boost::system::error_code& ec);
  /// Over the input budget: closes the connections holding the most unfinished input.
  void shed_largest_inputs();
  /// Accepts and closes one connection with the reserve descriptor (out of descriptors).
  void shed_one_connection();
  /// Called first by every handler: notices that the server did not run for a while.
  void note_awake();
  /// Every housekeeping period: stall check, hello and stalled-frame timeouts.
  void arm_housekeeping();
  void housekeeping();
  void on_message(std::uint64_t id, const nlohmann::json& body);
  void on_closed(std::uint64_t id, const CloseReason& why);
  /// After a Join of session `id` to job `run_id`: the session holds its node's id as the
  /// job's node table does (one copy), when the table has the node.
  void share_node_id(std::uint64_t id, const std::string& run_id);
  // FramedConnection::Listener, for every session (tagged with its id).
  void frame_received(std::uint64_t id, const nlohmann::json& body) override {
    on_message(id, body);
  }
  void connection_ended(std::uint64_t id, const CloseReason& why) override { on_closed(id, why); }
  void refuse(std::uint64_t id, Session& session, const std::string& message,
              RefusalKind kind = RefusalKind::Protocol);
  /// Ends session `id` once its queued frames are written, and then forgets it.
  void close_after_writes(std::uint64_t id, Session& session);
  void apply(const std::string& run_id, const Event& event);
  void deliver(const std::string& run_id, const Outgoing& out);
  void arm_timer();
  void on_timer();

  boost::asio::io_context& io_;
  const common::Clock& clock_;
  boost::asio::ip::tcp::acceptor acceptor_;
  common::AcceptLoop accepts_;
  boost::asio::steady_timer timer_;
  boost::asio::steady_timer housekeeping_timer_;
  boost::asio::steady_timer shutdown_timer_;  ///< shutdown()'s deadline
  std::function<void()> drained_;             ///< shutdown()'s callback, until it ran
  std::size_t draining_ = 0;                  ///< sessions shutdown() still waits for
  /// Expires with the server: a session's drained callback may run after it is gone.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  void session_drained();
  ServerLimits limits_;
  std::optional<Secret> secret_;
  TlsContext tls_;
  InputBudget input_budget_;
  std::optional<TimePoint> awake_at_;  ///< when a handler last ran
  int reserve_fd_ = -1;                ///< kept open to accept-and-close when out of descriptors
  std::uint64_t shed_count_ = 0;       ///< connections closed for lack of descriptors, unlogged
  std::optional<TimePoint> shed_logged_at_;
  /// Warnings about peers (refusals, bad frames, time-outs): at most 20 per 10 s, the rest
  /// counted, so a hostile peer cannot flood the log.
  void warn_peer(const std::string& peer, const std::string& message);
  common::WarningLimiter peer_warnings_;
  int port_ = 0;
  std::uint64_t next_session_ = 1;
  using Sessions = std::unordered_map<std::uint64_t, Session>;
  Sessions sessions_;
  /// Forgets session `it` and what housekeeping holds of it. Its route, which points at it,
  /// must be gone first.
  void erase_session(Sessions::iterator it);
  /// Of a session that holds part of a frame: bytes_received() and when housekeeping last saw
  /// it change. Only such sessions have an entry (a few at a time), not every session.
  struct Progress {
    std::uint64_t bytes = 0;
    TimePoint at;
  };
  std::unordered_map<std::uint64_t, Progress> partial_;
  /// Sessions that have not completed their hello, oldest first: `silent_` has sent no valid
  /// message yet, `greeting_` has said hello and is in the secret's handshake. Over
  /// ungreeted_cap_ together, the oldest silent one is closed (the oldest greeting one when
  /// none is silent), so a flood of connections that never greet cannot take every descriptor
  /// from the agents and `ddprun status`, which say hello at once.
  std::set<std::uint64_t> silent_;
  std::set<std::uint64_t> greeting_;
  std::size_t ungreeted_cap_ = 16;
  /// Closes the session that has waited longest without a word (see silent_).
  void evict_oldest_ungreeted();
  /// Forgets `id` in silent_ and greeting_.
  void forget_ungreeted(std::uint64_t id) {
    silent_.erase(id);
    greeting_.erase(id);
  }
  /// A node of a job, as routes_ finds it.
  struct RouteKey {
    std::string_view run_id;
    std::string_view node_id;
  };
  /// Hash and equality of routes_, by the session's (run id, node id) or by a RouteKey.
  struct RouteHash {
    using is_transparent = void;
    std::size_t operator()(const RouteKey& key) const noexcept;
    std::size_t operator()(const Sessions::value_type* session) const noexcept {
      return (*this)(RouteKey{session->second.run_id, session->second.node_id});
    }
  };
  struct RouteEqual {
    using is_transparent = void;
    static RouteKey key(const RouteKey& key) { return key; }
    static RouteKey key(const Sessions::value_type* session) {
      return {session->second.run_id, session->second.node_id};
    }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const noexcept {
      return key(a).run_id == key(b).run_id && key(a).node_id == key(b).node_id;
    }
  };
  /// The session that speaks for each node now, found by (run id, node id): a pointer to it,
  /// whose ids the hash reads (no copy of either id, nor a cached hash: 16 bytes a node). A
  /// route goes before its session.
  std::unordered_set<const Sessions::value_type*, RouteHash, RouteEqual> routes_;
  std::map<std::string, Job, std::less<>> jobs_;
  /// (wake_at, run id) of every job that has one: the earliest is the timer's.
  std::set<std::pair<TimePoint, std::string>> deadlines_;
  std::optional<TimePoint> armed_at_;  ///< what the timer is set for now
  bool stopped_ = false;
  bool daemon_ = false;
  ServerMetrics* metrics_ = nullptr;
  JobHistory* history_ = nullptr;
};

}  // namespace ddprun::rdzv
