// libFuzzer target: ddprun's command line. The input is split at NUL bytes into arguments;
// arguments of the form "PET_NAME=value" before the first "--" become environment variables.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string current;
  bool in_env = true;
  auto flush = [&] {
    if (in_env && current.rfind("PET_", 0) == 0 && current.find('=') != std::string::npos) {
      env[current.substr(0, current.find('='))] = current.substr(current.find('=') + 1);
    } else {
      if (current == "--") in_env = false;
      args.push_back(current);
    }
    current.clear();
  };
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      flush();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) flush();
  if (args.size() > 64) return 0;  // the parser's cost grows with the count; that is not a bug
  const ddprun::launcher::EnvLookup lookup =
      [&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  (void)ddprun::launcher::parse_command_line(args, lookup);
  (void)ddprun::launcher::parse_status_args(args, lookup);
  return 0;
}
