#include "launcher/events.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "common/exit_codes.h"

namespace ddprun::launcher {

using nlohmann::json;

namespace {

struct Event {
  double t = 0;
  std::string name;
  json body;
};

/// The time of the last event named `name` in [from, to), if any.
std::optional<double> last_of(const std::vector<Event>& events, const std::string& name,
                              double from, double to) {
  std::optional<double> last;
  for (const Event& e : events)
    if (e.name == name && e.t >= from && e.t < to) last = e.t;
  return last;
}

std::string describe_failure(const json& body) {
  std::ostringstream out;
  out << "rank " << body.value("rank", -1);
  if (body.value("signal", 0) != 0)
    out << " killed by signal " << body.value("signal", 0);
  else
    out << " exited with " << body.value("exit_code", 0);
  out << " (" << body.value("how", std::string("exit")) << ")";
  if (body.contains("node") && body["node"].is_string())
    out << " on " << body["node"].get<std::string>();
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
    json body = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("t") || !body["t"].is_number() ||
        !body.contains("event") || !body["event"].is_string()) {
      ++summary.malformed_lines;
      continue;
    }
    events.push_back(Event{body["t"].get<double>(), body["event"].get<std::string>(), body});
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.t < b.t; });

  // A recovery starts at a failure_detected after the previous recovery's restarted workers
  // started; nodes that saw the same failure round report it within that window.
  std::vector<size_t> starts;
  double resumed_at = -1e300;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].name != "failure_detected" || events[i].t < resumed_at) continue;
    starts.push_back(i);
    // The recovery ends with the next workers_started; later failures belong to the next one.
    resumed_at = 1e300;
    for (size_t j = i + 1; j < events.size(); ++j)
      if (events[j].name == "workers_started") {
        resumed_at = events[j].t;
        break;
      }
  }
  for (size_t k = 0; k < starts.size(); ++k) {
    const Event& failure = events[starts[k]];
    const double begin = failure.t;
    double end = k + 1 < starts.size() ? events[starts[k + 1]].t : 1e300;
    // A job stopped by a signal (or ended) after this recovery tears down again: its lines
    // belong to the stop, not to the recovery.
    for (size_t j = starts[k] + 1; j < events.size() && events[j].t < end; ++j)
      if (events[j].name == "signal" || events[j].name == "job_end") end = events[j].t;
    Recovery r;
    r.cause = describe_failure(failure.body);
    auto fault = last_of(events, "fault_injected", begin - 60.0, begin + 1e-9);
    if (fault) r.detect_ms = (begin - *fault) * 1000.0;
    double at = begin;
    auto phase = [&](const std::string& name, std::optional<double>& out) {
      auto t = last_of(events, name, at, end);
      if (!t) return;
      out = (*t - at) * 1000.0;
      at = *t;
    };
    phase("teardown_done", r.teardown_ms);
    phase("rendezvous_complete", r.rendezvous_ms);
    phase("workers_started", r.spawn_ms);
    phase("worker_main", r.process_start_ms);
    phase("pg_ready", r.pg_init_ms);
    phase("snapshot_loaded", r.snapshot_load_ms);
    phase("first_step", r.first_step_ms);
    r.total_ms = (at - (fault ? *fault : begin)) * 1000.0;
    for (const Event& e : events)
      if (e.name == "workers_started" && e.t >= begin && e.t < end)
        r.restart_count = e.body.value("restart_count", 0);
    summary.recoveries.push_back(r);
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
                   {"rendezvous_ms", opt(r.rendezvous_ms)},
                   {"spawn_ms", opt(r.spawn_ms)},
                   {"process_start_ms", opt(r.process_start_ms)},
                   {"pg_init_ms", opt(r.pg_init_ms)},
                   {"snapshot_load_ms", opt(r.snapshot_load_ms)},
                   {"first_step_ms", opt(r.first_step_ms)},
                   {"total_ms", r.total_ms}});
  }
  return {
      {"recoveries", out}, {"lines", summary.lines}, {"malformed_lines", summary.malformed_lines}};
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
        {"rendezvous", r.rendezvous_ms},
        {"spawn", r.spawn_ms},
        {"process start", r.process_start_ms},
        {"pg init", r.pg_init_ms},
        {"snapshot load", r.snapshot_load_ms},
        {"first step", r.first_step_ms},
        {"total", r.total_ms}};
    out << "  phase           ms\n";
    for (const auto& [name, ms] : rows)
      out << "  " << std::left << std::setw(14) << name << " " << std::right << std::setw(9)
          << ms_text(ms) << "\n";
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
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "ddprun: error: cannot read the event log %s\n", path.c_str());
    return common::kExitUsage;
  }
  std::stringstream text;
  text << in.rdbuf();
  const EventSummary summary = summarize_events(text.str());
  if (as_json)
    std::printf("%s\n", summary_json(summary).dump(2).c_str());
  else
    std::fputs(format_summary(summary).c_str(), stdout);
  return common::kExitSuccess;
}

}  // namespace ddprun::launcher
