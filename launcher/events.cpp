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

#include "common/exit_codes.h"
#include "common/strings.h"

namespace ddprun::launcher {

using nlohmann::json;

namespace {

/// Events nest no deeper than this; a deeper line is not an event (and is not parsed).
constexpr int kMaxEventDepth = 32;

struct Event {
  double t = 0;
  std::string name;
  json body;
};

/// The events' times by name, sorted: a phase's end is a binary search, not a scan of the
/// whole log per recovery.
class EventIndex {
 public:
  explicit EventIndex(const std::vector<Event>& events) {
    for (std::size_t i = 0; i < events.size(); ++i) by_name_[events[i].name].push_back(i);
  }
  /// The indices of the events named `name`, in time order.
  const std::vector<std::size_t>& of(const std::string& name) const {
    static const std::vector<std::size_t> none;
    auto it = by_name_.find(name);
    return it == by_name_.end() ? none : it->second;
  }

 private:
  std::map<std::string, std::vector<std::size_t>> by_name_;
};

/// The index of the last event named `name` with a time in [from, to), if any.
std::optional<std::size_t> last_of(const std::vector<Event>& events, const EventIndex& index,
                                   const std::string& name, double from, double to) {
  const auto& found = index.of(name);
  auto end = std::lower_bound(found.begin(), found.end(), to,
                              [&](std::size_t i, double t) { return events[i].t < t; });
  if (end == found.begin() || events[*std::prev(end)].t < from) return std::nullopt;
  return *std::prev(end);
}

/// The index of the first event named `name` after position `after`, if any.
std::optional<std::size_t> first_after(const EventIndex& index, const std::string& name,
                                       std::size_t after) {
  const auto& found = index.of(name);
  auto it = std::upper_bound(found.begin(), found.end(), after);
  if (it == found.end()) return std::nullopt;
  return *it;
}

/// A field as an integer when it is one and fits, else `fallback`: a log is read as it is,
/// and a wrong-typed field (hand-edited, another tool's) must not abort the summary.
long long int_field(const json& body, const char* key, long long fallback) {
  auto it = body.find(key);
  if (it == body.end()) return fallback;
  if (it->is_number_unsigned())
    return it->get<std::uint64_t>() <= static_cast<std::uint64_t>(LLONG_MAX)
               ? static_cast<long long>(it->get<std::uint64_t>())
               : fallback;
  return it->is_number_integer() ? it->get<long long>() : fallback;
}

/// A string field, made safe to print, or `fallback`.
std::string text_field(const json& body, const char* key, const std::string& fallback) {
  auto it = body.find(key);
  return it != body.end() && it->is_string() ? common::printable(it->get<std::string>()) : fallback;
}

std::string describe_failure(const json& body) {
  std::ostringstream out;
  out << "rank " << int_field(body, "rank", -1);
  if (const long long signal = int_field(body, "signal", 0); signal != 0)
    out << " killed by signal " << signal;
  else
    out << " exited with " << int_field(body, "exit_code", 0);
  out << " (" << text_field(body, "how", "exit") << ")";
  if (std::string node = text_field(body, "node", ""); !node.empty()) out << " on " << node;
  return out.str();
}

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
    events.push_back(Event{body["t"].get<double>(), body["event"].get<std::string>(), body});
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.t < b.t; });
  const EventIndex index(events);

  // A recovery starts at a failure_detected after the previous recovery's restarted workers
  // started; nodes that saw the same failure round report it within that window.
  std::vector<size_t> starts;
  double resumed_at = -1e300;
  for (const std::size_t i : index.of("failure_detected")) {
    if (events[i].t < resumed_at) continue;
    starts.push_back(i);
    // The recovery ends with the next workers_started; later failures belong to the next one.
    const auto next = first_after(index, "workers_started", i);
    resumed_at = next ? events[*next].t : 1e300;
  }
  for (size_t k = 0; k < starts.size(); ++k) {
    const Event& failure = events[starts[k]];
    const double begin = failure.t;
    double end = k + 1 < starts.size() ? events[starts[k + 1]].t : 1e300;
    // A job stopped by a signal (or ended) after this recovery tears down again: its lines
    // belong to the stop, not to the recovery.
    for (const char* stop : {"signal", "job_end"})
      if (auto s = first_after(index, stop, starts[k]); s && events[*s].t < end) end = events[*s].t;
    Recovery r;
    r.cause = describe_failure(failure.body);
    std::optional<double> fault;
    if (auto f = last_of(events, index, "fault_injected", begin - 60.0, begin + 1e-9))
      fault = events[*f].t;
    if (fault) r.detect_ms = (begin - *fault) * 1000.0;
    double at = begin;
    auto phase = [&](const std::string& name, std::optional<double>& out) {
      auto i = last_of(events, index, name, at, end);
      if (!i) return;
      out = (events[*i].t - at) * 1000.0;
      at = events[*i].t;
    };
    phase("teardown_done", r.teardown_ms);
    // A pause of --restart_backoff: until the join that followed it.
    if (auto delayed = first_after(index, "restart_delayed", starts[k]);
        delayed && events[*delayed].t < end) {
      if (auto join = first_after(index, "rendezvous_start", *delayed);
          join && events[*join].t < end) {
        r.backoff_ms = (events[*join].t - at) * 1000.0;
        at = events[*join].t;
      }
    }
    phase("rendezvous_complete", r.rendezvous_ms);
    phase("workers_started", r.spawn_ms);
    phase("worker_main", r.process_start_ms);
    phase("pg_ready", r.pg_init_ms);
    phase("snapshot_loaded", r.snapshot_load_ms);
    phase("first_step", r.first_step_ms);
    r.total_ms = (at - (fault ? *fault : begin)) * 1000.0;
    if (auto started = last_of(events, index, "workers_started", begin, end))
      r.restart_count = int_field(events[*started].body, "restart_count", 0);
    summary.recoveries.push_back(r);
  }
  if (const auto& ends = index.of("job_end"); !ends.empty()) {
    constexpr long long kNone = std::numeric_limits<long long>::min();
    if (const long long code = int_field(events[ends.back()].body, "exit_code", kNone);
        code != kNone)
      summary.exit_code = code;
  }
  if (const auto& closes = index.of("job_closed"); !closes.empty()) {
    const json& body = events[closes.back()].body;
    summary.closed_message = text_field(body, "message", "");
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
  return {{"recoveries", out},
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
        {"detect", r.detect_ms},         {"teardown", r.teardown_ms},
        {"back-off", r.backoff_ms},      {"rendezvous", r.rendezvous_ms},
        {"spawn", r.spawn_ms},           {"process start", r.process_start_ms},
        {"pg init", r.pg_init_ms},       {"snapshot load", r.snapshot_load_ms},
        {"first step", r.first_step_ms}, {"total", r.total_ms}};
    out << "  phase           ms\n";
    for (const auto& [name, ms] : rows)
      if (ms || std::string_view(name) != "back-off")  // a row only where there was a pause
        out << "  " << std::left << std::setw(14) << name << " " << std::right << std::setw(9)
            << ms_text(ms) << "\n";
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
