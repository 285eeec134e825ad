#include "ddprun/sdk/sampler_plan.h"

#include <cstddef>
#include <numeric>
#include "common/check.h"

namespace ddprun::sdk {
namespace {

/// ceil(a / b) for b > 0 and any sign of a, as Python's math.ceil(a / b).
int64_t ceil_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a > 0) ? q + 1 : q;
}

}  // namespace

int64_t sampler_num_samples(const SamplerOptions& o) {
  const int64_t n = o.dataset_size;
  const int64_t r = o.num_replicas;
  // Dropping the tail only matters when the split is uneven.
  if (o.drop_last && n % r != 0) return ceil_div(n - r, r);
  return ceil_div(n, r);
}

std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, const SamplerOptions& o) {
  DDPRUN_CHECK(o.num_replicas >= 1 && o.rank >= 0 && o.rank < o.num_replicas,
               "shard_indices: rank outside 0..num_replicas-1");
  DDPRUN_CHECK(static_cast<int64_t>(order.size()) == o.dataset_size,
               "shard_indices: the order does not hold dataset_size indices");
  const int64_t num_samples = sampler_num_samples(o);
  const int64_t total = num_samples * o.num_replicas;
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<int64_t> out;
  if (num_samples <= 0 || n == 0) return out;
  out.reserve(static_cast<std::size_t>(num_samples));
  // Position p of the padded (or cut) list is order[p % n]: padding repeats the list from its
  // start as often as needed, and cutting keeps a prefix.
  for (int64_t p = o.rank; p < total; p += o.num_replicas)
    out.push_back(order[static_cast<std::size_t>(p % n)]);
  return out;
}

std::vector<int64_t> identity_order(int64_t n) {
  std::vector<int64_t> v(static_cast<std::size_t>(n > 0 ? n : 0));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

}  // namespace ddprun::sdk
