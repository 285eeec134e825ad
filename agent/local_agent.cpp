#include "agent/local_agent.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "agent/agent_signals.h"
#include "agent/agent_state.h"
#include "agent/attempt_plan.h"
#include "agent/error_file.h"
#include "agent/event_log.h"
#include "agent/failure_report.h"
#include "agent/health_check.h"
#include "agent/process_tree.h"
#include "agent/stack_dump.h"
#include "agent/standby_supply.h"
#include "agent/worker_command.h"
#include "agent/worker_reports.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/strings.h"
#include "rendezvous/local_host.h"

namespace ddprun::agent {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

/// How long output of an ended group may still arrive (e.g. from a grandchild) before the
/// agent stops reading it.
constexpr std::chrono::milliseconds kDrainTimeout{2000};

/// What the executor keeps of one worker besides its slot in AgentState (by local rank).
struct WorkerFiles {
  std::string error_file;
  std::string launch_error;  ///< why the process could not be started
};

/// What says a file changed: its inode, size and modification time ("" when it is missing).
std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_ino) + "/" + std::to_string(st.st_size) + "/" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

}  // namespace

class LocalAgent::Impl {
 public:
  Impl(asio::io_context& io, AgentOptions options, rdzv::RendezvousHandler& rdzv,
       ProcessLauncher& launcher)
      : io_(io),
        opt_(std::move(options)),
        clock_(opt_.clock != nullptr ? *opt_.clock : steady_clock_),
        rdzv_(rdzv),
        launcher_(launcher),
        signals_(io),
        own_timers_(opt_.timers != nullptr ? nullptr : steady_deadline_timers(io, clock_)),
        deadlines_(opt_.timers != nullptr ? *opt_.timers : *own_timers_),
        reports_(io),
        output_(io, clock_, deadlines_, opt_.output,
                [this](const LogWriteFailure& f) { on_log_failure(f); }),
        standbys_(io, launcher, clock_, deadlines_, standby_settings(),
                  [this](EventName event, const nlohmann::json& fields) { emit(event, fields); }) {
    spec_.local_world_size = opt_.spec.local_world_size;
    spec_.max_restarts = opt_.spec.max_restarts;
    spec_.shutdown_timeout = opt_.spec.shutdown_timeout;
    spec_.watchdog_timeout = opt_.watchdog_timeout;
    spec_.restart_backoff = opt_.restart_backoff;
    spec_.restart_backoff_max = opt_.restart_backoff_max;
    spec_.restart_backoff_reset = opt_.restart_backoff_reset;
    spec_.python_tracebacks = !opt_.interpreter_origin.empty();
    spec_.host = rdzv::local_host_name();
    spec_.health_gate = opt_.health_gate;
    spec_.health_retry = opt_.health_check_interval;
    spec_.health_timeout = opt_.health_check_timeout;
    for (std::unique_ptr<DeadlineTimer>& timer : timers_) timer = deadlines_.make();
  }

  ~Impl() {
    std::error_code ignored;
    if (!temp_dir_.empty()) fs::remove_all(temp_dir_, ignored);
  }

  /// A caught signal, or one a test hands over (LocalAgent::on_signal).
  void on_signal(int sig) {
    if (finished_) return;
    if (sig == SIGCHLD) {
      reap_children();
      return;
    }
    apply(SignalReceived{sig});
    if (state_.pending_signal != 0) standbys_.quiet();
  }

