#pragma once
#include <functional>
#include <optional>
#include <string>

#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv {

/// Single-node rendezvous (--standalone, or --nnodes 1): this node is group rank 0 of 1, hosts
/// the workers' store at master_addr and a port that is free when the round completes, and
/// holds the restart budget itself.
class LocalRendezvous final : public RendezvousHandler {
 public:
  /// `post` runs a callback later on the agent's event loop (keeps completion asynchronous).
  LocalRendezvous(std::string backend, std::string run_id, std::string master_addr,
                  std::optional<int> master_port, int max_restarts,
                  std::function<void(std::function<void()>)> post);

  void next_rendezvous(std::function<void(RendezvousResult)> done) override;
  void set_notice_handler(std::function<void(Notice)> handler) override;
  void report_failure(const WorkersFailed& failure) override;
  void report_success() override;
  void leave(const std::string& reason) override;
  std::string backend() const override { return backend_; }
  std::string run_id() const override { return run_id_; }

 private:
  void notify(Notice notice);

  std::string backend_;
  std::string run_id_;
  std::string master_addr_;
  std::optional<int> master_port_;
  int max_restarts_ = 0;
  int restart_count_ = 0;
  int round_ = 0;
  bool left_ = false;
  std::function<void(std::function<void()>)> post_;
  std::function<void(Notice)> on_notice_;
};

}  // namespace ddprun::rdzv
