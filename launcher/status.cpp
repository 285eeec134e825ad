#include "launcher/status.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iomanip>
#include <sstream>
#include <thread>
#include <utility>

#include "common/exit_codes.h"
#include "common/strings.h"
#include "etcd/rdzv_store.h"
#include "rendezvous/auth.h"
#include "rendezvous/connection.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/framing.h"
#include "rendezvous/job_status.h"
#include "rendezvous/protocol.h"

namespace ddprun::launcher {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

/// At most this many status pages are read (a page holds about 64 KiB of jobs: 2.5 GB).
constexpr int kMaxStatusPages = 40'000;

std::string text_of(const json& j, const char* key, const std::string& fallback = "-") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  // A server's reply is still a peer's value: never dump it whole.
  return rdzv::quote_peer_value(*it);
}

std::string seconds_ago(const json& node) {
  auto it = node.find("last_seen_s");
  if (it == node.end() || !it->is_number()) return "-";
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << it->get<double>() << " s ago";
  return out.str();
}

/// While a round forms: "  round 2 forming: 1 joined (a); awaited: b; 1 more needed; ...".
std::string forming_line(const json& job, const json& forming) {
  std::string joined_names;
  if (auto nodes = job.find("nodes"); nodes != job.end() && nodes->is_array()) {
    int shown = 0;
    for (const json& node : *nodes) {
      if (text_of(node, "state") != "joined" || ++shown > 8) continue;
      joined_names += (joined_names.empty() ? "" : ", ") + text_of(node, "name");
    }
    if (shown > 8) joined_names += ", ...";
  }
  std::string line = "  round " + text_of(job, "round") +
                     " forming: " + text_of(forming, "joined") + " joined" +
                     (joined_names.empty() ? "" : " (" + joined_names + ")");
  if (auto awaited = forming.find("awaited");
      awaited != forming.end() && awaited->is_array() && !awaited->empty()) {
    std::string names;
    for (const json& name : *awaited)
      names += (names.empty() ? "" : ", ") + (name.is_string() ? name.get<std::string>() : "?");
    line += "; awaited: " + names;
    if (auto count = forming.find("awaited_count"); count != forming.end() &&
                                                    count->is_number_unsigned() &&
                                                    count->get<std::size_t>() > awaited->size())
      line += " and " + std::to_string(count->get<std::size_t>() - awaited->size()) + " more";
  }
  if (auto more = forming.find("more_needed");
      more != forming.end() && more->is_number_integer() && more->get<long long>() > 0)
    line += "; " + std::to_string(more->get<long long>()) + " more needed";
  const auto seconds = [&](const char* key, const char* what) {
    auto it = forming.find(key);
    if (it == forming.end() || !it->is_number()) return;
    std::ostringstream text;
    text << std::fixed << std::setprecision(1) << std::max(0.0, it->get<double>());
    line += std::string("; ") + what + " in " + text.str() + " s";
  };
  seconds("pause_ends_in_s", "the nodes' --restart_backoff pause ends");
  seconds("last_call_in_s", "last call ends");
  seconds("join_timeout_in_s", "join timeout");
  // Every node of the job has gone (left or lost): nobody runs it unless its nodes come back.
  if (auto nodes = job.find("nodes"); nodes != job.end() && nodes->is_array() && nodes->empty())
    line +=
        "; no node left: every node of the job has gone; it ends at the join timeout unless "
        "they come back";
  return line + "\n";
}

}  // namespace

