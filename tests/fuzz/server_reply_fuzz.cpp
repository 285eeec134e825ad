// libFuzzer target: a server's replies as an agent or `ddprun status` reads them: the frame
// decoder, the server-message reader, and the status table built from a status reply.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "launcher/status.h"
#include "rendezvous/framing.h"
#include "rendezvous/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ddprun::rdzv::FrameDecoder decoder;
  decoder.feed(std::string_view(reinterpret_cast<const char*>(data), size));
  for (;;) {
    ddprun::rdzv::DecodeResult r = decoder.next();
    if (r.status != ddprun::rdzv::DecodeStatus::Complete) break;
    auto parsed = ddprun::rdzv::parse_server_message(r.body);
    auto* message = parsed ? &*parsed : nullptr;
    if (!message) continue;
    if (auto* reply = std::get_if<ddprun::rdzv::StatusReply>(message))
      (void)ddprun::launcher::format_status(reply->jobs);
  }
  return 0;
}
