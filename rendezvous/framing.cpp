#include "rendezvous/framing.h"

#include <cassert>

namespace ddprun::rdzv {

std::string encode_frame(const nlohmann::json& body) {
  std::string text = body.dump();
  assert(text.size() <= kMaxFrameBytes && "rendezvous message over kMaxFrameBytes");
  const auto size = static_cast<std::uint32_t>(text.size());
  std::string frame;
  frame.reserve(kFrameHeaderBytes + text.size());
  frame.push_back(static_cast<char>((size >> 24) & 0xff));
  frame.push_back(static_cast<char>((size >> 16) & 0xff));
  frame.push_back(static_cast<char>((size >> 8) & 0xff));
  frame.push_back(static_cast<char>(size & 0xff));
  frame += text;
  return frame;
}

void FrameDecoder::feed(std::string_view bytes) {
  // A Bad stream is never read again, so keeping its bytes would only waste memory.
  if (bad_) return;
  buffer_.append(bytes);
}

DecodeResult FrameDecoder::next() {
  if (bad_) return DecodeResult{DecodeStatus::Bad, {}, *bad_};
  if (buffer_.size() < kFrameHeaderBytes) return DecodeResult{};

  std::uint32_t size = 0;
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
    size = (size << 8) | static_cast<unsigned char>(buffer_[i]);
  }
  // Refuse from the header alone, so a bogus length never makes us wait for (or buffer) its body.
  if (size > kMaxFrameBytes) {
    return fail("frame of " + std::to_string(size) + " bytes is over the " +
                std::to_string(kMaxFrameBytes) + "-byte limit");
  }
  if (buffer_.size() - kFrameHeaderBytes < size) return DecodeResult{};

  const char* begin = buffer_.data() + kFrameHeaderBytes;
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(begin, begin + size);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann reports parse failures only as exceptions; turn them into data right here.
    return fail(std::string("frame body is not valid JSON: ") + e.what());
  }
  buffer_.erase(0, kFrameHeaderBytes + size);
  if (!body.is_object()) {
    return fail(std::string("frame body is not a JSON object but a ") + body.type_name());
  }
  return DecodeResult{DecodeStatus::Complete, std::move(body), {}};
}

DecodeResult FrameDecoder::fail(std::string error) {
  bad_ = error;
  buffer_.clear();
  buffer_.shrink_to_fit();
  return DecodeResult{DecodeStatus::Bad, {}, std::move(error)};
}

std::optional<std::string> check_hello(const nlohmann::json& hello) {
  const std::string ours = std::to_string(kProtocolVersion);
  if (!hello.is_object()) {
    return std::string("hello is not a JSON object but a ") + hello.type_name();
  }
  auto type = hello.find("type");
  if (type == hello.end()) return std::string("hello has no \"type\" field");
  if (!type->is_string() || type->get_ref<const std::string&>() != "hello") {
    return "expected a message of type \"hello\", got type " + type->dump();
  }
  auto protocol = hello.find("protocol");
  if (protocol == hello.end()) {
    return "hello has no \"protocol\" field; this ddprun speaks rendezvous protocol " + ours +
           ": use the same ddprun version on every node and the daemon";
  }
  if (!protocol->is_number_integer()) {
    return "hello field \"protocol\" must be an integer, got " + protocol->dump();
  }
  if (protocol->get<std::int64_t>() != kProtocolVersion) {
    return "peer speaks rendezvous protocol " + protocol->dump() + ", this ddprun speaks " + ours +
           ": use the same ddprun version on every node and the daemon";
  }
  return std::nullopt;
}

}  // namespace ddprun::rdzv
