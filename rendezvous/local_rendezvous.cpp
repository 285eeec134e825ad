#include "rendezvous/local_rendezvous.h"

#include <utility>

#include "rendezvous/free_port.h"

namespace ddprun::rdzv {

LocalRendezvous::LocalRendezvous(std::string backend, std::string run_id, std::string master_addr,
                                 std::optional<int> master_port,
                                 std::function<void(std::function<void()>)> post)
    : backend_(std::move(backend)),
      run_id_(std::move(run_id)),
      master_addr_(std::move(master_addr)),
      master_port_(master_port),
      post_(std::move(post)) {}

void LocalRendezvous::next_rendezvous(int restart_count,
                                      std::function<void(RendezvousResult)> done) {
  RendezvousResult result;
  RendezvousInfo info;
  info.group_rank = 0;
  info.group_world_size = 1;
  info.master_addr = master_addr_;
  info.restart_count = restart_count;
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
  post_([done = std::move(done), result = std::move(result)]() { done(result); });
}

}  // namespace ddprun::rdzv
