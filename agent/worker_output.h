#pragma once
// Worker output: where each line of each rank's stdout and stderr goes (console, log file,
// filtered copy), the read loop over the pipes and the drain at the end of a group. The routing
// is a pure function; WorkerOutput owns the pipes and files of one group at a time.
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/deadline_timer.h"
#include "agent/failure_report.h"
#include "agent/worker.h"
#include "common/clock.h"
#include "common/result.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

/// Which standard streams of a worker go to log files (torchrun's Std: 0 none, 1 out, 2 err, 3
/// both).
enum class StdStreams : int { None = 0, Out = 1, Err = 2, All = 3 };

/// Whether `set` includes `which` (Out or Err).
bool has_stream(StdStreams set, StdStreams which);

/// --redirects / --tee: one default plus per-local-rank overrides ("3" or "0:1,1:2").
struct StdSpec {
  StdStreams all = StdStreams::None;
  std::map<int, StdStreams> per_rank;
  /// The setting for one local rank.
  StdStreams for_rank(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  /// Whether any rank's stream goes to a file.
  bool any() const { return all != StdStreams::None || !per_rank.empty(); }
};

/// How the job's worker output is shown and kept (the launcher's flags).
struct OutputSettings {
  StdSpec redirects;
  StdSpec tee;
  std::optional<std::set<int>> console_ranks;  ///< --local_ranks_filter
  /// --duplicate_stdout_filters / --duplicate_stderr_filters: worker lines containing any of
  /// these are also written, with their console prefix, to filtered_stdout.log /
  /// filtered_stderr.log in the attempt directory.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  std::string prefix_template;  ///< TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE ("" for the default)
  std::string role = "default";
  /// --dedup_output: identical console lines of several local ranks within this window are
  /// shown once, naming the ranks (agent/line_dedup.h); 0: off. Log files stay complete.
  std::chrono::milliseconds dedup_window{0};

  /// Whether any output goes to files (so a log directory is needed).
  bool wants_files() const {
    return redirects.any() || tee.any() || !duplicate_stdout_filters.empty() ||
           !duplicate_stderr_filters.empty();
  }
};

/// Where one stream of one rank goes.
struct StreamRoute {
  bool console = false;
  bool file = false;
};

/// --tee wins over --redirects, as in torchrun (its tee adds the console to a redirect);
/// --local_ranks_filter hides a rank from the console only.
StreamRoute route_stream(const OutputSettings& settings, int local_rank, StdStreams which);

/// Where one run's worker logs and error files go.
struct LogRoot {
  std::filesystem::path path;
  bool remove_at_exit = false;  ///< a private temporary directory holding only error files
};

/// `<log_dir>/<run_id>_XXXXXX`, as torchrun names it, so that a second run with the same
/// --rdzv_id (the default is "none") keeps the first run's logs; without --log_dir a private
/// temporary directory. Says where worker logs go.
common::Result<LogRoot> make_log_root(const std::string& log_dir, const std::string& run_id,
                                      bool wants_files);

/// The first failed write to one log file: reported once, the job goes on.
struct LogWriteFailure {
  std::string path;
  int error = 0;  ///< errno
  long long bytes_lost = 0;
};

/// The output of one worker group at a time.
class WorkerOutput {
 public:
  /// A failed write to a log file is warned about once per file, then `on_log_failure` runs.
  /// The drain's deadline and the dedup window's wake-ups are `timers` on `clock`.
  WorkerOutput(boost::asio::io_context& io, const common::Clock& clock, DeadlineTimers& timers,
               OutputSettings settings, std::function<void(const LogWriteFailure&)> on_log_failure);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  /// A new group: forgets the previous group's (closed) pipes and opens the attempt's filtered
  /// logs in `attempt_dir`.
  void begin_group(const std::filesystem::path& attempt_dir);
  /// Reads a started worker's stdout and stderr pipes (-1: none); `dir` holds its log files.
  void add(const WorkerPlacement& placement, int stdout_fd, int stderr_fd,
           const std::filesystem::path& dir);
  /// Calls `done` (from the event loop) once every pipe of the group has closed, or after
  /// `timeout`, when the rest are closed unread.
  void drain(std::chrono::milliseconds timeout, std::function<void()> done);
  /// Closes every pipe and file now (the job is over).
  void close_all();

  /// Calls `line(local_rank)` for each read of a worker's output that gives whole lines or parts
  /// of lines, a progress bar's redraw included (progress, for the watchdog).
  void on_line(std::function<void(int local_rank)> line);

  /// A line was typed in ddprun's terminal: its echo ended the line a prompt left open there,
  /// so a worker's next text starts a line of its own, with its prefix, on every console (when
  /// the console is a pipe or a file too, as torchrun's --tee prefixes the next line).
  void line_typed();

  /// A worker of this group printed "No module named 'torch'".
  bool saw_missing_torch() const;
  /// What could not be written to log files in the whole job.
  LogLoss log_loss() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
