// Latency of the etcd v3 client (etcd/client.h) against a three-member etcd cluster on
// 127.0.0.1 that it starts itself (tests/etcd/etcd_cluster.h), one request at a time on one
// io_context, as the agent would send them: range, put, txn, and the time from sending a put
// to its event arriving on a prefix watch; then the time the first put takes after the
// leader is killed. docs/benchmarks.md#etcd-v3-client has the figures and the command.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "etcd/client.h"
#include "tests/etcd/etcd_cluster.h"

using namespace ddprun;
using namespace ddprun::etcd;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Figures {
  std::vector<double> ms;
  int errors = 0;
};

void print(const std::string& name, Figures f) {
  std::sort(f.ms.begin(), f.ms.end());
  auto at = [&](double q) {
    return f.ms.empty() ? 0.0 : f.ms[static_cast<std::size_t>(q * (f.ms.size() - 1))];
  };
  double sum = 0;
  for (double v : f.ms) sum += v;
  std::printf("| %-28s | %6zu | %7.3f | %7.3f | %7.3f | %7.3f | %d |\n", name.c_str(), f.ms.size(),
              f.ms.empty() ? 0.0 : sum / f.ms.size(), at(0.5), at(0.99),
              f.ms.empty() ? 0.0 : f.ms.back(), f.errors);
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

/// Sends `make(i)` n times, one after another; the latency of each reply.
Figures sequential(boost::asio::io_context& io, Client& client, int n,
                   const std::function<Request(int)>& make,
                   const std::function<bool(const nlohmann::json&)>& ok = {}) {
  Figures f;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    auto reply = testing::call_sync(io, client, make(i), 30s);
    if (reply && (!ok || ok(*reply)))
      f.ms.push_back(ms_since(t0));
    else
      ++f.errors;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"etcd v3 client latency on a three-member loopback cluster"};
  int n = 1000;
  app.add_option("--requests", n, "requests of each kind")->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);

  testing::EtcdCluster cluster;
  if (!cluster.wait_ready()) {
    std::fprintf(stderr, "etcd cluster not ready:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  const int leader = cluster.leader();
  std::vector<Member> members = cluster.members();
  std::rotate(members.begin(), members.begin() + leader, members.end());
  boost::asio::io_context io;
  ClientSettings settings;
  settings.members = members;  // the leader first: no forwarding inside etcd
  auto client = std::make_shared<Client>(io, settings);

  std::printf(
      "| request (%d members, leader first) | n | mean ms | p50 ms | p99 ms | max ms | errors |\n",
      cluster.size());
  std::printf("|---|---|---|---|---|---|---|\n");
  const std::string prefix = "/ddprun/bench/";
  print("put", sequential(io, *client, n, [&](int i) {
          return put({prefix + "k" + std::to_string(i % 64), std::string(200, 'x'), 0, false});
        }));
  print("range (one key)", sequential(io, *client, n, [&](int i) {
          return range({prefix + "k" + std::to_string(i % 64), "", 0, 0, false});
        }));
  print("range (64 keys by prefix)", sequential(io, *client, n, [&](int) {
          return range({prefix, prefix_end(prefix), 0, 0, false});
        }));
  // A txn as a rendezvous transition: compare a mod revision, put on success.
  // Each compares on the revision the previous one wrote, so every one succeeds (a failed
  // compare counts as an error).
  std::int64_t seen = 0;
  print("txn (compare and put)",
        sequential(
            io, *client, n,
            [&](int) {
              return txn(
                  {{prefix + "state", CompareTarget::ModRevision, CompareResult::Equal, seen, ""}},
                  {PutOp{prefix + "state", std::string(200, 's'), 0, false}},
                  {RangeOp{prefix + "state", "", 0, 0, false}});
            },
            [&](const nlohmann::json& body) {
              auto t = decode_txn(body);
              if (!t || !t->succeeded) return false;
              seen = t->header.revision;
              return true;
            }));

  // Watch delivery: from sending a put to its event on the watch.
  Figures watch;
  std::map<std::string, Clock::time_point> sent;
  std::map<std::string, double> delivered;
  auto w = client->watch(
      {prefix + "w/", prefix_end(prefix + "w/"), 0, true, false},
      [&](const WatchResponse& r) {
        for (const Event& e : r.events) {
          auto it = sent.find(e.kv.key);
          if (it != sent.end()) delivered[e.kv.key] = ms_since(it->second);
        }
      },
      [](const common::Error&) {});
  testing::run_until(
      io, [&] { return w->next_revision() != 0; }, 10s);
  for (int i = 0; i < n; ++i) {
    const std::string key = prefix + "w/" + std::to_string(i);
    sent[key] = Clock::now();
    client->call(put({key, "v", 0, false}), [](Reply) {});
    if (testing::run_until(
            io, [&] { return delivered.count(key) == 1; }, 10s))
      watch.ms.push_back(delivered[key]);
    else
      ++watch.errors;
  }
  print("put -> watch event", watch);
  w->cancel();

  // Failover: SIGKILL to the leader (the client's current member), then a range until one is
  // answered, then puts until one lands, both timed from the kill.
  for (int i = 0; i < 3; ++i) {  // warm connections to the leader
    (void)testing::call_sync(io, *client, put({prefix + "f", "warm", 0, false}));
  }
  cluster.kill(leader);
  const auto t0 = Clock::now();
  // A range may be sent again on another member; a put may not (it could have been applied).
  Figures read_after;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto reply = testing::call_sync(io, *client, range({prefix + "f", "", 0, 0, false}), 30s);
    if (reply) {
      read_after.ms.push_back(ms_since(t0));
      break;
    }
    ++read_after.errors;
  }
  print("leader killed -> range read", read_after);
  Figures failover;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto reply = testing::call_sync(io, *client, put({prefix + "f", "after", 0, false}), 30s);
    if (reply) {
      failover.ms.push_back(ms_since(t0));
      break;
    }
    ++failover.errors;
  }
  print("leader killed -> put applied", failover);
  client->close();
  return 0;
}
