// ddprun-snapshot: what is inside a snapshot file, without a process group or the model's code.
//   ddprun-snapshot FILE...        metadata, then each tensor's name, dtype and shape
// Exit status: 0 when every file is a valid snapshot, 1 otherwise.
#include <cstdio>
#include <ctime>
#include <string>

#include "ddprun/sdk.h"

namespace {

std::string describe(const torch::Tensor& t) {
  std::string shape = "[";
  for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
  return std::string(c10::toString(t.scalar_type())) + " " + shape + "]";
}

int show(const std::string& path) {
  auto read = ddprun::sdk::read_snapshot_file(path);
  if (auto* err = std::get_if<std::string>(&read)) {
    std::printf("%s: INVALID: %s\n", path.c_str(), err->c_str());
    return 1;
  }
  const auto& s = std::get<ddprun::sdk::Snapshot>(read);
  char when[64] = "?";
  const std::time_t t = static_cast<std::time_t>(s.meta.saved_at);
  if (std::tm tm{}; gmtime_r(&t, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::printf(
      "%s\n  epoch      : %lld\n  step       : %lld\n  epoch_step : %lld\n  world_size : %lld\n"
      "  saved_at   : %s\n  checksum   : %s (verified)\n  model      : %zu tensors\n",
      path.c_str(), static_cast<long long>(s.meta.epoch), static_cast<long long>(s.meta.step),
      static_cast<long long>(s.meta.epoch_step), static_cast<long long>(s.meta.world_size), when,
      s.meta.checksum.c_str(), s.model.size());
  for (const auto& [name, tensor] : s.model)
    std::printf("    %-40s %s\n", name.c_str(), describe(tensor).c_str());
  std::printf("  optimizer  : %lld bytes (torch::serialize archive)\n",
              static_cast<long long>(s.optimizer.numel()));
  std::printf("  rng_state  : %s\n", describe(s.rng_state).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: ddprun-snapshot FILE...\n"
                 "Prints a ddprun snapshot's metadata and its tensors' names, dtypes and shapes,\n"
                 "after verifying its checksum. Exit status 1 when a file is not a valid "
                 "snapshot.\n");
    return argc < 2 ? 64 : 0;
  }
  int rc = 0;
  for (int i = 1; i < argc; ++i) rc |= show(argv[i]);
  return rc;
}