  bool start() {
    auto root = make_log_root(opt_.log_dir, rdzv_.run_id(), opt_.output.wants_files());
    if (!root) {
      spdlog::error("{}", root.error().message);
      // A --log_dir that cannot be written is a bad flag; the temporary directory is ours.
      return fail_to_start(opt_.log_dir.empty() ? common::kExitInternal : common::kExitUsage);
    }
    log_root_ = root->path;
    if (root->remove_at_exit) temp_dir_ = log_root_;
    if (!opt_.event_log.empty()) {
      if (auto why =
              events_.open(opt_.event_log, opt_.node_name.empty() ? spec_.host : opt_.node_name)) {
        spdlog::error("{}; pass a writable --event_log path", why->message);
        return fail_to_start(common::kExitUsage);
      }
    }
    // The workers' milestones feed the event log, the watchdog and the recovery phases of the
    // metrics; a program's training steps tell a crash loop from failures with progress between
    // (Python scripts report none: their environment stays torchrun's unless asked).
    if (events_.enabled() || opt_.watchdog_timeout.count() > 0 || opt_.metrics != nullptr ||
        !spec_.python_tracebacks) {
      if (auto why = reports_.open([this](const WorkerReport& r) { on_report(r); }))
        spdlog::warn("{}", why->message);
    }
    if (reports_.path().empty()) spec_.watchdog_timeout = Duration{0};  // nothing to watch
    // A line of output is progress too: a Python script without the SDK reports none.
    if (spec_.watchdog_timeout.count() > 0)
      output_.on_line([this](int local_rank) {
        if (auto slot = slot_of_report(state_, std::nullopt, local_rank))
          apply(ProgressReported{*slot});
      });
    install_signals();
    rdzv_.set_notice_handler([this](rdzv::Notice n) { apply(NoticeReceived{std::move(n)}); });
    const bool zygote = standbys_.start_zygote([this](bool ready) { apply(ZygoteSettled{ready}); });
    if (!zygote) standbys_.prewarm();
    apply(AgentStarted{zygote});
    return true;
  }

  int run() {
    if (start()) io_.run();
    return exit_code_;
  }

  bool finished() const { return finished_; }
  int exit_code() const { return exit_code_; }
  void line_typed() { output_.line_typed(); }

 private:
  StandbySettings standby_settings() const {
    return StandbySettings{
        opt_.standby_workers, opt_.python_bootstrap, opt_.python_standby, opt_.spec,
        opt_.agent_env,       rdzv_.run_id(),        opt_.cleanup,        opt_.standby_delay,
        opt_.worker_stdin};
  }

  /// The job ends before anything starts, with `code`.
  bool fail_to_start(int code) {
    finished_ = true;
    exit_code_ = code;
    return false;
  }

  // ---- the executor -----------------------------------------------------------------------

  /// Steps the lifecycle and carries out its effects. An effect that completes at once (a
  /// prepared group, a launched worker) queues its event: events are stepped in order, never
  /// inside another step.
  void apply(AgentEvent event) {
    queue_.push_back(std::move(event));
    if (applying_) return;
    applying_ = true;
    while (!queue_.empty()) {
      AgentEvent next = std::move(queue_.front());
      queue_.pop_front();
      for (const AgentEffect& effect : agent_step(state_, next, clock_.now(), spec_))
        std::visit([this](const auto& e) { execute(e); }, effect);
    }
    applying_ = false;
  }

  void execute(const JoinRound&) {
    rdzv_.next_rendezvous([this](rdzv::RendezvousResult result) {
      if (auto* error = std::get_if<rdzv::RendezvousError>(&result))
        apply(RoundFailed{*error});
      else
        apply(RoundReady{std::get<rdzv::RendezvousInfo>(result)});
    });
  }

  void execute(const PrepareGroup& e) { prepare_group(e); }

  void execute(const RunHealthCheck&) {
    if (!health_) {
      HealthInputs inputs;
      inputs.dirs = {log_root_.string()};
      health_ = std::make_unique<HealthCheckRunner>(io_, launcher_, clock_, deadlines_, inputs,
                                                    opt_.health_check_command,
                                                    opt_.health_check_timeout, opt_.agent_env);
      // With the standbys: out of every group's cgroup, in the node's (and told to the
      // watcher without one), so a SIGKILL of ddprun kills a check that runs.
      if (opt_.cleanup != nullptr)
        health_->place(opt_.cleanup->helper_procs_fd(), opt_.cleanup->watcher_fd());
    }
    health_->run([this](HealthResult r) {
      std::istringstream lines(r.output);
      for (std::string line; std::getline(lines, line);)
        spdlog::log(r.ok ? spdlog::level::info : spdlog::level::warn, "[health check] {}",
                    common::printable(common::tabs_as_spaces(line)));
      apply(HealthChecked{r.ok, r.why, r.output, r.ms});
    });
  }

