#include "launcher/agent_store.h"

#include <boost/asio/ip/address.hpp>
#include <utility>

namespace ddprun::launcher {

AgentStorePlan plan_agent_store(const LaunchConfig& config, const RendezvousPlan& rdzv) {
  AgentStorePlan plan;
  if (!config.agent_store) return plan;
  plan.use_agent_store = true;
  if (rdzv.single_node) {
    // Workers reach it at --master_addr (or --local_addr): bind that address when it is a
    // literal (127.0.0.1 by default keeps the store off the network), else every address.
    const std::string addr = config.local_addr.empty() ? config.master_addr : config.local_addr;
    boost::system::error_code ec;
    (void)boost::asio::ip::make_address(addr, ec);
    plan.host = true;
    plan.listen_host = ec ? std::string() : addr;
    plan.listen_port = config.master_port.value_or(0);
    return plan;
  }
  if (rdzv.client.backend == "static") {
    // Node rank 0 is group rank 0, and the workers of every node reach it at
    // --master_addr:--master_port, as torchrun's static agent store.
    plan.host = rdzv.client.node_rank.value_or(-1) == 0;
    plan.listen_port = rdzv.client.master_port.value_or(kDefaultMasterPort);
    return plan;
  }
  // c10d: any node may become group rank 0; each publishes its own store's port.
  plan.host = true;
  plan.listen_port = config.master_port.value_or(0);
  return plan;
}

void RoundObserver::next_rendezvous(std::function<void(rdzv::RendezvousResult)> done) {
  on_join_();
  inner_.next_rendezvous([this, done = std::move(done)](rdzv::RendezvousResult result) {
    if (const auto* round = std::get_if<rdzv::RendezvousInfo>(&result); round && on_round_)
      on_round_(*round);
    done(std::move(result));
  });
}

}  // namespace ddprun::launcher
