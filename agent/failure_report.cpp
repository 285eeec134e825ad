#include "agent/failure_report.h"

#include <algorithm>
#include <ctime>
#include <sstream>

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

}  // namespace ddprun::agent
