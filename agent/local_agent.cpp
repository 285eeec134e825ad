#include "agent/local_agent.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/datagram_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "agent/error_file.h"
#include "agent/event_log.h"
#include "agent/failure_report.h"
#include "agent/line_buffer.h"
#include "agent/policy.h"
#include "agent/python_zygote.h"
#include "agent/standby_pool.h"
#include "agent/worker_command.h"
#include "common/signals.h"
#include "rendezvous/local_host.h"

namespace ddprun::agent {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

/// How long output of an ended group may still arrive (e.g. from a grandchild) before the
/// agent stops reading it.
constexpr std::chrono::milliseconds kDrainTimeout{2000};
/// The watchdog looks at least this often (more often for a short --watchdog_timeout).
constexpr std::chrono::milliseconds kWatchdogTick{1000};
/// Standby processes start this long after a group: they load the program (and libtorch) while
/// the workers train, not while they start.
constexpr std::chrono::milliseconds kStandbyDelay{1000};
/// How long a group waits for the Python zygote to import torch before it starts without it
/// (a fresh interpreter per worker would spend as long importing the same modules).
constexpr std::chrono::seconds kZygoteReadyTimeout{60};

/// Writes all of `data`; returns the errno of a failed write (0: all written) and sets `lost`
/// to the bytes not written.
int write_all(int fd, const std::string& data, size_t* lost = nullptr) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (lost != nullptr) *lost = left;
      return errno;  // console gone (EPIPE), disk full (ENOSPC), file too large (EFBIG)
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

bool has_stream(launcher::StdStreams set, launcher::StdStreams which) {
  return (static_cast<int>(set) & static_cast<int>(which)) != 0;
}

/// filtered_stdout.log or filtered_stderr.log of one attempt, shared by every worker's stream:
/// the lines containing any of the needles (--duplicate_stdout_filters).
struct FilteredLog {
  FilteredLog(int fd_, std::vector<std::string> needles_) : fd(fd_), needles(std::move(needles_)) {}
  FilteredLog(const FilteredLog&) = delete;
  FilteredLog& operator=(const FilteredLog&) = delete;
  ~FilteredLog() { ::close(fd); }
  bool wants(const std::string& line) const {
    return std::any_of(needles.begin(), needles.end(), [&line](const std::string& needle) {
      return line.find(needle) != std::string::npos;
    });
  }
  int fd;
  std::vector<std::string> needles;
};

/// One stdout or stderr pipe of one worker: lines go to the console (prefixed) and/or a file.
struct OutputStream {
  OutputStream(asio::io_context& io, int fd) : pipe(io, fd) {}
  asio::posix::stream_descriptor pipe;
  std::array<char, 64 * 1024> chunk{};
  LineBuffer lines;
  int console_fd = -1;  ///< -1: not shown on the console
  std::string prefix;
  int file_fd = -1;  ///< -1: not written to a file
  std::string file_path;
  std::shared_ptr<FilteredLog> filtered;  ///< null: no --duplicate_*_filters
  bool saw_missing_torch = false;         ///< a line said "No module named 'torch'"
  int file_error = 0;       ///< errno of the first failed write to the file (0: none yet)
  long long file_lost = 0;  ///< bytes that did not reach the file
  bool open = true;

  /// True when this call saw the first failed write to the file (to be reported once).
  bool emit(const std::vector<std::string>& done) {
    bool first_failure = false;
    for (const auto& line : done) {
      if (console_fd >= 0) write_all(console_fd, prefix + line + "\n");
      if (line.find("No module named 'torch'") != std::string::npos) saw_missing_torch = true;
      if (filtered != nullptr && filtered->wants(line))
        write_all(filtered->fd, prefix + line + "\n");
      if (file_fd < 0) continue;
      // Later writes are still tried: output resumes once the disk has room again.
      size_t lost = 0;
      if (int err = write_all(file_fd, line + "\n", &lost); err != 0) {
        if (file_error == 0) {
          first_failure = true;
          file_error = err;
        }
        file_lost += static_cast<long long>(lost);
      }
    }
    return first_failure;
  }
  /// Like emit(): true when the last line's write was the file's first failure.
  bool close() {
    const bool first_failure = emit(lines.finish());
    boost::system::error_code ignored;
    pipe.close(ignored);
    if (file_fd >= 0) ::close(file_fd);
    file_fd = -1;
    open = false;
    return first_failure;
  }
  ~OutputStream() {
    if (file_fd >= 0) ::close(file_fd);
  }
};

struct WorkerRuntime {
  WorkerPlacement placement;
  pid_t pid = -1;
  bool running = false;
  ExitStatus status;
  std::string error_file;
  std::string launch_error;  ///< set when the process could not be started
  std::shared_ptr<OutputStream> out;
  std::shared_ptr<OutputStream> err;
  std::optional<std::chrono::steady_clock::time_point> last_progress;  ///< last report received
  bool hung = false;                                                   ///< killed by the watchdog
};

/// Largest report a worker may send over DDPRUN_AGENT_SOCKET.
constexpr size_t kMaxReportBytes = 64 * 1024;

/// Why the current group is being stopped.
enum class StopReason { None, WorkerFailed, Signalled, Requested };

}  // namespace

class LocalAgent::Impl {
 public:
  Impl(asio::io_context& io, AgentOptions options, rdzv::RendezvousHandler& rdzv,
       ProcessLauncher& launcher)
      : io_(io),
        opt_(std::move(options)),
        rdzv_(rdzv),
        launcher_(launcher),
        signals_(io),
        shutdown_timer_(io),
        drain_timer_(io),
        watchdog_timer_(io),
        standby_timer_(io),
        zygote_timer_(io),
        zygote_wait_(io),
        reports_(io),
        host_(rdzv::local_host_name()),
        standbys_(launcher) {
    if (!opt_.python_bootstrap.empty())
      standbys_.set_exit_hint("a Python standby imports torch and waits in ddprun's bootstrap (" +
                              opt_.python_bootstrap + "); exit code 3 means " +
                              opt_.spec.argv.front() +
                              " cannot import torch: set PYTHON_EXEC to an interpreter that can");
  }

  ~Impl() {
    std::error_code ignored;
    if (!temp_dir_.empty()) fs::remove_all(temp_dir_, ignored);
    if (!socket_dir_.empty()) fs::remove_all(socket_dir_, ignored);
  }

