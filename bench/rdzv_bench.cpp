// ddprun-rdzv-bench: the "light agent" mode of the rendezvous benchmark (bench/README.md).
//
// One process runs many NetworkRendezvous clients (the agent's own rendezvous client) on one
// io_context, with no workers, against a ddprun-rdzvd started separately on a loopback port.
//
//   --mode latency   N clients with --nnodes N:N. N-1 join first; once each has had the
//                    server's reply to its Join, the N-th joins. Measures the time from the last
//                    join to every client holding its group rank, checks the ranks are 0..N-1,
//                    and counts the frames the clients received during the round. With
//                    --procs K the N-1 first clients are spread over K forked processes (a
//                    process holds at most its descriptor limit of sockets), the N-th stays in
//                    this one, and the children report over pipes.
//   --mode loss      M clients with --nnodes 2:M and a fast keep-alive; one of them lives in a
//                    forked child process. Once the round runs, the child is sent SIGKILL (the
//                    kernel closes its socket) or SIGSTOP (its socket stays open and only the
//                    heartbeats stop); measures the time until every survivor holds a Restart,
//                    and until every survivor holds its rank of the next round.
//   --mode jobs      J jobs of N clients each (distinct rdzv ids, --nnodes N:N). Round 0 forms;
//                    then each job repeats rounds for --duration seconds: a client reports a
//                    worker failure, every client gets the server's Restart and joins again.
//                    Measures each round from the job's last join (and from the failure report)
//                    to every client of the job holding its rank, and the rounds per second.
//
// Prints one JSON object on stdout; exit 0 on success, 1 on a failed check, 2 on a timeout.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/open_files.h"
#include "rendezvous/network_rendezvous.h"

