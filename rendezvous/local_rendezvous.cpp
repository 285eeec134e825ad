#include "rendezvous/local_rendezvous.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <utility>

#include "rendezvous/free_port.h"
#include "rendezvous/local_host.h"

namespace ddprun::rdzv {

LocalRendezvous::LocalRendezvous(boost::asio::io_context& io, const common::Clock& clock,
                                 std::string backend, std::string run_id, std::string master_addr,
                                 std::optional<int> master_port, RdzvSettings settings)
    : ClientExecutor(io, clock),
      backend_(std::move(backend)),
      master_addr_(std::move(master_addr)),
      master_port_(master_port),
      job_(new_job(run_id, clock.now())),
      deadline_timer_(io) {
  spec_.run_id = std::move(run_id);
  spec_.endpoint = "this node (single-node rendezvous)";
  spec_.name = local_host_name();
  spec_.settings = std::move(settings);
  spec_.settings.min_nodes = 1;
  spec_.settings.max_nodes = 1;
  spec_.heartbeats = false;
}

LocalRendezvous::~LocalRendezvous() {
  *alive_ = false;
  deadline_timer_.cancel();
}

void LocalRendezvous::post(ClientEvent event) {
  boost::asio::post(io_, [this, alive = alive_, event = std::move(event)] {
    if (*alive) step(event);
  });
}

void LocalRendezvous::connect() {
  link_open_ = true;
  // Nothing to open and no secret to prove: the link is up at once, and the server in memory is
  // this build's (it holds nodes kept out by their health check).
  post(Connected{true});
  post(Greeted{});
}

void LocalRendezvous::send_join(Join join) {
  join.node_id = node_id_;
  join.addr = master_addr_;
  if (master_port_) {
    join.master_port = *master_port_;
  } else {
    // A fresh port every round: a restarted rank 0 must not race the old store's TIME_WAIT.
    auto port = find_free_port(master_addr_);
    if (!port.ok())
      return post(ServerUnusable{RendezvousError{
          RendezvousErrorKind::State, "cannot pick MASTER_PORT: " + port.error().message +
                                          "; pass --master_port PORT or --master_addr ADDR"}});
    join.master_port = *port;
  }
  to_server(std::move(join));
}

void LocalRendezvous::send(const AgentMessage& message) { to_server(message); }

void LocalRendezvous::close_link(bool /*after_writes*/) {
  // Nothing is queued in memory. The client gave up (a store port it could not find, a leave):
  // no deadline of the server's is news to it, and a timer left armed would hold the agent's
  // event loop after the agent has finished.
  link_open_ = false;
  deadline_timer_.cancel();
}

void LocalRendezvous::log_line(const ClientLog& line) {
  log_client_line(ClientLog{ClientLogLevel::Debug, line.text});
}

void LocalRendezvous::to_server(AgentMessage message) {
  server_step(FromNode{node_id_, std::move(message)});
}

void LocalRendezvous::server_step(const Event& event) {
  const common::TimePoint now = clock_.now();
  StepResult r = rdzv::step(std::move(job_), event, now);
  job_ = std::move(r.state);
  if (r.erase) job_ = new_job(spec_.run_id, now);  // a refused first join, or a closed job's end
  for (auto& out : r.messages)
    if (out.node_id == node_id_) post(FrameReceived{std::move(out.message)});
  deadline_timer_.cancel();
  // Only one deadline matters here: the join timeout while this node is kept out (one node
  // forms its round as soon as it joins). Keep-alive is moot; a node between rounds (draining,
  // pausing for --restart_backoff) rejoins when it is ready, as it always has; and a timer
  // armed for a running round, a node that left or a job that ended would hold the agent's
  // event loop (which runs until it has no work) until it expired.
  const auto node = job_.nodes.find(node_id_);
  if (!link_open_ || !r.wake_at || r.erase || job_.phase != JobPhase::Joining ||
      node == job_.nodes.end() || node->second.state != NodeState::KeptOut)
    return;
  deadline_timer_.expires_after(
      std::max(std::chrono::steady_clock::duration::zero(), *r.wake_at - now));
  deadline_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (!ec && *alive) deadline_due();
  });
}

void LocalRendezvous::deadline_due() {
  mark_all_seen(job_, clock_.now());
  server_step(Tick{});
}

}  // namespace ddprun::rdzv