  /// The lifecycle launches one worker per event-loop turn: what came meanwhile is stepped
  /// first (a stop then makes LaunchTurn start nothing).
  void execute(const YieldTurn&) {
    asio::post(io_, [this] { apply(LaunchTurn{}); });
  }

  void execute(const LaunchWorker& e) {
    apply(WorkerLaunched{e.index, launch_worker(e.placement)});
  }

  void execute(const SignalWorkers& e) {
    if (e.no_core_dump) forbid_core_dumps(e.pids);
    for (pid_t pid : e.pids) {
      // One that has ended already (not reaped yet) ended on its own, before this signal.
      if (!launcher_.has_ended(pid)) signalled_.insert(pid);
      launcher_.signal_group(pid, e.sig);
      if (e.then_continue) launcher_.signal_group(pid, SIGCONT);
    }
  }

  void execute(const RecordFailure& e) {
    const WorkerFiles& files = files_[e.placement.local_rank];
    failures_.push_back(collect_failure(
        e.placement, e.pid, e.status, files.error_file, files.launch_error,
        e.hung ? "no progress reported for " + std::to_string(opt_.watchdog_timeout.count()) +
                     " ms: killed by the watchdog (--watchdog_timeout)"
               : ""));
  }

  void execute(const ReportFailure& e) { rdzv_.report_failure(e.failure); }
  void execute(const ReportSuccess&) { rdzv_.report_success(); }
  void execute(const ReportKeptOut& e) { rdzv_.keep_out(e.why); }
  void execute(const Leave& e) { rdzv_.leave(e.reason); }

  /// Kills what is left in the workers' process groups (e.g. grandchildren) and every other
  /// descendant but the standbys (setsid), then reads the pipes to their end (bounded).
  void execute(const Drain& e) {
    for (pid_t pid : e.groups)
      if (launcher_.signal_group(pid, SIGKILL))
        spdlog::debug("killed leftover processes of worker pid {}", pid);
    if (opt_.cleanup != nullptr) {
      if (int killed = opt_.cleanup->end_group(standbys_.pids()); killed > 0)
        spdlog::debug("killed {} leftover descendant(s) of the group", killed);
    }
    output_.drain(kDrainTimeout, [this] { apply(OutputDrained{}); });
  }

  void execute(const ArmTimer& e) {
    timer_for(e.timer).arm(e.at, [this, which = e.timer] { apply(TimerFired{which}); });
  }

  void execute(const CancelTimer& e) { timer_for(e.timer).cancel(); }
  void execute(const EmitEvent& e) { emit(e.name, e.fields); }

  void execute(const Log& e) {
    constexpr spdlog::level::level_enum kLevels[] = {spdlog::level::debug, spdlog::level::info,
                                                     spdlog::level::warn, spdlog::level::err};
    spdlog::log(kLevels[static_cast<int>(e.level)], "{}", e.text);
  }

  void execute(const InspectHung& e) {
    HungInspected seen;
    for (pid_t pid : e.pids) seen.workers.push_back({pid, read_process_state(pid)});
    apply(std::move(seen));
  }

  /// Native stacks of hung workers, in ddprun's log and the event log, before they are killed.
  void execute(const DumpStacks& e) {
    std::vector<StackTarget> targets;
    for (const WorkerRef& w : e.workers) targets.push_back({w.pid, w.global_rank, w.local_rank});
    for (nlohmann::json& fields : log_native_stacks(targets, e.why)) {
      fields["python_traceback"] = spec_.python_tracebacks;
      emit(EventName::StacksDumped, fields);
    }
  }

  void execute(const ScheduleStandbys&) { standbys_.schedule(attempt_.executable); }