  int run() {
    if (!prepare_log_root()) return job_exit_code(JobOutcome::of(JobEnd::Internal));
    if (!opt_.event_log.empty()) {
      if (auto why =
              events_.open(opt_.event_log, opt_.node_name.empty() ? host_ : opt_.node_name)) {
        spdlog::error("{}; pass a writable --event_log path", *why);
        return job_exit_code(JobOutcome::of(JobEnd::Internal));
      }
    }
    // The workers' milestones feed the event log, the watchdog and the recovery phases of the
    // metrics.
    if (events_.enabled() || opt_.watchdog_timeout.count() > 0 || opt_.metrics != nullptr)
      open_report_socket();
    install_signals();
    rdzv_.set_notice_handler([this](rdzv::Notice notice) { on_notice(std::move(notice)); });
    if (will_default_omp_threads(opt_.agent_env, opt_.spec.local_world_size))
      spdlog::info(
          "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the system; set it "
          "yourself to tune it");
    start_zygote();
    start_round();
    io_.run();
    return exit_code_;
  }

 private:
  // ---- set-up -----------------------------------------------------------------------------

  bool prepare_log_root() {
    if (!opt_.log_dir.empty()) {
      // <log_dir>/<run_id>_<random>, as torchrun names it: a second run with the same
      // --rdzv_id (the default is "none") keeps the first run's logs.
      std::error_code made;
      fs::create_directories(opt_.log_dir, made);
      std::string tmpl = (fs::path(opt_.log_dir) / (rdzv_.run_id() + "_XXXXXX")).string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        spdlog::error(
            "cannot create a run directory in --log_dir {}: {}; pass a writable "
            "--log_dir",
            opt_.log_dir, std::strerror(errno));
        return false;
      }
      log_root_ = tmpl;
      spdlog::info("worker logs and error files go to {}/attempt_<n>/<local_rank>/",
                   log_root_.string());
    } else {
      std::string tmpl = (fs::temp_directory_path() / "ddprun-XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        spdlog::error("cannot create a temporary directory for error files in {}: {}",
                      fs::temp_directory_path().string(), std::strerror(errno));
        return false;
      }
      log_root_ = tmpl;
      const bool wants_files =
          opt_.redirects.all != launcher::StdStreams::None || !opt_.redirects.per_rank.empty() ||
          opt_.tee.all != launcher::StdStreams::None || !opt_.tee.per_rank.empty() ||
          !opt_.duplicate_stdout_filters.empty() || !opt_.duplicate_stderr_filters.empty();
      if (wants_files)
        spdlog::info("no --log_dir given: worker logs go to {}", log_root_.string());
      else
        temp_dir_ = log_root_;  // only error files live there: remove it at exit
    }
    std::error_code ec;
    fs::create_directories(log_root_, ec);
    if (ec) {
      spdlog::error("cannot create log directory {}: {}; pass a writable --log_dir",
                    log_root_.string(), ec.message());
      return false;
    }
    return true;
  }

  void install_signals() {
    boost::system::error_code ec;
    signals_.add(SIGCHLD, ec);
    std::vector<int> sigs = opt_.signals_to_handle;
    // Preemption notices are always handled, whatever --signals_to_handle lists: left to their
    // default action they would kill the agent, and with it (PDEATHSIG) every worker.
    for (int notice : {SIGUSR1, SIGUSR2})
      if (std::find(sigs.begin(), sigs.end(), notice) == sigs.end()) sigs.push_back(notice);
    for (int sig : sigs) {
      signals_.add(sig, ec);
      if (ec) spdlog::warn("cannot handle {}: {}", common::signal_name(sig), ec.message());
    }
    // launch() blocked the notices while ddprun started; one that came meanwhile is delivered
    // now, to the handler just installed.
    sigset_t notices;
    sigemptyset(&notices);
    sigaddset(&notices, SIGUSR1);
    sigaddset(&notices, SIGUSR2);
    pthread_sigmask(SIG_UNBLOCK, &notices, nullptr);
    // A closed console must not kill the agent while it still has workers to stop.
    std::signal(SIGPIPE, SIG_IGN);
    // Nor a log file past RLIMIT_FSIZE: the write fails with EFBIG and is reported instead.
    std::signal(SIGXFSZ, SIG_IGN);
    wait_for_signal();
  }

  void wait_for_signal() {
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (sig == SIGCHLD)
        reap_children();
      else
        on_signal(sig);
      if (!finished_) wait_for_signal();
    });
  }

  // ---- event log and worker reports -------------------------------------------------------

  void emit(const std::string& event, const nlohmann::json& fields = nlohmann::json::object()) {
    const auto at = std::chrono::steady_clock::now();
    events_.write(event, fields, at);
    if (opt_.metrics != nullptr) opt_.metrics->observe(event, fields, at);
  }

  /// Workers (through the SDK) send JSON datagrams here: progress heartbeats for the watchdog
  /// and milestones ("pg_ready", "snapshot_loaded", "first_step") for the event log.
  void open_report_socket() {
    std::string tmpl = (fs::temp_directory_path() / "ddprun-sock-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      spdlog::warn("cannot create a directory for the workers' report socket: {}",
                   std::strerror(errno));
      return;
    }
    socket_dir_ = tmpl;
    const std::string path = (fs::path(tmpl) / "agent.sock").string();
    boost::system::error_code ec;
    reports_.open(asio::local::datagram_protocol(), ec);
    if (!ec) reports_.bind(asio::local::datagram_protocol::endpoint(path), ec);
    if (ec) {
      spdlog::warn("cannot open the workers' report socket {}: {}", path, ec.message());
      return;
    }
    socket_path_ = path;
    report_buffer_.resize(kMaxReportBytes);
    read_report();
  }

  void read_report() {
    reports_.async_receive(asio::buffer(report_buffer_),
                           [this](const boost::system::error_code& ec, size_t n) {
                             if (ec) return;  // closed at the end of the job
                             on_report(std::string_view(report_buffer_.data(), n));
                             read_report();
                           });
  }

  void on_report(std::string_view text) {
    auto report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!report.is_object() || !report.contains("event") || !report["event"].is_string() ||
        !report.contains("local_rank") || !report["local_rank"].is_number_integer()) {
      spdlog::debug("ignoring a malformed worker report: {}", std::string(text.substr(0, 200)));
      return;
    }
    const int local_rank = report["local_rank"].get<int>();
    // By pid when the report has one: a report sent just before the worker exited may be read
    // after its exit was reaped, and still belongs to it. Without one, a running worker's.
    const bool has_pid = report.contains("pid") && report["pid"].is_number_integer();
    WorkerRuntime* worker = nullptr;
    for (auto& w : workers_)
      if (has_pid ? w->pid == report["pid"].get<pid_t>()
                  : w->placement.local_rank == local_rank && w->running)
        worker = w.get();
    if (worker == nullptr) return;  // a report from a worker of an earlier group
    report.erase("pid");
    worker->last_progress = std::chrono::steady_clock::now();
    const std::string event = report["event"].get<std::string>();
    if (event == "heartbeat") return;
    report.erase("event");
    report["source"] = "worker";
    report["rank"] = worker->placement.global_rank;
    report["restart_count"] = restart_count_;
    emit(event, report);
  }

  /// Reports already queued on the socket when the job ends (a worker's last milestone before
  /// its exit) still reach the event log.
  void drain_reports() {
    if (!reports_.is_open()) return;
    boost::system::error_code ec;
    reports_.non_blocking(true, ec);
    for (int i = 0; i < 1024 && !ec; ++i) {
      const size_t n = reports_.receive(asio::buffer(report_buffer_), 0, ec);
      if (!ec) on_report(std::string_view(report_buffer_.data(), n));
    }
  }

  void arm_watchdog() {
    if (opt_.watchdog_timeout.count() <= 0 || socket_path_.empty()) return;
    watchdog_timer_.expires_after(
        std::min<std::chrono::milliseconds>(opt_.watchdog_timeout / 4, kWatchdogTick));
    watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || finished_) return;
      check_watchdog();
      arm_watchdog();
    });
  }

  /// A worker that reported progress once and then nothing for --watchdog_timeout is hung:
  /// it gets SIGKILL at once (a stopped or deadlocked process would ignore SIGTERM) and its
  /// group fails as if it had crashed.
  void check_watchdog() {
    if (group_ended_ || stop_reason_ != StopReason::None) return;
    const auto now = std::chrono::steady_clock::now();
    for (auto& w : workers_) {
      if (!w->running || w->hung || !w->last_progress) continue;
      if (now - *w->last_progress < opt_.watchdog_timeout) continue;
      w->hung = true;
      spdlog::warn(
          "worker rank {} (local rank {}, pid {}) made no progress for {} ms "
          "(--watchdog_timeout): killing it",
          w->placement.global_rank, w->placement.local_rank, w->pid,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - *w->last_progress).count());
      launcher_.signal_group(w->pid, SIGKILL);
    }
  }

  // ---- rounds -----------------------------------------------------------------------------

  void start_round() {
    emit("rendezvous_start", {{"restart_count", restart_count_}});
    rdzv_.next_rendezvous([this](rdzv::RendezvousResult result) {
      if (finished_) return;
      if (pending_signal_ != 0) return advance();
      if (auto* error = std::get_if<rdzv::RendezvousError>(&result)) {
        emit("rendezvous_failed", {{"message", error->message}});
        spdlog::error("rendezvous failed: {}", error->message);
        return finish(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)));
      }
      const auto& info = std::get<rdzv::RendezvousInfo>(result);
      emit("rendezvous_complete", {{"round", info.round},
                                   {"group_rank", info.group_rank},
                                   {"group_world_size", info.group_world_size},
                                   {"restart_count", info.restart_count},
                                   {"master_addr", info.master_addr},
                                   {"master_port", info.master_port}});
      start_workers(info);
    });
  }

  /// Between rounds the rendezvous decides: join again, the job is over, or it is lost.
  void on_notice(rdzv::Notice notice) {
    if (finished_) return;
    waiting_round_.reset();  // that round is over for this node
    if (auto* restart = std::get_if<rdzv::Restart>(&notice)) {
      emit("restart", {{"reason", restart->reason},
                       {"counted", restart->counted},
                       {"restart_count", restart->restart_count}});
      restart_count_ = restart->restart_count;
      if (restart->counted)
        spdlog::warn("restarting workers: restart {} of {} ({})", restart->restart_count,
                     opt_.spec.max_restarts, restart->reason);
      else
        spdlog::warn("restarting workers for a new round: {}", restart->reason);
      restart_ = *restart;
    } else if (auto* closed = std::get_if<rdzv::Closed>(&notice)) {
      emit("job_closed", {{"message", closed->message}});
      closed_ = *closed;
    } else {
      lost_ = std::get<rdzv::RendezvousError>(notice);
    }
    // Healthy -> Stopped: the rendezvous asks this node to stop its workers.
    if (!idle_ && !group_ended_ && stop_reason_ == StopReason::None)
      stop_group(StopReason::Requested, SIGTERM);
    advance();
  }

  /// Once no worker runs and their output is drained: act on what is pending.
  void advance() {
    if (finished_ || !idle_) return;
    if (pending_signal_ != 0) {
      rdzv_.leave("received " + common::signal_name(pending_signal_));
      return finish(job_exit_code(JobOutcome::signalled(pending_signal_)));
    }
    if (lost_) {
      spdlog::error("{}", lost_->message);
      return finish(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)));
    }
    if (closed_) return conclude(*closed_);
    if (restart_) {
      restart_.reset();
      return start_round();
    }
    // Otherwise the rendezvous has not answered this node's report yet.
  }

  /// For a Python job whose workers said "No module named 'torch'" or whose interpreter could
  /// not start: which interpreter ran and how to choose another.
  std::optional<std::string> interpreter_trouble() const {
    if (opt_.interpreter_origin.empty()) return std::nullopt;
    bool missing_torch = false;
    bool cannot_run = false;
    for (const auto& w : workers_) {
      if (w->err != nullptr && w->err->saw_missing_torch) missing_torch = true;
      if (!w->launch_error.empty()) cannot_run = true;
    }
    if (!missing_torch && !cannot_run) return std::nullopt;
    return interpreter_hint(opt_.interpreter, opt_.interpreter_origin, missing_torch);
  }

  /// The failure report names the workers' error files: the private temporary directory they
  /// are in (no --log_dir) is kept for the user to read instead of removed at exit.
  void keep_named_error_files() {
    if (temp_dir_.empty()) return;
    const bool named = std::any_of(failures_.begin(), failures_.end(), [](const auto& f) {
      return f.error.has_value() && !f.error_file.empty();
    });
    if (!named) return;
    spdlog::info("the error files named below are kept in {} (remove it when done)",
                 temp_dir_.string());
    temp_dir_.clear();
  }

  /// torchrun's @record: a launcher started with TORCHELASTIC_ERROR_FILE (by a scheduler such
  /// as TorchX) leaves the root cause's error file there, its exit code filled in.
  void copy_root_cause_for_parent(const ProcessFailure& root) {
    auto it = opt_.agent_env.find("TORCHELASTIC_ERROR_FILE");
    if (it == opt_.agent_env.end() || it->second.empty()) return;
    const std::string& parent_file = it->second;
    std::ifstream in(root.error_file);
    if (root.error_file.empty() || !in) {
      spdlog::info(
          "local rank {} failed with no error file: nothing to copy to {} (decorate the "
          "entry point with @record for a traceback)",
          root.local_rank, parent_file);
      return;
    }
    std::stringstream text;
    text << in.rdbuf();
    const int code = root.status.signal != 0 ? -root.status.signal : root.status.code;
    auto json = error_file_for_parent(text.str(), code);
    if (!json) {
      spdlog::warn("the error file {} is not JSON: not copied to {}", root.error_file, parent_file);
      return;
    }
    const std::string partial = parent_file + ".partial";
    {
      std::ofstream out(partial, std::ios::trunc);
      out << *json;
      if (!out.flush()) {
        spdlog::warn("cannot write {}: the root cause is not copied to TORCHELASTIC_ERROR_FILE",
                     partial);
        return;
      }
    }
    std::error_code ec;
    fs::rename(partial, parent_file, ec);
    if (ec)
      spdlog::warn("cannot write {}: {}", parent_file, ec.message());
    else
      spdlog::info("copied the root cause's error file to TORCHELASTIC_ERROR_FILE {}", parent_file);
  }

  /// The job is over: report and exit as the rendezvous says, the same on every node.
  void conclude(const rdzv::Closed& closed) {
    switch (closed.outcome) {
      case rdzv::JobOutcomeKind::Succeeded:
        return finish(job_exit_code(JobOutcome::of(JobEnd::Succeeded)));
      case rdzv::JobOutcomeKind::TimedOut:
        spdlog::error("rendezvous failed: {}", closed.message);
        return finish(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)));
      case rdzv::JobOutcomeKind::Failed:
        break;
    }
    if (!failures_.empty()) {
      keep_named_error_files();
      write_all(STDERR_FILENO, format_failure_report(opt_.script, host_, failures_, restart_count_,
                                                     opt_.spec.max_restarts, log_loss()));
      copy_root_cause_for_parent(failures_.front());
      if (auto hint = interpreter_trouble()) write_all(STDERR_FILENO, *hint);
    } else
      spdlog::error("the job failed on another node: {}", closed.message);
    // A job that failed without a worker failing (a node was lost) still must not exit 0.
    ExitStatus root{closed.exit_code, closed.signal};
    if (root.ok()) root.code = 1;
    finish(job_exit_code(JobOutcome::workers_failed(root, opt_.spec.max_restarts)));
  }

  void start_workers(const rdzv::RendezvousInfo& round) {
    if (zygote_ != nullptr && zygote_->state() == PythonZygote::State::Starting) {
      // The zygote still imports torch: the group starts from it once it is ready (or has
      // failed, or kZygoteReadyTimeout passed). Signals and notices are acted on meanwhile.
      waiting_round_ = round;
      return;
    }
    round_ = round;
    restart_count_ = round.restart_count;
    idle_ = false;
    const fs::path attempt_dir = log_root_ / ("attempt_" + std::to_string(restart_count_));
    std::error_code ec;
    fs::remove_all(attempt_dir, ec);  // a stale error.json must not be blamed on this attempt
    workers_.clear();
    failures_.clear();
    filtered_out_ =
        open_filtered_log(attempt_dir, "filtered_stdout.log", opt_.duplicate_stdout_filters);
    filtered_err_ =
        open_filtered_log(attempt_dir, "filtered_stderr.log", opt_.duplicate_stderr_filters);
    stop_reason_ = StopReason::None;
    group_ended_ = false;
    const std::string path_env = search_path(opt_.agent_env);
    const std::string executable = resolve_executable(opt_.spec.argv.front(), path_env);
    spdlog::debug("starting {} workers (restart {}): master {}:{}", opt_.spec.local_world_size,
                  restart_count_, round.master_addr, round.master_port);
    std::map<int, EnvMap> envs;  // by local rank
    for (const WorkerPlacement& p : place_workers(round, opt_.spec.local_world_size)) {
      auto w = std::make_unique<WorkerRuntime>();
      w->placement = p;
      const fs::path dir = attempt_dir / std::to_string(p.local_rank);
      fs::create_directories(dir, ec);
      if (ec) {
        spdlog::error("cannot create {}: {}", dir.string(), ec.message());
        return finish(job_exit_code(JobOutcome::of(JobEnd::Internal)));
      }
      w->error_file = (dir / "error.json").string();
      // The agent's store (launcher/agent_store.h), or worker rank 0's with --agent_store off.
      WorkerEnvInputs in{&opt_.spec,
                         &round_,
                         p,
                         rdzv_.run_id(),
                         opt_.spec.use_agent_store,
                         w->error_file,
                         socket_path_,
                         checkpoint_requested_};
      envs[p.local_rank] = build_worker_env(opt_.agent_env, in);
      workers_.push_back(std::move(w));
    }
    // Standbys first, all at once: each must acknowledge its hand-over before it counts as the
    // worker; the ranks whose standby did not start afresh below.
    std::map<int, LaunchedProcess> handed;
    if (standbys_active() && !executable.empty()) {
      // With a zygote, the ranks without a standby get one now (a fork each): the first group
      // imports torch once, not once per worker.
      if (zygote_ != nullptr && zygote_->state() == PythonZygote::State::Ready)
        start_standbys(executable);
      std::vector<std::string> warnings;
      handed = standbys_.hand_over(envs, warnings);
      for (const auto& line : warnings) spdlog::warn("{}", line);
    }
    auto plan = std::make_shared<LaunchPlan>();
    plan->executable = executable;
    plan->path_env = path_env;
    plan->attempt_dir = attempt_dir;
    plan->envs = std::move(envs);
    plan->handed = std::move(handed);
    plan->from_standby = static_cast<int>(plan->handed.size());
    plan->cgroup_procs_fd = opt_.cleanup != nullptr ? opt_.cleanup->begin_group() : -1;
    // The standbys handed over run already: they are workers before any launch.
    for (auto& w : workers_) {
      if (plan->handed.count(w->placement.local_rank) == 0) continue;
      if (opt_.cleanup != nullptr)
        opt_.cleanup->adopt(plan->handed.at(w->placement.local_rank).pid);
      launch_one(*plan, *w);
    }
    launching_ = true;
    launch_next(std::move(plan), 0);
  }

  /// What start_workers hands to each launch step.
  struct LaunchPlan {
    std::string executable;
    std::string path_env;
    fs::path attempt_dir;
    std::map<int, EnvMap> envs;  // by local rank
    std::map<int, LaunchedProcess> handed;
    int from_standby = 0;
    int cgroup_procs_fd = -1;
  };

  /// Starts worker `index`, then lets the event loop run before the next: a stop signal that
  /// comes while a large group starts is acted on between two launches, not after the last.
  void launch_next(std::shared_ptr<LaunchPlan> plan, size_t index) {
    while (index < workers_.size() && workers_[index]->pid > 0) ++index;  // a standby's
    if (index < workers_.size() && stop_reason_ == StopReason::None && !finished_) {
      launch_one(*plan, *workers_[index]);
      asio::post(io_, [this, plan, index] { launch_next(plan, index + 1); });
      return;
    }
    launching_ = false;
    if (finished_) return;
    // Init -> Stopped for the workers not started: a stop came while the group started.
    const size_t planned = workers_.size();
    workers_.erase(
        std::remove_if(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->pid <= 0 && w->launch_error.empty(); }),
        workers_.end());
    if (workers_.size() < planned)
      spdlog::info("stopped starting workers: {} of {} started", workers_.size(), planned);
    if (workers_.empty()) return on_group_stopped();  // Init -> Stopped: none had started
    for (auto& w : workers_) {
      if (!w->launch_error.empty()) {
        // Init -> Failed: a worker that cannot start fails its group like a crash would.
        spdlog::error("local rank {} did not start: {}", w->placement.local_rank, w->launch_error);
        w->status.code = 127;
        record_failure(*w);
      }
    }
    nlohmann::json pids = nlohmann::json::array();
    for (auto& w : workers_) pids.push_back(w->pid);
    emit("workers_started", {{"count", workers_.size()},
                             {"pids", pids},
                             {"restart_count", restart_count_},
                             {"from_standby", plan->from_standby}});
    arm_watchdog();
    arm_standbys(plan->executable);
    // SIGCHLD may have arrived before every pid was known.
    reap_children();
    evaluate();
  }

  void launch_one(const LaunchPlan& plan, WorkerRuntime& w) {
    const WorkerPlacement& p = w.placement;
    const fs::path dir = plan.attempt_dir / std::to_string(p.local_rank);
    if (plan.executable.empty()) {
      w.launch_error = "command not found: " + opt_.spec.argv.front() + " (PATH=" + plan.path_env +
                       "); check the script name or set PYTHON_EXEC";
      return;
    }
    auto standby = plan.handed.find(p.local_rank);
    ProcessSpec spec{plan.executable, opt_.spec.argv, to_envp(plan.envs.at(p.local_rank))};
    spec.cgroup_procs_fd = plan.cgroup_procs_fd;
    if (static_cast<size_t>(p.local_rank) < opt_.cpus_by_local_rank.size())
      spec.cpus = opt_.cpus_by_local_rank[static_cast<size_t>(p.local_rank)];
    auto launched = standby != plan.handed.end()
                        ? std::variant<LaunchedProcess, std::string>(standby->second)
                        : launcher_.launch(spec);
    if (auto* why = std::get_if<std::string>(&launched)) {
      w.launch_error = *why;
    } else {
      const LaunchedProcess& lp = std::get<LaunchedProcess>(launched);
      w.pid = lp.pid;
      w.running = true;
      w.out = open_stream(lp.stdout_fd, p, launcher::StdStreams::Out, dir);
      w.err = open_stream(lp.stderr_fd, p, launcher::StdStreams::Err, dir);
      read_more(w.out);
      read_more(w.err);
    }
  }

  bool standbys_active() const { return opt_.standby_workers; }

  /// --standby_workers: a while after a group starts, one standby per local rank for the
  /// next restart.
  void arm_standbys(const std::string& executable) {
    if (!standbys_active() || executable.empty()) return;
    standby_timer_.expires_after(kStandbyDelay);
    standby_timer_.async_wait([this, executable](const boost::system::error_code& ec) {
      if (ec || finished_) return;
      start_standbys(executable);
    });
  }

  /// A standby for every local rank that has none (from the zygote when it runs).
  void start_standbys(const std::string& executable) {
    if (!standbys_.enabled()) return;
    nlohmann::json started = nlohmann::json::array();
    for (int local = 0; local < opt_.spec.local_world_size; ++local) {
      if (standbys_.has(local)) continue;
      ProcessSpec ps{executable,
                     opt_.python_bootstrap.empty()
                         ? opt_.spec.argv
                         : build_python_standby_command(opt_.spec.argv, opt_.python_bootstrap,
                                                        opt_.standby_preload),
                     to_envp(build_standby_env(opt_.agent_env, opt_.spec, local, rdzv_.run_id()))};
      if (opt_.cleanup != nullptr) ps.cgroup_procs_fd = opt_.cleanup->standby_procs_fd();
      if (std::string why = standbys_.start(local, std::move(ps)); !why.empty())
        spdlog::warn("cannot start a standby for local rank {}: {}", local, why);
      else
        started.push_back(standbys_.pid_of(local));
    }
    if (!started.empty())
      emit("standbys_started",
           {{"count", started.size()},
            {"pids", started},
            {"forked", zygote_ != nullptr && zygote_->state() == PythonZygote::State::Ready}});
  }

  // ---- the Python zygote -------------------------------------------------------------------

  /// --standby_workers with a Python script: one interpreter (agent/python_zygote.h) starts
  /// importing torch at once, while the rendezvous forms; the first group's workers and every
  /// standby are then forked from it. Needs the agent to be a child subreaper (GroupCleanup),
  /// which adopts the forks; without one, standbys start one interpreter each.
  void start_zygote() {
    if (!standbys_active() || opt_.python_bootstrap.empty() || opt_.cleanup == nullptr) return;
    const std::string executable =
        resolve_executable(opt_.spec.argv.front(), search_path(opt_.agent_env));
    if (executable.empty()) return;  // start_workers reports the missing command
    std::vector<std::string> argv = build_python_standby_command(
        opt_.spec.argv, opt_.python_bootstrap, opt_.standby_preload, /*zygote=*/true);
    ProcessSpec ps{executable, argv,
                   to_envp(build_standby_env(opt_.agent_env, opt_.spec, 0, rdzv_.run_id()))};
    ps.cgroup_procs_fd = opt_.cleanup->standby_procs_fd();
    zygote_ = std::make_unique<PythonZygote>(launcher_);
    if (std::string why = zygote_->start(std::move(ps)); !why.empty()) {
      spdlog::warn("cannot start the Python zygote: {}; standbys start one interpreter each", why);
      zygote_.reset();
      return;
    }
    zygote_started_ = std::chrono::steady_clock::now();
    emit("zygote_started", {{"pid", zygote_->pid()}});
    zygote_wait_.assign(::dup(zygote_->control_fd()));
    zygote_wait_.async_wait(asio::posix::stream_descriptor::wait_read,
                            [this](const boost::system::error_code& ec) {
                              if (ec || finished_ || zygote_settled_) return;
                              on_zygote_settled(zygote_->on_readable());
                            });
    zygote_timer_.expires_after(kZygoteReadyTimeout);
    zygote_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || finished_ || zygote_ == nullptr ||
          zygote_->state() != PythonZygote::State::Starting)
        return;
      zygote_->stop();
      on_zygote_settled(
          PythonZygote::State::Gone,
          "it was not ready within " + std::to_string(kZygoteReadyTimeout.count()) + " s");
    });
  }

  /// Starting -> Ready or Gone: standbys come from the zygote, or there are none; a group
  /// that waited for it starts now.
  void on_zygote_settled(PythonZygote::State state, const std::string& why = "") {
    if (zygote_settled_) return;
    zygote_settled_ = true;
    zygote_timer_.cancel();
    boost::system::error_code ignored;
    zygote_wait_.close(ignored);
    if (state == PythonZygote::State::Ready) {
      zygote_ready_ = true;
      standbys_.use_launcher(*zygote_);
      emit("zygote_ready", {{"pid", zygote_->pid()},
                            {"import_ms", std::chrono::duration<double, std::milli>(
                                              std::chrono::steady_clock::now() - zygote_started_)
                                              .count()}});
    } else {
      // What the zygote could not import, a standby cannot either.
      const std::string failure = why.empty() ? zygote_->failure() : why;
      spdlog::warn(
          "no standbys: the Python zygote (pid {}) failed: {}{}; workers start afresh",
          zygote_->pid(), failure,
          failure.find("cannot import torch") != std::string::npos ? "; " + zygote_hint() : "");
      standbys_.disable();
    }
    if (waiting_round_ && !finished_) {
      const rdzv::RendezvousInfo round = *waiting_round_;
      waiting_round_.reset();
      start_workers(round);
    }
  }

  /// The zygote was reaped: while it starts, as a failure; once it ran, standbys start one
  /// interpreter each from now on.
  void on_zygote_exit() {
    if (finished_) return;
    if (!zygote_settled_) {
      on_zygote_settled(PythonZygote::State::Gone);
    } else if (zygote_ready_ && standbys_.enabled()) {
      spdlog::warn(
          "the Python zygote (pid {}) ended: {}; standbys start one interpreter each from now on",
          zygote_->pid(), zygote_->failure());
      standbys_.use_launcher(launcher_);
    }
  }

  std::string zygote_hint() const {
    return "exit code 3 means " + opt_.spec.argv.front() +
           " cannot import torch: set PYTHON_EXEC to an interpreter that can";
  }

  /// The attempt's filtered_*.log for --duplicate_*_filters; null when none are given or the
  /// file cannot be created (said once: the job goes on without it).
  static std::shared_ptr<FilteredLog> open_filtered_log(const fs::path& attempt_dir,
                                                        const std::string& name,
                                                        const std::vector<std::string>& needles) {
    if (needles.empty()) return nullptr;
    std::error_code ec;
    fs::create_directories(attempt_dir, ec);
    const fs::path file = attempt_dir / name;
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      spdlog::warn("cannot open {}: {}; filtered lines are not copied", file.string(),
                   std::strerror(errno));
      return nullptr;
    }
    return std::make_shared<FilteredLog>(fd, needles);
  }

  std::shared_ptr<OutputStream> open_stream(int fd, const WorkerPlacement& placement,
                                            launcher::StdStreams which, const fs::path& dir) {
    const int local_rank = placement.local_rank;
    auto s = std::make_shared<OutputStream>(io_, fd);
    const bool redirected = has_stream(opt_.redirects.for_rank(local_rank), which);
    const bool teed = has_stream(opt_.tee.for_rank(local_rank), which);
    const bool shown = !opt_.console_ranks || opt_.console_ranks->count(local_rank) > 0;
    // --tee wins over --redirects, as in torchrun (its tee adds the console to a redirect).
    if ((!redirected || teed) && shown)
      s->console_fd = which == launcher::StdStreams::Out ? STDOUT_FILENO : STDERR_FILENO;
    auto tmpl = opt_.agent_env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    s->prefix = console_prefix(tmpl == opt_.agent_env.end() ? "" : tmpl->second, opt_.spec.role,
                               placement.global_rank, local_rank);
    s->filtered = which == launcher::StdStreams::Out ? filtered_out_ : filtered_err_;
    if (redirected || teed) {
      const fs::path file =
          dir / (which == launcher::StdStreams::Out ? "stdout.log" : "stderr.log");
      s->file_fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      s->file_path = file.string();
      if (s->file_fd < 0)
        spdlog::warn("cannot open {}: {}; its output goes to the console", file.string(),
                     std::strerror(errno));
      if (s->file_fd < 0 && s->console_fd < 0)
        s->console_fd = which == launcher::StdStreams::Out ? STDOUT_FILENO : STDERR_FILENO;
    }
    return s;
  }

  /// The handler owns the stream: a read aborted by close() may run after the group is gone.
  void read_more(std::shared_ptr<OutputStream> s) {
    OutputStream& stream = *s;
    stream.pipe.async_read_some(
        asio::buffer(stream.chunk), [this, s](const boost::system::error_code& ec, size_t n) {
          if (!s->open) return;
          if (n > 0 && s->emit(s->lines.feed(std::string_view(s->chunk.data(), n))))
            report_log_failure(s);
          if (ec) {
            if (s->close()) report_log_failure(s);
            maybe_drained();
            return;
          }
          read_more(s);
        });
  }

  /// Once per log file: the job goes on without that file's output (a full disk must not stop
  /// training); the loss is counted in the failure report and at the job's end.
  void report_log_failure(const std::shared_ptr<OutputStream>& s) {
    failed_logs_.push_back(s);
    spdlog::warn(
        "cannot write worker output to {}: {}; {} bytes lost so far, the job goes on without "
        "this file's output (free space, or pick another --log_dir)",
        s->file_path, std::strerror(s->file_error), s->file_lost);
    emit("log_write_failed", {{"path", s->file_path},
                              {"error", std::strerror(s->file_error)},
                              {"bytes_lost", s->file_lost}});
  }

  LogLoss log_loss() const {
    LogLoss loss;
    for (const auto& s : failed_logs_) {
      ++loss.files;
      loss.bytes += s->file_lost;
    }
    return loss;
  }

  // ---- observing workers ------------------------------------------------------------------

  void reap_children() {
    while (true) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      if (standbys_.on_exit(pid, ExitStatus::from_wait_status(status))) continue;
      if (zygote_ != nullptr && zygote_->on_exit(pid, ExitStatus::from_wait_status(status))) {
        on_zygote_exit();
        continue;
      }
      // As a child subreaper the agent also reaps orphaned descendants of its workers (and the
      // cgroup watcher): a pid that is no running worker's is only reaped.
      for (auto& w : workers_) {
        if (w->running && w->pid == pid) on_worker_exit(*w, ExitStatus::from_wait_status(status));
      }
    }
    evaluate();
  }

  void on_worker_exit(WorkerRuntime& w, ExitStatus status) {
    w.running = false;
    w.status = status;
    spdlog::debug("local rank {} (pid {}) ended: {}", w.placement.local_rank, w.pid,
                  describe_exit(status));
    if (status.ok()) return;
    // Healthy -> Failed for this worker, unless the agent itself was stopping the group.
    if (stop_reason_ == StopReason::None) return record_failure(w);
    // Failed too while its group was being stopped for another worker's failure: a worker
    // that wrote an error file failed on its own (the stop signal writes none), and is
    // reported with its traceback, as torchrun reports every rank failing together.
    if (stop_reason_ == StopReason::WorkerFailed && wrote_error_file(w)) record_failure(w);
  }

  static bool wrote_error_file(const WorkerRuntime& w) {
    std::error_code ec;
    return !w.error_file.empty() && fs::file_size(w.error_file, ec) > 0 && !ec;
  }

  void record_failure(WorkerRuntime& w) {
    ProcessFailure f;
    f.local_rank = w.placement.local_rank;
    f.global_rank = w.placement.global_rank;
    f.pid = w.pid;
    f.status = w.status;
    f.time = std::chrono::system_clock::now();
    f.error_file = w.error_file;
    if (!w.launch_error.empty()) {
      f.error = ErrorFileContent{w.launch_error, "", std::nullopt};
      f.error_file.clear();  // the worker never ran, so no file of its own exists
    } else if (std::ifstream in(w.error_file); in) {
      std::stringstream text;
      text << in.rdbuf();
      auto parsed = parse_error_file(text.str());
      if (auto* content = std::get_if<ErrorFileContent>(&parsed))
        f.error = *content;
      else
        f.error_file_problem = std::get<std::string>(parsed);
    }
    if (w.hung && !f.error)
      f.error = ErrorFileContent{"no progress reported for " +
                                     std::to_string(opt_.watchdog_timeout.count()) +
                                     " ms: killed by the watchdog (--watchdog_timeout)",
                                 "", std::nullopt};
    failures_.push_back(std::move(f));
  }

  GroupObservation observe() const {
    GroupObservation obs;
    for (const auto& w : workers_) {
      if (w->running)
        ++obs.running;
      else if (w->status.ok() && w->launch_error.empty())
        ++obs.succeeded;
      else
        ++obs.failed;
    }
    return obs;
  }

  void evaluate() {
    // While a group starts, exits are recorded and judged once every worker was launched.
    if (finished_ || workers_.empty() || group_ended_ || launching_) return;
    const GroupObservation obs = observe();
    if (stop_reason_ != StopReason::None) {
      if (obs.running == 0) on_group_stopped();
      return;
    }
    switch (decide(obs)) {
      case Action::Monitor:
        return;
      case Action::Succeed:
        // Healthy -> Succeeded: the job is done once the rendezvous says every node is.
        group_ended_ = true;
        return drain_then([this] {
          idle_ = true;
          rdzv_.report_success();
          advance();
        });
      case Action::StopGroup: {
        // Healthy -> Unhealthy: report at once so other nodes stop too, then stop ours.
        const ProcessFailure& root = failures_.front();
        const std::string what = fmt::format(
            "worker rank {} (local rank {}, pid {}) on {} failed with {}", root.global_rank,
            root.local_rank, root.pid, host_, describe_exit(root.status));
        spdlog::warn("{}; stopping the group", what);
        emit("failure_detected", {{"rank", root.global_rank},
                                  {"local_rank", root.local_rank},
                                  {"pid", root.pid},
                                  {"exit_code", root.status.code},
                                  {"signal", root.status.signal},
                                  {"how", how_detected(root)}});
        rdzv_.report_failure(
            rdzv::WorkersFailed{round_.round, what, root.status.code, root.status.signal});
        stop_group(StopReason::WorkerFailed, SIGTERM);
        return;
      }
    }
  }

  /// "exit" (SIGCHLD), "watchdog" (no progress) or "launch" (never started), for the event log.
  std::string how_detected(const ProcessFailure& failure) const {
    if (failure.pid <= 0) return "launch";
    for (const auto& w : workers_)
      if (w->pid == failure.pid && w->hung) return "watchdog";
    return "exit";
  }

  // ---- stopping ---------------------------------------------------------------------------

  void on_signal(int sig) {
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      // A preemption notice: the workers decide what to do; the group keeps running.
      size_t reached = 0;
      for (auto& w : workers_)
        if (w->running && launcher_.signal_group(w->pid, sig)) ++reached;
      if (reached > 0) spdlog::info("forwarding {} to the workers", common::signal_name(sig));
      if (sig == SIGUSR1) {
        // Remembered: workers started later (the first group, or one after a restart) learn of
        // the notice from DDPRUN_CHECKPOINT_REQUESTED=1 instead of the signal they missed.
        if (reached == 0)
          spdlog::info(
              "received SIGUSR1 while no workers run: workers started from now on get "
              "DDPRUN_CHECKPOINT_REQUESTED=1");
        checkpoint_requested_ = true;
      } else if (reached == 0) {
        spdlog::info("received SIGUSR2 while no workers run: nothing to forward");
      }
      return;
    }
    if (pending_signal_ != 0) {
      spdlog::warn("received {} again: killing the workers now", common::signal_name(sig));
      kill_remaining();
      return;
    }
    pending_signal_ = sig;
    emit("signal", {{"signal", common::signal_name(sig)}});
    spdlog::warn("received {}: stopping the workers", common::signal_name(sig));
    // Between rounds (or in a rendezvous): leave now. Group already ending: the end of the
    // drain leaves.
    if (idle_) return advance();
    if (group_ended_) return;
    stop_group(StopReason::Signalled, sig);
  }

  void stop_group(StopReason reason, int stop_signal) {
    if (stop_reason_ == StopReason::None) stop_started_ = std::chrono::steady_clock::now();
    if (stop_reason_ == StopReason::None || reason == StopReason::Signalled) stop_reason_ = reason;
    for (auto& w : workers_) {
      if (!w->running) continue;
      launcher_.signal_group(w->pid, stop_signal);
      // A stopped (SIGSTOP) worker acts on the stop signal only once continued.
      if (stop_signal != SIGKILL) launcher_.signal_group(w->pid, SIGCONT);
    }
    shutdown_timer_.expires_after(opt_.spec.shutdown_timeout);
    shutdown_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      if (observe().running > 0)
        spdlog::warn("workers still running {} ms after the stop signal: sending SIGKILL",
                     opt_.spec.shutdown_timeout.count());
      kill_remaining();
    });
    evaluate();
  }

  void kill_remaining() {
    for (auto& w : workers_)
      if (w->running) launcher_.signal_group(w->pid, SIGKILL);
  }

  /// Unhealthy -> Stopped: every worker of the group has been reaped.
  void on_group_stopped() {
    group_ended_ = true;
    shutdown_timer_.cancel();
    // group_ended_ stays set until the next group starts: a late SIGCHLD during the
    // rendezvous must not see the stopped old group and act a second time.
    drain_then([this] {
      emit("teardown_done", {{"teardown_ms", std::chrono::duration<double, std::milli>(
                                                 std::chrono::steady_clock::now() - stop_started_)
                                                 .count()}});
      idle_ = true;
      advance();
    });
  }

  /// Kills what is left in the workers' process groups (e.g. grandchildren), then waits a
  /// bounded time for their output pipes to close before `next`.
  void drain_then(std::function<void()> next) {
    for (auto& w : workers_)
      if (w->pid > 0 && launcher_.signal_group(w->pid, SIGKILL))
        spdlog::debug("killed leftover processes of local rank {}", w->placement.local_rank);
    // And what left the process groups (setsid): every descendant but the standbys.
    if (opt_.cleanup != nullptr) {
      std::set<pid_t> standbys;
      for (int local = 0; local < opt_.spec.local_world_size; ++local)
        if (standbys_.has(local)) standbys.insert(standbys_.pid_of(local));
      if (zygote_ != nullptr && zygote_->state() != PythonZygote::State::Gone)
        standbys.insert(zygote_->pid());
      if (int killed = opt_.cleanup->end_group(standbys); killed > 0)
        spdlog::debug("killed {} leftover descendant(s) of the group", killed);
    }
    after_drain_ = std::move(next);
    drain_timer_.expires_after(kDrainTimeout);
    drain_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (auto& w : workers_) {
        if (w->out && w->out->open) w->out->close();
        if (w->err && w->err->open) w->err->close();
      }
      maybe_drained();
    });
    maybe_drained();
  }

  void maybe_drained() {
    if (!after_drain_) return;
    for (auto& w : workers_)
      if ((w->out && w->out->open) || (w->err && w->err->open)) return;
    drain_timer_.cancel();
    auto next = std::move(after_drain_);
    after_drain_ = nullptr;
    asio::post(io_, std::move(next));
  }

  void finish(int code) {
    if (finished_) return;
    finished_ = true;
    exit_code_ = code;
    drain_reports();
    nlohmann::json end{{"exit_code", code}};
    if (const LogLoss loss = log_loss(); loss.files > 0) {
      end["log_write_failures"] = loss.files;
      end["log_bytes_lost"] = loss.bytes;
      spdlog::warn("{} bytes of worker output could not be written to {} log file(s) (see above)",
                   loss.bytes, loss.files);
    }
    emit("job_end", end);
    watchdog_timer_.cancel();
    standby_timer_.cancel();
    standbys_.clear();
    zygote_timer_.cancel();
    if (zygote_ != nullptr) zygote_->stop();
    boost::system::error_code closed;
    reports_.close(closed);
    kill_remaining();
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    shutdown_timer_.cancel();
    drain_timer_.cancel();
    for (auto& w : workers_) {
      if (w->out && w->out->open) w->out->close();
      if (w->err && w->err->open) w->err->close();
    }
    // Reap what SIGKILL just ended so nothing is left as a zombie of ours.
    for (auto& w : workers_)
      if (w->running)
        while (::waitpid(w->pid, nullptr, 0) < 0 && errno == EINTR) {
        }
    if (opt_.cleanup != nullptr) opt_.cleanup->finish();
    if (opt_.on_finish) opt_.on_finish();
  }

  asio::io_context& io_;
  AgentOptions opt_;
  rdzv::RendezvousHandler& rdzv_;
  ProcessLauncher& launcher_;
  asio::signal_set signals_;
  asio::steady_timer shutdown_timer_;
  asio::steady_timer drain_timer_;
  asio::steady_timer watchdog_timer_;
  asio::steady_timer standby_timer_;
  asio::steady_timer zygote_timer_;
  asio::posix::stream_descriptor zygote_wait_;  ///< a copy of the zygote's control socket
  asio::local::datagram_protocol::socket reports_;
  std::vector<char> report_buffer_;
  std::string socket_dir_;
  std::string socket_path_;
  EventLog events_;
  std::chrono::steady_clock::time_point stop_started_;
  std::string host_;
  fs::path log_root_;
  std::shared_ptr<FilteredLog> filtered_out_;  ///< this attempt's filtered_stdout.log
  std::shared_ptr<FilteredLog> filtered_err_;  ///< this attempt's filtered_stderr.log
  fs::path temp_dir_;
  rdzv::RendezvousInfo round_;
  std::vector<std::unique_ptr<WorkerRuntime>> workers_;
  std::vector<ProcessFailure> failures_;
  std::vector<std::shared_ptr<OutputStream>> failed_logs_;  ///< each reported once
  /// Before standbys_, which may use it as its launcher until it is destroyed.
  std::unique_ptr<PythonZygote> zygote_;
  StandbyPool standbys_;
  bool zygote_settled_ = false;  ///< ready, or failed before it was
  bool zygote_ready_ = false;
  std::chrono::steady_clock::time_point zygote_started_;
  /// A round that waits for the zygote to be ready before its workers start.
  std::optional<rdzv::RendezvousInfo> waiting_round_;
  StopReason stop_reason_ = StopReason::None;
  std::function<void()> after_drain_;
  int restart_count_ = 0;
  int pending_signal_ = 0;
  bool idle_ = true;                   ///< no worker group runs or drains: between rounds
  bool checkpoint_requested_ = false;  ///< SIGUSR1 arrived: later workers are told at start
  std::optional<rdzv::Restart> restart_;
  std::optional<rdzv::Closed> closed_;
  std::optional<rdzv::RendezvousError> lost_;
  bool group_ended_ = false;
  bool launching_ = false;  ///< launch_next() is starting the group's workers one by one
  bool finished_ = false;
  int exit_code_ = 0;
};

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options, rdzv::RendezvousHandler& rdzv,
                       ProcessLauncher& launcher)
    : impl_(std::make_unique<Impl>(io, std::move(options), rdzv, launcher)) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::run() { return impl_->run(); }

}  // namespace ddprun::agent
