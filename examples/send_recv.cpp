// Point-to-point messages on ddprun's worker SDK: every rank passes a tensor to the next one
// around a ring, then all ranks check a sum with all_reduce.
//
//   ddprun --standalone --nproc_per_node 3 --no_python build/bin/send_recv
#include <cstdio>

#include "ddprun/sdk.h"

namespace sdk = ddprun::sdk;

int main() {
  return sdk::record([] {
    auto group = sdk::ProcessGroup::create(sdk::WorkerContext::from_env());
    const int rank = group->rank();
    const int world = group->world_size();
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;

    // Post the receive and the send together: a blocking send first would wait for a receive
    // that the next rank has not posted yet, all around the ring.
    torch::Tensor outgoing = torch::full({4}, 100.0 * rank);
    torch::Tensor incoming = torch::empty({4});
    sdk::PendingWork received = group->recv_async(incoming, prev);
    sdk::PendingWork sent = group->send_async(outgoing, next);
    received.wait();
    sent.wait();
    std::printf("rank %d received %.0f from rank %d\n", rank, incoming[0].item<double>(), prev);

    torch::Tensor total = torch::full({1}, static_cast<double>(rank));
    group->all_reduce(total);
    std::printf("rank %d: all_reduce sum of ranks = %.0f (%s: %s)\n", rank, total.item<double>(),
                sdk::backend_name(group->backend()).c_str(),
                total.item<double>() == world * (world - 1) / 2.0 ? "ok" : "WRONG");
    group->barrier();
    return 0;
  });
}
