// libFuzzer target: bytes from a peer, as the rendezvous server reads them. The first byte
// says where to split the input into two feeds; every complete frame goes through the hello
// check and the agent-message reader, as the server does.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rendezvous/framing.h"
#include "rendezvous/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::size_t split = std::min<std::size_t>(data[0], bytes.size());
  ddprun::rdzv::FrameDecoder decoder;
  decoder.feed(bytes.substr(0, split));
  bool first = true;
  for (int round = 0; round < 2; ++round) {
    for (;;) {
      ddprun::rdzv::DecodeResult r = decoder.next();
      if (r.status != ddprun::rdzv::DecodeStatus::Complete) break;
      if (first) {
        (void)ddprun::rdzv::check_hello(r.body);
        first = false;
      }
      auto parsed = ddprun::rdzv::parse_agent_message(r.body);
      if (parsed) {
        // What the server accepts it can also write back.
        (void)ddprun::rdzv::encode_frame(ddprun::rdzv::to_json(*parsed));
      }
      for (const auto& [key, value] : r.body.items()) (void)ddprun::rdzv::quote_peer_value(value);
    }
    decoder.feed(bytes.substr(split));
  }
  return 0;
}
