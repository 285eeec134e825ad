#include "common/strings.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace ddprun::common {

std::optional<bool> parse_bool(std::string_view text) {
  const std::string lowered = to_lower(trim(text));
  if (lowered == "1" || lowered == "true") return true;
  if (lowered == "0" || lowered == "false") return false;
  return std::nullopt;
}

int json_nesting_over(std::string_view text, int limit) {
  // One pass, no recursion: strings (with their escapes) are skipped, so brackets inside them
  // do not count.
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}

namespace {

/// The code point of a bidirectional formatting character that starts at `text[i]` (UTF-8),
/// or 0: U+061C, U+200E, U+200F, U+202A..U+202E and U+2066..U+2069. They reorder what a
/// terminal shows after them, so a name holding one can make a line read differently.
unsigned bidi_control_at(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0U;
  };
  if (byte(0) == 0xd8 && byte(1) == 0x9c) return 0x061c;
  if (byte(0) != 0xe2) return 0;
  const unsigned code = 0x2000U + ((byte(1) & 0x3fU) << 6U) + (byte(2) & 0x3fU);
  if (byte(1) == 0x80 && (byte(2) == 0x8e || byte(2) == 0x8f)) return code;
  if (byte(1) == 0x80 && byte(2) >= 0xaa && byte(2) <= 0xae) return code;
  if (byte(1) == 0x81 && byte(2) >= 0xa6 && byte(2) <= 0xa9) return code;
  return 0;
}

}  // namespace

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if (const unsigned bidi = bidi_control_at(text, i); bidi != 0) {
      out += "\\u";
      for (const unsigned shift : {12U, 8U, 4U, 0U}) out += kHex[(bidi >> shift) & 15U];
      i += bidi == 0x061c ? 1 : 2;
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else if (c == 0xc2 && next >= 0x80 && next <= 0x9f) {
      // U+0080..U+009F: C1 controls (CSI is U+009B), which some terminals obey.
      out += "\\u00";
      out += kHex[next >> 4];
      out += kHex[next & 15];
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

bool cut_utf8(std::string& text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return false;
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return true;
}

std::string tabs_as_spaces(std::string text) {
  std::replace(text.begin(), text.end(), '\t', ' ');
  return text;
}

bool has_control_characters(std::string_view text) {
  for (const char c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  return false;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      parts.emplace_back(text.substr(start));
      return parts;
    }
    parts.emplace_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string trim(std::string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return std::string(text.substr(b, e - b));
}

std::optional<long long> parse_int(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (text.front() == '+') text.remove_prefix(1);
  long long value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_double(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::string copy(text);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string to_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

namespace {

bool identifier_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool identifier_char(char c) { return identifier_start(c) || (c >= '0' && c <= '9'); }

}  // namespace

std::string safe_substitute(
    std::string_view text,
    const std::function<std::optional<std::string>(std::string_view)>& value_of) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '$' || i + 1 == text.size()) {
      out += text[i++];
      continue;
    }
    if (text[i + 1] == '$') {  // "$$" is one "$"
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = text[i + 1] == '{';
    const size_t start = i + (braced ? 2 : 1);
    size_t end = start;
    if (end < text.size() && identifier_start(text[end]))
      while (end < text.size() && identifier_char(text[end])) ++end;
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    std::optional<std::string> value;
    if (end > start && closed) value = value_of(text.substr(start, end - start));
    if (!value) {  // kept as written
      out += '$';
      ++i;
      continue;
    }
    out += *value;
    i = end + (braced ? 1 : 0);
  }
  return out;
}

}  // namespace ddprun::common
