#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_metrics.h"
#include "agent/group_cleanup.h"
#include "agent/process_launcher.h"
#include "agent/worker.h"
#include "agent/worker_env.h"
#include "launcher/launch_config.h"
#include "rendezvous/rendezvous_handler.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

/// Everything the agent needs besides its collaborators.
struct AgentOptions {
  WorkerSpec spec;
  std::string script;   ///< shown as "<script> FAILED"
  std::string log_dir;  ///< "" for none: error files go to a private temporary directory
  launcher::StdSpec redirects;
  launcher::StdSpec tee;
  std::optional<std::set<int>> console_ranks;  ///< --local_ranks_filter
  /// --duplicate_stdout_filters / --duplicate_stderr_filters: worker lines containing any of
  /// these are also written, with their console prefix, to filtered_stdout.log /
  /// filtered_stderr.log in the attempt directory.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  /// --numa_binding: the CPUs of each local rank (empty: no binding).
  std::vector<std::vector<int>> cpus_by_local_rank;
  std::vector<int> signals_to_handle;
  EnvMap agent_env;
  std::string event_log;  ///< --event_log: the recovery timeline ("" for none)
  std::string node_name;  ///< this node as events and reports name it
  /// --watchdog_timeout: a worker that reported progress and then went silent this long is
  /// killed as hung (0: off).
  std::chrono::milliseconds watchdog_timeout{0};
  /// --standby_workers: keep a standby process per local rank for the next restart
  /// (agent/standby_pool.h).
  bool standby_workers = false;
  /// With standby_workers, for a Python script: the bootstrap (agent/python/ddprun_standby.py)
  /// the standbys run, which imports torch and waits; "" when the program itself waits (the C++
  /// worker SDK).
  std::string python_bootstrap;
  /// A Python job's interpreter as found (its path, or the name when not found) and where
  /// it came from ("PYTHON_EXEC", "the first python3 on PATH"); "" for --no_python. Named in
  /// the failure report when workers cannot import torch or the interpreter cannot run.
  std::string interpreter;
  std::string interpreter_origin;
  /// --standby_preload: modules a Python standby imports besides the script's own imports.
  std::vector<std::string> standby_preload;
  /// Kills what each group leaves behind (--cleanup); nullptr: only the workers' process
  /// groups are killed.
  GroupCleanup* cleanup = nullptr;
  /// --metrics_port: every event the agent records also goes to these metrics (nullptr: none).
  /// Must outlive the agent.
  AgentMetrics* metrics = nullptr;
  /// Runs once when the job has ended, before run() returns (e.g. to stop an embedded server).
  std::function<void()> on_finish;
};

/// The single-node elastic agent: rendezvous, start the worker group, watch it, stop it on the
/// first failure or a signal, and restart it while the budget lasts.
///
///   signals (SIGCHLD, SIGTERM...) --+
///   worker stdout/stderr pipes -----+--> io_context (one thread) --> decide() --> launcher
///   shutdown timer -----------------+                                       \--> rendezvous
///
/// Everything runs on one thread: PR_SET_PDEATHSIG is tied to the thread that forked.
class LocalAgent {
 public:
  LocalAgent(boost::asio::io_context& io, AgentOptions options, rdzv::RendezvousHandler& rdzv,
             ProcessLauncher& launcher);
  ~LocalAgent();
  LocalAgent(const LocalAgent&) = delete;
  LocalAgent& operator=(const LocalAgent&) = delete;

  /// Runs the job to its end and returns ddprun's exit status.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
