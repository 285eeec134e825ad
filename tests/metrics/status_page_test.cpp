// The daemon's status page and document (docs/operations.md#status-page): who may read them,
// what the document says about a job that restarted, and a page that loads nothing from
// elsewhere and never puts an id into the page as markup.
#include "rendezvous/status_page.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rendezvous/job_history.h"
#include "tests/integration/rdzv_fixtures.h"
#include "tests/metrics/http_client.h"

namespace ddprun::testing {
namespace {

using namespace std::chrono_literals;
using metrics::HttpRequest;
using metrics::HttpResponse;
using nlohmann::json;
using rdzv::authorized;
using rdzv::Secret;

const Secret kSecret{"0123456789abcdef-secret"};

std::string header_of(const HttpResponse& r, const std::string& name) {
  for (const auto& [n, v] : r.headers)
    if (n == name) return v;
  return "";
}

/// Polls /status until `done` holds for the document (bounded); the last document.
json status_until(int port, const std::function<bool(const json&)>& done) {
  json doc;
  wait_until(
      [&] {
        const auto reply = http_get(port, "/status");
        if (reply.status != 200) return false;
        doc = json::parse(reply.body, nullptr, false);
        return !doc.is_discarded() && done(doc);
      },
      kJobLimit);
  return doc;
}

}  // namespace

TEST_CASE("the secret is taken as a bearer token or as the password of HTTP Basic",
          "[metrics][status-page]") {
  CHECK(authorized("Bearer 0123456789abcdef-secret", kSecret));
  CHECK(authorized("bearer 0123456789abcdef-secret", kSecret));
  // base64("anyone:0123456789abcdef-secret")
  CHECK(authorized("Basic YW55b25lOjAxMjM0NTY3ODlhYmNkZWYtc2VjcmV0", kSecret));
  CHECK_FALSE(authorized("", kSecret));
  CHECK_FALSE(authorized("Bearer", kSecret));
  CHECK_FALSE(authorized("Bearer ", kSecret));
  CHECK_FALSE(authorized("Bearer 0123456789abcdef-secreT", kSecret));
  CHECK_FALSE(authorized("Bearer 0123456789abcdef-secret ", kSecret));
  CHECK_FALSE(authorized("Token 0123456789abcdef-secret", kSecret));
  // base64("0123456789abcdef-secret"): no user, no colon
  CHECK_FALSE(authorized("Basic MDEyMzQ1Njc4OWFiY2RlZi1zZWNyZXQ=", kSecret));
  CHECK_FALSE(authorized("Basic !!!!", kSecret));
}

TEST_CASE("with a secret the page and /status ask for it and /metrics only with metrics_auth",
          "[metrics][status-page]") {
  auto metrics = [](const HttpRequest&) {
    return HttpResponse{200, "text/plain", "metrics\n", {}};
  };
  int documents = 0;
  auto document = [&] {
    ++documents;
    return json{{"schema_version", rdzv::kStatusSchemaVersion}, {"jobs", json::array()}};
  };
  int wrong = 0;
  rdzv::StatusPageOptions options{kSecret, false, {}};
  options.wrong_secret = [&](const HttpRequest&) { ++wrong; };
  auto handler = rdzv::status_page_handler(metrics, document, options);
  for (const char* path : {"/", "/status", "/status?x=1"}) {
    const HttpResponse r = handler(HttpRequest{"GET", path, ""});
    CHECK(r.status == 401);
    CHECK(header_of(r, "WWW-Authenticate") == "Basic realm=\"ddprun-rdzvd\"");
    CHECK(handler(HttpRequest{"GET", path, "Bearer wrong-secret-0123456789"}).status == 401);
  }
  CHECK(documents == 0);  // nothing is built for a client without the secret
  CHECK(wrong == 3);      // a wrong secret is told of; a first ask without one is not
  const HttpResponse page = handler(HttpRequest{"GET", "/", "Bearer " + kSecret.bytes});
  CHECK(page.status == 200);
  CHECK(page.content_type == "text/html; charset=utf-8");
  CHECK(header_of(page, "Content-Security-Policy").find("default-src 'none'") != std::string::npos);
  const HttpResponse status = handler(HttpRequest{"GET", "/status", "Bearer " + kSecret.bytes});
  CHECK(status.status == 200);
  CHECK(status.content_type == "application/json");
  CHECK(json::parse(status.body)["schema_version"] == 1);
  CHECK(documents == 1);
  CHECK(handler(HttpRequest{"POST", "/status", "Bearer " + kSecret.bytes}).status == 405);
  CHECK(handler(HttpRequest{"GET", "/metrics", ""}).body == "metrics\n");

  auto guarded = rdzv::status_page_handler(metrics, document, {kSecret, true});
  const HttpResponse refused = guarded(HttpRequest{"GET", "/metrics", ""});
  CHECK(refused.status == 401);
  CHECK(header_of(refused, "WWW-Authenticate") == "Bearer realm=\"ddprun-rdzvd\"");
  CHECK(guarded(HttpRequest{"GET", "/metrics", "Bearer " + kSecret.bytes}).body == "metrics\n");

  auto open = rdzv::status_page_handler(metrics, document, {std::nullopt, false});
  CHECK(open(HttpRequest{"GET", "/", ""}).status == 200);
  CHECK(open(HttpRequest{"GET", "/status", ""}).status == 200);
}

TEST_CASE("the page loads nothing from elsewhere and puts no data into it as markup",
          "[metrics][status-page]") {
  const std::string html(rdzv::status_page_html());
  // The only URL is the SVG namespace, a name and not a place to load from.
  std::size_t urls = 0;
  for (auto at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1)) {
    CHECK(html.compare(at, 26, "http://www.w3.org/2000/svg") == 0);
    ++urls;
  }
  CHECK(urls == 1);
  for (const char* sink :
       {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "src=", "href="})
    CHECK(html.find(sink) == std::string::npos);
}

