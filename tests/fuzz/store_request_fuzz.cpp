// libFuzzer target: bytes from a store client, as the agent's store reads them: dialect
// detection, then every whole request decoded and applied to one store state from two
// connections (the first input byte picks which connection sends each request).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "store/codec.h"
#include "store/store_state.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ddprun::store;
  if (size == 0) return 0;
  const std::uint8_t senders = data[0];
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  StoreLimits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 4096;
  limits.max_keys_per_request = 64;
  limits.max_request_bytes = 64 * 1024;
  const Detected d = detect_dialect(bytes);
  if (d.status != DecodeStatus::Complete) return 0;
  bytes.remove_prefix(d.used);
  StoreState state;
  for (int i = 0; i < 10'000; ++i) {
    const Decoded r = decode_request(d.dialect, bytes, limits);
    if (r.status != DecodeStatus::Complete) break;
    if (r.used == 0 || r.used > bytes.size()) __builtin_trap();
    // What decodes also encodes to the same bytes.
    if (encode_request(d.dialect, r.request) != bytes.substr(0, r.used)) __builtin_trap();
    bytes.remove_prefix(r.used);
    const ConnId conn = 1 + ((senders >> (i % 8)) & 1);
    const Effects e = state.apply(conn, r.request);
    if (e.close) state.disconnect(conn);
  }
  // Every parked wait and watch belongs to a connection: with both gone, nothing is counted.
  state.disconnect(1);
  state.disconnect(2);
  if (state.parked_bytes() != 0 || state.parked() != 0) __builtin_trap();
  state.clear();
  if (state.size() != 0 || state.bytes() != 0) __builtin_trap();
  return 0;
}
