#pragma once
// The arithmetic of torch.utils.data.distributed.DistributedSampler, without libtorch: given the
// epoch's order of the whole dataset, which indices one replica reads. The shuffled order itself
// comes from torch::randperm (see DistributedSampler in ddprun/sdk.h).
#include <cstdint>
#include <vector>

namespace ddprun::sdk {

/// The sampler's parameters, with PyTorch's meanings and defaults.
struct SamplerOptions {
  int64_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  /// Drop the tail so every replica gets the same count; otherwise pad by repeating the start.
  bool drop_last = false;
};

/// Samples each replica reads per epoch (len(sampler) in PyTorch).
int64_t sampler_num_samples(const SamplerOptions& o);

/// The indices replica `o.rank` reads, given the epoch's order of all `o.dataset_size` indices
/// (0..n-1 when not shuffling, randperm(n) seeded with seed + epoch when shuffling): pad to (or
/// cut at) num_samples * num_replicas, then take every num_replicas-th starting at rank.
std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, const SamplerOptions& o);

/// The identity order 0..n-1, used when not shuffling.
std::vector<int64_t> identity_order(int64_t n);

}  // namespace ddprun::sdk
