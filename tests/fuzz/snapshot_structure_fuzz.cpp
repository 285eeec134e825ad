// libFuzzer entry point for the snapshot structure check (ddprun_sdk_core): any bytes must give
// a structure or an error, never a crash, a read out of bounds or an allocation beyond the input.
// Seeds: tests/fuzz/corpus/snapshot_structure/ (snapshots from the SDK and from torch.save, and
// damaged ones).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ddprun/sdk/snapshot_structure.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto result = ddprun::sdk::check_snapshot_structure(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (const auto* s = std::get_if<ddprun::sdk::SnapshotStructure>(&result)) {
    // What the reader relies on afterwards: every record lies inside the input.
    for (const auto& r : s->records)
      if (r.offset > size || r.size > size - r.offset) __builtin_trap();
  }
  return 0;
}
