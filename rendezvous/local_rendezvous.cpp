#include "rendezvous/local_rendezvous.h"

#include <utility>

#include "rendezvous/free_port.h"

namespace ddprun::rdzv {

LocalRendezvous::LocalRendezvous(std::string backend, std::string run_id, std::string master_addr,
                                 std::optional<int> master_port, int max_restarts,
                                 std::function<void(std::function<void()>)> post)
    : backend_(std::move(backend)),
      run_id_(std::move(run_id)),
      master_addr_(std::move(master_addr)),
      master_port_(master_port),
      max_restarts_(max_restarts),
      post_(std::move(post)) {}

void LocalRendezvous::next_rendezvous(std::function<void(RendezvousResult)> done) {
  RendezvousResult result;
  RendezvousInfo info;
  info.round = round_++;
  info.group_rank = 0;
  info.group_world_size = 1;
  info.master_addr = master_addr_;
  info.restart_count = restart_count_;
  if (master_port_) {
    info.master_port = *master_port_;
    result = info;
  } else {
    // A fresh port every round: a restarted rank 0 must not race the old store's TIME_WAIT.
    auto port = find_free_port(master_addr_);
    if (auto* p = std::get_if<int>(&port)) {
      info.master_port = *p;
      result = info;
    } else {
      result = RendezvousError{RendezvousErrorKind::State,
                               "cannot pick MASTER_PORT: " + std::get<std::string>(port) +
                                   "; pass --master_port PORT or --master_addr ADDR"};
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
  if (restart_count_ < max_restarts_) {
    // Running -> Joining: the budget allows another round.
    ++restart_count_;
    return notify(Restart{round_, failure.description, true, restart_count_});
  }
  // Running -> Closed: the budget is used up.
  notify(Closed{JobOutcomeKind::Failed, failure.description, failure.exit_code, failure.signal});
}

void LocalRendezvous::report_success() { notify(Closed{JobOutcomeKind::Succeeded, "", 0, 0}); }

void LocalRendezvous::leave(const std::string&) { left_ = true; }

void LocalRendezvous::notify(Notice notice) {
  post_([this, notice = std::move(notice)]() {
    if (!left_ && on_notice_) on_notice_(notice);
  });
}

}  // namespace ddprun::rdzv
