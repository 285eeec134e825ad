#include "rendezvous/local_rendezvous.h"

#include <utility>

#include "rendezvous/free_port.h"
#include "rendezvous/local_host.h"

namespace ddprun::rdzv {

namespace {

/// The one node's id in the in-memory job (never on a wire).
constexpr const char* kNodeId = "local";

}  // namespace

LocalRendezvous::LocalRendezvous(std::string backend, std::string run_id, std::string master_addr,
                                 std::optional<int> master_port, RdzvSettings settings,
                                 std::function<void(std::function<void()>)> post)
    : backend_(std::move(backend)),
      run_id_(std::move(run_id)),
      master_addr_(std::move(master_addr)),
      master_port_(master_port),
      settings_(std::move(settings)),
      host_(local_host_name()),
      job_(new_job(run_id_, std::chrono::steady_clock::now())),
      post_(std::move(post)) {
  settings_.min_nodes = 1;
  settings_.max_nodes = 1;
}

std::vector<ServerMessage> LocalRendezvous::step(AgentMessage message) {
  const common::TimePoint now = std::chrono::steady_clock::now();
  StepResult r = rdzv::step(std::move(job_), FromNode{kNodeId, std::move(message)}, now);
  job_ = std::move(r.state);
  if (r.erase) job_ = new_job(run_id_, now);  // a refused first join
  std::vector<ServerMessage> replies;
  for (auto& out : r.messages) {
    if (out.node_id == kNodeId) replies.push_back(std::move(out.message));
  }
  return replies;
}

void LocalRendezvous::next_rendezvous(std::function<void(RendezvousResult)> done) {
  Join join;
  join.run_id = run_id_;
  join.node_id = kNodeId;
  join.name = host_;
  join.addr = master_addr_;
  join.settings = settings_;
  join.restart_count = job_.restart_count;
  RendezvousResult result =
      RendezvousError{RendezvousErrorKind::State, "the rendezvous did not complete the round"};
  if (master_port_) {
    join.master_port = *master_port_;
  } else {
    // A fresh port every round: a restarted rank 0 must not race the old store's TIME_WAIT.
    auto port = find_free_port(master_addr_);
    if (port) {
      join.master_port = *port;
    } else {
      result = RendezvousError{RendezvousErrorKind::State,
                               "cannot pick MASTER_PORT: " + port.error().message +
                                   "; pass --master_port PORT or --master_addr ADDR"};
      join.master_port = -1;
    }
  }
  if (join.master_port >= 0) {
    for (const ServerMessage& reply : step(join)) {
      if (const auto* ready = std::get_if<RoundReady>(&reply)) {
        // Joining -> Running: one node is min and max nodes, so the round completes at once.
        RendezvousInfo info;
        info.round = ready->round;
        info.group_rank = ready->group_rank;
        info.group_world_size = ready->group_world_size;
        info.master_addr = ready->master_addr;
        info.master_port = ready->master_port;
        info.restart_count = ready->restart_count;
        result = info;
      } else if (const auto* refused = std::get_if<Refused>(&reply)) {
        // Closed -> Closed: the job is over; a late join is refused with its end.
        result = RendezvousError{refused->kind == RefusalKind::Closed ? RendezvousErrorKind::Closed
                                                                      : RendezvousErrorKind::State,
                                 refused->message};
      }
    }
  }
  post_([this, done = std::move(done), result = std::move(result)]() {
    if (!left_) done(result);
  });
}

void LocalRendezvous::set_notice_handler(std::function<void(Notice)> handler) {
  on_notice_ = std::move(handler);
}

void LocalRendezvous::report_failure(const WorkersFailed& failure) {
  // Running -> Joining (Restart) while the budget lasts, else Running -> Closed(Failed).
  for (const ServerMessage& reply : step(failure)) {
    if (const auto* restart = std::get_if<Restart>(&reply)) notify(*restart);
    if (const auto* closed = std::get_if<Closed>(&reply)) notify(*closed);
  }
}

void LocalRendezvous::report_success() {
  // Running -> Closed(Succeeded): the only participant succeeded.
  for (const ServerMessage& reply : step(WorkersSucceeded{job_.round})) {
    if (const auto* closed = std::get_if<Closed>(&reply)) notify(*closed);
  }
}

void LocalRendezvous::leave(const std::string& reason) {
  left_ = true;
  step(Leave{reason});
}

void LocalRendezvous::notify(Notice notice) {
  post_([this, notice = std::move(notice)]() {
    if (!left_ && on_notice_) on_notice_(notice);
  });
}

}  // namespace ddprun::rdzv
