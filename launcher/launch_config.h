#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/group_cleanup.h"
#include "agent/worker_command.h"
#include "agent/worker_output.h"

namespace ddprun::launcher {

/// How --nproc_per_node was given; gpu/cpu/auto are resolved when the node is known.
enum class NprocKind { Count, Cpu, Gpu, Auto };

/// --standby_workers: off, on (bare flag), or auto, the default (on for Python scripts that
/// import torch, on a node with the memory for them).
enum class StandbyMode { Off, On, Auto };

/// --redirects / --tee (agent/worker_output.h).
using agent::StdSpec;
using agent::StdStreams;

/// What a SLURM job step supplied (launcher/slurm.h); empty outside srun.
struct SlurmDerived {
  std::string job_id;
  std::string step_id;
  std::vector<std::string> values;    ///< "--nnodes 2 (SLURM_NNODES)", for the notice line
  std::vector<std::string> warnings;  ///< one line each (SlurmFill::warnings)
  /// The node whose address launch() resolves for --rdzv_endpoint (the nodelist's first);
  /// "" when the endpoint was given by the user or not needed.
  std::string endpoint_node;
};

/// Everything one ddprun invocation was asked to do, parsed and validated, before any effect.
/// A LaunchConfig{} holds zeroes: the defaults are the flag table's, in launcher/cli.cpp
/// (default_launch_config(), and every parse_command_line).
struct LaunchConfig {
  // Node and worker counts.
  int min_nodes{};
  int max_nodes{};
  NprocKind nproc_kind{};
  int nproc_per_node{};  ///< meaningful when nproc_kind == Count (or after resolution)
  /// --virtual_local_rank: LOCAL_RANK=0 and one GPU in CUDA_VISIBLE_DEVICES per worker.
  bool virtual_local_rank{};
  /// --numa_binding: "" (off) or "node" (each worker on the CPUs of its GPU's NUMA node).
  std::string numa_binding;

  // Rendezvous.
  bool standalone{};
  std::string rdzv_backend;
  std::string rdzv_endpoint;  ///< "" when not given
  std::string rdzv_id;
  std::map<std::string, std::string> rdzv_conf;
  std::optional<int> node_rank;  ///< nullopt when not given (torchrun's default is 0)
  std::string master_addr;
  std::optional<int> master_port;  ///< nullopt: the agent picks a free port
  /// --agent_store: the agent hosts the workers' TCPStore (TORCHELASTIC_USE_AGENT_STORE=True).
  bool agent_store{};
  std::string local_addr;  ///< "" when not given

  // Supervision.
  int max_restarts{};
  double monitor_interval{};  ///< seconds; accepted for compatibility, exits are observed at once
  double shutdown_timeout{};  ///< seconds between the stop signal and SIGKILL
  std::string start_method;   ///< accepted for compatibility; workers are always fork+exec
  std::vector<int> signals_to_handle;  ///< signal numbers, default SIGTERM,SIGINT,SIGHUP,SIGQUIT
  double watchdog_timeout{};           ///< seconds; 0 = off (ddprun's own flag)
  /// --restart_backoff BASE[:MAX] and --restart_backoff_reset, seconds (ddprun's own flags).
  double restart_backoff{};
  double restart_backoff_max{};
  double restart_backoff_reset{};
  /// --restart_window (seconds; 0: the whole job), --crash_loop_stop (0: off) and
  /// --fatal_exit_codes (sorted, unique): the job-wide failure policy (rdzv::RdzvSettings).
  double restart_window{};
  int crash_loop_stop{};
  std::vector<int> fatal_exit_codes;
  /// --quarantine_after (0: off) and --quarantine_cooldown SECONDS[:MAX] (seconds).
  int quarantine_after{};
  double quarantine_cooldown{};
  double quarantine_cooldown_max{};
  std::string progress_file;  ///< --progress_file ("" for none)
  /// --health_check: "off", "builtin" (the built-in checks only) or a shell command (run after
  /// them); --health_check_timeout and --health_check_interval in seconds.
  std::string health_check;
  double health_check_timeout{};
  double health_check_interval{};
  StandbyMode standby_workers{};             ///< a standby per local rank (ddprun's own)
  bool standby_workers_given{};              ///< by the flag or PET_STANDBY_WORKERS, not by default
  std::vector<std::string> standby_preload;  ///< --standby_preload: modules to import
  agent::StandbyCuda standby_cuda{};         ///< --standby_cuda: a standby's GPU made ready
  std::string role;
  /// --cleanup: how no descendant of a worker outlives its group or the agent (ddprun's own).
  agent::CleanupMode cleanup{};

  // How workers are started.
  bool module{};               ///< -m: python -u -m <script>
  bool no_python{};            ///< --no_python: exec the script directly
  bool run_path{};             ///< --run_path: runpy.run_path(script) under python -u -c
  std::string local_rank_arg;  ///< --local_rank_arg: "local-rank", "local_rank" or ""

  // Logs.
  std::string log_dir;       ///< "" when not given
  std::string event_log;     ///< --event_log: JSON lines of the recovery timeline ("" none)
  int metrics_port{};        ///< --metrics_port: serve GET /metrics there (0: off)
  std::string metrics_host;  ///< --metrics_host
  StdSpec redirects;
  StdSpec tee;
  /// --dedup_output: seconds within which identical console lines of several local ranks are
  /// shown once (0: off).
  double dedup_output{};
  std::optional<std::set<int>> local_ranks_filter;  ///< nullopt: every local rank on the console
  /// --duplicate_stdout_filters / --duplicate_stderr_filters: lines containing any of these
  /// are also copied to filtered_stdout.log / filtered_stderr.log of the attempt.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;

  // SLURM.
  bool no_slurm_fanout = false;  ///< refuse instead of rerunning under srun (launcher/slurm.h)
  SlurmDerived slurm;

  // The training program: passed through untouched.
  std::string script;
  std::vector<std::string> script_args;
};

}  // namespace ddprun::launcher
