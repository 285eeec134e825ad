#include "metrics/exposition.h"

#include <prometheus/text_serializer.h>

#include <regex>
#include <set>
#include <sstream>

namespace ddprun::metrics {

std::string serialize(const prometheus::Registry& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry.Collect());
  return out.str();
}

HttpServer::Handler metrics_handler(const prometheus::Registry& registry,
                                    std::function<void()> refresh) {
  return [&registry, refresh = std::move(refresh)](const HttpRequest& request) {
    const std::string path = request.target.substr(0, request.target.find('?'));
    if (path != "/metrics")
      return HttpResponse{404, "text/plain; charset=utf-8", "not found\n", {}};
    if (request.method != "GET" && request.method != "HEAD")
      return HttpResponse{405, "text/plain; charset=utf-8", "only GET and HEAD\n", {}};
    if (refresh) refresh();
    return HttpResponse{200, kPrometheusTextType, serialize(registry), {}};
  };
}

namespace {

std::vector<std::string> words_of(const std::string& name) {
  std::vector<std::string> words;
  std::istringstream in(name);
  for (std::string word; std::getline(in, word, '_');) words.push_back(word);
  return words;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::vector<std::string> naming_problems(const std::vector<prometheus::MetricFamily>& families) {
  static const std::regex kSnake("ddprun_[a-z][a-z0-9]*(_[a-z0-9]+)*");
  static const std::regex kLabel("[a-z][a-z0-9]*(_[a-z0-9]+)*");
  // Base units only (Prometheus: "use base units"): a scaled or non-base unit is a problem.
  static const std::set<std::string> kNotBase{
      "ms",          "millis",    "milliseconds", "us",      "microseconds", "ns",
      "nanoseconds", "sec",       "secs",         "minutes", "hours",        "days",
      "kb",          "kib",       "mb",           "mib",     "gb",           "gib",
      "kilobytes",   "megabytes", "bits",         "percent"};
  static const std::set<std::string> kUnits{"seconds", "bytes", "ratio"};
  static const std::set<std::string> kAboutTime{"time", "latency", "duration", "age", "delay"};
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const auto& f : families) {
    const std::string& n = f.name;
    auto problem = [&](const std::string& what) { problems.push_back(n + ": " + what); };
    if (!seen.insert(n).second) problem("exported twice");
    if (!std::regex_match(n, kSnake)) problem("not snake_case with the ddprun_ prefix");
    if (f.help.empty()) problem("no help text");
    const bool counter = f.type == prometheus::MetricType::Counter;
    if (counter != ends_with(n, "_total"))
      problem(counter ? "a counter must end in _total" : "only counters end in _total");
    for (const char* reserved : {"_count", "_sum", "_bucket", "_info"})
      if (ends_with(n, reserved)) problem(std::string("ends in the reserved suffix ") + reserved);
    std::vector<std::string> words = words_of(n);
    if (counter && !words.empty()) words.pop_back();  // "total"
    bool has_unit = false;
    bool about_time = false;
    for (std::size_t i = 0; i < words.size(); ++i) {
      if (kNotBase.count(words[i])) problem("'" + words[i] + "' is not a base unit");
      if (kUnits.count(words[i])) {
        has_unit = true;
        if (i + 1 != words.size()) problem("the unit '" + words[i] + "' must be the last word");
      }
      if (kAboutTime.count(words[i])) about_time = true;
    }
    if (about_time && !(has_unit && words.back() == "seconds"))
      problem("a name about time must end in _seconds");
    if (f.type == prometheus::MetricType::Histogram && !has_unit)
      problem("a histogram must name its unit (_seconds, _bytes)");
    if (f.type == prometheus::MetricType::Untyped) problem("untyped");
    for (const auto& m : f.metric)
      for (const auto& label : m.label)
        if (!std::regex_match(label.name, kLabel) || label.name == "le" || label.name == "quantile")
          problem("bad label name '" + label.name + "'");
  }
  return problems;
}

}  // namespace ddprun::metrics
