// Rendezvous latency on etcd v3 against ddprun-rdzvd, in one run
// (docs/benchmarks.md#rendezvous-on-etcd-v3): for each N, N light clients in this process (the
// agent's own handlers, no workers) form one round of a job with --nnodes N:N, once through a
// three-member etcd on 127.0.0.1 that this program starts (EtcdRendezvous) and once through a
// ddprun-rdzvd it starts (NetworkRendezvous). N-1 clients join first; once the rendezvous holds all
// N-1, the N-th calls next_rendezvous(). "last join -> all ranks" runs from that call to the last
// client holding its group rank.

#include <signal.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>

#include "common/clock.h"
#include "common/log.h"
#include "common/open_files.h"
#include "etcd/etcd_rendezvous.h"
#include "rendezvous/free_port.h"
#include "rendezvous/network_rendezvous.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/support/polling.h"
#include "tests/support/subprocess.h"

using namespace ddprun;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

rdzv::RdzvSettings settings_for(int n, double timeout_s) {
  rdzv::RdzvSettings s;
  s.min_nodes = n;
  s.max_nodes = n;
  s.nproc_per_node = 1;
  s.max_restarts = 3;
  s.join_timeout = rdzv::Millis(static_cast<long long>(timeout_s * 1000));
  return s;  // keep-alive: torchrun's default, 5 s x 3
}

struct Outcome {
  bool ok = false;
  double first_to_all_ms = 0;
  double last_to_all_ms = 0;
  std::string problem;
};

/// Forms one round of `handlers`: N-1 join, `joined()` says when the rendezvous holds them,
/// then the last joins. Checks ranks 0..N-1 and world size N.
Outcome form_round(boost::asio::io_context& io,
                   std::vector<std::unique_ptr<rdzv::RendezvousHandler>>& handlers,
                   const std::function<bool()>& joined, double timeout_s) {
  const int n = static_cast<int>(handlers.size());
  std::vector<std::optional<rdzv::RendezvousResult>> results(n);
  int finished = 0;
  auto join = [&](int i) {
    handlers[i]->next_rendezvous([&, i](rdzv::RendezvousResult r) {
      results[i] = std::move(r);
      ++finished;
    });
  };
  const auto limit = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  Outcome out;
  const auto first = Clock::now();
  for (int i = 0; i + 1 < n; ++i) join(i);
  if (!testing::run_until(io, joined, limit)) {
    out.problem = "the first N-1 did not all join within the timeout";
    return out;
  }
  const auto last = Clock::now();
  join(n - 1);
  if (!testing::run_until(
          io, [&] { return finished == n; }, limit)) {
    out.problem = std::to_string(finished) + " of " + std::to_string(n) + " got a round";
    return out;
  }
  const auto all = Clock::now();
  std::set<int> ranks;
  for (const auto& r : results) {
    const auto* info = std::get_if<rdzv::RendezvousInfo>(&*r);
    if (!info) {
      out.problem = std::get<rdzv::RendezvousError>(*r).message;
      return out;
    }
    if (info->group_world_size != n) out.problem = "a world size is not N";
    ranks.insert(info->group_rank);
  }
  if (static_cast<int>(ranks.size()) != n) out.problem = "group ranks are not 0..N-1";
  out.ok = out.problem.empty();
  out.first_to_all_ms = ms_between(first, all);
  out.last_to_all_ms = ms_between(last, all);
  return out;
}

