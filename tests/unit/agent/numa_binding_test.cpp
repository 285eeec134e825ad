#include "agent/numa_binding.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tests/support/subprocess.h"

using namespace ddprun::agent;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

}  // namespace

TEST_CASE("a CPU list is read as the kernel writes it", "[agent][unit]") {
  CHECK(parse_cpu_list("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5") == std::vector<int>{5});
  CHECK_FALSE(parse_cpu_list("3-1").has_value());
  CHECK_FALSE(parse_cpu_list("a").has_value());
}

TEST_CASE("the NUMA topology is read from a sysfs-like tree", "[agent][unit]") {
  ddprun::testing::TempDir root;
  write(fs::path(root.path()) / "devices/system/node/node0/cpulist", "0-1");
  write(fs::path(root.path()) / "devices/system/node/node1/cpulist", "2-3");
  write(fs::path(root.path()) / "devices/system/node/possible", "0-1");
  write(fs::path(root.path()) / "bus/pci/drivers/nvidia/0000:81:00.0/numa_node", "1");
  write(fs::path(root.path()) / "bus/pci/drivers/nvidia/0000:01:00.0/numa_node", "0");
  write(fs::path(root.path()) / "bus/pci/drivers/nvidia/module/refcnt", "1");
  auto topology = read_numa_topology(root.path());
  REQUIRE(topology.ok());
  CHECK(topology->node_cpus.at(0) == std::vector<int>{0, 1});
  CHECK(topology->node_cpus.at(1) == std::vector<int>{2, 3});
  CHECK(topology->gpu_nodes == std::vector<int>{0, 1});  // in PCI bus order
  ddprun::testing::TempDir empty;
  CHECK_FALSE(read_numa_topology(empty.path()).ok());
}

TEST_CASE("with --numa_binding node each local rank gets the CPUs of its GPU's node",
          "[agent][unit]") {
  NumaTopology topology{{{0, {0, 1}}, {1, {2, 3}}}, {1, 0, -1}};
  auto cpus = cpus_per_local_rank(topology, 3, std::nullopt);
  REQUIRE(cpus.ok());
  CHECK(*cpus == std::vector<std::vector<int>>{{2, 3}, {0, 1}, {0, 1}});
  // CUDA_VISIBLE_DEVICES maps local ranks to GPU indices.
  auto mapped = cpus_per_local_rank(topology, 2, std::string("1,0"));
  REQUIRE(mapped.ok());
  CHECK(*mapped == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  auto too_many = cpus_per_local_rank(topology, 4, std::nullopt);
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.error().message ==
        "--numa_binding: local rank 3 would use GPU 3, but there are 3 GPUs");
}

TEST_CASE("without GPUs local ranks go round the NUMA nodes", "[agent][unit]") {
  NumaTopology topology{{{0, {0}}, {2, {1}}}, {}};
  auto cpus = cpus_per_local_rank(topology, 3, std::nullopt);
  REQUIRE(cpus.ok());
  CHECK(*cpus == std::vector<std::vector<int>>{{0}, {1}, {0}});
}
