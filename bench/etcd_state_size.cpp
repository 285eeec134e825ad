// etcd_state_size: how many bytes the etcd-v3 rendezvous's `state` value takes per node
// (docs/benchmarks.md#rendezvous-on-etcd-v3). It steps N joins through the rendezvous state
// machine with agent-like names (node ids "gpu-node-00017:123456:0123456789abcdef", addresses
// "10.0.0.17", --nproc_per_node 8), so round 0 forms at N:N, and prints the size of the value
// the etcd backend would write, which etcd refuses over its request limit (1.5 MiB by default;
// ddprun stops at kMaxStateBytes).
//
//   etcd_state_size N...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "etcd/rdzv_store.h"
#include "rendezvous/rdzv_state.h"

int main(int argc, char** argv) {
  using namespace ddprun;
  if (argc < 2) {
    std::fprintf(stderr, "usage: etcd_state_size N...\n");
    return 64;
  }
  for (int arg = 1; arg < argc; ++arg) {
    const int n = std::atoi(argv[arg]);
    if (n < 1) {
      std::fprintf(stderr, "etcd_state_size: %s is not a number of nodes\n", argv[arg]);
      return 64;
    }
    const auto now = common::TimePoint{} + std::chrono::hours(1000);
    etcd::StoredState state;
    state.job = rdzv::new_job("llm-pretrain-run-42", now);
    rdzv::RdzvSettings settings;
    settings.min_nodes = n;
    settings.max_nodes = n;
    settings.nproc_per_node = 8;
    settings.max_restarts = 3;
    for (int i = 0; i < n; ++i) {
      rdzv::Join join;
      join.run_id = "llm-pretrain-run-42";
      char id[64];
      std::snprintf(id, sizeof id, "gpu-node-%05d:123456:0123456789abcdef", i);
      char name[32];
      std::snprintf(name, sizeof name, "10.%d.%d.%d", i / 65536, (i / 256) % 256, i % 256);
      join.node_id = id;
      join.name = name;
      join.addr = name;
      join.master_port = 29500;
      join.settings = settings;
      rdzv::StepResult r = rdzv::step(std::move(state.job), rdzv::FromNode{id, join}, now);
      state.job = std::move(r.state);
    }
    const std::size_t bytes = etcd::encode_state(state, etcd::TimeAnchor{}).size();
    std::printf(
        "%d nodes (%s): state %zu bytes, %.0f per node; etcd-v3 holds at most %zu such "
        "nodes (kMaxStateBytes %zu)\n",
        n, state.job.phase == rdzv::JobPhase::Running ? "round 0 running" : "joining", bytes,
        static_cast<double>(bytes) / n,
        static_cast<std::size_t>(static_cast<double>(etcd::kMaxStateBytes) * n / bytes),
        etcd::kMaxStateBytes);
  }
  return 0;
}
