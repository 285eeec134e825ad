#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace ddprun::agent {

/// What --numa_binding needs of the machine, as sysfs shows it (a test lays out a fake tree).
struct NumaTopology {
  std::map<int, std::vector<int>> node_cpus;  ///< NUMA node id -> its CPUs
  /// The NUMA node of each NVIDIA GPU, in PCI bus order (CUDA's PCI_BUS_ID order); -1 when
  /// the device does not say.
  std::vector<int> gpu_nodes;
};

/// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; nullopt when malformed.
std::optional<std::vector<int>> parse_cpu_list(std::string_view text);

/// Reads <root>/devices/system/node/node<N>/cpulist and the numa_node of every device bound
/// to the nvidia driver (<root>/bus/pci/drivers/nvidia/<PCI address>/numa_node). root is
/// "/sys" outside tests.
common::Result<NumaTopology> read_numa_topology(const std::string& root);

/// The CPUs each local rank is bound to with --numa_binding node, as torchrun does it: the
/// CPUs of the NUMA node of the GPU whose index is the local rank (through
/// CUDA_VISIBLE_DEVICES when it lists indices). Without NVIDIA GPUs, local ranks go round the
/// NUMA nodes in order (ddprun's extension for CPU jobs). An error names what is missing.
common::Result<std::vector<std::vector<int>>> cpus_per_local_rank(
    const NumaTopology& topology, int local_world_size,
    const std::optional<std::string>& cuda_visible_devices);

}  // namespace ddprun::agent
