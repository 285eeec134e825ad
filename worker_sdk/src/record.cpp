#include "ddprun/sdk/record.h"

#include <cxxabi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <typeinfo>

namespace ddprun::sdk {
namespace {

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

}  // namespace

std::string error_file_json(const std::string& message, const std::string& callstack,
                            long long unix_seconds) {
  nlohmann::json doc;
  doc["message"]["message"] = message;
  doc["message"]["extraInfo"]["py_callstack"] = callstack;
  doc["message"]["extraInfo"]["timestamp"] = std::to_string(unix_seconds);
  return doc.dump();
}

ExceptionText describe_current_exception() {
  std::type_info* type = abi::__cxa_current_exception_type();
  const std::string type_name = type ? demangle(type->name()) : std::string("unknown exception");
  ExceptionText text;
  try {
    throw;
  } catch (const std::exception& e) {
    text.message = type_name + ": " + e.what();
  } catch (...) {
    text.message = type_name;
  }
  // C++ has no portable stack of the throw site; c10::Error's what() carries its own backtrace.
  text.details = "C++ exception (uncaught in the worker's main)\n" + text.message + "\n";
  return text;
}

int record(const std::function<int()>& body, const std::string& error_file) {
  try {
    return body();
  } catch (...) {
    const ExceptionText text = describe_current_exception();
    std::fprintf(stderr, "%s\n", text.message.c_str());
    std::fflush(stderr);
    if (!error_file.empty()) {
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      std::ofstream out(error_file, std::ios::trunc);
      out << error_file_json(text.message, text.details,
                             std::chrono::duration_cast<std::chrono::seconds>(now).count());
      if (!out) std::fprintf(stderr, "cannot write the error file %s\n", error_file.c_str());
    }
    return 1;
  }
}

int record(const std::function<int()>& body) {
  const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
  return record(body, file ? std::string(file) : std::string());
}

}  // namespace ddprun::sdk
