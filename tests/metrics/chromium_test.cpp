// The status page in a real browser: headless Chromium (Debian's chromium) loads it from a
// daemon holding a job that restarted once, lets its refresh run on virtual time, and the test
// reads the page as the browser built it; a screenshot is kept as an artifact in the build
// directory (test-artifacts/status-page.png).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/integration/rdzv_fixtures.h"
#include "tests/metrics/http_client.h"

namespace ddprun::testing {
namespace {

const char* const kChromium = "/usr/bin/chromium";

/// A run id with every character that means something in HTML: the page must show it as text.
const std::string kHostileRunId = "job<b>&\"'x";

/// Chromium's headless flags; as root it runs only without its sandbox.
std::vector<std::string> chromium(const TempDir& dir, const std::vector<std::string>& more) {
  std::vector<std::string> argv{kChromium,
                                "--headless",
                                "--no-sandbox",
                                "--disable-gpu",
                                "--disable-dev-shm-usage",
                                "--no-first-run",
                                "--user-data-dir=" + dir.path() + "/chromium",
                                "--virtual-time-budget=6000"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

}  // namespace

TEST_CASE("headless Chromium shows the running job and its recovery on the status page",
          "[metrics][status-page][chromium]") {
  // CI installs chromium (scripts/install-deps.sh): missing, this test fails, never skips.
  {
    INFO("chromium is missing: install Debian's chromium (scripts/install-deps.sh)");
    REQUIRE(::access(kChromium, X_OK) == 0);
  }
  TempDir dir;
  const int metrics_port = free_port();
  Daemon daemon({"--metrics_port", std::to_string(metrics_port)});
  const std::string gate = dir.path() + "/gate";
  Subprocess agent(ddprun_fake(
      {"--nnodes", "1", "--nproc_per_node", "1", "--max_restarts", "1", "--rdzv_backend", "c10d",
       "--rdzv_endpoint", "127.0.0.1:" + std::to_string(daemon.port), "--rdzv_id", kHostileRunId,
       "--rdzv_conf", kFastRdzvConf, "--local_addr", "127.0.0.1"},
      {"exit_if_restart=0:3", "print=running", "wait_lines=" + gate + ":1"}));
  REQUIRE(agent.wait_for_output("running", kJobLimit));
  // The second round formed: the document has the recovery with its end.
  REQUIRE(wait_until(
      [&] {
        const auto reply = http_get(metrics_port, "/status");
        const auto doc = nlohmann::json::parse(reply.body, nullptr, false);
        return !doc.is_discarded() && doc["jobs"].size() == 1 &&
               doc["jobs"][0]["history"]["recoveries"].size() == 1 &&
               doc["jobs"][0]["history"]["recoveries"][0].contains("duration_s");
      },
      kJobLimit));

  const std::string url = "http://127.0.0.1:" + std::to_string(metrics_port) + "/?refresh=1";
  const auto dom = run_command(chromium(dir, {"--dump-dom", url}), {}, kJobLimit);
  INFO(dom.err.substr(0, 4000));
  REQUIRE(dom.exit_code == 0);
  const std::string& html = dom.out;
  INFO(html.substr(0, 20000));
  // The page refreshed itself on its timer (its first load counts one).
  std::smatch refreshes;
  REQUIRE(std::regex_search(html, refreshes, std::regex("data-refreshes=\"([0-9]+)\"")));
  CHECK(std::stoi(refreshes[1]) >= 2);
  // The running job, by its id shown as text: the markup characters escaped, no <b> element.
  CHECK(contains(html, "<span class=\"run-id\">job&lt;b&gt;&amp;\"'x</span>"));
  CHECK_FALSE(contains(html, "<b>"));
  CHECK(contains(html, "<span class=\"phase running\">running</span>"));
  CHECK(contains(html, "round 1 · restarts 1 of 1"));
  // Its node, with a heartbeat age.
  CHECK(std::regex_search(html, std::regex("<td>[^<]+</td><td>running</td>")));
  CHECK(std::regex_search(html, std::regex("[0-9.]+ s ago")));
  // The recovery: on the timeline (a span and its title) and in the restart history.
  CHECK(contains(html, "class=\"recovery\""));
  CHECK(contains(html, "<title>recovery to round 1: "));
  CHECK(contains(html, "class=\"segment running\""));
  CHECK(contains(html, "class=\"marker failure_reported\""));
  CHECK(contains(html, "Restart history"));
  CHECK(contains(html, "<span id=\"state\" class=\"\">updated "));  // no refresh failed

  // The screenshot, kept for people to look at.
  const std::string artifacts = std::string(DDPRUN_BUILD_DIR) + "/test-artifacts";
  ::mkdir(artifacts.c_str(), 0755);
  const std::string png = artifacts + "/status-page.png";
  ::unlink(png.c_str());
  const auto shot = run_command(
      chromium(dir, {"--hide-scrollbars", "--window-size=1100,900", "--screenshot=" + png, url}),
      {}, kJobLimit);
  CHECK(shot.exit_code == 0);
  const std::string image = read_file(png);
  CHECK(image.size() > 10'000);
  CHECK(image.rfind("\x89PNG", 0) == 0);

  std::ofstream(gate) << "go\n";
  CHECK(agent.wait(kJobLimit).exit_code == 0);
}

TEST_CASE("headless Chromium reads a page that asks for the secret when given it as Basic",
          "[metrics][status-page][chromium]") {
  {
    INFO("chromium is missing: install Debian's chromium (scripts/install-deps.sh)");
    REQUIRE(::access(kChromium, X_OK) == 0);
  }
  TempDir dir;
  const std::string secret = "0123456789abcdef-secret";
  const int metrics_port = free_port();
  Daemon daemon({"--metrics_port", std::to_string(metrics_port), "--secret_file",
                 secret_file(dir, "secret", secret)});
  const std::string where = "127.0.0.1:" + std::to_string(metrics_port) + "/?refresh=1";
  // With the secret in the URL the browser sends it as Basic, to the page and its fetches.
  const auto given = run_command(chromium(dir, {"--dump-dom", "http://me:" + secret + "@" + where}),
                                 {}, kJobLimit);
  REQUIRE(given.exit_code == 0);
  INFO(given.out.substr(0, 3000));
  CHECK(contains(given.out, "<span id=\"state\" class=\"\">updated "));
  CHECK(contains(given.out, "No jobs on this rendezvous server."));
  CHECK_FALSE(contains(given.out, "data-refreshes=\"0\""));
  // Without it (a fresh profile: nothing remembered) the browser gets a 401 and no page
  // (headless, it cannot ask anyone for the password).
  TempDir fresh;
  const auto refused =
      run_command(chromium(fresh, {"--dump-dom", "http://" + where}), {}, kJobLimit);
  INFO(refused.out.substr(0, 3000));
  CHECK_FALSE(contains(refused.out, "data-refreshes"));
}

}  // namespace ddprun::testing
