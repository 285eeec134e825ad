// ddprun-rdzvd: the standalone rendezvous daemon. Thin main over ddprun_rendezvous.
#include <cstdio>
#include <exception>

#include "common/exit_codes.h"
#include "rendezvous/daemon.h"

int main(int argc, char** argv) {
  try {
    auto parsed = ddprun::rdzv::parse_daemon_args({argv + 1, argv + argc});
    if (auto* done = std::get_if<ddprun::rdzv::DaemonExit>(&parsed)) {
      std::fputs(done->message.c_str(), done->exit_code == 0 ? stdout : stderr);
      return done->exit_code;
    }
    return ddprun::rdzv::run_daemon(std::get<ddprun::rdzv::DaemonConfig>(parsed));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun-rdzvd: internal error: %s\n", e.what());
    return ddprun::common::kExitInternal;
  }
}