  void execute(const ReportJobFailure& e) {
    // Why, and the exit status, were said on every node (AgentState's conclude). A job that
    // ended on a lost node has no failure report anywhere.
    if (failures_.empty()) {
      const bool reported = e.closed.exit_code != 0 || e.closed.signal != 0;
      return spdlog::error("the job failed on another node{}",
                           reported ? ": its log has the failure report" : " (see above)");
    }
    if (!temp_dir_.empty() && names_error_files(failures_)) {
      // Before the report names them: the watcher leaves them, should ddprun be killed now.
      if (opt_.cleanup != nullptr) opt_.cleanup->keep_error_files();
      spdlog::info("the error files named below are kept in {} (remove it when done)",
                   temp_dir_.string());
      temp_dir_.clear();  // not removed at exit: the user reads them
    }
    auto parent = opt_.agent_env.find("TORCHELASTIC_ERROR_FILE");
    print_job_failure(
        failures_, FailureReportContext{
                       opt_.script, spec_.host, state_.restart_count, opt_.spec.max_restarts,
                       output_.log_loss(), parent == opt_.agent_env.end() ? "" : parent->second,
                       opt_.interpreter, opt_.interpreter_origin, output_.saw_missing_torch(),
                       std::any_of(files_.begin(), files_.end(),
                                   [](const auto& f) { return !f.second.launch_error.empty(); })});
  }

  void execute(const Finish& e) { finish(e.code, e.kill); }

  DeadlineTimer& timer_for(AgentTimer timer) { return *timers_[static_cast<size_t>(timer)]; }

  // ---- set-up -----------------------------------------------------------------------------

  /// Signals, and the ends of children: by SIGCHLD, or through the launcher when it says so
  /// itself (a test's fake), reaped on the loop after the call.
  void install_signals() {
    const bool told = launcher_.notify_exits([this] {
      asio::post(io_, [this] {
        if (!finished_) reap_children();
      });
    });
    handle_agent_signals(signals_, opt_.signals_to_handle, /*sigchld=*/!told);
    wait_for_signal();
  }

