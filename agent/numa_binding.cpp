#include "agent/numa_binding.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/strings.h"

namespace ddprun::agent {
namespace fs = std::filesystem;

namespace {

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return common::trim(text.str());
}

/// "0000:3b:00.0": a PCI address, as the driver directory names its devices.
bool is_pci_address(const std::string& name) {
  return name.size() == 12 && name[4] == ':' && name[7] == ':' && name[10] == '.';
}

}  // namespace

std::optional<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  for (const std::string& piece : common::split(common::trim(text), ',')) {
    const std::string item = common::trim(piece);
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    auto first = common::parse_int(item.substr(0, dash));
    auto last = dash == std::string::npos ? first : common::parse_int(item.substr(dash + 1));
    if (!first || !last || *first < 0 || *last < *first || *last >= 1 << 20) return std::nullopt;
    for (long long cpu = *first; cpu <= *last; ++cpu) cpus.push_back(static_cast<int>(cpu));
  }
  return cpus;
}

common::Result<NumaTopology> read_numa_topology(const std::string& root) {
  NumaTopology topology;
  const fs::path nodes = fs::path(root) / "devices/system/node";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(nodes, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0) continue;
    auto id = common::parse_int(name.substr(4));
    if (!id) continue;
    auto text = read_text(entry.path() / "cpulist");
    auto cpus = text ? parse_cpu_list(*text) : std::nullopt;
    if (!cpus) return common::Error{"cannot read " + (entry.path() / "cpulist").string()};
    if (!cpus->empty()) topology.node_cpus[static_cast<int>(*id)] = *cpus;
  }
  if (topology.node_cpus.empty())
    return common::Error{"no NUMA node with CPUs in " + nodes.string()};
  std::vector<std::string> gpus;
  for (const auto& entry : fs::directory_iterator(fs::path(root) / "bus/pci/drivers/nvidia", ec))
    if (is_pci_address(entry.path().filename().string()))
      gpus.push_back(entry.path().filename().string());
  std::sort(gpus.begin(), gpus.end());
  for (const std::string& gpu : gpus) {
    auto text = read_text(fs::path(root) / "bus/pci/drivers/nvidia" / gpu / "numa_node");
    auto node = text ? common::parse_int(*text) : std::nullopt;
    topology.gpu_nodes.push_back(node ? static_cast<int>(*node) : -1);
  }
  return topology;
}

common::Result<std::vector<std::vector<int>>> cpus_per_local_rank(
    const NumaTopology& topology, int local_world_size,
    const std::optional<std::string>& cuda_visible_devices) {
  std::vector<std::vector<int>> out;
  std::vector<int> node_ids;
  for (const auto& [id, cpus] : topology.node_cpus) node_ids.push_back(id);
  for (int local = 0; local < local_world_size; ++local) {
    int node = node_ids[static_cast<size_t>(local) % node_ids.size()];
    if (!topology.gpu_nodes.empty()) {
      int gpu = local;
      if (cuda_visible_devices) {
        const auto visible = common::split(*cuda_visible_devices, ',');
        auto index = static_cast<size_t>(local) < visible.size()
                         ? common::parse_int(common::trim(visible[static_cast<size_t>(local)]))
                         : std::nullopt;
        if (!index)
          return common::Error{
              "--numa_binding: local rank " + std::to_string(local) +
              " has no GPU index in CUDA_VISIBLE_DEVICES=" + *cuda_visible_devices};
        gpu = static_cast<int>(*index);
      }
      if (gpu < 0 || gpu >= static_cast<int>(topology.gpu_nodes.size()))
        return common::Error{"--numa_binding: local rank " + std::to_string(local) +
                             " would use GPU " + std::to_string(gpu) + ", but there are " +
                             std::to_string(topology.gpu_nodes.size()) + " GPUs"};
      // A device that does not say its node (-1, one-node machines) is on the first.
      const int gpu_node = topology.gpu_nodes[static_cast<size_t>(gpu)];
      node = topology.node_cpus.count(gpu_node) > 0 ? gpu_node : node_ids.front();
    }
    out.push_back(topology.node_cpus.at(node));
  }
  return out;
}

}  // namespace ddprun::agent
