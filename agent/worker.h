#pragma once
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

/// Lifecycle of a worker group, with torchelastic's names.
enum class WorkerState { Init, Healthy, Unhealthy, Stopped, Succeeded, Failed };

/// How a process ended: an exit code, or the signal that killed it.
struct ExitStatus {
  int code = 0;    ///< valid when signal == 0
  int signal = 0;  ///< non-zero when killed by a signal
  bool ok() const { return signal == 0 && code == 0; }
  /// The shell's convention: the code, or 128+N for signal N.
  int shell_code() const { return signal != 0 ? 128 + signal : code; }
  /// Decodes a waitpid() status.
  static ExitStatus from_wait_status(int status);
};

/// What a worker's TORCHELASTIC_ERROR_FILE said (torch's @record JSON), if anything.
struct ErrorFileContent {
  std::string message;    ///< "RuntimeError: boom", or the whole message for non-Python writers
  std::string traceback;  ///< py_callstack, "" when absent
  std::optional<long long> timestamp;  ///< seconds since the epoch, when the file gave one
};

/// One worker that ended badly, as the failure report shows it.
struct ProcessFailure {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  ExitStatus status;
  std::chrono::system_clock::time_point time;  ///< when the agent observed the exit
  std::string error_file;                      ///< path given to the worker
  std::optional<ErrorFileContent> error;       ///< parsed error file, when it existed
  std::string error_file_problem;              ///< why an existing error file could not be read
};

/// The static description of the workers this agent runs (torchelastic's WorkerSpec).
struct WorkerSpec {
  std::string role = "default";
  int local_world_size = 1;
  std::vector<std::string> argv;  ///< the worker command, resolved by build_worker_command
  int max_restarts = 0;
  std::chrono::milliseconds shutdown_timeout{30000};
  /// --virtual_local_rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES of one GPU per worker.
  bool virtual_local_rank = false;
  /// TORCHELASTIC_SIGNALS_TO_HANDLE as torchrun 2.x exports it: "SIGTERM,SIGINT,..." (the
  /// signals the agent handles; "" exports nothing).
  std::string signals_to_handle;
  /// The agent hosts the workers' TCPStore (TORCHELASTIC_USE_AGENT_STORE=True): workers connect
  /// to MASTER_ADDR:MASTER_PORT as clients and no rank starts a server.
  bool use_agent_store = false;
};

/// Where one worker sits in the job for the current round.
struct WorkerPlacement {
  int local_rank = 0;
  int global_rank = 0;
  int role_rank = 0;
  int world_size = 1;
  int role_world_size = 1;
};

}  // namespace ddprun::agent