  void wait_for_signal() {
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      on_signal(sig);
      if (!finished_) wait_for_signal();
    });
  }

  void reap_children() {
    if (handing_over_) {
      reap_deferred_ = true;
      return;
    }
    // Every exit reaped here had ended before this pass began: one whose group the agent had
    // not signalled by then (or had found ended when it signalled it) ended on its own,
    // whatever the pass's first exit makes it send.
    const std::set<pid_t> signalled = signalled_;
    for (const ProcessExit& exit : launcher_.reap()) {
      if (standbys_.on_exit(exit.pid, exit.status)) continue;
      if (health_ && health_->on_exit(exit.pid, exit.status)) continue;
      WorkerExited exited{exit.pid, exit.status, false, {}, false};
      exited.ended_unsignalled = signalled.count(exit.pid) == 0;
      signalled_.erase(exit.pid);
      if (!exit.status.ok()) {
        read_error_file(exited);
        exited.progress_file_changed =
            !opt_.progress_file.empty() && file_stamp(opt_.progress_file) != progress_stamp_;
      }
      apply(std::move(exited));
    }
  }

  /// What a failed worker's error file tells the lifecycle: that it wrote one, and the
  /// exception type it names.
  void read_error_file(WorkerExited& exited) {
    for (const auto& w : state_.workers) {
      if (w.pid != exited.pid) continue;
      const std::string& path = files_[w.placement.local_rank].error_file;
      if (is_empty_file(path)) return;
      exited.wrote_error_file = true;
      std::ifstream in(path);
      std::ostringstream text;
      text << in.rdbuf();
      auto parsed = parse_error_file(text.str());
      if (parsed) exited.exception = exception_type(*parsed);
      return;
    }
  }

  // ---- event log and worker reports -------------------------------------------------------

  void emit(EventName event, const nlohmann::json& fields = nlohmann::json::object()) {
    record(event_name(event), event, fields);
  }

  /// An event as the log names it (a worker's report may name one ddprun does not know).
  void record(std::string_view name, EventName event, const nlohmann::json& fields) {
    const auto at = clock_.now();
    events_.write(name, fields, at);
    if (opt_.metrics != nullptr) opt_.metrics->observe(event, fields, at);
  }

  void on_report(const WorkerReport& report) {
    const auto slot = slot_of_report(state_, report.pid, report.local_rank);
    if (!slot) return;  // a report from a worker of an earlier group
    // The SDK heartbeats once per training step (at most every 100 ms).
    apply(ProgressReported{*slot, report.event == "heartbeat" || report.event == "first_step"});
    if (report.event == "heartbeat") return;
    nlohmann::json fields = report.fields;
    fields["local_rank"] = report.local_rank;
    fields["source"] = "worker";
    fields["rank"] = state_.workers[*slot].placement.global_rank;
    fields["restart_count"] = state_.restart_count;
    record(report.event, event_named(report.event), fields);
  }

  void on_log_failure(const LogWriteFailure& f) {
    emit(EventName::LogWriteFailed,
         {{"path", f.path}, {"error", std::strerror(f.error)}, {"bytes_lost", f.bytes_lost}});
  }

  // ---- starting a group -------------------------------------------------------------------

  /// The attempt's directories and environments, and the standbys handed over.
  void prepare_group(const PrepareGroup& group) {
    if (!opt_.progress_file.empty()) progress_stamp_ = file_stamp(opt_.progress_file);
    failures_.clear();
    files_.clear();
    placements_ = group.placements;
    auto plan =
        plan_attempt({log_root_, &opt_.spec, &opt_.agent_env, &group.round, group.placements,
                      rdzv_.run_id(), reports_.path(), group.checkpoint_requested});
    if (!plan) {
      spdlog::error("{}", plan.error().message);
      return apply(GroupPrepared{false, {}});
    }
    attempt_ = std::move(*plan);
    for (const auto& [local_rank, path] : attempt_.error_files)
      files_[local_rank].error_file = path;
    output_.begin_group(attempt_.dir);
    spdlog::debug("starting {} workers (restart {}): master {}:{}", opt_.spec.local_world_size,
                  group.round.restart_count, group.round.master_addr, group.round.master_port);
    // Standbys first, all at once: each must acknowledge its hand-over before it counts as the
    // worker; the ranks whose standby did not start afresh, one per turn. The acknowledgements
    // arrive as the loop turns; until they have, exits are left unreaped (a standby that took
    // over and ended at once is reaped as the worker it became).
    handing_over_ = true;
    standbys_.hand_over(attempt_.executable, attempt_.envs,
                        [this](std::map<int, LaunchedProcess> handed) { group_handed(handed); });
  }

  /// The hand-over is over: the standbys that took it are workers.
  void group_handed(const std::map<int, LaunchedProcess>& handed) {
    handing_over_ = false;
    cgroup_procs_fd_ = opt_.cleanup != nullptr ? opt_.cleanup->begin_group() : -1;
    GroupPrepared prepared;
    for (const auto& [local_rank, process] : handed) {
      if (opt_.cleanup != nullptr) opt_.cleanup->adopt(process.pid);
      output_.add(placement_of(local_rank), process.stdout_fd, process.stderr_fd,
                  attempt_.rank_dir(local_rank));
      prepared.handed[local_rank] = process.pid;
    }
    apply(std::move(prepared));
    if (std::exchange(reap_deferred_, false)) reap_children();
  }

  const WorkerPlacement& placement_of(int local_rank) const {
    for (const auto& p : placements_)
      if (p.local_rank == local_rank) return p;
    return placements_.front();  // every handed rank has a placement
  }

  /// Starts one worker afresh; its pid, or -1 (the reason is kept for the failure report).
  pid_t launch_worker(const WorkerPlacement& p) {
    WorkerFiles& files = files_[p.local_rank];
    if (attempt_.executable.empty()) {
      files.launch_error = attempt_.missing_command;
    } else {
      ProcessSpec spec{attempt_.executable, argv_for_local_rank(opt_.spec.argv, p.local_rank),
                       to_envp(attempt_.envs.at(p.local_rank))};
      spec.cgroup_procs_fd = cgroup_procs_fd_;
      spec.watcher_fd = opt_.cleanup != nullptr ? opt_.cleanup->watcher_fd() : -1;
      spec.stdin_fd = opt_.worker_stdin;
      if (static_cast<size_t>(p.local_rank) < opt_.cpus_by_local_rank.size())
        spec.cpus = opt_.cpus_by_local_rank[static_cast<size_t>(p.local_rank)];
      auto launched = launcher_.launch(spec);
      if (launched) {
        output_.add(p, launched->stdout_fd, launched->stderr_fd, attempt_.rank_dir(p.local_rank));
        return launched->pid;
      }
      files.launch_error = launched.error().message;
    }
    spdlog::error("local rank {} did not start: {}", p.local_rank, files.launch_error);
    return -1;
  }

  // ---- the end ------------------------------------------------------------------------------

  void finish(int code, const std::vector<pid_t>& running) {
    if (finished_) return;
    finished_ = true;
    exit_code_ = code;
    reports_.drain();
    nlohmann::json end{{"exit_code", code}};
    if (const LogLoss loss = output_.log_loss(); loss.files > 0) {
      end["log_write_failures"] = loss.files;
      end["log_bytes_lost"] = loss.bytes;
      spdlog::warn("{} bytes of worker output could not be written to {} log file(s) (see above)",
                   loss.bytes, loss.files);
    }
    emit(EventName::JobEnd, end);
    for (std::unique_ptr<DeadlineTimer>& timer : timers_) timer->cancel();
    standbys_.stop();
    if (health_) health_->stop();
    reports_.close();
    for (pid_t pid : running) launcher_.signal_group(pid, SIGKILL);
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    output_.close_all();
    // Reap what SIGKILL just ended so nothing is left as a zombie of ours.
    for (pid_t pid : running) launcher_.wait(pid);
    if (opt_.cleanup != nullptr) opt_.cleanup->finish();
    if (opt_.on_finish) opt_.on_finish();
  }

  asio::io_context& io_;
  AgentOptions opt_;
  common::SteadyClock steady_clock_;
  const common::Clock& clock_;
  rdzv::RendezvousHandler& rdzv_;
  ProcessLauncher& launcher_;
  AgentSpec spec_;
  AgentState state_;
  std::deque<AgentEvent> queue_;
  bool applying_ = false;
  asio::signal_set signals_;
  std::unique_ptr<DeadlineTimers> own_timers_;  ///< when the options gave none
  /// Every timer of the agent and its parts (output, standbys, health check) comes from here.
  DeadlineTimers& deadlines_;
  std::array<std::unique_ptr<DeadlineTimer>, kAgentTimers> timers_;  ///< by AgentTimer
  ReportSocket reports_;
  EventLog events_;
  WorkerOutput output_;
  fs::path log_root_;
  std::unique_ptr<HealthCheckRunner> health_;
  std::string progress_stamp_;  ///< --progress_file as the current group found it  ///< made at the
                                ///< first check (--health_check)
  fs::path temp_dir_;           ///< removed at exit unless the failure report names files in it
  // The current group, as the executor prepared it.
  std::vector<WorkerPlacement> placements_;
  AttemptPlan attempt_;
  std::map<int, WorkerFiles> files_;  ///< by local rank
  std::vector<ProcessFailure> failures_;
  /// Workers whose process group the agent has signalled, until they are reaped.
  std::set<pid_t> signalled_;
  int cgroup_procs_fd_ = -1;
  bool handing_over_ = false;   ///< standbys' acknowledgements awaited (GroupPrepared to come)
  bool reap_deferred_ = false;  ///< SIGCHLD came meanwhile: reap once the hand-over is over
  StandbySupply standbys_;
  bool finished_ = false;
  int exit_code_ = 0;
};

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options, rdzv::RendezvousHandler& rdzv,
                       ProcessLauncher& launcher)
    : impl_(std::make_unique<Impl>(io, std::move(options), rdzv, launcher)) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::run() { return impl_->run(); }
bool LocalAgent::start() { return impl_->start(); }
bool LocalAgent::finished() const { return impl_->finished(); }
int LocalAgent::exit_code() const { return impl_->exit_code(); }
void LocalAgent::on_signal(int sig) { impl_->on_signal(sig); }

void LocalAgent::line_typed() { impl_->line_typed(); }

}  // namespace ddprun::agent
