#pragma once
#include <functional>
#include <optional>
#include <string>

#include "launcher/launch_config.h"
#include "launcher/rdzv_plan.h"
#include "rendezvous/rendezvous_handler.h"

namespace ddprun::launcher {

/// Where this node's agent hosts the workers' TCPStore (docs/design.md#the-agent-store).
struct AgentStorePlan {
  /// Workers get TORCHELASTIC_USE_AGENT_STORE=True and connect as clients.
  bool use_agent_store = false;
  /// Whether this node binds a store: a node that may become group rank 0.
  bool host = false;
  std::string listen_host;  ///< "" for every address
  int listen_port = 0;      ///< 0: a free port, published as MASTER_PORT
};

/// Decided from the configuration alone: one node binds --master_addr (an IP literal) or every
/// address; the static backend's node rank 0 binds --master_port (29500 by default); with c10d,
/// every node binds one (--master_port, else a free port) and publishes it in its join.
AgentStorePlan plan_agent_store(const LaunchConfig& config, const RendezvousPlan& rdzv);

/// A rendezvous handler that calls `on_join()` each time the agent joins a round, before the
/// join goes out: the agent joins only once its workers are gone, and no node's next group
/// can start before this join, so the store clears the last group's keys then. `on_round`
/// sees each round that forms, before the agent starts its workers.
class RoundObserver : public rdzv::RendezvousHandler {
 public:
  RoundObserver(rdzv::RendezvousHandler& inner, std::function<void()> on_join,
                std::function<void(const rdzv::RendezvousInfo&)> on_round = {})
      : inner_(inner), on_join_(std::move(on_join)), on_round_(std::move(on_round)) {}
  void next_rendezvous(std::function<void(rdzv::RendezvousResult)> done) override;
  void set_notice_handler(std::function<void(rdzv::Notice)> handler) override {
    inner_.set_notice_handler(std::move(handler));
  }
  void report_failure(const rdzv::WorkersFailed& failure) override {
    inner_.report_failure(failure);
  }
  void report_success() override { inner_.report_success(); }
  void keep_out(const std::string& why) override { inner_.keep_out(why); }
  void leave(const std::string& reason) override { inner_.leave(reason); }
  std::string backend() const override { return inner_.backend(); }
  std::string run_id() const override { return inner_.run_id(); }

 private:
  rdzv::RendezvousHandler& inner_;
  std::function<void()> on_join_;
  std::function<void(const rdzv::RendezvousInfo&)> on_round_;
};

}  // namespace ddprun::launcher
