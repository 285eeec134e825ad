#pragma once
#include <functional>
#include <optional>
#include <string>

#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv {

/// Single-node rendezvous (--standalone, or --nnodes 1): this node is group rank 0 of 1 and
/// hosts the workers' store at master_addr and a port that is free when the round completes.
class LocalRendezvous final : public RendezvousHandler {
 public:
  /// `post` runs a callback later on the agent's event loop (keeps completion asynchronous).
  LocalRendezvous(std::string backend, std::string run_id, std::string master_addr,
                  std::optional<int> master_port, std::function<void(std::function<void()>)> post);

  void next_rendezvous(int restart_count, std::function<void(RendezvousResult)> done) override;
  std::string backend() const override { return backend_; }
  std::string run_id() const override { return run_id_; }

 private:
  std::string backend_;
  std::string run_id_;
  std::string master_addr_;
  std::optional<int> master_port_;
  std::function<void(std::function<void()>)> post_;
};

}  // namespace ddprun::rdzv
