#pragma once
#include <optional>
#include <string>

#include "agent/worker.h"
#include "common/result.h"

namespace ddprun::agent {

/// Parses the JSON that torch's @record (or any worker) writes to TORCHELASTIC_ERROR_FILE:
/// {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
/// or {"message": "...", "timestamp": N}. Returns the content or why it could not be read.
common::Result<ErrorFileContent> parse_error_file(const std::string& json_text);

/// The exception type the message names: "ValueError" of "ValueError: bad value" (torch's
/// @record writes "<type>: <text>"), a dotted name kept whole; "" when it names none.
std::string exception_type(const ErrorFileContent& content);

/// The error file a launcher started with TORCHELASTIC_ERROR_FILE leaves for its own parent
/// (a scheduler): the root cause's JSON, with its exit code written into message.errorCode
/// when the message is torch's object form and exit_code is not 0 (a worker killed by a signal
/// could not write it), as torchrun's @record does; nullopt when the JSON cannot be read.
std::optional<std::string> error_file_for_parent(const std::string& child_json, int exit_code);

}  // namespace ddprun::agent