TEST_CASE("a recovery runs from the failure report to the next round formed",
          "[metrics][status-page]") {
  using rdzv::JobEvent;
  using rdzv::JobEventKind;
  const common::TimePoint t0{};
  const auto event = [&](JobEventKind kind, common::Duration at, int round, bool counted = false) {
    JobEvent e;
    e.kind = kind;
    e.at = t0 + at;
    e.round = round;
    e.counted = counted;
    if (kind == JobEventKind::FailureReported) e.node = "node<1>";
    if (kind == JobEventKind::RoundOpened && round > 0) e.detail = "worker failed";
    return e;
  };
  rdzv::JobHistory::Job job;
  job.events = {event(JobEventKind::RoundOpened, 0s, 0),
                event(JobEventKind::RoundFormed, 1s, 0),
                event(JobEventKind::FailureReported, 10s, 0),
                event(JobEventKind::RoundOpened, 10500ms, 1, true),
                event(JobEventKind::RoundFormed, 12s, 1),
                event(JobEventKind::RoundOpened, 15s, 2, false)};  // a scale-up: no recovery
  const json h = rdzv::describe_history(job, t0 + 20s);
  REQUIRE(h["events"].size() == 6);
  CHECK(h["events"][2]["kind"] == "failure_reported");
  CHECK(h["events"][2]["node"] == "node<1>");
  CHECK(h["events"][2]["ago_s"] == 10.0);
  CHECK(h["events"][3]["counted"] == true);
  REQUIRE(h["recoveries"].size() == 1);
  const json& r = h["recoveries"][0];
  CHECK(r["round"] == 1);
  CHECK(r["cause"] == "worker failed");
  CHECK(r["started_ago_s"] == 10.0);
  CHECK(r["restart_ago_s"] == 9.5);
  CHECK(r["formed_ago_s"] == 8.0);
  CHECK(r["duration_s"] == 2.0);

  // A recovery whose round has not formed yet has no end.
  job.events.push_back(event(JobEventKind::NodeLost, 16s, 2));
  job.events.push_back(event(JobEventKind::RoundOpened, 16s, 3, true));
  const json open = rdzv::describe_history(job, t0 + 20s);
  REQUIRE(open["recoveries"].size() == 2);
  CHECK(open["recoveries"][1]["started_ago_s"] == 4.0);
  CHECK_FALSE(open["recoveries"][1].contains("duration_s"));
}

TEST_CASE("the daemon's /status shows a job with its nodes and its restart as a recovery",
          "[metrics][status-page][integration]") {
  TempDir dir;
  const int metrics_port = free_port();
  Daemon daemon({"--metrics_port", std::to_string(metrics_port)});
  REQUIRE(contains(daemon.process->err_so_far(), "and the status page on http://127.0.0.1:"));
  const std::string gate = dir.path() + "/gate";
  // One node, one worker: it fails in the first round, runs in the second until the gate opens.
  Subprocess agent(ddprun_fake(
      {"--nnodes", "1", "--nproc_per_node", "1", "--max_restarts", "1", "--rdzv_backend", "c10d",
       "--rdzv_endpoint", "127.0.0.1:" + std::to_string(daemon.port), "--rdzv_id", "job",
       "--rdzv_conf", kFastRdzvConf, "--local_addr", "127.0.0.1"},
      {"exit_if_restart=0:3", "print=running", "wait_lines=" + gate + ":1"}));
  REQUIRE(agent.wait_for_output("running", kJobLimit));
  const json doc = status_until(metrics_port, [](const json& d) {
    return d["jobs"].size() == 1 && d["jobs"][0]["history"]["recoveries"].size() == 1 &&
           d["jobs"][0]["history"]["recoveries"][0].contains("duration_s");
  });
  INFO(doc.dump(2));
  CHECK(doc["schema_version"] == 1);
  CHECK(doc["job_count"] == 1);
  CHECK(doc["uptime_s"].get<double>() > 0);
  REQUIRE(doc["jobs"].size() == 1);
  const json& job = doc["jobs"][0];
  CHECK(job["run_id"] == "job");
  CHECK(job["phase"] == "running");
  CHECK(job["round"] == 1);
  CHECK(job["restart_count"] == 1);
  REQUIRE(job["nodes"].size() == 1);
  CHECK(job["nodes"][0]["state"] == "running");
  CHECK(job["nodes"][0]["last_seen_s"].get<double>() >= 0);
  std::vector<std::string> kinds;
  for (const json& e : job["history"]["events"]) kinds.push_back(e["kind"]);
  CHECK(kinds == std::vector<std::string>{"round_opened", "round_formed", "failure_reported",
                                          "round_opened", "round_formed"});
  CHECK(job["history"]["events"][2]["node"] == job["nodes"][0]["name"]);
  const json& recovery = job["history"]["recoveries"][0];
  CHECK(recovery["round"] == 1);
  CHECK(recovery["duration_s"].get<double>() >= 0);
  CHECK_FALSE(recovery["cause"].get<std::string>().empty());

  std::ofstream(gate) << "go\n";
  CHECK(agent.wait(kJobLimit).exit_code == 0);
}

