#include "agent/failure_report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/error_file.h"
#include "common/fd_write.h"
#include "common/log.h"
#include "common/signals.h"

namespace ddprun::agent {
namespace {

std::string format_time(std::chrono::system_clock::time_point tp) {
  std::time_t t = std::chrono::system_clock::to_time_t(tp);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out += pad;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

std::string format_one(int idx, const std::string& host, const ProcessFailure& f) {
  std::ostringstream os;
  os << "[" << idx << "]:\n";
  os << "  time      : " << format_time(f.time) << "\n";
  os << "  host      : " << host << "\n";
  os << "  rank      : " << f.global_rank << " (local_rank: " << f.local_rank << ")\n";
  os << "  exitcode  : " << (f.status.signal != 0 ? -f.status.signal : f.status.code)
     << (f.pid > 0 ? " (pid: " + std::to_string(f.pid) + ")" : std::string(" (never started)"));
  if (f.status.signal != 0)
    os << "\n  signal    : " << common::signal_name(f.status.signal) << " (" << f.status.signal
       << ")";
  os << "\n  error_file: "
     << (f.error && !f.error_file.empty() ? f.error_file : std::string("<N/A>"));
  std::string trace;
  if (f.error) {
    const ErrorFileContent& e = *f.error;
    trace = e.traceback.empty() ? e.message : e.traceback;
    // Python's traceback already ends with the message; other writers may give only one.
    if (!e.traceback.empty() && !e.message.empty() &&
        e.traceback.find(e.message) == std::string::npos)
      trace += "\n" + e.message;
  } else if (!f.error_file_problem.empty()) {
    trace = "error file " + f.error_file + " unreadable: " + f.error_file_problem;
  } else {
    trace = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  }
  os << "\n  traceback : " << indent(trace, "  ");
  return os.str();
}

}  // namespace

std::string describe_exit(const ExitStatus& status) {
  if (status.signal != 0)
    return "signal " + common::signal_name(status.signal) + " (" + std::to_string(status.signal) +
           ")";
  return "exit code " + std::to_string(status.code);
}

std::string format_failure_report(const std::string& script, const std::string& host,
                                  const std::vector<ProcessFailure>& failures, int restarts_used,
                                  int max_restarts, LogLoss log_loss) {
  const std::string title = script + " FAILED";
  std::vector<std::string> blocks;
  for (size_t i = 0; i < failures.size(); ++i)
    blocks.push_back(format_one(static_cast<int>(i), host, failures[i]));
  size_t width = title.size();
  for (const auto& b : blocks) {
    std::istringstream lines(b);
    for (std::string line; std::getline(lines, line);) width = std::max(width, line.size());
  }
  width = std::min<size_t>(width, 60);
  const std::string border(width, '='), section(width, '-');
  std::ostringstream os;
  os << border << "\n" << title << "\n" << section << "\n";
  os << "Restarts  : " << restarts_used << " of " << max_restarts << " used\n";
  if (log_loss.files > 0)
    os << "Log writes: failed for " << log_loss.files << " file(s), " << log_loss.bytes
       << " bytes of output lost\n";
  os << "Failures:\n";
  if (blocks.size() <= 1) os << "  <NO_OTHER_FAILURES>\n";
  for (size_t i = 1; i < blocks.size(); ++i) os << blocks[i] << "\n";
  os << section << "\n";
  os << "Root Cause (first observed failure):\n";
  if (!blocks.empty()) os << blocks[0] << "\n";
  os << border << "\n";
  return os.str();
}

std::string interpreter_hint(const std::string& interpreter, const std::string& origin,
                             bool missing_torch) {
  return std::string("The workers ran ") + interpreter + " (" + origin + "), which " +
         (missing_torch ? "cannot import torch" : "could not run") +
         ". Choose the interpreter that has torch: set PYTHON_EXEC=/path/to/python, or activate "
         "its virtual environment (source venv/bin/activate) before ddprun.\n";
}

ProcessFailure collect_failure(const WorkerPlacement& placement, pid_t pid, ExitStatus status,
                               const std::string& error_file, const std::string& launch_error,
                               const std::string& hung_reason) {
  ProcessFailure f;
  f.local_rank = placement.local_rank;
  f.global_rank = placement.global_rank;
  f.pid = pid;
  f.status = status;
  f.time = std::chrono::system_clock::now();
  f.error_file = error_file;
  if (!launch_error.empty()) {
    f.error = ErrorFileContent{launch_error, "", std::nullopt};
    f.error_file.clear();  // the worker never ran, so no file of its own exists
  } else if (std::ifstream in(error_file); in) {
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = parse_error_file(text.str());
    if (parsed)
      f.error = *parsed;
    else
      f.error_file_problem = parsed.error().message;
  }
  if (!hung_reason.empty() && !f.error) f.error = ErrorFileContent{hung_reason, "", std::nullopt};
  return f;
}

void copy_root_cause_for_parent(const ProcessFailure& root, const std::string& parent_file) {
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
  std::filesystem::rename(partial, parent_file, ec);
  if (ec)
    spdlog::warn("cannot write {}: {}", parent_file, ec.message());
  else
    spdlog::info("copied the root cause's error file to TORCHELASTIC_ERROR_FILE {}", parent_file);
}

void print_job_failure(const std::vector<ProcessFailure>& failures, const FailureReportContext& c) {
  auto write_stderr = [](const std::string& text) { common::write_all(STDERR_FILENO, text); };
  write_stderr(format_failure_report(c.script, c.host, failures, c.restarts_used, c.max_restarts,
                                     c.log_loss));
  if (!c.parent_error_file.empty() && !failures.empty())
    copy_root_cause_for_parent(failures.front(), c.parent_error_file);
  if (!c.interpreter_origin.empty() && (c.missing_torch || c.cannot_run))
    write_stderr(interpreter_hint(c.interpreter, c.interpreter_origin, c.missing_torch));
}

bool is_empty_file(const std::string& path) {
  std::error_code ec;
  return path.empty() || std::filesystem::file_size(path, ec) == 0 || ec;
}

bool names_error_files(const std::vector<ProcessFailure>& failures) {
  return std::any_of(failures.begin(), failures.end(), [](const ProcessFailure& f) {
    return f.error.has_value() && !f.error_file.empty();
  });
}

}  // namespace ddprun::agent
