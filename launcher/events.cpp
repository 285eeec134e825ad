#include "launcher/events.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>

#include "agent/event_names.h"
#include "common/exit_codes.h"
#include "common/strings.h"

namespace ddprun::launcher {

using nlohmann::json;

namespace {

/// Events nest no deeper than this; a deeper line is not an event (and is not parsed).
constexpr int kMaxEventDepth = 32;

struct Event {
  double t = 0;
  agent::EventName name = agent::EventName::Other;
  json body;
};

std::string ms_text(const std::optional<double>& ms) {
  if (!ms) return "-";
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << *ms;
  return out.str();
}

}  // namespace

EventSummary summarize_events(const std::string& text) {
  EventSummary summary;
  std::vector<Event> events;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++summary.lines;
    json body = common::json_nesting_over(line, kMaxEventDepth) != 0
                    ? json()
                    : json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("t") || !body["t"].is_number() ||
        !std::isfinite(body["t"].get<double>()) || !body.contains("event") ||
        !body["event"].is_string()) {
      ++summary.malformed_lines;
      continue;
    }
    events.push_back(
        Event{body["t"].get<double>(), agent::event_named(body["event"].get<std::string>()), body});
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.t < b.t; });
  agent::RecoveryTracker tracker;
  for (const Event& e : events) tracker.observe(e.name, e.body, e.t);
  summary.recoveries = tracker.recoveries();
  const Event* ended = nullptr;
  const Event* closed = nullptr;
  for (const Event& e : events) {
    if (e.name == agent::EventName::JobEnd) ended = &e;
    if (e.name == agent::EventName::JobClosed) closed = &e;
  }
  if (ended != nullptr) {
    constexpr long long kNone = std::numeric_limits<long long>::min();
    if (const long long code = agent::event_int_field(ended->body, "exit_code", kNone);
        code != kNone)
      summary.exit_code = code;
  }
  if (closed != nullptr) {
    const json& body = closed->body;
    summary.closed_message = agent::event_text_field(body, "message", "");
    const auto flag = body.find("do_not_requeue");
    summary.do_not_requeue = flag != body.end() && flag->is_boolean() && flag->get<bool>();
  }
  return summary;
}

json summary_json(const EventSummary& summary) {
  json out = json::array();
  for (const Recovery& r : summary.recoveries) {
    auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    out.push_back({{"restart_count", r.restart_count},
                   {"cause", r.cause},
                   {"detect_ms", opt(r.detect_ms)},
                   {"teardown_ms", opt(r.teardown_ms)},
                   {"backoff_ms", opt(r.backoff_ms)},
                   {"quarantine_ms", opt(r.quarantine_ms)},
                   {"rendezvous_ms", opt(r.rendezvous_ms)},
                   {"spawn_ms", opt(r.spawn_ms)},
                   {"process_start_ms", opt(r.process_start_ms)},
                   {"pg_init_ms", opt(r.pg_init_ms)},
                   {"snapshot_load_ms", opt(r.snapshot_load_ms)},
                   {"first_step_ms", opt(r.first_step_ms)},
                   {"total_ms", r.total_ms}});
  }
  json end = {{"exit_code", summary.exit_code ? json(*summary.exit_code) : json(nullptr)},
              {"do_not_requeue", summary.do_not_requeue}};
  if (!summary.closed_message.empty()) end["message"] = summary.closed_message;
  double total = 0;
  for (const Recovery& r : summary.recoveries) total += r.total_ms;
  return {{"recoveries", out},
          {"recovery_ms_total", total},
          {"end", end},
          {"lines", summary.lines},
          {"malformed_lines", summary.malformed_lines}};
}

std::string format_summary(const EventSummary& summary) {
  std::ostringstream out;
  if (summary.recoveries.empty()) out << "no recovery in " << summary.lines << " event(s)\n";
  int n = 0;
  for (const Recovery& r : summary.recoveries) {
    out << "recovery " << ++n << " (restart count " << r.restart_count << "): " << r.cause << "\n";
    const std::pair<const char*, std::optional<double>> rows[] = {
        {"detect", r.detect_ms},
        {"teardown", r.teardown_ms},
        {"back-off", r.backoff_ms},
        {"quarantine", r.quarantine_ms},
        {"rendezvous", r.rendezvous_ms},
        {"spawn", r.spawn_ms},
        {"process start", r.process_start_ms},
        {"pg init", r.pg_init_ms},
        {"snapshot load", r.snapshot_load_ms},
        {"first step", r.first_step_ms},
        {"total", r.total_ms}};
    out << "  phase           ms\n";
    for (const auto& [name, ms] : rows)
      // A row only where there was a pause or a quarantine.
      if (ms || (std::string_view(name) != "back-off" && std::string_view(name) != "quarantine"))
        out << "  " << std::left << std::setw(14) << name << " " << std::right << std::setw(9)
            << ms_text(ms) << "\n";
  }
  if (summary.recoveries.size() > 1) {
    double total = 0;
    for (const Recovery& r : summary.recoveries) total += r.total_ms;
    out << "time in recovery: " << ms_text(total) << " ms over " << summary.recoveries.size()
        << " recoveries\n";
  }
  if (summary.exit_code) {
    out << "the job ended with exit " << *summary.exit_code;
    if (summary.do_not_requeue) out << " (do not requeue)";
    if (!summary.closed_message.empty()) out << ": " << summary.closed_message;
    out << "\n";
  }
  if (summary.malformed_lines > 0)
    out << summary.malformed_lines << " line(s) were not events and were skipped\n";
  return out.str();
}

int run_events(const std::vector<std::string>& args) {
  CLI::App app{"ddprun events: read an --event_log", "ddprun events"};
  app.require_subcommand(1);
  auto* summarize = app.add_subcommand(
      "summarize", "time to recovery and its phases for each failure in the log");
  std::string path;
  bool as_json = false;
  summarize->add_option("path", path, "the --event_log file")->required();
  summarize->add_flag("--json", as_json, "print JSON instead of tables");
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return common::kExitSuccess;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ddprun: error: ddprun events: %s: see ddprun events --help\n", e.what());
    return common::kExitUsage;
  }
  // Opened without blocking and read only if it is a regular file: a FIFO or a device given
  // by mistake would wait for a writer, or never end.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = fd < 0 ? std::strerror(errno) : "not a regular file";
    if (fd >= 0) ::close(fd);
    std::fprintf(stderr, "ddprun: error: cannot read the event log %s: %s\n",
                 common::printable(path).c_str(), why.c_str());
    return common::kExitUsage;
  }
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::fprintf(stderr, "ddprun: error: cannot read the event log %s: %s\n",
                   common::printable(path).c_str(), std::strerror(errno));
      ::close(fd);
      return common::kExitUsage;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const EventSummary summary = summarize_events(text);
  if (as_json)
    std::printf("%s\n", summary_json(summary).dump(2).c_str());
  else
    std::fputs(format_summary(summary).c_str(), stdout);
  return common::kExitSuccess;
}

}  // namespace ddprun::launcher
