#include "ddprun/sdk/sampler_plan.h"

#include <catch2/catch.hpp>

using namespace ddprun::sdk;
using V = std::vector<int64_t>;

namespace {

SamplerOptions opts(int64_t n, int replicas, int rank, bool drop_last) {
  SamplerOptions o;
  o.dataset_size = n;
  o.num_replicas = replicas;
  o.rank = rank;
  o.drop_last = drop_last;
  return o;
}

}  // namespace

TEST_CASE("an uneven split is padded by repeating the start of the order", "[sdk][unit]") {
  // 10 samples over 4 replicas: 3 each, total 12, positions 10 and 11 are order[0] and order[1].
  const V order{9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  CHECK(sampler_num_samples(opts(10, 4, 0, false)) == 3);
  CHECK(shard_indices(order, opts(10, 4, 0, false)) == V{9, 5, 1});
  CHECK(shard_indices(order, opts(10, 4, 1, false)) == V{8, 4, 0});
  CHECK(shard_indices(order, opts(10, 4, 2, false)) == V{7, 3, 9});
  CHECK(shard_indices(order, opts(10, 4, 3, false)) == V{6, 2, 8});
}

TEST_CASE("drop_last cuts the tail so every replica gets the same count", "[sdk][unit]") {
  const V order = identity_order(10);
  CHECK(sampler_num_samples(opts(10, 4, 0, true)) == 2);
  CHECK(shard_indices(order, opts(10, 4, 0, true)) == V{0, 4});
  CHECK(shard_indices(order, opts(10, 4, 3, true)) == V{3, 7});
  // An even split drops nothing.
  CHECK(sampler_num_samples(opts(12, 4, 0, true)) == 3);
}

TEST_CASE("padding wraps around more than once when replicas outnumber samples", "[sdk][unit]") {
  const V order{2, 0, 1};
  CHECK(sampler_num_samples(opts(3, 7, 0, false)) == 1);
  V all;
  for (int r = 0; r < 7; ++r) {
    V mine = shard_indices(order, opts(3, 7, r, false));
    REQUIRE(mine.size() == 1);
    all.push_back(mine[0]);
  }
  CHECK(all == V{2, 0, 1, 2, 0, 1, 2});
  // With drop_last there is nothing left for anyone.
  CHECK(sampler_num_samples(opts(3, 7, 0, true)) == 0);
  CHECK(shard_indices(order, opts(3, 7, 6, true)).empty());
}

TEST_CASE("an empty dataset gives every replica nothing", "[sdk][unit]") {
  CHECK(sampler_num_samples(opts(0, 3, 0, false)) == 0);
  CHECK(shard_indices({}, opts(0, 3, 2, false)).empty());
}