TEST_CASE("the last node of a running job leaving opens a round that the history and log explain",
          "[metrics][status-page][integration]") {
  const int metrics_port = free_port();
  Daemon daemon({"--metrics_port", std::to_string(metrics_port)});
  Subprocess agent(ddprun_fake(
      {"--nnodes", "1:2", "--nproc_per_node", "1", "--max_restarts", "3", "--rdzv_backend", "c10d",
       "--rdzv_endpoint", "127.0.0.1:" + std::to_string(daemon.port), "--rdzv_id", "job",
       "--rdzv_conf", kFastRdzvConf, "--local_addr", "127.0.0.1"},
      {"print=running", "hang"}));
  REQUIRE(agent.wait_for_output("running", kJobLimit));
  agent.send(SIGTERM);
  CHECK_FALSE(agent.wait(kJobLimit).timed_out);
  // Nobody is left to hear a Restart: the round opens all the same, counted like any loss, and
  // the history and the daemon's log say why.
  const json doc = status_until(metrics_port, [](const json& d) {
    return d["jobs"].size() == 1 && d["jobs"][0]["round"] == 1;
  });
  INFO(doc.dump(2));
  REQUIRE(doc["jobs"].size() == 1);
  const json& job = doc["jobs"][0];
  CHECK(job["restart_count"] == 1);
  const json& last = job["history"]["events"].back();
  CHECK(last["kind"] == "round_opened");
  CHECK(last["counted"] == true);
  CHECK(contains(last["detail"].get<std::string>(),
                 "the last node of the round went (127.0.0.1): nobody restarts until nodes join "
                 "again"));
  CHECK(contains(daemon.process->err_so_far(),
                 "info: job 'job': restart (round 1, restart count 1): the last node of the round "
                 "went (127.0.0.1)"));
}

TEST_CASE("a daemon with a secret asks for it on its page and on /metrics with --metrics_auth",
          "[metrics][status-page][integration]") {
  TempDir dir;
  const std::string secret = secret_file(dir, "secret", kSecret.bytes);
  const std::string bearer = "Authorization: Bearer " + kSecret.bytes + "\r\n";
  {
    const int port = free_port();
    Daemon daemon({"--metrics_port", std::to_string(port), "--secret_file", secret});
    const auto page = http_get(port, "/");
    CHECK(page.status == 401);
    CHECK(contains(page.head, "WWW-Authenticate: Basic realm=\"ddprun-rdzvd\""));
    CHECK(http_get(port, "/status").status == 401);
    const auto status = http_get(port, "/status", 10s, bearer);
    CHECK(status.status == 200);
    CHECK(contains(status.body, "\"schema_version\":1"));
    CHECK(http_get(port, "/", 10s, bearer).status == 200);
    CHECK(http_get(port, "/metrics").status == 200);  // Prometheus scrapes it as before
  }
  {
    const int port = free_port();
    Daemon daemon(
        {"--metrics_port", std::to_string(port), "--secret_file", secret, "--metrics_auth"});
    CHECK(http_get(port, "/metrics").status == 401);
    // A wrong secret is counted and logged with the client's address; a first ask without any
    // (a browser's) is not.
    CHECK(http_get(port, "/metrics", 10s, "Authorization: Bearer guess-0123456789\r\n").status ==
          401);
    const auto scrape = http_get(port, "/metrics", 10s, bearer);
    CHECK(scrape.status == 200);
    CHECK(sample(scrape.body, "ddprun_rdzv_http_authentication_failures_total") == 1);
    CHECK(contains(daemon.process->err_so_far(),
                   "warning: metrics port: refused GET /metrics from 127.0.0.1:"));
    CHECK(contains(daemon.process->err_so_far(), ": wrong secret (401)"));
  }
  const auto alone = run_command({RDZVD_BIN, "--metrics_port", "1", "--metrics_auth"});
  CHECK(alone.exit_code == 64);
  CHECK(contains(alone.err, "--metrics_auth asks for the rendezvous secret"));
}

}  // namespace ddprun::testing