std::variant<StatusRequest, InfoRequest, UsageError> parse_status_args(
    const std::vector<std::string>& args, const EnvLookup& env) {
  CLI::App app{"ddprun status: show the jobs, rounds and nodes a rendezvous server holds",
               "ddprun status"};
  std::string endpoint;
  std::string run_id;
  bool as_json = false;
  double timeout_s = 5.0;
  app.add_option(flag_spellings(Flag::RdzvEndpoint), endpoint,
                 "host:port of the server (an agent's embedded one or ddprun-rdzvd)");
  app.add_option(flag_spellings(Flag::RdzvId), run_id, "show this job only");
  std::string backend = "c10d";
  app.add_option(flag_spellings(Flag::RdzvBackend), backend,
                 "c10d (default) or etcd-v3: read the jobs from etcd, --rdzv_endpoint listing "
                 "its members");
  app.add_flag("--json", as_json, "print the server's JSON instead of tables");
  app.add_option("--timeout", timeout_s, "seconds to wait for the answer (default 5)");
  bool watch = false;
  double interval_s = 2.0;
  int iterations = 0;
  auto* watch_flag = app.add_flag(
      "--watch", watch,
      "ask again every --interval and redraw, until Ctrl-C; while a round forms it shows who "
      "joined, who is awaited and the time left");
  app.add_option("--interval", interval_s, "with --watch: seconds between two answers (default 2)")
      ->needs(watch_flag);
  app.add_option("--iterations", iterations,
                 "with --watch: stop after this many answers (default 0: until Ctrl-C)")
      ->needs(watch_flag)
      ->check(CLI::Range(0, 1'000'000'000));
  std::string secret_file;
  app.add_option("--secret_file,--secret-file", secret_file,
                 "the server's shared secret, for a server started with --secret_file");
  rdzv::TlsFiles tls;
  app.add_option("--tls_ca,--tls-ca", tls.ca,
                 "speak TLS: the CA that signed the server's certificate (PEM)");
  app.add_option("--tls_cert,--tls-cert", tls.cert,
                 "with --tls_ca: this client's certificate, for a server started with --tls_ca");
  app.add_option("--tls_key,--tls-key", tls.key, "the private key of --tls_cert");
  std::string rdzv_conf;
  app.add_option(flag_spellings(Flag::RdzvConf), rdzv_conf,
                 "K=V,... as the agents were given it: with etcd-v3, etcd_user and "
                 "etcd_password_file log in to etcd, tls_ca, tls_cert and tls_key speak TLS to it; "
                 "other keys are ignored");
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return InfoRequest{app.help()};
  } catch (const CLI::ParseError& e) {
    return UsageError{std::string("ddprun status: ") + e.what() + ": see ddprun status --help"};
  }
  if (endpoint.empty()) {
    if (auto from_env = env(flag_env_name(Flag::RdzvEndpoint))) endpoint = *from_env;
  }
  if (run_id.empty()) {
    if (auto from_env = env(flag_env_name(Flag::RdzvId))) run_id = *from_env;
  }
  if (endpoint.empty())
    return UsageError{
        "ddprun status needs --rdzv_endpoint host:port (the address every node "
        "of the job was given)"};
  std::vector<etcd::Member> etcd_members;
  if (backend == "etcd-v3") {
    auto members = etcd::parse_members(endpoint);
    if (!members)
      return UsageError{"ddprun status --rdzv_endpoint " + endpoint + ": " +
                        members.error().message};
    etcd_members = *std::move(members);
    endpoint = etcd_members.front().text();
  } else if (backend != "c10d") {
    return UsageError{"ddprun status --rdzv_backend " + backend + ": expected c10d or etcd-v3"};
  }
  auto parsed = rdzv::parse_endpoint(endpoint, rdzv::kDefaultPort);
  if (!parsed || parsed->second == 0)
    return UsageError{"ddprun status --rdzv_endpoint " + endpoint +
                      ": expected host:port or [ipv6]:port"};
  if (!(timeout_s > 0) || timeout_s > 86400)
    return UsageError{
        "ddprun status --timeout must be a positive number of seconds, at most 86400"};
  if (!(interval_s >= 0.1) || interval_s > 86400)
    return UsageError{"ddprun status --interval must be at least 0.1 and at most 86400 seconds"};
  if (secret_file.empty()) {
    if (auto from_env = env(rdzv::kSecretFileVariable)) secret_file = *from_env;
  }
  StatusRequest request;
  request.host = parsed->first;
  request.port = parsed->second;
  if (!run_id.empty()) request.run_id = run_id;
  request.json = as_json;
  request.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  if (!secret_file.empty()) request.secret_file = secret_file;
  request.tls = tls;
  request.watch = watch;
  request.interval = std::chrono::milliseconds(static_cast<long long>(interval_s * 1000));
  request.iterations = iterations;
  request.etcd_members = std::move(etcd_members);
  // The agents' --rdzv_conf, so that it can be pasted: what reaches etcd is read, the rest
  // (timeouts, keep-alive) means nothing to a status query.
  for (const std::string& piece : common::split(rdzv_conf, ',')) {
    const std::string pair = common::trim(piece);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    const std::string key = eq == std::string::npos ? "" : common::trim(pair.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : common::trim(pair.substr(eq + 1));
    if (key.empty() || value.empty())
      return UsageError{"ddprun status --rdzv_conf: malformed pair '" + pair +
                        "'; expected key=value,key2=value2"};
    if ((key == "etcd_user" || key == "etcd_password_file") && request.etcd_members.empty())
      return UsageError{"ddprun status --rdzv_conf: " + key +
                        " is for --rdzv_backend etcd-v3 only"};
    if (key == "etcd_user") request.etcd_user = value;
    if (key == "etcd_password_file") request.etcd_password_file = value;
    for (auto [name, file] :
         {std::pair{"tls_ca", &request.tls.ca}, std::pair{"tls_cert", &request.tls.cert},
          std::pair{"tls_key", &request.tls.key}})
      if (key == name && file->empty()) *file = value;  // a --tls_ flag wins
  }
  if (request.etcd_user.empty() != request.etcd_password_file.empty())
    return UsageError{
        "ddprun status --rdzv_conf: etcd_user and etcd_password_file go together (the etcd "
        "user and a file holding its password)"};
  if (!request.etcd_members.empty() && request.secret_file)
    return UsageError{
        "ddprun status --secret_file is the c10d rendezvous's; etcd-v3 has no shared secret"};
  return request;
}

/// A node's state as the table shows it: a wait-listed node of a running job is a spare; a
/// quarantined one says how long it sits out; one kept out by its health check says why; in a
/// closed job, each says it ended.
std::string state_text(const json& job, const json& node) {
  const std::string state = text_of(node, "state");
  // A closed job's table is how the job ended: no node of it runs or waits any more.
  if (text_of(job, "phase") == "closed")
    return "ended (" + (state == "wait_listed" ? std::string("spare") : state) + ")";
  if (state == "wait_listed" && text_of(job, "phase") == "running") return "spare";
  if (state == "kept_out") {
    // The check's reason, cut to keep the table readable.
    constexpr std::size_t kShown = 40;
    // Printable: the reason is a check's output, as a node sent it.
    std::string why = node.contains("kept_out") ? common::printable(text_of(node, "kept_out")) : "";
    if (common::cut_utf8(why, kShown)) why += "...";
    return why.empty() ? "kept out (health check)" : "kept out (health check: " + why + ")";
  }
  if (state == "quarantined") {
    auto left = node.find("quarantine_left_s");
    if (left != node.end() && left->is_number())
      return "quarantined (" + std::to_string(std::llround(left->get<double>())) + " s left)";
  }
  return state;
}

std::string format_status(const json& jobs) {
  std::ostringstream out;
  for (const json& job : jobs) {
    const json& s = job.contains("settings") ? job.at("settings") : json::object();
    out << "job " << text_of(job, "run_id") << ": " << text_of(job, "phase") << ", round "
        << text_of(job, "round") << ", restarts " << text_of(job, "restart_count") << " of "
        << text_of(s, "max_restarts") << ", --nnodes " << text_of(s, "min_nodes") << ":"
        << text_of(s, "max_nodes") << ", --nproc_per_node " << text_of(s, "nproc_per_node") << "\n";
    if (job.contains("message")) out << "  ended: " << text_of(job, "message") << "\n";
    if (auto f = job.find("forming"); f != job.end() && f->is_object())
      out << forming_line(job, *f);
    std::vector<std::array<std::string, 5>> rows{
        {"GROUP_RANK", "NODE", "STATE", "NODE_RANK", "LAST HEARD"}};
    if (job.contains("nodes") && job.at("nodes").is_array()) {
      for (const json& node : job.at("nodes")) {
        std::string rank = text_of(node, "group_rank");
        if (rank == "-1") rank = "-";
        rows.push_back({rank, text_of(node, "name"), state_text(job, node),
                        text_of(node, "node_rank"), seconds_ago(node)});
      }
      const auto listed = job.at("nodes").size();
      if (auto count = job.find("node_count");
          count != job.end() && count->is_number_unsigned() && count->get<std::size_t>() > listed)
        rows.push_back(
            {"",
             "(" + std::to_string(count->get<std::size_t>() - listed) + " more nodes not listed)",
             "", "", ""});
    }
    std::array<size_t, 5> width{};
    for (const auto& row : rows)
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    for (const auto& row : rows) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        line += " " + row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size(), ' ');
      }
      out << line << "\n";
    }
  }
  return out.str();
}

