#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "metrics/http_server.h"
#include "rendezvous/auth.h"

// The daemon's status page and document on its metrics port (docs/operations.md#status-page):
//
//   GET /         the page: one HTML file with its style and script, no network beyond this
//                 port; it fetches /status every few seconds and draws it
//   GET /status   the status document (JSON, schema kStatusSchemaVersion)
//   GET /metrics  Prometheus metrics (metrics/exposition.h)
//
// With a rendezvous secret the page and the document ask for it (a bearer token, or HTTP Basic
// with the secret as the password, which a browser prompts for); /metrics too with
// protect_metrics (ddprun-rdzvd --metrics_auth).

namespace ddprun::rdzv {

/// The status document's schema version ("schema_version"): a field that changes meaning or
/// goes away bumps it; a new field does not.
constexpr int kStatusSchemaVersion = 1;

/// At most this many jobs in the status document (the first by run id); "job_count" counts all.
constexpr std::size_t kMaxJobsInStatusDocument = 100;

/// True when `authorization` (an Authorization header) carries the secret: "Bearer <secret>",
/// or "Basic base64(<any user>:<secret>)". The comparison takes the same time wherever the
/// candidate differs from the secret (both are hashed first, then compared in constant time).
bool authorized(const std::string& authorization, const Secret& secret);

struct StatusPageOptions {
  std::optional<Secret> secret;  ///< ask for it on / and /status
  bool protect_metrics = false;  ///< ask for it on /metrics too
  /// Told of each request refused for a wrong secret (one without any is a browser's first
  /// ask, not counted).
  std::function<void(const metrics::HttpRequest&)> wrong_secret = {};
};

/// The daemon's handler for its metrics port: routes /, /status and /metrics (to `metrics`);
/// `document` builds the status document at request time.
metrics::HttpServer::Handler status_page_handler(metrics::HttpServer::Handler metrics,
                                                 std::function<nlohmann::json()> document,
                                                 StatusPageOptions options);

/// The page: HTML with inline style and script; every id the document carries is put into the
/// page as text (textContent), never as markup.
std::string_view status_page_html();

}  // namespace ddprun::rdzv
