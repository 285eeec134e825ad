#include "agent/worker_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>

#include "agent/group_cleanup.h"
#include "agent/line_buffer.h"
#include "agent/line_dedup.h"
#include "common/fd_write.h"
#include "common/log.h"

namespace ddprun::agent {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

using common::write_all;

/// How long part of a line waits for the rest before it is shown (LineBuffer::give_held): a
/// worker's print() under `python -u` writes the text and its '\n' in two writes, which come
/// well within it.
constexpr std::chrono::milliseconds kShowHeldAfter{100};

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

/// The attempt's filtered_*.log; null when no needles are given or the file cannot be created
/// (said once: the job goes on without it).
std::shared_ptr<FilteredLog> open_filtered_log(const fs::path& attempt_dir, const std::string& name,
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

struct OutputStream;

/// The stream whose line is open (begun, not ended) on each console (console_key): what another
/// stream shows there first ends that line, so a line never carries two streams' text.
using OpenLines = std::map<int, OutputStream*>;

/// Which console descriptor `fd` writes to, as OpenLines keys them: stderr counts as stdout
/// when both are the same file (a terminal, or `2>&1`), where a tqdm bar on stderr and a
/// print on stdout share lines.
int console_key(int fd) {
  struct stat out {
  }, err{};
  const bool same = ::fstat(STDOUT_FILENO, &out) == 0 && ::fstat(STDERR_FILENO, &err) == 0 &&
                    out.st_dev == err.st_dev && out.st_ino == err.st_ino;
  return fd == STDERR_FILENO && same ? STDOUT_FILENO : fd;
}

/// One stdout or stderr pipe of one worker: lines go to the console (prefixed) and/or a file.
struct OutputStream {
  OutputStream(asio::io_context& io, int fd) : pipe(io, fd), quiet(io) {}
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;
  asio::posix::stream_descriptor pipe;
  std::array<char, 64 * 1024> chunk{};
  LineBuffer lines;
  /// Armed after a read that left part of a line held: when nothing more comes meanwhile,
  /// that part is shown (kShowHeldAfter).
  asio::steady_timer quiet;
  int console_fd = -1;  ///< -1: not shown on the console
  std::string prefix;
  /// With --dedup_output: where console lines go instead of straight to console_fd.
  std::function<void(int fd, const std::string& line)> dedup;
  std::function<void()> printed;  ///< called after each read that gave lines or parts of lines
  int file_fd = -1;               ///< -1: not written to a file
  std::string file_path;
  std::shared_ptr<FilteredLog> filtered;  ///< null: no --duplicate_*_filters
  bool saw_missing_torch = false;         ///< a line said "No module named 'torch'"
  int file_error = 0;       ///< errno of the first failed write to the file (0: none yet)
  long long file_lost = 0;  ///< bytes that did not reach the file
  bool open = true;
  OpenLines* open_lines = nullptr;  ///< the group's, shared by its streams
  int console = -1;                 ///< console_key(console_fd)
  /// Part of this stream's current line is on the console, without its '\n' (a part of a long
  /// or progress line was shown): its next part continues it.
  bool line_shown = false;
  bool after_cr = false;  ///< and the last byte shown was '\r': the cursor is at its start
  /// With --dedup_output or --duplicate_*_filters: the current line as far as it came, for
  /// them, which take whole lines (a part of at most kMaxLinePiece).
  std::string whole;

  /// Ends another stream's line left open on this stream's console ("\n"); that stream shows
  /// its prefix again when it goes on.
  std::string end_others_line() {
    OutputStream*& owner = (*open_lines)[console];
    if (owner == nullptr || owner == this) return "";
    owner->line_shown = owner->after_cr = false;
    owner = nullptr;
    return "\n";
  }

  /// `piece` as the console shows it: the prefix before a line, and again after each carriage
  /// return within it (a progress bar that redraws itself keeps its prefix).
  std::string console_text(const LinePiece& piece) {
    std::string out = end_others_line();
    for (char c : piece.text) {
      if (c != '\r' && (!line_shown || after_cr)) out += prefix;
      out += c;
      line_shown = true;
      after_cr = c == '\r';
    }
    if (piece.ends_line) {
      if (!line_shown) out += prefix;  // an empty line
      out += '\n';
      line_shown = after_cr = false;
    }
    (*open_lines)[console] = line_shown ? this : nullptr;
    return out;
  }

  /// Gives a whole line to what compares or matches whole lines: --dedup_output, which then
  /// shows it, and --duplicate_*_filters.
  void take_whole(const std::string& line) {
    if (console_fd >= 0 && dedup) dedup(console_fd, line);
    if (filtered != nullptr && filtered->wants(line)) write_all(filtered->fd, prefix + line + "\n");
  }

  /// take_whole() of each line `piece` completes (or part as long as kMaxLinePiece).
  void whole_lines(const LinePiece& piece) {
    if (whole.empty() && piece.ends_line) return take_whole(piece.text);
    whole += piece.text;
    if (piece.ends_line || whole.size() >= kMaxLinePiece) {
      take_whole(whole);
      whole.clear();
    }
  }

  /// True when this call saw the first failed write to the file (to be reported once).
  bool emit(const std::vector<LinePiece>& done) {
    bool first_failure = false;
    if (!done.empty() && printed) printed();
    for (const auto& piece : done) {
      const std::string& line = piece.text;
      const bool to_dedup = console_fd >= 0 && dedup;
      if (console_fd >= 0 && !to_dedup) write_all(console_fd, console_text(piece));
      if (to_dedup || filtered != nullptr) whole_lines(piece);
      if (line.find("No module named 'torch'") != std::string::npos) saw_missing_torch = true;
      if (file_fd < 0) continue;
      // The file gets the bytes as the worker wrote them. Later writes are still tried: output
      // resumes once the disk has room again.
      size_t lost = 0;
      if (int err = write_all(file_fd, piece.ends_line ? line + "\n" : line, &lost); err != 0) {
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
    // A last line without its '\n' is ended on the console (the file keeps it as it was), and
    // what is left of one for --dedup_output or the filters is given to them.
    if (!whole.empty()) take_whole(whole);
    whole.clear();
    if (console_fd >= 0 && line_shown) {
      write_all(console_fd, "\n");
      (*open_lines)[console] = nullptr;
    }
    line_shown = after_cr = false;
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

}  // namespace

bool has_stream(StdStreams set, StdStreams which) {
  return (static_cast<int>(set) & static_cast<int>(which)) != 0;
}

StreamRoute route_stream(const OutputSettings& settings, int local_rank, StdStreams which) {
  const bool redirected = has_stream(settings.redirects.for_rank(local_rank), which);
  const bool teed = has_stream(settings.tee.for_rank(local_rank), which);
  const bool shown = !settings.console_ranks || settings.console_ranks->count(local_rank) > 0;
  return StreamRoute{(!redirected || teed) && shown, redirected || teed};
}

common::Result<LogRoot> make_log_root(const std::string& log_dir, const std::string& run_id,
                                      bool wants_files) {
  std::string tmpl;
  if (!log_dir.empty()) {
    std::error_code made;  // mkdtemp below names the problem
    fs::create_directories(log_dir, made);
    tmpl = (fs::path(log_dir) / (run_id + "_XXXXXX")).string();
  } else if (wants_files) {
    tmpl = (fs::temp_directory_path() / "ddprun-XXXXXX").string();  // logs: kept
  } else {
    // Error files alone, removed at the end: named after this agent, so that its watcher
    // removes the directory should the agent be SIGKILLed.
    tmpl = (fs::temp_directory_path() / ("ddprun-" + temp_dir_tag() + "-XXXXXX")).string();
  }
  if (::mkdtemp(tmpl.data()) == nullptr)
    return common::Error{"cannot create a directory for worker logs and error files from " + tmpl +
                         ": " + std::strerror(errno) + "; pass a writable --log_dir"};
  LogRoot root{tmpl, false};
  if (!log_dir.empty())
    spdlog::info("worker logs and error files go to {}/attempt_<n>/<local_rank>/", tmpl);
  else if (wants_files)
    spdlog::info("no --log_dir given: worker logs go to {}", tmpl);
  else
    root.remove_at_exit = true;  // only error files live there
  return root;
}

struct WorkerOutput::Impl {
  Impl(asio::io_context& io_, const common::Clock& clock_, DeadlineTimers& timers,
       OutputSettings settings_, std::function<void(const LogWriteFailure&)> on_log_failure_)
      : io(io_),
        clock(clock_),
        settings(std::move(settings_)),
        on_log_failure(std::move(on_log_failure_)),
        drain_timer(timers.make()),
        dedup_timer(timers.make()) {
    if (settings.dedup_window.count() > 0)
      dedup.emplace(settings.dedup_window, settings.prefix_template, settings.role);
  }

  void show(const std::vector<ConsoleLine>& lines) {
    for (const auto& line : lines) write_all(line.fd, line.text);
  }

  /// Wakes at the oldest waiting line's deadline to show what is due.
  void arm_dedup() {
    const auto next = dedup->next_deadline();
    if (!next || (dedup_armed_for && *dedup_armed_for <= *next)) return;
    dedup_armed_for = *next;
    dedup_timer->arm(*next, [this] {
      dedup_armed_for.reset();
      show(dedup->due(clock.now()));
      arm_dedup();
    });
  }

  void flush_dedup() {
    if (!dedup) return;
    dedup_timer->cancel();
    dedup_armed_for.reset();
    show(dedup->flush());
  }

  std::shared_ptr<OutputStream> open_stream(int fd, const WorkerPlacement& placement,
                                            StdStreams which, const fs::path& dir) {
    auto s = std::make_shared<OutputStream>(io, fd);
    s->open_lines = &open_lines;
    const StreamRoute route = route_stream(settings, placement.local_rank, which);
    const int console = which == StdStreams::Out ? STDOUT_FILENO : STDERR_FILENO;
    if (route.console) s->console_fd = console;
    s->console = console_key(console);
    s->prefix = console_prefix(settings.prefix_template, settings.role, placement.global_rank,
                               placement.local_rank);
    s->filtered = which == StdStreams::Out ? filtered_out : filtered_err;
    if (on_line) s->printed = [this, rank = placement.local_rank] { on_line(rank); };
    if (dedup)
      s->dedup = [this, placement](int fd, const std::string& line) {
        show(dedup->offer(fd, placement.global_rank, placement.local_rank, line, clock.now()));
        arm_dedup();
      };
    if (route.file) {
      const fs::path file = dir / (which == StdStreams::Out ? "stdout.log" : "stderr.log");
      s->file_fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      s->file_path = file.string();
      if (s->file_fd < 0) {
        spdlog::warn("cannot open {}: {}; its output goes to the console", file.string(),
                     std::strerror(errno));
        s->console_fd = console;
      }
    }
    return s;
  }

  /// A part of a line still held kShowHeldAfter after the read that brought it is given out:
  /// a prompt (`input("name: ")`, pdb's "(Pdb) ") is shown before the worker gets its answer.
  /// A line whose rest comes sooner stays whole.
  void show_held_when_quiet(const std::shared_ptr<OutputStream>& s) {
    s->quiet.expires_after(kShowHeldAfter);
    s->quiet.async_wait([this, s](const boost::system::error_code& ec) {
      if (ec || !s->open) return;
      if (s->emit(s->lines.give_held())) report_log_failure(s);
    });
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
            s->quiet.cancel();
            if (s->close()) report_log_failure(s);
            maybe_drained();
            return;
          }
          if (n > 0 && s->lines.holds()) show_held_when_quiet(s);
          read_more(s);
        });
  }

  /// Once per log file: the job goes on without that file's output (a full disk must not stop
  /// training); the loss is counted in the failure report and at the job's end.
  void report_log_failure(const std::shared_ptr<OutputStream>& s) {
    failed.push_back(s);
    spdlog::warn(
        "cannot write worker output to {}: {}; {} bytes lost so far, the job goes on without "
        "this file's output (free space, or pick another --log_dir)",
        s->file_path, std::strerror(s->file_error), s->file_lost);
    if (on_log_failure) on_log_failure(LogWriteFailure{s->file_path, s->file_error, s->file_lost});
  }

  void close_open() {
    for (auto& s : streams)
      if (s->open && s->close()) report_log_failure(s);
  }

  void maybe_drained() {
    if (!after_drain) return;
    for (auto& s : streams)
      if (s->open) return;
    drain_timer->cancel();
    flush_dedup();
    auto next = std::move(after_drain);
    after_drain = nullptr;
    asio::post(io, std::move(next));
  }

  asio::io_context& io;
  const common::Clock& clock;
  OutputSettings settings;
  std::function<void(const LogWriteFailure&)> on_log_failure;
  std::function<void(int)> on_line;
  std::unique_ptr<DeadlineTimer> drain_timer;
  std::unique_ptr<DeadlineTimer> dedup_timer;
  std::optional<LineDedup> dedup;  ///< --dedup_output
  std::optional<common::TimePoint> dedup_armed_for;
  std::function<void()> after_drain;
  std::shared_ptr<FilteredLog> filtered_out;           ///< this attempt's filtered_stdout.log
  std::shared_ptr<FilteredLog> filtered_err;           ///< this attempt's filtered_stderr.log
  std::vector<std::shared_ptr<OutputStream>> streams;  ///< the current group's
  OpenLines open_lines;
  std::vector<std::shared_ptr<OutputStream>> failed;  ///< each reported once
};

WorkerOutput::WorkerOutput(asio::io_context& io, const common::Clock& clock, DeadlineTimers& timers,
                           OutputSettings settings,
                           std::function<void(const LogWriteFailure&)> on_log_failure)
    : impl_(std::make_unique<Impl>(io, clock, timers, std::move(settings),
                                   std::move(on_log_failure))) {}

WorkerOutput::~WorkerOutput() = default;

void WorkerOutput::begin_group(const fs::path& attempt_dir) {
  impl_->close_open();
  impl_->streams.clear();
  impl_->filtered_out = open_filtered_log(attempt_dir, "filtered_stdout.log",
                                          impl_->settings.duplicate_stdout_filters);
  impl_->filtered_err = open_filtered_log(attempt_dir, "filtered_stderr.log",
                                          impl_->settings.duplicate_stderr_filters);
}

void WorkerOutput::add(const WorkerPlacement& placement, int stdout_fd, int stderr_fd,
                       const fs::path& dir) {
  for (auto [fd, which] : {std::pair{stdout_fd, StdStreams::Out}, {stderr_fd, StdStreams::Err}}) {
    if (fd < 0) continue;
    auto s = impl_->open_stream(fd, placement, which, dir);
    impl_->streams.push_back(s);
    impl_->read_more(std::move(s));
  }
}

void WorkerOutput::drain(std::chrono::milliseconds timeout, std::function<void()> done) {
  impl_->after_drain = std::move(done);
  impl_->drain_timer->arm(impl_->clock.now() + timeout, [impl = impl_.get()] {
    impl->close_open();
    impl->maybe_drained();
  });
  impl_->maybe_drained();
}

void WorkerOutput::close_all() {
  impl_->after_drain = nullptr;
  impl_->drain_timer->cancel();
  impl_->close_open();
  impl_->flush_dedup();
}

void WorkerOutput::on_line(std::function<void(int local_rank)> line) {
  impl_->on_line = std::move(line);
}

void WorkerOutput::line_typed() {
  for (auto& [console, stream] : impl_->open_lines) {
    if (stream == nullptr) continue;
    stream->line_shown = stream->after_cr = false;
    stream = nullptr;
  }
}

bool WorkerOutput::saw_missing_torch() const {
  return std::any_of(impl_->streams.begin(), impl_->streams.end(),
                     [](const auto& s) { return s->saw_missing_torch; });
}

LogLoss WorkerOutput::log_loss() const {
  LogLoss loss;
  for (const auto& s : impl_->failed) {
    ++loss.files;
    loss.bytes += s->file_lost;
  }
  return loss;
}

}  // namespace ddprun::agent
