#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_metrics.h"
#include "agent/deadline_timer.h"
#include "agent/group_cleanup.h"
#include "agent/process_launcher.h"
#include "agent/worker.h"
#include "agent/worker_command.h"
#include "agent/worker_env.h"
#include "agent/worker_output.h"
#include "common/clock.h"
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
  /// Where worker output goes (--redirects, --tee, --local_ranks_filter, filters, prefix).
  OutputSettings output;
  /// --numa_binding: the CPUs of each local rank (empty: no binding).
  std::vector<std::vector<int>> cpus_by_local_rank;
  std::vector<int> signals_to_handle;
  EnvMap agent_env;
  std::string event_log;  ///< --event_log: the recovery timeline ("" for none)
  std::string node_name;  ///< this node as events and reports name it
  /// --watchdog_timeout: a worker that reported progress and then went silent this long is
  /// killed as hung (0: off).
  std::chrono::milliseconds watchdog_timeout{0};
  /// --restart_backoff BASE:MAX and --restart_backoff_reset (AgentSpec says what they do).
  std::chrono::milliseconds restart_backoff{1'000};
  std::chrono::milliseconds restart_backoff_max{30'000};
  std::chrono::milliseconds restart_backoff_reset{60'000};
  /// --health_check: check before every join (agent/health_check.h): the built-in checks, and
  /// `health_check_command` when not empty; health_check_timeout bounds the command and
  /// health_check_interval spaces the checks of a node that failed one.
  /// --progress_file: a file whose change while a group runs counts as that group's progress
  /// (--crash_loop_stop); "" for none.
  std::string progress_file;
  bool health_gate = false;
  std::string health_check_command;
  std::chrono::milliseconds health_check_timeout{60'000};
  std::chrono::milliseconds health_check_interval{30'000};
  /// --standby_workers: keep a standby process per local rank for the next restart
  /// (agent/standby_pool.h).
  bool standby_workers = false;
  /// How long after a group starts its standbys for the next restart start (they load while
  /// the workers train, not while they start).
  std::chrono::milliseconds standby_delay{1'000};
  /// With standby_workers, for a Python script: the bootstrap (agent/python/ddprun_standby.py)
  /// the standbys run, which imports torch and waits; "" when the program itself waits (the C++
  /// worker SDK).
  std::string python_bootstrap;
  /// A Python job's interpreter as found (its path, or the name when not found) and where
  /// it came from ("PYTHON_EXEC", "the first python3 on PATH"); "" for --no_python. Named in
  /// the failure report when workers cannot import torch or the interpreter cannot run.
  std::string interpreter;
  std::string interpreter_origin;
  /// --standby_preload and --standby_cuda: what a Python standby does besides importing torch
  /// and the script's own imports.
  PythonStandbyOptions python_standby;
  /// Kills what each group leaves behind (--cleanup); nullptr: only the workers' process
  /// groups are killed.
  GroupCleanup* cleanup = nullptr;
  /// Each worker's and standby's stdin (agent/worker_stdin.h); -1: /dev/null.
  int worker_stdin = -1;
  /// --metrics_port: every event the agent records also goes to these metrics (nullptr: none).
  /// Must outlive the agent.
  AgentMetrics* metrics = nullptr;
  /// Runs once when the job has ended, before run() returns (e.g. to stop an embedded server).
  std::function<void()> on_finish;
  /// The time source (nullptr: the steady clock). Must outlive the agent.
  const common::Clock* clock = nullptr;
  /// The agent's deadline timers (nullptr: steady timers on `clock`); a test's fire when it
  /// moves its fake clock on. Must outlive the agent.
  DeadlineTimers* timers = nullptr;
};

/// The node's elastic agent: rendezvous, start the worker group, watch it, stop it on the first
/// failure or a signal, and start it again while the rendezvous allows. The lifecycle is the
/// pure agent_step (agent/agent_state.h); LocalAgent is its executor:
///
///   signals (SIGCHLD -> launcher.reap(), SIGTERM...) --+
///   rendezvous callbacks and notices ------------------+--> AgentEvent --> agent_step
///   worker reports, timers, output drained ------------+                       |
///                                                                   AgentEffects: launch,
///                                                                   signal, report, timers...
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

  /// Starts the job without running the event loop: the caller runs (or polls) it until
  /// finished(). Returns false when the job could not start (exit_code() says how it ended).
  bool start();
  bool finished() const;
  int exit_code() const;

  /// Acts on `sig` as if it had just arrived (a stop signal, a preemption notice): what the
  /// agent's signal set does with one it caught, for a test that raises no real signal.
  void on_signal(int sig);
  /// A line was typed in ddprun's terminal (WorkerStdin::on_line): the console's open line
  /// ended there (WorkerOutput::line_typed).
  void line_typed();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