namespace {

namespace asio = boost::asio;
using ddprun::common::SteadyClock;
using ddprun::common::TimePoint;
using ddprun::rdzv::Millis;
using ddprun::rdzv::NetworkRendezvous;
using ddprun::rdzv::NetworkRendezvousOptions;
using ddprun::rdzv::Notice;
using ddprun::rdzv::RendezvousError;
using ddprun::rdzv::RendezvousInfo;
using ddprun::rdzv::RendezvousResult;
using ddprun::rdzv::Restart;
using nlohmann::json;

struct BenchConfig {
  std::string mode = "latency";
  std::string host = "127.0.0.1";
  int port = 0;
  std::string run_id;
  int nodes = 8;
  int min_nodes = 2;
  double keep_alive_interval_s = 0;  ///< 0: 5 s (torchrun's default) in latency, 0.5 s in loss
  int keep_alive_max_attempt = 3;
  bool progress = false;
  std::string victim = "kill";
  double timeout_s = 120;
  int jobs = 1000;          ///< jobs mode: concurrent jobs of `nodes` clients each
  double round_gap_ms = 0;  ///< jobs mode: pause between a round's end and the next failure
  double duration_s = 20;   ///< jobs mode: the measurement window
  double warmup_s = 5;      ///< jobs mode: rounds repeat unmeasured this long first
  int procs = 1;            ///< latency mode: processes the N-1 first clients are spread over
  double hold_s = 0;        ///< latency mode: how long the clients stay in the running round
};

/// --hold: the clients stay connected in the running round (heartbeats going) this long after
/// the figures are out, so the daemon's memory can be read with the round running.
void hold(asio::io_context& io, const BenchConfig& c) {
  if (c.hold_s <= 0) return;
  io.restart();
  io.run_for(std::chrono::milliseconds(static_cast<long long>(c.hold_s * 1000)));
}

double ms_between(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

NetworkRendezvousOptions client_options(const BenchConfig& c, int index, int min_nodes,
                                        int max_nodes) {
  NetworkRendezvousOptions o;
  o.backend = "c10d";
  o.run_id = c.run_id;
  o.endpoint_host = c.host;
  o.endpoint_port = c.port;
  o.name = "node" + std::to_string(index);
  o.settings.min_nodes = min_nodes;
  o.settings.max_nodes = max_nodes;
  o.settings.nproc_per_node = 1;
  // The jobs mode restarts every job round after round: a budget it never runs out of.
  o.settings.max_restarts = c.mode == "jobs" ? 1'000'000 : 3;
  o.settings.join_timeout = Millis(static_cast<long long>(c.timeout_s * 1000));
  o.settings.keep_alive_interval = Millis(static_cast<long long>(c.keep_alive_interval_s * 1000));
  o.settings.keep_alive_max_attempt = c.keep_alive_max_attempt;
  o.connect_timeout = Millis(10'000);
  return o;
}

/// `count` clients whose node ids are distinct. All clients of this process share host and
/// pid, so only the 6 random hex digits tell them apart; a collision (about 3% of runs at
/// N = 1024) would make the server take two clients for one node, so a colliding client is
/// made again.
std::vector<std::unique_ptr<NetworkRendezvous>> make_clients(asio::io_context& io,
                                                             const SteadyClock& clock,
                                                             const BenchConfig& c, int first,
                                                             int count, int min_nodes,
                                                             int max_nodes) {
  std::vector<std::unique_ptr<NetworkRendezvous>> clients;
  std::set<std::string> ids;
  for (int i = first; i < first + count; ++i) {
    for (;;) {
      auto client = std::make_unique<NetworkRendezvous>(io, clock,
                                                        client_options(c, i, min_nodes, max_nodes));
      if (ids.insert(client->node_id()).second) {
        clients.push_back(std::move(client));
        break;
      }
    }
  }
  return clients;
}

/// Runs `io` until `done()` holds, checking every millisecond; false on timeout. Calls
/// `progress`, when set, once a second.
bool run_until(asio::io_context& io, const std::function<bool()>& done, double timeout_s,
               const std::function<void()>& progress = {}) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  auto next_report = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (progress && std::chrono::steady_clock::now() >= next_report) {
      progress();
      next_report += std::chrono::seconds(1);
    }
    io.run_for(std::chrono::milliseconds(1));
    if (io.stopped()) io.restart();
  }
  return true;
}

void print(const json& j) { std::cout << j.dump() << std::endl; }

/// Nanoseconds on the monotonic clock, which every process of the bench shares.
std::int64_t mono_ns(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// One line from `fd` (without its newline), or nothing by `deadline` or at end of file.
std::optional<std::string> read_line(int fd, std::chrono::steady_clock::time_point deadline) {
  std::string line;
  char ch = 0;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return std::nullopt;
    const ssize_t got = ::read(fd, &ch, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return std::nullopt;
    if (ch == '\n') return line;
    line += ch;
  }
}

void write_line(int fd, const json& j) {
  const std::string text = j.dump() + "\n";
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

/// A child of the multi-process latency mode: clients first..first+count-1 join; it says
/// "joined" once each has the server's reply, then reports their ranks once the round forms.
[[noreturn]] void run_latency_part(const BenchConfig& c, int first, int count, int fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  asio::io_context io;
  SteadyClock clock;
  auto clients = make_clients(io, clock, c, first, count, c.nodes, c.nodes);
  std::vector<std::optional<RendezvousInfo>> infos(static_cast<std::size_t>(count));
  std::vector<std::string> errors;
  int finished = 0;
  std::optional<TimePoint> first_rank_at, all_ranks_at;
  for (int i = 0; i < count; ++i) {
    clients[static_cast<std::size_t>(i)]->next_rendezvous([&, i](RendezvousResult result) {
      const auto now = clock.now();
      ++finished;
      if (auto* info = std::get_if<RendezvousInfo>(&result))
        infos[static_cast<std::size_t>(i)] = *info;
      else
        errors.push_back(std::get<RendezvousError>(result).message);
      if (!first_rank_at) first_rank_at = now;
      if (finished == count) all_ranks_at = now;
    });
  }
  const bool joined = run_until(
      io,
      [&] {
        return std::all_of(clients.begin(), clients.end(),
                           [](const auto& cl) { return cl->frames_received() >= 2; });
      },
      c.timeout_s);
  write_line(fd, json{{"joined", joined}});
  if (!joined) ::_exit(2);
  const bool complete = run_until(
      io, [&] { return finished == count; }, c.timeout_s);
  json out{{"complete", complete}};
  std::uint64_t frames = 0;
  for (const auto& cl : clients) frames += cl->frames_received();
  out["frames"] = frames - static_cast<std::uint64_t>(count);  // hellos excluded
  json ranks = json::array(), worlds = json::array(), rounds = json::array();
  for (const auto& info : infos) {
    if (!info) continue;
    ranks.push_back(info->group_rank);
    worlds.push_back(info->group_world_size);
    rounds.push_back(info->round);
  }
  out["ranks"] = ranks;
  out["worlds"] = worlds;
  out["rounds"] = rounds;
  if (errors.size() > 10) errors.resize(10);
  out["errors"] = errors;
  if (first_rank_at) out["first_rank_ns"] = mono_ns(*first_rank_at);
  if (all_ranks_at) out["all_ranks_ns"] = mono_ns(*all_ranks_at);
  write_line(fd, out);
  hold(io, c);
  for (auto& cl : clients) cl->leave("benchmark done");
  io.restart();
  io.run_for(std::chrono::milliseconds(200));
  ::_exit(complete ? 0 : 2);
}

/// --mode latency with --procs K > 1: the same figures as run_latency, from K child processes
/// holding the N-1 first clients and this one holding the N-th.
int run_latency_procs(const BenchConfig& c) {
  const int n = c.nodes;
  const int k = std::min(c.procs, n - 1);
  json out{{"mode", "latency"}, {"n", n}, {"procs", k}};
  std::vector<pid_t> children;
  std::vector<int> fds;
  const auto reap = [&] {
    for (pid_t pid : children) ::kill(pid, SIGKILL);
    for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
    for (int fd : fds) ::close(fd);
  };
  const TimePoint first_join_at = std::chrono::steady_clock::now();
  for (int part = 0, first = 0; part < k; ++part) {
    const int count = (n - 1) / k + (part < (n - 1) % k ? 1 : 0);
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(pipe_fds[0]);
      run_latency_part(c, first, count, pipe_fds[1]);
    }
    ::close(pipe_fds[1]);
    children.push_back(pid);
    fds.push_back(pipe_fds[0]);
    first += count;
  }
  const auto deadline = [&] {
    return std::chrono::steady_clock::now() +
           std::chrono::milliseconds(static_cast<long long>(c.timeout_s * 1000));
  };
  const auto wait_joined = deadline();
  for (int fd : fds) {
    const auto line = read_line(fd, wait_joined);
    if (!line || !json::parse(*line, nullptr, false).value("joined", false)) {
      out["error"] = "timed out waiting for the first N-1 joins";
      print(out);
      reap();
      return 2;
    }
  }
  const TimePoint joined_at = std::chrono::steady_clock::now();

  // The last join, from this process.
  asio::io_context io;
  SteadyClock clock;
  auto last = make_clients(io, clock, c, n - 1, 1, n, n);
  std::optional<RendezvousInfo> last_info;
  std::optional<TimePoint> last_rank_at;
  std::string last_error;
  const TimePoint last_join_at = clock.now();
  last.front()->next_rendezvous([&](RendezvousResult result) {
    last_rank_at = clock.now();
    if (auto* info = std::get_if<RendezvousInfo>(&result))
      last_info = *info;
    else
      last_error = std::get<RendezvousError>(result).message;
  });
  const bool complete = run_until(
      io, [&] { return last_rank_at.has_value(); }, c.timeout_s);
  std::vector<std::string> problems;
  if (!complete) problems.push_back("the last client got no round in time");
  if (!last_error.empty()) problems.push_back("the last client: " + last_error);
  std::uint64_t frames = last.front()->frames_received() - 1;
  std::int64_t first_rank_ns = last_rank_at ? mono_ns(*last_rank_at) : 0;
  std::int64_t all_ranks_ns = first_rank_ns;
  std::vector<int> ranks;
  int world_wrong = 0, rounds_other = 0;
  if (last_info) ranks.push_back(last_info->group_rank);
  const auto wait_ranks = deadline();
  for (int fd : fds) {
    const auto line = read_line(fd, wait_ranks);
    const json part = line ? json::parse(*line, nullptr, false) : json();
    if (!part.is_object() || !part.value("complete", false)) {
      problems.push_back("a child's clients did not all get their round in time");
      continue;
    }
    frames += part.at("frames").get<std::uint64_t>();
    for (const auto& rank : part.at("ranks")) ranks.push_back(rank.get<int>());
    for (const auto& world : part.at("worlds")) world_wrong += world.get<int>() != n ? 1 : 0;
    for (const auto& round : part.at("rounds"))
      rounds_other += last_info && round.get<int>() != last_info->round ? 1 : 0;
    for (const auto& e : part.at("errors")) problems.push_back(e.get<std::string>());
    first_rank_ns = std::min(first_rank_ns, part.value("first_rank_ns", first_rank_ns));
    all_ranks_ns = std::max(all_ranks_ns, part.value("all_ranks_ns", all_ranks_ns));
  }
  std::sort(ranks.begin(), ranks.end());
  bool exact = static_cast<int>(ranks.size()) == n;
  for (int i = 0; exact && i < n; ++i) exact = ranks[static_cast<std::size_t>(i)] == i;
  if (!exact) problems.push_back("group ranks are not exactly 0.." + std::to_string(n - 1));
  if (world_wrong)
    problems.push_back(std::to_string(world_wrong) + " clients got another world size");
  if (rounds_other)
    problems.push_back(std::to_string(rounds_other) + " clients are in another round");
  const double ns_per_ms = 1e6;
  out["first_n_minus_1_joined_ms"] = ms_between(first_join_at, joined_at);
  out["last_join_to_first_rank_ms"] =
      static_cast<double>(first_rank_ns - mono_ns(last_join_at)) / ns_per_ms;
  out["last_join_to_all_ranks_ms"] =
      static_cast<double>(all_ranks_ns - mono_ns(last_join_at)) / ns_per_ms;
  out["first_join_to_all_ranks_ms"] =
      static_cast<double>(all_ranks_ns - mono_ns(first_join_at)) / ns_per_ms;
  out["frames_received"] = frames;
  out["ranks_ok"] = problems.empty();
  if (!problems.empty()) {
    if (problems.size() > 10) problems.resize(10);
    out["problems"] = problems;
  }
  print(out);
  hold(io, c);
  last.front()->leave("benchmark done");
  io.restart();
  io.run_for(std::chrono::milliseconds(200));
  for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
  for (int fd : fds) ::close(fd);
  return problems.empty() ? 0 : 1;
}

int run_latency(const BenchConfig& c) {
  if (c.procs > 1 && c.nodes > 2) return run_latency_procs(c);
  const int n = c.nodes;
  asio::io_context io;
  SteadyClock clock;
  auto clients = make_clients(io, clock, c, 0, n, n, n);
  std::vector<std::optional<RendezvousInfo>> infos(n);
  std::vector<std::string> errors;
  int finished = 0;
  std::optional<TimePoint> first_rank_at, all_ranks_at;
  auto join = [&](int i) {
    clients[i]->next_rendezvous([&, i](RendezvousResult result) {
      const auto now = clock.now();
      ++finished;
      if (auto* info = std::get_if<RendezvousInfo>(&result))
        infos[i] = *info;
      else
        errors.push_back(clients[i]->node_id() + ": " + std::get<RendezvousError>(result).message);
      if (!first_rank_at) first_rank_at = now;
      if (finished == n) all_ranks_at = now;
    });
  };

  const TimePoint first_join_at = clock.now();
  json out{{"mode", "latency"}, {"n", n}};
  std::function<void()> progress;
  if (c.progress)
    progress = [&] {
      std::map<std::uint64_t, int> h;
      for (auto& cl : clients) h[cl->frames_received()]++;
      std::string line;
      for (auto [k, v] : h) line += std::to_string(k) + ":" + std::to_string(v) + " ";
      std::cerr << "t=" << ms_between(first_join_at, clock.now()) << " finished=" << finished
                << " frames " << line << "\n";
    };
  // N-1 clients join at once; each has joined once the server's reply to its Join (a Waiting,
  // after the hello) has arrived.
  for (int i = 0; i + 1 < n; ++i) join(i);
  const bool joined = run_until(
      io,
      [&] {
        return std::all_of(clients.begin(), clients.end() - 1,
                           [](const auto& cl) { return cl->frames_received() >= 2; });
      },
      c.timeout_s, progress);
  if (!joined) {
    out["error"] = "timed out waiting for the first N-1 joins";
    print(out);
    return 2;
  }
  const TimePoint joined_at = clock.now();
  std::uint64_t frames_before = 0;
  for (const auto& cl : clients) frames_before += cl->frames_received();

  // The last join: connect, hello and Join of the N-th client.
  const TimePoint last_join_at = clock.now();
  join(n - 1);
  const bool complete = run_until(
      io, [&] { return finished == n; }, c.timeout_s, progress);
  if (!complete) {
    out["error"] =
        "timed out: " + std::to_string(finished) + " of " + std::to_string(n) + " clients finished";
    if (errors.size() > 10) errors.resize(10);
    out["problems"] = errors;
    print(out);
    return 2;
  }
  std::uint64_t frames_after = 0;
  for (const auto& cl : clients) frames_after += cl->frames_received();

  // Checks: no errors, one round, world size n, ranks exactly 0..n-1.
  std::vector<std::string> problems = errors;
  std::set<int> ranks;
  for (int i = 0; i < n; ++i) {
    if (!infos[i]) continue;
    if (infos[i]->group_world_size != n)
      problems.push_back("client " + std::to_string(i) + " got world size " +
                         std::to_string(infos[i]->group_world_size));
    if (!ranks.insert(infos[i]->group_rank).second)
      problems.push_back("duplicate group rank " + std::to_string(infos[i]->group_rank));
    if (infos[i]->round != infos[0].value_or(RendezvousInfo{}).round)
      problems.push_back("client " + std::to_string(i) + " is in another round");
  }
  if (static_cast<int>(ranks.size()) != n ||
      (n > 0 && (*ranks.begin() != 0 || *ranks.rbegin() != n - 1)))
    problems.push_back("group ranks are not exactly 0.." + std::to_string(n - 1));

  out["first_join_to_all_ranks_ms"] = ms_between(first_join_at, *all_ranks_at);
  out["first_n_minus_1_joined_ms"] = ms_between(first_join_at, joined_at);
  out["last_join_to_first_rank_ms"] = ms_between(last_join_at, *first_rank_at);
  out["last_join_to_all_ranks_ms"] = ms_between(last_join_at, *all_ranks_at);
  // Everything the clients received, hellos excluded: the replies to the joins, any Waiting
  // broadcasts, and one RoundReady each.
  out["frames_received"] = frames_after - static_cast<std::uint64_t>(n);
  out["frames_received_during_last_join"] = frames_after - frames_before;
  out["ranks_ok"] = problems.empty();
  if (!problems.empty()) {
    if (problems.size() > 10) problems.resize(10);
    out["problems"] = problems;
  }
  print(out);
  hold(io, c);

  for (auto& cl : clients) cl->leave("benchmark done");
  io.restart();
  io.run_for(std::chrono::milliseconds(200));
  return problems.empty() ? 0 : 1;
}

/// The forked child of the loss mode: one client that joins and then only heartbeats.
[[noreturn]] void run_victim(const BenchConfig& c, int index, int max_nodes) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  asio::io_context io;
  SteadyClock clock;
  NetworkRendezvous client(io, clock, client_options(c, index, c.min_nodes, max_nodes));
  client.next_rendezvous([](RendezvousResult) {});
  io.run();
  _exit(0);
}

int run_loss(const BenchConfig& c) {
  const int m = c.nodes;
  if (m < 2 || c.min_nodes > m - 1) {
    std::cerr << "ddprun-rdzv-bench: --mode loss needs --nodes >= 2 and --min <= nodes - 1\n";
    return 64;
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) run_victim(c, m - 1, m);

  json out{{"mode", "loss"},
           {"victim", c.victim},
           {"nodes", m},
           {"min_nodes", c.min_nodes},
           {"keep_alive_interval_ms", c.keep_alive_interval_s * 1000},
           {"keep_alive_max_attempt", c.keep_alive_max_attempt},
           {"keep_alive_window_ms", c.keep_alive_interval_s * 1000 * c.keep_alive_max_attempt}};
  int rc = 0;
  {
    asio::io_context io;
    SteadyClock clock;
    auto clients = make_clients(io, clock, c, 0, m - 1, c.min_nodes, m);
    std::vector<std::optional<RendezvousInfo>> infos(m - 1);
    std::vector<std::optional<TimePoint>> restarted_at(m - 1), next_round_at(m - 1);
    std::vector<std::optional<RendezvousInfo>> next_infos(m - 1);
    std::string reason;
    int ready = 0, failed = 0, next_failed = 0;
    for (int i = 0; i < m - 1; ++i) {
      clients[i]->set_notice_handler([&, i](Notice notice) {
        if (auto* restart = std::get_if<Restart>(&notice)) {
          if (restarted_at[i]) return;
          restarted_at[i] = clock.now();
          reason = restart->reason;
          // As an agent does once its workers stopped: join the next round.
          asio::post(io, [&, i] {
            clients[i]->next_rendezvous([&, i](RendezvousResult result) {
              next_round_at[i] = clock.now();
              if (auto* info = std::get_if<RendezvousInfo>(&result))
                next_infos[i] = *info;
              else
                ++next_failed;
            });
          });
        }
      });
      clients[i]->next_rendezvous([&, i](RendezvousResult result) {
        if (auto* info = std::get_if<RendezvousInfo>(&result))
          infos[i] = *info, ++ready;
        else
          ++failed;
      });
    }
    if (!run_until(
            io, [&] { return ready + failed == m - 1; }, c.timeout_s) ||
        failed > 0 || infos[0]->group_world_size != m) {
      out["error"] = "the first round did not complete with all " + std::to_string(m) + " nodes";
      rc = 2;
    } else {
      // Let a few heartbeats pass so the victim is in its steady state, then signal it at a
      // random point of its heartbeat cycle: the server's reaction to a silent node depends on
      // how long ago its last heartbeat arrived.
      std::random_device rd;
      const double phase = std::uniform_real_distribution<double>(0.0, 1.0)(rd);
      run_until(
          io, [] { return false; }, c.keep_alive_interval_s * (2 + phase));
      const TimePoint signalled_at = clock.now();
      kill(child, c.victim == "stop" ? SIGSTOP : SIGKILL);
      const bool reacted = run_until(
          io,
          [&] {
            return std::all_of(restarted_at.begin(), restarted_at.end(),
                               [](const auto& t) { return t.has_value(); });
          },
          c.timeout_s);
      if (!reacted) {
        out["error"] = "the survivors got no Restart";
        rc = 2;
      } else {
        TimePoint first = *restarted_at[0], last = *restarted_at[0];
        for (const auto& t : restarted_at) first = std::min(first, *t), last = std::max(last, *t);
        out["signal_to_first_restart_ms"] = ms_between(signalled_at, first);
        out["signal_to_all_restarts_ms"] = ms_between(signalled_at, last);
        out["reason"] = reason;
        // The next round: every survivor holds a rank of it, 0..M-2 exactly.
        const bool formed = run_until(
            io,
            [&] {
              return std::all_of(next_round_at.begin(), next_round_at.end(),
                                 [](const auto& t) { return t.has_value(); });
            },
            c.timeout_s);
        std::set<int> ranks;
        for (const auto& info : next_infos)
          if (info && info->group_world_size == m - 1) ranks.insert(info->group_rank);
        const bool right = formed && next_failed == 0 && static_cast<int>(ranks.size()) == m - 1 &&
                           *ranks.begin() == 0 && *ranks.rbegin() == m - 2;
        if (!right) {
          out["error"] = "the survivors did not all get ranks 0.." + std::to_string(m - 2) +
                         " of the next round";
          rc = 2;
        } else {
          TimePoint all = *next_round_at[0];
          for (const auto& t : next_round_at) all = std::max(all, *t);
          out["signal_to_next_round_ms"] = ms_between(signalled_at, all);
        }
      }
    }
    for (auto& cl : clients) cl->leave("benchmark done");
    io.restart();
    io.run_for(std::chrono::milliseconds(100));
  }
  kill(child, SIGKILL);
  kill(child, SIGCONT);
  waitpid(child, nullptr, 0);
  print(out);
  return rc;
}

/// Per-job bookkeeping of the jobs mode.
struct JobRun {
  std::vector<std::unique_ptr<NetworkRendezvous>> clients;
  int round = -1;  ///< the round the job's clients hold (after RoundReady)
  int joins = 0;   ///< clients that have called next_rendezvous for the forming round
  int ranks = 0;   ///< clients holding their rank in the forming round
  TimePoint last_join_at;
  TimePoint failure_at;    ///< when a client reported the failure that started the forming round
  bool measured = false;   ///< the forming round started inside the measurement window
  bool in_flight = false;  ///< a failure was reported and the next round is not complete
};

/// The q-quantile (0..1) of `v` by the nearest-rank method; v is sorted.
double quantile(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

json summary(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {{"count", v.size()},
          {"median", quantile(v, 0.5)},
          {"p90", quantile(v, 0.9)},
          {"p99", quantile(v, 0.99)},
          {"max", v.empty() ? 0.0 : v.back()}};
}

/// J jobs of N clients (distinct rdzv ids, --nnodes N:N) on one io_context. Round 0 forms as
/// the clients join; then each job repeats rounds until the measurement window ends: one of its
/// clients reports a worker failure (counted, within a large --max_restarts), the server sends
/// every participant a Restart, each client joins the next round at once, and the server
/// completes it when the N-th join arrives (a re-round completes as soon as no node is
/// stopping). A job pauses --round-gap-ms between the end of one round and its failure report.
int run_jobs(const BenchConfig& c) {
  const int jobs = c.jobs, n = c.nodes;
  asio::io_context io;
  SteadyClock clock;
  std::mt19937 random(std::random_device{}());
  std::vector<JobRun> runs(jobs);
  std::vector<std::unique_ptr<asio::steady_timer>> gaps;
  std::vector<double> join_to_ranks_ms, failure_to_ranks_ms;
  std::vector<std::string> errors;
  int formed0 = 0;  // jobs whose round 0 is complete
  bool cycling = false, in_window = false, stopping = false;
  TimePoint window_start{}, window_end{};
  long long rounds_in_window = 0;
  const auto gap_ms = [&](bool first) {
    if (c.round_gap_ms <= 0) return 0.0;
    // The first gap is spread over [0, gap] so the jobs do not restart in step.
    return first ? std::uniform_real_distribution<double>(0, c.round_gap_ms)(random)
                 : c.round_gap_ms;
  };

  std::function<void(int)> start_round;  // a client of job j reports a failure
  std::function<void(int, int)> join;    // client i of job j calls next_rendezvous
  const auto schedule_next = [&](int j, bool first) {
    const double wait = gap_ms(first);
    gaps[j]->expires_after(std::chrono::microseconds(static_cast<long long>(wait * 1000)));
    gaps[j]->async_wait([&, j](boost::system::error_code ec) {
      if (!ec && !stopping) start_round(j);
    });
  };
  start_round = [&](int j) {
    JobRun& run = runs[j];
    run.failure_at = clock.now();
    run.in_flight = true;
    run.measured = in_window;
    ddprun::rdzv::WorkersFailed failure;
    failure.round = run.round;
    failure.description = "benchmark: a worker of round " + std::to_string(run.round) + " failed";
    failure.exit_code = 1;
    run.clients[0]->report_failure(failure);
  };
  join = [&](int j, int i) {
    JobRun& run = runs[j];
    if (++run.joins == n) run.last_join_at = clock.now();
    run.clients[i]->next_rendezvous([&, j](RendezvousResult result) {
      JobRun& r = runs[j];
      const TimePoint now = clock.now();
      if (auto* error = std::get_if<RendezvousError>(&result)) {
        errors.push_back("job " + std::to_string(j) + ": " + error->message);
        r.in_flight = false;  // the job is over for this benchmark: counted as an error
        return;
      }
      const auto& info = std::get<RendezvousInfo>(result);
      if (++r.ranks < n) return;
      // Every client of the job holds its rank: the round is complete.
      r.round = info.round;
      r.joins = r.ranks = 0;
      r.in_flight = false;
      if (info.round == 0) {
        ++formed0;
      } else if (r.measured) {
        join_to_ranks_ms.push_back(ms_between(r.last_join_at, now));
        failure_to_ranks_ms.push_back(ms_between(r.failure_at, now));
        if (now <= window_end) ++rounds_in_window;
      }
      if (cycling && !stopping) schedule_next(j, false);
    });
  };

  for (int j = 0; j < jobs; ++j) {
    BenchConfig jc = c;
    jc.run_id = c.run_id + "-job" + std::to_string(j);
    runs[j].clients = make_clients(io, clock, jc, 0, n, n, n);
    gaps.push_back(std::make_unique<asio::steady_timer>(io));
    for (int i = 0; i < n; ++i) {
      runs[j].clients[i]->set_notice_handler([&, j, i](Notice notice) {
        if (std::holds_alternative<Restart>(notice)) {
          // Restart -> join the next round at once, as an agent does once its workers stopped.
          asio::post(io, [&, j, i] { join(j, i); });
        } else if (auto* error = std::get_if<RendezvousError>(&notice)) {
          errors.push_back("job " + std::to_string(j) + ": " + error->message);
          runs[j].in_flight = false;
        } else if (auto* closed = std::get_if<ddprun::rdzv::Closed>(&notice)) {
          errors.push_back("job " + std::to_string(j) + " closed: " + closed->message);
          runs[j].in_flight = false;
        }
      });
    }
  }
  json out{{"mode", "jobs"},
           {"jobs", jobs},
           {"nodes", n},
           {"clients", jobs * n},
           {"round_gap_ms", c.round_gap_ms},
           {"duration_s", c.duration_s},
           {"warmup_s", c.warmup_s}};

  // Round 0 of every job: all clients join at once.
  const TimePoint setup_start = clock.now();
  for (int j = 0; j < jobs; ++j)
    for (int i = 0; i < n; ++i) join(j, i);
  if (!run_until(
          io, [&] { return formed0 == jobs || !errors.empty(); }, c.timeout_s) ||
      !errors.empty()) {
    out["error"] =
        "round 0 formed for " + std::to_string(formed0) + " of " + std::to_string(jobs) + " jobs";
    if (errors.size() > 10) errors.resize(10);
    out["problems"] = errors;
    print(out);
    return 2;
  }
  out["round0_all_jobs_ms"] = ms_between(setup_start, clock.now());
  // bench/rdzv_attack_bench.py starts its attacker on this line.
  std::cerr << "ddprun-rdzv-bench: round 0 formed for all " << jobs << " jobs" << std::endl;

  // Warm-up, then the measurement window: every job restarts round after round.
  cycling = true;
  for (int j = 0; j < jobs; ++j) schedule_next(j, true);
  run_until(
      io, [] { return false; }, c.warmup_s);
  in_window = true;
  window_start = clock.now();
  window_end =
      window_start + std::chrono::milliseconds(static_cast<long long>(c.duration_s * 1000));
  run_until(
      io, [&] { return clock.now() >= window_end; }, c.duration_s + 5);
  stopping = true;
  for (auto& g : gaps) g->cancel();
  // Rounds under way finish (they are measured); no new ones start. Bounded: a round that
  // needs a lost node back never completes.
  const bool drained = run_until(
      io,
      [&] {
        return std::all_of(runs.begin(), runs.end(), [](const JobRun& r) { return !r.in_flight; });
      },
      std::min(c.timeout_s, 30.0));

  out["window_s"] = ms_between(window_start, window_end) / 1000;
  out["rounds"] = join_to_ranks_ms.size();
  out["rounds_per_s"] =
      static_cast<double>(rounds_in_window) / (c.duration_s > 0 ? c.duration_s : 1);
  out["last_join_to_all_ranks_ms"] = summary(join_to_ranks_ms);
  out["failure_to_all_ranks_ms"] = summary(failure_to_ranks_ms);
  out["drained"] = drained;
  out["errors"] = errors.size();
  out["jobs_in_flight_at_end"] =
      std::count_if(runs.begin(), runs.end(), [](const JobRun& r) { return r.in_flight; });
  if (!errors.empty()) {
    if (errors.size() > 10) errors.resize(10);
    out["problems"] = errors;
  }
  print(out);
  for (auto& run : runs)
    for (auto& cl : run.clients) cl->leave("benchmark done");
  io.restart();
  io.run_for(std::chrono::milliseconds(500));
  return errors.empty() && drained ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  BenchConfig c;
  CLI::App app{
      "ddprun-rdzv-bench: rendezvous latency and node-loss reaction of many light "
      "agents (no workers) in one process, against ddprun-rdzvd",
      "ddprun-rdzv-bench"};
  app.add_option("--mode", c.mode, "latency, loss or jobs")
      ->check(CLI::IsMember({"latency", "loss", "jobs"}));
  app.add_option("--host", c.host, "the daemon's address (default 127.0.0.1)");
  app.add_option("--port", c.port, "the daemon's port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--run-id", c.run_id, "rdzv_id of the job (default: one made from the pid)");
  app.add_option("--nodes", c.nodes, "number of agents (latency: N of N:N; loss: the maximum)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--min", c.min_nodes, "loss: the minimum of --nnodes MIN:MAX (default 2)");
  app.add_option("--keep-alive-interval", c.keep_alive_interval_s,
                 "keep_alive_interval in seconds (default: 5 in latency, 0.5 in loss)");
  app.add_option("--keep-alive-max-attempt", c.keep_alive_max_attempt,
                 "keep_alive_max_attempt (default 3)");
  app.add_flag("--progress", c.progress,
               "latency: print, every second on stderr, how many clients finished and how many "
               "frames each received");
  app.add_option("--victim", c.victim,
                 "loss: kill (SIGKILL: the socket closes) or stop (SIGSTOP: heartbeats stop)")
      ->check(CLI::IsMember({"kill", "stop"}));
  app.add_option("--jobs", c.jobs, "jobs: number of concurrent jobs (default 1000)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--round-gap-ms", c.round_gap_ms,
                 "jobs: pause between the end of a job's round and its next failure report "
                 "(default 0: back to back)")
      ->check(CLI::Range(0.0, 3600000.0));
  app.add_option("--duration", c.duration_s,
                 "jobs: seconds of the measurement window after every round 0 formed (default 20)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--warmup", c.warmup_s,
                 "jobs: seconds of repeated rounds, not measured, between round 0 and the "
                 "window (default 5)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--procs", c.procs,
                 "latency: spread the first N-1 clients over this many processes (default 1; "
                 "each process holds at most its descriptor limit of sockets)")
      ->check(CLI::Range(1, 64));
  app.add_option("--hold", c.hold_s,
                 "latency: seconds the clients stay in the running round after the figures are "
                 "printed, before they leave (default 0): the daemon's memory with the round "
                 "running can be read then")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--timeout", c.timeout_s, "give up after this many seconds (default 120)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (c.keep_alive_interval_s <= 0) c.keep_alive_interval_s = c.mode == "loss" ? 0.5 : 5.0;
  if (c.run_id.empty()) c.run_id = "bench-" + c.mode + "-" + std::to_string(getpid());
  spdlog::set_level(spdlog::level::warn);  // one process speaks for N agents: no per-agent lines
  std::signal(SIGPIPE, SIG_IGN);
  ddprun::common::raise_open_file_limit();  // 1024 clients need more than 1024 descriptors
  try {
    if (c.mode == "jobs") return run_jobs(c);
    return c.mode == "latency" ? run_latency(c) : run_loss(c);
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rdzv-bench: " << e.what() << "\n";
    return 70;
  }
}
