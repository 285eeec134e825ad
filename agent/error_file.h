#pragma once
#include <string>
#include <variant>

#include "agent/worker.h"

namespace ddprun::agent {

/// Parses the JSON that torch's @record (or any worker) writes to TORCHELASTIC_ERROR_FILE:
/// {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
/// or {"message": "...", "timestamp": N}. Returns the content or why it could not be read.
std::variant<ErrorFileContent, std::string> parse_error_file(const std::string& json_text);

}  // namespace ddprun::agent
