// The smallest program on ddprun's installed SDK (examples/out_of_tree/CMakeLists.txt): each
// rank reads its place from torchrun's environment, joins the process group and takes part in
// one all_reduce of the ranks.
//
//   ddprun --standalone --nproc_per_node 2 --no_python build-trainer/trainer
#include <ddprun/sdk.h>

#include <cstdio>

namespace sdk = ddprun::sdk;

int main() {
  return sdk::record([] {
    const sdk::WorkerContext ctx = sdk::WorkerContext::from_env();
    auto group = sdk::ProcessGroup::create(ctx);
    torch::Tensor sum = torch::full({1}, static_cast<double>(group->rank()));
    group->all_reduce(sum);
    const int world = group->world_size();
    const bool right = sum.item<double>() == world * (world - 1) / 2.0;
    std::printf("trainer rank %d of %d: sum of ranks %.0f (%s)\n", group->rank(), world,
                sum.item<double>(), right ? "ok" : "WRONG");
    return right ? 0 : 1;
  });
}
