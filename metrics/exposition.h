#pragma once
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <functional>
#include <string>
#include <vector>

#include "metrics/http_server.h"

namespace ddprun::metrics {

/// The registry's metrics in Prometheus's text exposition format 0.0.4.
std::string serialize(const prometheus::Registry& registry);

/// The endpoint's handler: GET or HEAD /metrics runs `refresh` (gauges read at scrape time)
/// and serves the registry; 405 for another method, 404 for another path.
HttpServer::Handler metrics_handler(const prometheus::Registry& registry,
                                    std::function<void()> refresh = {});

/// Where the families break ddprun's naming rules (docs/operations.md#metrics): the "ddprun_"
/// prefix, snake_case, "_total" on counters and only on counters, base units (seconds, bytes)
/// as the last word before "_total", a unit on every histogram and on every name about time,
/// help text, label names. promtool checks the format, not these conventions. Empty: all good.
std::vector<std::string> naming_problems(const std::vector<prometheus::MetricFamily>& families);

}  // namespace ddprun::metrics
