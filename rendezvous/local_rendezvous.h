#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rdzv_state.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::rdzv {

/// Single-node rendezvous (--standalone, or --nnodes 1): this node is group rank 0 of 1 and hosts
/// the workers' store at master_addr and a port that is free when the round completes. It runs
/// the rendezvous server's step() (rdzv_state.h) in memory on a job of one node, so the restart
/// budget, the restart reasons and the job's outcome follow the same policy as a multi-node job.
/// The single node is never silent: no Tick is ever given; the steady clock dates each message
/// (for --restart_window).
class LocalRendezvous final : public RendezvousHandler {
 public:
  /// `settings`: --max_restarts and the failure policy (restart window, crash loops, fatal exit
  /// codes); its node counts are set to 1. `post` runs a callback later on the agent's event
  /// loop (keeps completion asynchronous).
  LocalRendezvous(std::string backend, std::string run_id, std::string master_addr,
                  std::optional<int> master_port, RdzvSettings settings,
                  std::function<void(std::function<void()>)> post);

  void next_rendezvous(std::function<void(RendezvousResult)> done) override;
  void set_notice_handler(std::function<void(Notice)> handler) override;
  void report_failure(const WorkersFailed& failure) override;
  void report_success() override;
  void leave(const std::string& reason) override;
  std::string backend() const override { return backend_; }
  std::string run_id() const override { return run_id_; }

 private:
  /// Runs the server's step() on this node's message; returns what it sends back to the node.
  std::vector<ServerMessage> step(AgentMessage message);
  void notify(Notice notice);

  std::string backend_;
  std::string run_id_;
  std::string master_addr_;
  std::optional<int> master_port_;
  RdzvSettings settings_;
  std::string host_;
  JobState job_;
  bool left_ = false;
  std::function<void(std::function<void()>)> post_;
  std::function<void(Notice)> on_notice_;
};

}  // namespace ddprun::rdzv
