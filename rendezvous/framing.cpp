#include "rendezvous/framing.h"

#include <cstdio>
#include "common/check.h"
#include "common/strings.h"

namespace ddprun::rdzv {

std::string encode_frame(const nlohmann::json& body) {
  std::string text = body.dump();
  DDPRUN_CHECK(text.size() <= kMaxFrameBytes, "rendezvous message over kMaxFrameBytes");
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
  if (bytes.empty()) return;
  if (!held_) held_ = std::make_unique<Held>();
  // A Bad stream is never read again, so keeping its bytes would only waste memory.
  if (held_->bad) return;
  held_->bytes.append(bytes);
}

DecodeResult FrameDecoder::next() {
  if (!held_) return DecodeResult{};
  if (held_->bad) return DecodeResult{DecodeStatus::Bad, {}, *held_->bad};
  std::string& buffer = held_->bytes;
  if (buffer.size() < kFrameHeaderBytes) return DecodeResult{};

  std::uint32_t size = 0;
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
    size = (size << 8) | static_cast<unsigned char>(buffer[i]);
  }
  // Refuse from the header alone, so a bogus length never makes us wait for (or buffer) its body.
  if (size > kMaxFrameBytes) {
    // A peer that speaks HTTP (a metrics or status page port given for the rendezvous's, or a
    // proxy) starts with "HTTP" or a method; a length spelled in letters says which it is.
    const std::string_view head(buffer.data(), kFrameHeaderBytes);
    for (const std::string_view word : {"HTTP", "GET ", "POST", "PUT ", "HEAD"})
      if (head == word)
        return fail(
            "the peer speaks HTTP, not the rendezvous protocol (is the port a metrics or "
            "status page, or a proxy?)");
    return fail("frame of " + std::to_string(size) + " bytes is over the " +
                std::to_string(kMaxFrameBytes) + "-byte limit");
  }
  if (buffer.size() - kFrameHeaderBytes < size) return DecodeResult{};

  const char* begin = buffer.data() + kFrameHeaderBytes;
  if (common::json_nesting_over(std::string_view(begin, size), kMaxJsonDepth) != 0) {
    return fail("frame body nests arrays or objects deeper than " + std::to_string(kMaxJsonDepth) +
                " levels");
  }
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(begin, begin + size);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann reports every parse failure as an exception: a syntax error (parse_error), but
    // also a number too large for a double (out_of_range 406, "1e400"). Turn them all into data
    // right here, so that no peer's frame can end the process.
    return fail(std::string("frame body is not valid JSON: ") + e.what());
  }
  buffer.erase(0, kFrameHeaderBytes + size);
  // Between frames a connection holds no buffer: a daemon with 16,384 idle agents would
  // otherwise keep one frame's capacity for each (docs/design.md#rendezvous-at-scale).
  if (buffer.empty()) held_.reset();
  if (!body.is_object()) {
    return fail(std::string("frame body is not a JSON object but a ") + body.type_name());
  }
  return DecodeResult{DecodeStatus::Complete, std::move(body), {}};
}

DecodeResult FrameDecoder::fail(std::string error) {
  held_ = std::make_unique<Held>(Held{{}, error});
  return DecodeResult{DecodeStatus::Bad, {}, std::move(error)};
}

std::string quote_peer_value(const nlohmann::json& value) {
  using nlohmann::json;
  switch (value.type()) {
    case json::value_t::string: {
      const auto& text = value.get_ref<const std::string&>();
      std::string out = "\"";
      std::size_t shown = 0;
      for (const char ch : text) {
        if (shown >= kMaxQuotedChars) break;
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') {
          out += '\\';
          out += ch;
        } else if (c < 0x20 || c >= 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          out += hex;
        } else {
          out += ch;
        }
        ++shown;
      }
      out += '"';
      if (shown < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
      return out;
    }
    case json::value_t::array:
      return "an array of " + std::to_string(value.size()) + " item(s)";
    case json::value_t::object:
      return "an object of " + std::to_string(value.size()) + " field(s)";
    case json::value_t::binary:
      return "binary data";
    case json::value_t::discarded:
      return "nothing";
    default:
      // Numbers, booleans and null: short by nature (a double prints in at most 24 characters).
      return value.dump();
  }
}

std::optional<common::Error> check_hello(const nlohmann::json& hello) {
  const std::string ours = std::to_string(kProtocolVersion);
  if (!hello.is_object()) {
    return common::Error{std::string("hello is not a JSON object but a ") + hello.type_name()};
  }
  auto type = hello.find("type");
  if (type == hello.end()) return common::Error{std::string("hello has no \"type\" field")};
  if (!type->is_string() || type->get_ref<const std::string&>() != "hello") {
    return common::Error{"expected a message of type \"hello\", got type " +
                         quote_peer_value(*type)};
  }
  auto protocol = hello.find("protocol");
  if (protocol == hello.end()) {
    return common::Error{
        "hello has no \"protocol\" field; this ddprun speaks rendezvous protocol " + ours +
        ": use the same ddprun version on every node and the daemon"};
  }
  if (!protocol->is_number_integer()) {
    return common::Error{"hello field \"protocol\" must be an integer, got " +
                         quote_peer_value(*protocol)};
  }
  if (protocol->get<std::int64_t>() != kProtocolVersion) {
    return common::Error{"peer speaks rendezvous protocol " + quote_peer_value(*protocol) +
                         ", this ddprun speaks " + ours +
                         ": use the same ddprun version on every node and the daemon"};
  }
  return std::nullopt;
}

}  // namespace ddprun::rdzv
