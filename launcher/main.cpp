// ddprun: a torchrun-compatible elastic launcher. Thin main over ddprun_launcher.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "agent/worker_stdin.h"
#include "common/exit_codes.h"
#include "launcher/cli.h"
#include "launcher/events.h"
#include "launcher/launch.h"
#include "launcher/status.h"

int main(int argc, char** argv) {
  // Before anything is opened: a closed stdin must not become the first socket's number,
  // which the workers would inherit as theirs.
  ddprun::agent::open_standard_descriptors();
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    const auto env = ddprun::agent::current_environment();
    auto lookup = [&env](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    if (!args.empty() && args.front() == "events")
      return ddprun::launcher::run_events({args.begin() + 1, args.end()});
    if (!args.empty() && args.front() == "status") {
      auto status = ddprun::launcher::parse_status_args({args.begin() + 1, args.end()}, lookup);
      if (auto* info = std::get_if<ddprun::launcher::InfoRequest>(&status)) {
        std::fputs(info->text.c_str(), stdout);
        return ddprun::common::kExitSuccess;
      }
      if (auto* error = std::get_if<ddprun::launcher::UsageError>(&status)) {
        std::fprintf(stderr, "ddprun: error: %s\n", error->message.c_str());
        return ddprun::common::kExitUsage;
      }
      return ddprun::launcher::run_status(std::get<ddprun::launcher::StatusRequest>(status));
    }
    auto parsed = ddprun::launcher::parse_command_line(args, lookup);
    if (auto* info = std::get_if<ddprun::launcher::InfoRequest>(&parsed)) {
      std::fputs(info->text.c_str(), stdout);
      return ddprun::common::kExitSuccess;
    }
    if (auto* error = std::get_if<ddprun::launcher::UsageError>(&parsed)) {
      std::fprintf(stderr, "ddprun: error: %s\n", error->message.c_str());
      return ddprun::common::kExitUsage;
    }
    if (auto* fan_out = std::get_if<ddprun::launcher::SlurmFanOut>(&parsed)) {
      return ddprun::launcher::exec_under_srun(*fan_out);
    }
    return ddprun::launcher::launch(std::get<ddprun::launcher::LaunchConfig>(parsed), env);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: internal error: %s\n", e.what());
    return ddprun::common::kExitInternal;
  }
}
