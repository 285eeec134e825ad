#pragma once
// Reporting a worker's uncaught exception to the agent, like Python's
// torch.distributed.elastic.multiprocessing.errors.record. Free of libtorch.
#include <functional>
#include <string>

namespace ddprun::sdk {

/// The JSON that torch's @record writes to TORCHELASTIC_ERROR_FILE:
/// {"message": {"message": M, "extraInfo": {"py_callstack": S, "timestamp": "T"}}}.
std::string error_file_json(const std::string& message, const std::string& callstack,
                            long long unix_seconds);

/// "<demangled type>: <what()>" for the exception currently being handled (call it inside a
/// catch block), and the longer description that goes where Python puts its traceback.
struct ExceptionText {
  std::string message;
  std::string details;
};
ExceptionText describe_current_exception();

/// Runs `body` and returns its result. If it throws, prints the error to stderr, writes it to
/// `error_file` (when not empty) in @record's format, and returns 1.
int record(const std::function<int()>& body, const std::string& error_file);

/// As above, with the error file named by TORCHELASTIC_ERROR_FILE (no file when unset):
/// `int main(int argc, char** argv) { return ddprun::sdk::record([&] { return run(argc, argv);
/// }); }`.
int record(const std::function<int()>& body);

}  // namespace ddprun::sdk