namespace {

/// Set by SIGINT and SIGTERM while --watch runs.
volatile std::sig_atomic_t g_stop_watch = 0;

extern "C" void on_watch_signal(int) { g_stop_watch = 1; }

/// How often fetch_status asks when the server closes the connection before a byte came back.
constexpr int kStatusAttempts = 3;

/// One status query on a connection of its own: every page of jobs, or why not. Gives up at
/// `deadline`, or at once when `stop` says so. `closed_unheard` is set when the server closed a
/// plain connection before sending a byte.
common::Result<json> fetch_status_once(const StatusRequest& request,
                                       const std::optional<rdzv::Secret>& secret,
                                       const std::optional<rdzv::TlsRole>& tls,
                                       const std::function<bool()>& stop,
                                       std::chrono::steady_clock::time_point deadline,
                                       bool& closed_unheard) {
  asio::io_context io;
  std::string error;
  rdzv::ClientHandshake handshake(secret, "status", rdzv::make_nonce());
  std::optional<json> jobs;       // every page, once the last one arrived
  std::optional<json> page_jobs;  // the pages so far
  int pages = 0;
  std::shared_ptr<rdzv::FramedConnection> conn;
  const auto send_query = [&] {
    conn->send(rdzv::to_json(rdzv::AgentMessage{rdzv::StatusQuery{request.run_id, std::nullopt}}));
  };
  asio::ip::tcp::resolver resolver(io);
  resolver.async_resolve(
      request.host, std::to_string(request.port),
      [&](boost::system::error_code ec, asio::ip::tcp::resolver::results_type results) {
        if (ec) {
          error = "cannot resolve " + request.host + ": " + ec.message();
          return;
        }
        auto socket = std::make_shared<asio::ip::tcp::socket>(io);
        asio::async_connect(
            *socket, results, [&, socket](boost::system::error_code ec, const auto&) {
              if (ec) {
                error = ec.message();
                return;
              }
              conn = std::make_shared<rdzv::FramedConnection>(std::move(*socket), tls);
              bool greeted = false;
              conn->start(
                  [&, greeted](const json& body) mutable {
                    if (!greeted) {
                      rdzv::HandshakeStep hs = handshake.on_message(body);
                      if (hs.error) {
                        error = hs.error->message;
                        return conn->close();
                      }
                      if (hs.send) conn->send(*hs.send);
                      if (!hs.done) return;
                      greeted = true;
                      if (handshake.authenticates()) send_query();
                      return;
                    }
                    auto parsed = rdzv::parse_server_message(body);
                    auto* m = parsed ? &*parsed : nullptr;
                    auto* reply = m ? std::get_if<rdzv::StatusReply>(m) : nullptr;
                    if (!reply) {
                      if (!m)
                        error = "unexpected answer: " + parsed.error().message;
                      else if (auto* refused = std::get_if<rdzv::Refused>(m))
                        error = "refused: " + refused->message;
                      else
                        error = "unexpected answer: not a status reply";
                      return conn->close();
                    }
                    if (!page_jobs) page_jobs = json::array();
                    for (auto& job : reply->jobs) page_jobs->push_back(std::move(job));
                    // The server answers in pages of about kStatusPageBytes; ask for the next
                    // one, a bounded number of times.
                    if (reply->next && ++pages < kMaxStatusPages) {
                      conn->send(rdzv::to_json(
                          rdzv::AgentMessage{rdzv::StatusQuery{request.run_id, reply->next}}));
                      return;
                    }
                    if (reply->next)
                      error = "more than " + std::to_string(kMaxStatusPages) +
                              " pages of jobs; use --rdzv_id to show one job";
                    else
                      jobs = std::move(page_jobs);
                    conn->close();
                  },
                  [&](const rdzv::CloseReason& why) {
                    if (jobs || !error.empty()) return;
                    closed_unheard = !tls && conn->bytes_received() == 0;
                    if (why.kind == rdzv::CloseKind::Tls)
                      error = why.text +
                              "; check --tls_ca, --tls_cert and --tls_key against the "
                              "server's TLS settings";
                    else
                      error = conn->client_close_reason(why.text, "--tls_ca");
                  });
              conn->send(handshake.hello());
              // Without a secret the query follows the hello at once.
              if (!handshake.authenticates()) send_query();
            });
      });
  // Bounded by the --timeout, in slices, so a signal ends the wait within one.
  while (!jobs && error.empty() && !stop() && !io.stopped() &&
         std::chrono::steady_clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    io.run_for(std::min(left, std::chrono::milliseconds(100)));
  }
  if (conn) conn->close();
  if (jobs) return *std::move(jobs);
  if (stop()) return common::Error{"interrupted"};
  return common::Error{error.empty() ? "no answer within the --timeout" : error};
}

/// fetch_status_once, asked again (kStatusAttempts in all, within the --timeout) when the server
/// closed the connection before a byte came back: a daemon flooded with connections that never
/// greet closes the oldest of those still silent, and a client slow to say its hello may be one
/// (docs/operations.md). Otherwise, and after the last attempt, its answer.
common::Result<json> fetch_status(const StatusRequest& request,
                                  const std::optional<rdzv::Secret>& secret,
                                  const std::optional<rdzv::TlsRole>& tls,
                                  const std::function<bool()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + request.timeout;
  for (int attempt = 1;; ++attempt) {
    bool closed_unheard = false;
    auto jobs = fetch_status_once(request, secret, tls, stop, deadline, closed_unheard);
    const auto pause = std::chrono::milliseconds(100 * attempt);
    if (jobs || !closed_unheard || attempt == kStatusAttempts || stop() ||
        std::chrono::steady_clock::now() + pause >= deadline)
      return jobs;
    std::this_thread::sleep_for(pause);
  }
}

/// The jobs held in etcd (--rdzv_backend etcd-v3): every `/ddprun/<run_id>/state`, or the one
/// of --rdzv_id, described as the server describes its jobs. Nodes were seen "now": their keys
/// exist, and their leases say they are alive.
common::Result<json> fetch_etcd_status(const StatusRequest& request,
                                       const std::optional<rdzv::TlsRole>& tls,
                                       const std::optional<etcd::Credentials>& credentials,
                                       const std::function<bool()>& stop) {
  asio::io_context io;
  etcd::ClientSettings settings;
  settings.members = request.etcd_members;
  settings.request_timeout = request.timeout;
  settings.credentials = credentials;
  if (tls) settings.tls = tls->context;
  auto client = std::make_shared<etcd::Client>(io, settings);
  const std::string prefix = request.run_id ? etcd::job_prefix(*request.run_id) : "/ddprun/";
  std::optional<common::Result<etcd::RangeResponse>> answer;
  client->call_as<etcd::RangeResponse>(
      etcd::range({prefix, etcd::prefix_end(prefix), 0, 0, false}), etcd::decode_range,
      [&answer](common::Result<etcd::RangeResponse> r) { answer = std::move(r); });
  while (!answer && !stop() && !io.stopped()) io.run_for(std::chrono::milliseconds(100));
  client->close();
  if (!answer) return common::Error{"interrupted"};
  if (!*answer) return answer->error();
  const common::TimePoint now = std::chrono::steady_clock::now();
  etcd::TimeAnchor anchor{now, std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()};
  json jobs = json::array();
  for (const etcd::KeyValue& kv : (*answer)->kvs) {
    // /ddprun/<run_id>/state, where a run id holds no '/'.
    const std::string head = "/ddprun/";
    const std::string tail = "/state";
    if (kv.key.size() <= head.size() + tail.size() ||
        kv.key.compare(kv.key.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string run_id =
        kv.key.substr(head.size(), kv.key.size() - head.size() - tail.size());
    if (run_id.find('/') != std::string::npos) continue;
    auto state = etcd::decode_state(kv.value, kv.key, anchor, now);
    // The job asked for is that one; in a listing, one unreadable job (another ddprun's, or a
    // value written by hand) is named and the others are still shown.
    if (!state && request.run_id) return state.error();
    if (!state) {
      std::fprintf(stderr, "ddprun status: job '%s' left out: %s\n",
                   common::printable(run_id).c_str(),
                   common::printable(state.error().message).c_str());
      continue;
    }
    jobs.push_back(rdzv::describe_job(state->job, now));
  }
  return jobs;
}

/// What one answer prints (the tables, the JSON, or "no jobs").
std::string render(const StatusRequest& request, const json& jobs, const std::string& where) {
  if (request.json) return jobs.dump(request.watch ? -1 : 2) + "\n";
  if (!jobs.empty()) return format_status(jobs);
  if (request.run_id) return "no job '" + *request.run_id + "' at " + where + "\n";
  return "no jobs at " + where + "\n";
}

std::string clock_time() {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  char text[32];
  std::strftime(text, sizeof text, "%H:%M:%S", &local);
  return text;
}

/// --watch: ask, draw, wait --interval; until a signal or --iterations answers.
int watch_status(const StatusRequest& request, const std::optional<rdzv::Secret>& secret,
                 const std::optional<rdzv::TlsRole>& tls,
                 const std::optional<etcd::Credentials>& credentials, const std::string& where) {
  struct sigaction action {};
  action.sa_handler = on_watch_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  const auto stop = [] { return g_stop_watch != 0; };
  // A terminal is redrawn in place; a pipe or a file gets one snapshot after another.
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  int status = common::kExitSuccess;
  for (int n = 0; !stop() && (request.iterations == 0 || n < request.iterations); ++n) {
    if (n > 0) {
      const auto next = std::chrono::steady_clock::now() + request.interval;
      while (!stop() && std::chrono::steady_clock::now() < next)
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            next - std::chrono::steady_clock::now(), std::chrono::milliseconds(50)));
      if (stop()) break;
    }
    auto jobs = request.etcd_members.empty() ? fetch_status(request, secret, tls, stop)
                                             : fetch_etcd_status(request, tls, credentials, stop);
    if (!jobs && stop()) break;
    std::string frame;
    if (!request.json) {
      char every[32];
      std::snprintf(every, sizeof every, "%.1f", request.interval.count() / 1000.0);
      frame = "ddprun status " + where + " at " + clock_time() + ", every " + every +
              " s (Ctrl-C to stop)\n";
    }
    if (jobs) {
      frame += render(request, *jobs, where);
      status = request.run_id && jobs->empty() ? 1 : common::kExitSuccess;
    } else {
      frame +=
          "cannot get the status from " + where + ": " + jobs.error().message + "; asking again\n";
      status = common::kExitRendezvous;
    }
    if (terminal && !request.json)
      frame = "\x1b[H\x1b[2J" + frame;  // home, clear: the new frame replaces the old
    else if (n > 0 && !request.json)
      frame = "\n" + frame;
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  // Ctrl-C or SIGTERM is how a watch ends: not a failure.
  return stop() ? common::kExitSuccess : status;
}

}  // namespace

int run_status(const StatusRequest& request) {
  std::string where = rdzv::format_endpoint(request.host, request.port);
  if (!request.etcd_members.empty()) {
    where = "etcd";
    for (std::size_t i = 0; i < request.etcd_members.size(); ++i)
      where += (i ? "," : " ") + request.etcd_members[i].text();
  }
  std::optional<rdzv::Secret> secret;
  if (request.secret_file) {
    auto read = rdzv::read_secret_file(*request.secret_file);
    if (!read) {
      std::fprintf(stderr, "ddprun status: %s\n", read.error().message.c_str());
      return common::kExitUsage;
    }
    secret = *read;
  }
  std::optional<rdzv::TlsRole> tls;
  if (request.tls.any()) {
    auto made = rdzv::make_client_tls(request.tls, "--tls_");
    if (!made) {
      std::fprintf(stderr, "ddprun status: %s\n", made.error().message.c_str());
      return common::kExitUsage;
    }
    tls = rdzv::TlsRole{*made, false, request.host};
  }
  std::optional<etcd::Credentials> credentials;
  if (!request.etcd_user.empty()) {
    auto read = etcd::read_credentials(request.etcd_user, request.etcd_password_file);
    if (!read) {
      std::fprintf(stderr, "ddprun status: %s\n", read.error().message.c_str());
      return common::kExitUsage;
    }
    credentials = *std::move(read);
  }
  if (request.watch) return watch_status(request, secret, tls, credentials, where);
  const auto never = [] { return false; };
  auto jobs = request.etcd_members.empty() ? fetch_status(request, secret, tls, never)
                                           : fetch_etcd_status(request, tls, credentials, never);
  if (!jobs) {
    std::fprintf(stderr, "ddprun status: cannot get the status from %s: %s\n", where.c_str(),
                 jobs.error().message.c_str());
    return common::kExitRendezvous;
  }
  std::fputs(render(request, *jobs, where).c_str(), stdout);
  return request.run_id && jobs->empty() ? 1 : common::kExitSuccess;
}

}  // namespace ddprun::launcher
