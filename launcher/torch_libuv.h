#pragma once
#include <chrono>
#include <string>
#include <string_view>

#include "common/env.h"

namespace ddprun::launcher {

/// What the workers' torch does about libuv when it makes a TCPStore (torch 2.4 and later ask
/// for the libuv backend by default, server and client alike, and a torch built without libuv,
/// such as Debian 13's 2.6, refuses to make one: "use_libuv was requested but PyTorch was build
/// without libuv support").
enum class TorchLibuv {
  Unknown,    ///< the probe could not tell (no torch, no torch.distributed, it failed)
  NotAsked,   ///< torch older than 2.4: its stores never ask for libuv
  Available,  ///< asked for and built in
  Missing,    ///< asked for by default and not built in: the workers' stores fail
};

/// The probe's answer, one word on its standard output.
TorchLibuv parse_libuv_probe(std::string_view output);

/// The Python program the probe runs with the workers' interpreter. It reads torch's version
/// without importing torch (torch older than 2.4: NotAsked, in a few milliseconds); else it
/// imports torch.distributed and makes a TCPStore client to a closed loopback port, which a
/// torch without libuv refuses before it connects.
extern const char* const kLibuvProbeProgram;

/// Runs kLibuvProbeProgram with `interpreter` in the workers' environment `env`, waiting at
/// most `timeout`; Unknown when it does not answer.
TorchLibuv probe_torch_libuv(const std::string& interpreter, const common::EnvMap& env,
                             std::chrono::milliseconds timeout);

/// True for a program named like a Python interpreter (python, python3, python3.13, a path
/// to one): a --no_python command that runs Python is probed as well.
bool names_python_interpreter(const std::string& program);

/// What ddprun changes so that a job works where the workers' torch lacks libuv.
struct LibuvAdaptation {
  /// --agent_store off: torch makes the agent store's clients with libuv whatever USE_LIBUV
  /// says, so worker rank 0 hosts the store instead.
  bool agent_store_off = false;
  /// USE_LIBUV=0 for the workers: torch's env:// and tcp:// rendezvous then make rank 0's
  /// store and the clients without libuv.
  bool set_use_libuv_0 = false;
  /// The one info line that says what ddprun did and why ("" when it did nothing).
  std::string info;
};

/// Decided once per node from the probe's answer, the --agent_store setting and the workers'
/// environment: nothing unless the workers' torch lacks libuv.
LibuvAdaptation adapt_to_libuv(TorchLibuv probed, bool agent_store, const common::EnvMap& env);

}  // namespace ddprun::launcher
