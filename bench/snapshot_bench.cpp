// Snapshot save throughput: SnapshotStore::save of a model of about N MiB of float32
// parameters, timed from the call to its return (capture, checksum, serialisation, write, fsync,
// rename, directory fsync). Driven by bench/snapshot_bench.py, which times `dd` beside it.
//   snapshot_bench DIR [MIB=256] [REPEATS=3]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "ddprun/sdk.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: snapshot_bench DIR [MIB=256] [REPEATS=3]\n");
    return 64;
  }
  const std::string dir = argv[1];
  const int mib = argc > 2 ? std::stoi(argv[2]) : 256;
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 3;
  // Layers of 1024 x 1024 float32 (4 MiB each).
  torch::nn::Sequential model;
  for (int i = 0; i < mib / 4; ++i) model->push_back(torch::nn::Linear(1024, 1024));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  ddprun::sdk::SnapshotStore store(dir + "/bench_snapshot.pt", /*keep_last=*/1);
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const std::string path = store.save(*model, optimizer, r, r, 1);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double bytes = static_cast<double>(std::filesystem::file_size(path));
    std::printf("save %d: %.1f MiB in %.3f s = %.1f MiB/s\n", r, bytes / (1 << 20), seconds,
                bytes / (1 << 20) / seconds);
  }
  for (const auto& f : store.files()) std::filesystem::remove(f);
  return 0;
}