Outcome run_etcd(const testing::EtcdCluster& cluster, int n, double timeout_s) {
  boost::asio::io_context io;
  common::SteadyClock clock;
  const std::string run_id = "bench" + std::to_string(n);
  std::vector<std::unique_ptr<rdzv::RendezvousHandler>> handlers;
  for (int i = 0; i < n; ++i) {
    etcd::EtcdRendezvousOptions o;
    o.run_id = run_id;
    o.client.members = cluster.members();
    o.name = "node" + std::to_string(i);
    o.local_addr = "127.0.0.1";
    o.master_port = 29500;
    o.settings = settings_for(n, timeout_s);
    handlers.push_back(std::make_unique<etcd::EtcdRendezvous>(io, clock, std::move(o)));
  }
  // The rendezvous holds the N-1 once `state` lists them (read with a client of its own).
  auto reader = std::make_shared<etcd::Client>(io, cluster.client_settings());
  const std::string key = etcd::state_key(etcd::job_prefix(run_id));
  bool reading = false;
  bool all_in = false;
  auto joined = [&] {
    if (!reading && !all_in) {
      reading = true;
      reader->call(etcd::range({key, "", 0, 0, false}), [&](etcd::Reply reply) {
        reading = false;
        if (!reply) return;
        auto r = etcd::decode_range(*reply);
        if (!r || r->kvs.empty()) return;
        auto j = nlohmann::json::parse(r->kvs[0].value, nullptr, false);
        if (j.is_object() && j.contains("job") && j["job"].contains("nodes"))
          all_in = static_cast<int>(j["job"]["nodes"].size()) == n - 1;
      });
    }
    return all_in;
  };
  Outcome out = form_round(io, handlers, joined, timeout_s);
  for (auto& h : handlers) h->leave("benchmark done");
  int flushed = 0;
  for (auto& h : handlers)
    static_cast<etcd::EtcdRendezvous&>(*h).when_flushed([&flushed] { ++flushed; });
  testing::run_until(
      io, [&] { return flushed == n; }, 30s);
  reader->close();
  return out;
}

Outcome run_rdzvd(int port, int n, double timeout_s) {
  boost::asio::io_context io;
  common::SteadyClock clock;
  std::vector<std::unique_ptr<rdzv::RendezvousHandler>> handlers;
  std::vector<rdzv::NetworkRendezvous*> clients;
  for (int i = 0; i < n; ++i) {
    rdzv::NetworkRendezvousOptions o;
    o.run_id = "bench" + std::to_string(n);
    o.endpoint_host = "127.0.0.1";
    o.endpoint_port = port;
    o.name = "node" + std::to_string(i);
    o.local_addr = "127.0.0.1";
    o.master_port = 29500;
    o.settings = settings_for(n, timeout_s);
    auto c = std::make_unique<rdzv::NetworkRendezvous>(io, clock, std::move(o));
    clients.push_back(c.get());
    handlers.push_back(std::move(c));
  }
  // The server holds a client once its reply to the join (a Waiting, after the hello) came.
  auto joined = [&] {
    for (std::size_t i = 0; i + 1 < clients.size(); ++i)
      if (clients[i]->frames_received() < 2) return false;
    return true;
  };
  Outcome out = form_round(io, handlers, joined, timeout_s);
  for (auto& h : handlers) h->leave("benchmark done");
  testing::run_until(
      io, [] { return false; }, 200ms);
  return out;
}

void print(const char* backend, int n, const Outcome& o) {
  if (o.ok)
    std::printf("| %-22s | %5d | %10.1f | %10.1f |\n", backend, n, o.last_to_all_ms,
                o.first_to_all_ms);
  else
    std::printf("| %-22s | %5d | failed: %s | |\n", backend, n, o.problem.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rendezvous latency: etcd v3 (3 members) against ddprun-rdzvd"};
  std::vector<int> sizes{8, 64, 256, 1024};
  std::string rdzvd = "ddprun-rdzvd";
  double timeout_s = 300;
  app.add_option("--nodes", sizes, "N values")->delimiter(',');
  app.add_option("--rdzvd", rdzvd, "the ddprun-rdzvd binary");
  app.add_option("--timeout", timeout_s, "seconds per phase of one round");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);  // each light client's status lines are noise here
  ddprun::common::raise_open_file_limit();

  testing::EtcdCluster cluster;
  if (!cluster.wait_ready()) {
    std::fprintf(stderr, "etcd cluster not ready:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  auto port = rdzv::find_free_port("127.0.0.1");
  if (!port.ok()) return 1;
  const int rdzvd_port = *port;
  testing::Subprocess daemon({rdzvd, "--port", std::to_string(rdzvd_port), "--host", "127.0.0.1"});
  if (!testing::wait_until([&] { return testing::contains(daemon.err_so_far(), "listening on"); },
                           10s)) {
    std::fprintf(stderr, "ddprun-rdzvd did not start: %s\n", daemon.err_so_far().c_str());
    return 1;
  }
  std::printf("| rendezvous | N | last join -> all ranks, ms | first join -> all ranks, ms |\n");
  std::printf("|---|---|---|---|\n");
  for (int n : sizes) {
    print("ddprun-rdzvd", n, run_rdzvd(rdzvd_port, n, timeout_s));
    print("etcd-v3 (3 members)", n, run_etcd(cluster, n, timeout_s));
  }
  daemon.send(SIGTERM);
  daemon.wait(10s);
  return 0;
}
