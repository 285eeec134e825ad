#include "agent/error_file.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace ddprun::agent {
namespace {

std::optional<long long> timestamp_of(const nlohmann::json& j) {
  if (j.is_number_integer()) return j.get<long long>();
  if (j.is_number()) return static_cast<long long>(j.get<double>());
  if (j.is_string()) return common::parse_int(j.get<std::string>());
  return std::nullopt;
}

}  // namespace

common::Result<ErrorFileContent> parse_error_file(const std::string& json_text) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return common::Error{"not valid JSON"};
  if (!doc.is_object() || !doc.contains("message"))
    return common::Error{"no \"message\" field (expected torch's @record format)"};
  ErrorFileContent out;
  const nlohmann::json& message = doc["message"];
  if (message.is_string()) {
    out.message = message.get<std::string>();
  } else if (message.is_object()) {
    if (auto it = message.find("message"); it != message.end() && it->is_string())
      out.message = it->get<std::string>();
    if (auto extra = message.find("extraInfo"); extra != message.end() && extra->is_object()) {
      if (auto cs = extra->find("py_callstack"); cs != extra->end() && cs->is_string())
        out.traceback = cs->get<std::string>();
      if (auto ts = extra->find("timestamp"); ts != extra->end()) out.timestamp = timestamp_of(*ts);
    }
  } else {
    out.message = message.dump();
  }
  if (auto ts = doc.find("timestamp"); ts != doc.end() && !out.timestamp)
    out.timestamp = timestamp_of(*ts);
  return out;
}

std::string exception_type(const ErrorFileContent& content) {
  const std::string& m = content.message;
  // An identifier of at most 200 bytes, its parts joined by dots (Python's type names) or by
  // "::" (C++'s, as the SDK's record writes "std::runtime_error: ..."), then a colon.
  std::size_t colon = std::string::npos;
  bool start = true;
  for (std::size_t i = 0; i < m.size() && i <= 200; ++i) {
    const unsigned char c = static_cast<unsigned char>(m[i]);
    if (c == ':' && i + 1 < m.size() && m[i + 1] == ':') {
      if (start) return {};
      start = true;
      ++i;
      continue;
    }
    if (c == ':') {
      colon = i;
      break;
    }
    if (c == '.' && !start) {
      start = true;
      continue;
    }
    const bool letter = std::isalpha(c) != 0 || c == '_';
    if (!(letter || (!start && std::isdigit(c) != 0))) return {};
    start = false;
  }
  if (colon == std::string::npos || start) return {};  // none, empty, or ends with a separator
  return m.substr(0, colon);
}

std::optional<std::string> error_file_for_parent(const std::string& child_json, int exit_code) {
  nlohmann::json doc = nlohmann::json::parse(child_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
  if (exit_code != 0 && doc.contains("message") && doc["message"].is_object())
    doc["message"]["errorCode"] = exit_code;
  return doc.dump();
}

}  // namespace ddprun::agent
