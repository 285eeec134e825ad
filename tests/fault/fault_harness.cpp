// ddprun-fault: a multi-node ddp_train job on one machine (agents on 127.0.0.x, or one of them in
// a network namespace), with one fault per round injected at a point drawn from a seed, and the
// guarantees a user relies on asserted after each round:
//
//   the job completes (every agent exits 0)      the restart count is what the fault implies
//   every rank's final parameters are bitwise those of an uninterrupted run (same world, seed)
//   no process of the job remains                no torn or corrupt snapshot is ever loaded
//
//   ddprun-fault --rounds 100 --seed 7            # soak: kinds drawn from the seed
//   ddprun-fault --seed 7 --round 42              # replay one round exactly as drawn
//   ddprun-fault --faults partition,disk_full     # only these kinds
//
// Each round prints what it drew; a failed round prints its replay command and what went wrong.
// See docs/design.md#fault-injection.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <variant>

#include "rendezvous/free_port.h"
#include "tests/fault/netns.h"
#include "tests/support/polling.h"
#include "tests/support/subprocess.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ddprun::testing::contains;
using ddprun::testing::count_of;
using ddprun::testing::lines_of;
using ddprun::testing::read_file;
using ddprun::testing::Subprocess;
using ddprun::testing::TempDir;
using ddprun::testing::wait_until;

namespace ddprun::fault {
namespace {

enum class FaultKind {
  WorkerKill,       ///< SIGKILL of one worker
  AgentKill,        ///< SIGKILL of one agent (node loss), then a replacement agent
  WorkerHang,       ///< SIGSTOP of one worker, found by --watchdog_timeout
  DaemonKill,       ///< SIGKILL of ddprun-rdzvd, then a new one on the same port
  Partition,        ///< one node's network cut (a veth link down), then healed
  SnapshotCorrupt,  ///< rank 0 killed, then the newest snapshot truncated or scrambled
  DiskFull,         ///< the snapshot file system (a small tmpfs) filled so a save fails
};

constexpr std::array kAllKinds{
    FaultKind::WorkerKill, FaultKind::AgentKill,       FaultKind::WorkerHang, FaultKind::DaemonKill,
    FaultKind::Partition,  FaultKind::SnapshotCorrupt, FaultKind::DiskFull};

const char* kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::WorkerKill:
      return "worker_kill";
    case FaultKind::AgentKill:
      return "agent_kill";
    case FaultKind::WorkerHang:
      return "worker_hang";
    case FaultKind::DaemonKill:
      return "daemon_kill";
    case FaultKind::Partition:
      return "partition";
    case FaultKind::SnapshotCorrupt:
      return "snapshot_corrupt";
    case FaultKind::DiskFull:
      return "disk_full";
  }
  return "?";
}

/// Restarts (TORCHELASTIC_RESTART_COUNT at the end) that one fault of this kind implies: a
/// lost daemon is not a restart (the agents re-register their running round); every other
/// fault fails or loses a node once, which the job's budget counts once.
int expected_restarts(FaultKind k) { return k == FaultKind::DaemonKill ? 0 : 1; }

/// What the harness does, from the command line.
struct Options {
  int rounds = 1;
  uint64_t seed = 1;
  int only_round = -1;
  std::vector<FaultKind> kinds{kAllKinds.begin(), kAllKinds.end()};
  int nodes = 2;
  int nproc = 2;
  int epochs = 8;
  int dataset = 4096;
  int watchdog_s = 8;
  bool verbose = false;
};

/// splitmix64: one well-mixed 64-bit value per (seed, round), so a round replays on its own.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Everything a round decides from the seed.
struct Draw {
  FaultKind kind = FaultKind::WorkerKill;
  int victim_node = 0;
  int victim_local = 0;
  int after_epoch = 1;   ///< inject once rank 0 saved the snapshot of this epoch ...
  int delay_ms = 0;      ///< ... and this long after
  bool truncate = true;  ///< snapshot_corrupt: truncate (else scramble 256 bytes)
  double cut_at = 0.5;   ///< where in the file (fraction of its size)
  int outage_ms = 0;     ///< daemon down or network cut this long (beyond detection)
};

Draw draw_round(const Options& o, int round) {
  uint64_t state = mix(o.seed * 0x100000001b3ULL + static_cast<uint64_t>(round));
  auto next = [&](uint64_t n) {
    state = mix(state);
    return static_cast<int>(state % n);
  };
  Draw d;
  d.kind = o.kinds[static_cast<size_t>(next(o.kinds.size()))];
  d.victim_node = next(static_cast<uint64_t>(o.nodes));
  d.victim_local = next(static_cast<uint64_t>(o.nproc));
  // Two snapshots exist before the earliest point, and two epochs remain after the latest.
  d.after_epoch = 2 + next(static_cast<uint64_t>(std::max(1, o.epochs - 4)));
  d.delay_ms = next(300);
  d.truncate = next(2) == 0;
  d.cut_at = next(1000) / 1000.0;
  d.outage_ms = 200 + next(2000);
  switch (d.kind) {
    case FaultKind::AgentKill:
    case FaultKind::Partition:
      // Node 0 hosts the embedded rendezvous server: the lost node is another one.
      d.victim_node = 1 + next(static_cast<uint64_t>(o.nodes - 1));
      break;
    case FaultKind::SnapshotCorrupt:
      // Rank 0 is the one that saves: with it dead no save can land after the corruption.
      d.victim_node = 0;
      d.victim_local = 0;
      break;
    default:
      break;
  }
  return d;
}

std::string describe(const Draw& d) {
  std::string s = std::string(kind_name(d.kind)) + " node " + std::to_string(d.victim_node);
  if (d.kind == FaultKind::WorkerKill || d.kind == FaultKind::WorkerHang ||
      d.kind == FaultKind::SnapshotCorrupt)
    s += " local rank " + std::to_string(d.victim_local);
  s += " after epoch " + std::to_string(d.after_epoch) + " +" + std::to_string(d.delay_ms) + " ms";
  if (d.kind == FaultKind::SnapshotCorrupt)
    s += std::string(d.truncate ? " truncate" : " scramble") + " at " +
         std::to_string(static_cast<int>(d.cut_at * 100)) + "%";
  if (d.kind == FaultKind::DaemonKill || d.kind == FaultKind::Partition)
    s += " outage " + std::to_string(d.outage_ms) + " ms";
  return s;
}

// ---- the job's processes -------------------------------------------------------------------

/// The round's limit for the job to finish after it started.
constexpr auto kJobLimit = 300s;

/// One JSON object per line of every events-*.jsonl in `dir`, with "file" added.
std::vector<nlohmann::json> read_events(const std::string& dir) {
  std::vector<nlohmann::json> events;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("events-", 0) != 0) continue;
    for (const std::string& line : lines_of(read_file(e.path().string()))) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      j["file"] = name;
      events.push_back(std::move(j));
    }
  }
  return events;
}

std::vector<nlohmann::json> events_named(const std::vector<nlohmann::json>& all,
                                         const std::string& event) {
  std::vector<nlohmann::json> out;
  for (const auto& e : all)
    if (e.value("event", "") == event) out.push_back(e);
  return out;
}

/// Pids of the processes whose environment holds `tag` (the harness sets it on every process
/// of a job; workers and their children inherit it).
std::vector<pid_t> tagged_processes(const std::string& tag) {
  std::vector<pid_t> pids;
  const std::string needle = std::string("DDPRUN_FAULT_JOB=") + tag;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = read_file(e.path().string() + "/environ");
    for (size_t at = env.find(needle); at != std::string::npos; at = env.find(needle, at + 1)) {
      const bool starts = at == 0 || env[at - 1] == '\0';
      const size_t end = at + needle.size();
      if (starts && (end == env.size() || env[end] == '\0')) {
        pids.push_back(static_cast<pid_t>(std::stol(name)));
        break;
      }
    }
  }
  return pids;
}

/// A small tmpfs mounted on a directory for the round, always unmounted.
class Tmpfs {
 public:
  Tmpfs(std::string dir, const std::string& size) : dir_(std::move(dir)) {
    fs::create_directories(dir_);
    const std::string options = "size=" + size + ",mode=0755";
    if (::mount("ddprun-fault", dir_.c_str(), "tmpfs", 0, options.c_str()) != 0)
      error_ = "mount -t tmpfs -o " + options + " " + dir_ + ": " + std::strerror(errno);
    else
      mounted_ = true;
  }
  ~Tmpfs() {
    if (mounted_ && ::umount2(dir_.c_str(), 0) != 0) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  const std::string& error() const { return error_; }

  /// Writes `path` until the file system is full (bounded by its size); returns bytes written.
  size_t fill(const std::string& path) const {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return 0;
    const std::string block(4096, 'x');
    size_t total = 0;
    // A tmpfs of a few MiB: a few thousand blocks at most.
    for (int i = 0; i < 100000; ++i) {
      const ssize_t n = ::write(fd, block.data(), block.size());
      if (n <= 0) break;
      total += static_cast<size_t>(n);
    }
    ::close(fd);
    return total;
  }

 private:
  std::string dir_;
  std::string error_;
  bool mounted_ = false;
};

/// Where the agents meet and which addresses they use.
struct Network {
  std::string endpoint;
  bool daemon = false;
  std::vector<std::string> addrs;                       ///< per node
  std::vector<std::map<std::string, std::string>> env;  ///< extra environment per node
  const NetworkNamespace* ns = nullptr;
  int ns_node = -1;  ///< the node that runs inside `ns`
};

/// One job: the agents (one per node), maybe a daemon, their files in one directory.
class Job {
 public:
  Job(const Options& o, std::string dir, std::string tag, Network net, std::string snapshot_dir,
      int watchdog_s)
      : o_(o),
        dir_(std::move(dir)),
        tag_(std::move(tag)),
        net_(std::move(net)),
        snapshot_dir_(std::move(snapshot_dir)),
        watchdog_s_(watchdog_s) {
    nodes_.resize(static_cast<size_t>(o.nodes));
  }

  void start_daemon() {
    const auto colon = net_.endpoint.rfind(':');
    daemon_argv_ = {RDZVD_BIN, "--host", net_.endpoint.substr(0, colon), "--port",
                    net_.endpoint.substr(colon + 1)};
    daemon_ = std::make_unique<Subprocess>(daemon_argv_, tagged({}));
  }
  Subprocess* daemon() { return daemon_.get(); }

  /// Starts node i's agent (again, with `generation` > 0, as a replacement).
  void start_node(int i, int generation = 0) {
    std::vector<std::string> argv;
    if (i == net_.ns_node) argv = net_.ns->exec_prefix();
    const std::string conf =
        std::string(net_.daemon ? "is_host=0," : "") +
        "join_timeout=120,last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=4,"
        "connect_timeout=60";
    const std::vector<std::string> agent{DDPRUN_BIN,
                                         "--nnodes",
                                         std::to_string(o_.nodes),
                                         "--nproc_per_node",
                                         std::to_string(o_.nproc),
                                         "--node_rank",
                                         std::to_string(i),
                                         "--rdzv_backend",
                                         "c10d",
                                         "--rdzv_endpoint",
                                         net_.endpoint,
                                         "--rdzv_id",
                                         "fault",
                                         "--local_addr",
                                         net_.addrs[static_cast<size_t>(i)],
                                         "--max_restarts",
                                         "3",
                                         "--rdzv_conf",
                                         conf,
                                         "--event_log",
                                         event_log(i, generation)};
    argv.insert(argv.end(), agent.begin(), agent.end());
    if (watchdog_s_ > 0) {
      argv.push_back("--watchdog_timeout");
      argv.push_back(std::to_string(watchdog_s_));
    }
    for (const std::string& a :
         {std::string("--no_python"), std::string(DDP_TRAIN_BIN), std::to_string(o_.epochs),
          std::string("1"), std::string("--dataset_size"), std::to_string(o_.dataset),
          std::string("--snapshot_path"), snapshot_dir_ + "/snap.pt",
          std::string("--keep_snapshots"), std::string("3"), std::string("--dump_params"),
          dir_ + "/params"})
      argv.push_back(a);
    auto& slot = nodes_[static_cast<size_t>(i)];
    if (slot) retired_.push_back(std::move(slot));
    slot = std::make_unique<Subprocess>(
        argv, tagged(net_.env.empty() ? std::map<std::string, std::string>{}
                                      : net_.env[static_cast<size_t>(i)]));
    generation_[i] = generation;
  }

  /// Starts every node, node 0 first: it hosts the embedded server.
  bool start_all(std::string& why) {
    for (int i = 0; i < o_.nodes; ++i) {
      start_node(i);
      if (i == 0 && !net_.daemon &&
          !wait_until([&] { return contains(node(0).err_so_far(), "hosting the rendezvous"); },
                      60s)) {
        why = "node 0 did not host the rendezvous within 60 s:\n" + node(0).err_so_far();
        return false;
      }
    }
    return true;
  }

  Subprocess& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  bool has_node(int i) const { return nodes_[static_cast<size_t>(i)] != nullptr; }
  std::string event_log(int i, int generation) const {
    return dir_ + "/events-" + std::to_string(i) + "-" + std::to_string(generation) + ".jsonl";
  }
  std::vector<nlohmann::json> node_events(int i) const {
    std::vector<nlohmann::json> out;
    const auto it = generation_.find(i);
    for (const std::string& line :
         lines_of(read_file(event_log(i, it == generation_.end() ? 0 : it->second)))) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object()) out.push_back(std::move(j));
    }
    return out;
  }

  /// The pid of node i's local rank `local` in its newest group, once started.
  std::optional<pid_t> worker_pid(int i, int local) const {
    std::optional<pid_t> pid;
    for (const auto& e : node_events(i))
      if (e.value("event", "") == "workers_started" && e.contains("pids") &&
          e["pids"].size() > static_cast<size_t>(local))
        pid = e["pids"][static_cast<size_t>(local)].get<pid_t>();
    return pid;
  }

  /// Blocks until rank 0 printed that it saved epoch `epoch`'s snapshot.
  bool wait_saved(int epoch, std::chrono::milliseconds limit) {
    const std::string line =
        "[default0]:Epoch " + std::to_string(epoch) + " | Training snapshot saved";
    return wait_until([&] { return contains(node(0).out_so_far(), line); }, limit);
  }

  std::map<std::string, std::string> tagged(std::map<std::string, std::string> env) const {
    env["DDPRUN_FAULT_JOB"] = tag_;
    return env;
  }

  const std::string& dir() const { return dir_; }
  const std::string& tag() const { return tag_; }
  const std::vector<std::string>& daemon_argv() const { return daemon_argv_; }
  void restart_daemon() { daemon_ = std::make_unique<Subprocess>(daemon_argv_, tagged({})); }
  std::vector<std::unique_ptr<Subprocess>>& retired() { return retired_; }

 private:
  const Options& o_;
  std::string dir_, tag_;
  Network net_;
  std::string snapshot_dir_;
  int watchdog_s_;
  std::vector<std::unique_ptr<Subprocess>> nodes_;
  std::vector<std::unique_ptr<Subprocess>> retired_;  ///< killed agents, kept for their output
  std::map<int, int> generation_;
  std::unique_ptr<Subprocess> daemon_;
  std::vector<std::string> daemon_argv_;
};

// ---- one round ---------------------------------------------------------------------------

/// What a round found; `problems` empty means every guarantee held.
struct RoundResult {
  std::vector<std::string> problems;
  int restarts = -1;
  bool params_match = false;
  int orphans = 0;
  std::string note;  ///< e.g. the snapshot epoch loaded
  std::string logs;  ///< the end of each agent's stderr, printed when a round fails
};

std::string tail(const std::string& text, size_t n = 4000) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

int free_port(const std::string& host) {
  auto p = rdzv::find_free_port(host);
  if (!p.ok()) throw std::runtime_error("no free port on " + host + ": " + p.error().message);
  return *p;
}

/// The snapshot files in `dir`, newest (highest sequence) first.
std::vector<std::string> snapshot_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("snap.pt.", 0) == 0 &&
        name.find_first_not_of("0123456789", 8) == std::string::npos)
      files.push_back(e.path().string());
  }
  std::sort(files.rbegin(), files.rend());
  return files;
}

/// Truncates or scrambles `path` as drawn; returns what it did.
std::string damage(const std::string& path, const Draw& d) {
  const auto size = static_cast<size_t>(fs::file_size(path));
  if (d.truncate) {
    const size_t keep = static_cast<size_t>(d.cut_at * static_cast<double>(size - 1));
    fs::resize_file(path, keep);
    return "truncated " + path + " from " + std::to_string(size) + " to " + std::to_string(keep) +
           " bytes";
  }
  // 256 bytes inverted in the first half (the pickle and tensor data); more than any padding.
  std::string bytes = read_file(path);
  const size_t at = static_cast<size_t>(d.cut_at * static_cast<double>(size / 2));
  for (size_t i = at; i < std::min(size, at + 256); ++i) bytes[i] = static_cast<char>(~bytes[i]);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return "scrambled 256 bytes of " + path + " at offset " + std::to_string(at);
}

/// Runs the job; with `fault` set, injects it as drawn. Fills `result` and `params_dir`.
class RoundRunner {
 public:
  RoundRunner(const Options& o, int round, const Draw& d, std::optional<FaultKind> fault,
              std::string tag)
      : o_(o), round_(round), d_(d), fault_(fault), tag_(std::move(tag)) {}

  RoundResult run(std::map<int, std::string>& params) {
    RoundResult r;
    try {
      run_job(r, params);
    } catch (const std::exception& e) {
      r.problems.push_back(std::string("harness error: ") + e.what());
    }
    return r;
  }

 private:
  void run_job(RoundResult& r, std::map<int, std::string>& params) {
    const std::string dir = tmp_.path();
    std::string snapshot_dir = dir + "/snapshots";
    std::unique_ptr<Tmpfs> tmpfs;
    std::unique_ptr<NetworkNamespace> ns;
    Network net;
    net.daemon = fault_ == FaultKind::DaemonKill;
    if (fault_ == FaultKind::DiskFull) {
      // Room for the three kept snapshots and one being written, not much more.
      tmpfs = std::make_unique<Tmpfs>(snapshot_dir, "256k");
      if (!tmpfs->error().empty()) {
        r.problems.push_back("cannot create the small file system: " + tmpfs->error());
        return;
      }
    }
    fs::create_directories(snapshot_dir);
    if (fault_ == FaultKind::Partition) {
      // A name and a 10.X.Y.0/28 unique to this process and round.
      const int id = static_cast<int>(::getpid() % 100000);
      const std::string name = "ddpf" + std::to_string(id) + "r" + std::to_string(round_);
      const std::string prefix =
          "10." + std::to_string(100 + id % 100) + "." + std::to_string((id / 100 + round_) % 250);
      auto made = NetworkNamespace::create(name, prefix, o_.nodes - 1);
      if (auto* why = std::get_if<std::string>(&made)) {
        r.problems.push_back("cannot create the network namespace for the partition: " + *why);
        return;
      }
      ns = std::move(std::get<std::unique_ptr<NetworkNamespace>>(made));
      net.ns = ns.get();
      net.ns_node = d_.victim_node;
      net.endpoint = ns->host_addr(0) + ":" + std::to_string(free_port(ns->host_addr(0)));
      for (int i = 0, host = 0; i < o_.nodes; ++i) {
        const bool inside = i == net.ns_node;
        net.addrs.push_back(inside ? ns->ns_addr() : ns->host_addr(host++));
        // Gloo binds to the interface's address: each side's end of the pair.
        net.env.push_back({{"GLOO_SOCKET_IFNAME", inside ? ns->ns_if() : ns->host_if()}});
      }
    } else {
      net.endpoint = "127.0.0.1:" + std::to_string(free_port("127.0.0.1"));
      for (int i = 0; i < o_.nodes; ++i) net.addrs.push_back(testing::loopback_node_addr(i));
    }
    const int watchdog = fault_ == FaultKind::WorkerHang ? o_.watchdog_s : 0;
    Job job(o_, dir, tag_, net, snapshot_dir, watchdog);
    if (net.daemon) job.start_daemon();
    std::string why;
    if (!job.start_all(why)) {
      r.problems.push_back(why);
      stop_everything(job, r);
      return;
    }
    std::string injected;
    int expect_loaded = -1;
    if (fault_) inject(job, tmpfs.get(), ns.get(), snapshot_dir, injected, expect_loaded, r);
    if (!injected.empty()) r.note = injected;

    // Every agent (the replacement included) must finish with 0.
    const auto deadline = std::chrono::steady_clock::now() + kJobLimit;
    for (int i = 0; i < o_.nodes; ++i) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(std::max(
          deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(1s)));
      const auto res = job.node(i).wait(left);
      if (res.exit_code != 0 || res.timed_out)
        r.problems.push_back("node " + std::to_string(i) + " exited " +
                             std::to_string(res.exit_code) +
                             (res.timed_out ? " (killed at the time limit)" : ""));
      all_err_ += res.err;
      r.logs += "--- node " + std::to_string(i) + " stderr:\n" + tail(res.err) + "\n--- node " +
                std::to_string(i) + " stdout:\n" + tail(res.out, 1500) + "\n";
    }
    stop_everything(job, r);

    // The restart count: the highest any node's last round carried.
    const auto events = read_events(dir);
    int restarts = 0;
    for (const auto& e : events_named(events, "rendezvous_complete"))
      restarts = std::max(restarts, e.value("restart_count", 0));
    r.restarts = restarts;
    if (fault_ && restarts != expected_restarts(*fault_))
      r.problems.push_back("restart count " + std::to_string(restarts) + ", expected " +
                           std::to_string(expected_restarts(*fault_)) + " for " +
                           kind_name(*fault_));
    if (!fault_ && restarts != 0)
      r.problems.push_back("the reference run restarted " + std::to_string(restarts) + " time(s)");
    if (fault_ == FaultKind::WorkerHang) {
      const auto failures = events_named(events, "failure_detected");
      if (std::none_of(failures.begin(), failures.end(),
                       [](const nlohmann::json& e) { return e.value("how", "") == "watchdog"; }))
        r.problems.push_back("no failure_detected with how=watchdog in the event logs");
    }

    // Snapshots: after a damaged or failed save the restart loads exactly the newest valid
    // one; after any other fault, nothing older than the one saved before the fault.
    std::set<int64_t> loaded;
    for (const auto& e : events_named(events, "snapshot_loaded"))
      if (e.value("restart_count", 0) >= 1) loaded.insert(e.value("epoch", int64_t{-1}));
    std::string got;
    for (auto ep : loaded) got += (got.empty() ? "" : ",") + std::to_string(ep);
    if (expect_loaded >= 0 && loaded != std::set<int64_t>{expect_loaded})
      r.problems.push_back("after the restart the ranks loaded snapshot epoch(s) [" + got +
                           "], expected only " + std::to_string(expect_loaded));
    if (expect_loaded < 0 && fault_ && !loaded.empty() && *loaded.begin() < d_.after_epoch)
      r.problems.push_back("after the restart a rank loaded epoch " +
                           std::to_string(*loaded.begin()) + ", older than epoch " +
                           std::to_string(d_.after_epoch) + " saved before the fault");
    if (!got.empty()) r.note += (r.note.empty() ? "" : "; ") + std::string("loaded epoch ") + got;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(snapshot_dir, ec))
      if (contains(e.path().filename().string(), ".tmp-"))
        r.problems.push_back("a partial snapshot was left behind: " + e.path().string());

    // Every rank's final parameters.
    for (int rank = 0; rank < o_.nodes * o_.nproc; ++rank) {
      const std::string bytes = read_file(dir + "/params.rank" + std::to_string(rank));
      if (bytes.empty())
        r.problems.push_back("rank " + std::to_string(rank) + " wrote no final parameters");
      params[rank] = bytes;
    }
  }

  /// Stops the daemon, waits (bounded) for the job's processes to go, counts and kills the rest.
  void stop_everything(Job& job, RoundResult& r) {
    if (auto* d = job.daemon()) {
      d->send(SIGTERM);
      d->wait(10s);
    }
    // An agent still running (the round went wrong) gets SIGKILL; a reaped one is left alone.
    for (int i = 0; i < o_.nodes; ++i)
      if (job.has_node(i)) job.node(i).wait(1ms);
    std::vector<pid_t> left;
    wait_until(
        [&] {
          left = tagged_processes(tag_);
          return left.empty();
        },
        15s);
    r.orphans = static_cast<int>(left.size());
    if (!left.empty()) {
      std::string what;
      for (pid_t pid : left) {
        std::string cmd = read_file("/proc/" + std::to_string(pid) + "/cmdline");
        std::replace(cmd.begin(), cmd.end(), '\0', ' ');
        what += "  pid " + std::to_string(pid) + ": " + cmd + "\n";
        ::kill(pid, SIGKILL);  // ours: it carries this round's tag
      }
      r.problems.push_back(std::to_string(left.size()) +
                           " process(es) of the job still ran 15 s after it ended:\n" + what);
    }
  }

  void inject(Job& job, Tmpfs* tmpfs, NetworkNamespace* ns, const std::string& snapshot_dir,
              std::string& injected, int& expect_loaded, RoundResult& r) {
    if (!job.wait_saved(d_.after_epoch, 240s)) {
      r.problems.push_back("rank 0 never saved epoch " + std::to_string(d_.after_epoch) + ":\n" +
                           tail(job.node(0).err_so_far()));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(d_.delay_ms));
    const int v = d_.victim_node;
    switch (*fault_) {
      case FaultKind::WorkerKill:
      case FaultKind::WorkerHang:
      case FaultKind::SnapshotCorrupt: {
        const auto pid = job.worker_pid(v, d_.victim_local);
        if (!pid || !testing::process_alive(*pid)) {
          r.problems.push_back("no running worker to signal on node " + std::to_string(v));
          return;
        }
        const int sig = *fault_ == FaultKind::WorkerHang ? SIGSTOP : SIGKILL;
        ::kill(*pid, sig);
        injected =
            std::string(sig == SIGSTOP ? "SIGSTOP" : "SIGKILL") + " to pid " + std::to_string(*pid);
        if (*fault_ != FaultKind::SnapshotCorrupt) return;
        // Rank 0 is gone: no save can land any more. Damage the newest snapshot before the
        // restarted group (seconds away: teardown, rendezvous, exec) reads it.
        testing::wait_until([&] { return !testing::process_alive(*pid); }, 10s);
        const auto files = snapshot_files(snapshot_dir);
        if (files.size() < 2) {
          r.problems.push_back("fewer than two snapshots to fall back on");
          return;
        }
        // Before the fault one save per epoch: sequence number = epoch.
        const int newest = std::stoi(files[0].substr(files[0].size() - 6));
        injected += "; " + damage(files[0], d_);
        expect_loaded = newest - 1;
        damaged_ = files[0];
        return;
      }
      case FaultKind::AgentKill: {
        job.node(v).send(SIGKILL);
        job.node(v).wait(10s);
        injected = "SIGKILL to the agent of node " + std::to_string(v);
        // The replacement may take the node rank once the server let go of the dead node.
        if (!wait_until([&] { return !events_named(job.node_events(0), "restart").empty(); },
                        60s)) {
          r.problems.push_back("node 0 never restarted after losing node " + std::to_string(v));
          return;
        }
        job.start_node(v, 1);
        return;
      }
      case FaultKind::DaemonKill: {
        job.daemon()->send(SIGKILL);
        job.daemon()->wait(10s);
        std::this_thread::sleep_for(std::chrono::milliseconds(d_.outage_ms));
        job.restart_daemon();
        injected =
            "SIGKILL to ddprun-rdzvd, a new one " + std::to_string(d_.outage_ms) + " ms later";
        return;
      }
      case FaultKind::Partition: {
        if (auto why = ns->set_connected(false); !why.empty()) {
          r.problems.push_back("cannot cut the network: " + why);
          return;
        }
        injected = "link " + ns->ns_if() + " down";
        // Healed once the rest of the job gave the node up (the keep-alive ran out).
        const bool noticed =
            wait_until([&] { return !events_named(job.node_events(0), "restart").empty(); }, 60s);
        std::this_thread::sleep_for(std::chrono::milliseconds(d_.outage_ms));
        if (auto why = ns->set_connected(true); !why.empty())
          r.problems.push_back("cannot heal the network: " + why);
        if (!noticed) r.problems.push_back("the cut-off node was never given up");
        injected += ", up again " + std::to_string(d_.outage_ms) + " ms after the restart";
        return;
      }
      case FaultKind::DiskFull: {
        const std::string filler = snapshot_dir + "/filler";
        const size_t bytes = tmpfs->fill(filler);
        injected = "filled the snapshot file system (" + std::to_string(bytes) + " bytes)";
        // The next save fails; once the failure is seen, space comes back for the restart.
        const bool failed = wait_until(
            [&] { return !events_named(job.node_events(0), "failure_detected").empty(); }, 120s);
        // The newest save that completed before the failure is what the restart must load.
        int last_saved = -1;
        for (const std::string& line : lines_of(job.node(0).out_so_far())) {
          const std::string head = "[default0]:Epoch ";
          if (line.rfind(head, 0) == 0 && contains(line, "| Training snapshot saved"))
            last_saved = std::stoi(line.substr(head.size()));
        }
        fs::remove(filler);
        if (!failed) {
          r.problems.push_back("no save failed on the full file system");
          return;
        }
        expect_loaded = last_saved;
        disk_full_ = true;
        return;
      }
    }
  }

 public:
  /// Checks that need the agents' stderr (called after run()).
  void check_messages(RoundResult& r) const {
    if (!damaged_.empty() && !contains(all_err_, "skipping snapshot " + damaged_))
      r.problems.push_back("the SDK did not warn that it skipped " + damaged_);
    // Saves are atomic: with no snapshot damaged by the harness, none may be found torn.
    if (damaged_.empty() && contains(all_err_, "skipping snapshot"))
      r.problems.push_back("a snapshot the harness did not damage was found torn or corrupt");
    if (disk_full_ && !contains(all_err_, "No space left on device"))
      r.problems.push_back("the failed save did not say \"No space left on device\"");
  }

 private:
  const Options& o_;
  int round_;
  Draw d_;
  std::optional<FaultKind> fault_;
  std::string tag_;
  TempDir tmp_;
  std::string all_err_;
  std::string damaged_;
  bool disk_full_ = false;
};

// ---- the rounds --------------------------------------------------------------------------

struct Totals {
  int rounds = 0, recovered = 0, mismatches = 0, orphans = 0, restart_mismatches = 0;
  std::map<std::string, int> by_kind;
  std::vector<int> failed_rounds;
};

int run(const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  std::printf("ddprun-fault: seed %llu, %d round(s), %d node(s) x %d worker(s), %d epochs\n",
              static_cast<unsigned long long>(o.seed), o.rounds, o.nodes, o.nproc, o.epochs);
  std::fflush(stdout);
  const std::string base_tag = "ddpf-" + std::to_string(::getpid()) + "-" + std::to_string(o.seed);

  // The uninterrupted run with the same world size and seed, once.
  std::map<int, std::string> reference;
  {
    RoundRunner ref(o, -1, Draw{}, std::nullopt, base_tag + "-ref");
    RoundResult rr = ref.run(reference);
    if (!rr.problems.empty()) {
      std::printf("reference run FAILED:\n");
      for (const auto& p : rr.problems) std::printf("  - %s\n", p.c_str());
      return 1;
    }
    std::printf("reference run: %zu ranks, %zu bytes of parameters each (%.1f s)\n",
                reference.size(), reference.empty() ? size_t{0} : reference.begin()->second.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    std::fflush(stdout);
  }

  Totals t;
  const int first = o.only_round >= 0 ? o.only_round : 0;
  const int last = o.only_round >= 0 ? o.only_round + 1 : o.rounds;
  for (int round = first; round < last; ++round) {
    const Draw d = draw_round(o, round);
    const auto round_start = std::chrono::steady_clock::now();
    std::printf("round %d: %s\n", round, describe(d).c_str());
    std::fflush(stdout);
    RoundRunner runner(o, round, d, d.kind, base_tag + "-r" + std::to_string(round));
    std::map<int, std::string> params;
    RoundResult r = runner.run(params);
    runner.check_messages(r);
    bool same = params.size() == reference.size();
    for (const auto& [rank, bytes] : params) {
      if (bytes.empty()) continue;  // reported already
      if (reference[rank] != bytes) {
        same = false;
        r.problems.push_back("rank " + std::to_string(rank) +
                             "'s final parameters differ from the uninterrupted run");
      }
    }
    ++t.rounds;
    ++t.by_kind[kind_name(d.kind)];
    t.orphans += r.orphans;
    if (!same) ++t.mismatches;
    if (r.restarts != expected_restarts(d.kind)) ++t.restart_mismatches;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - round_start).count();
    if (r.problems.empty()) {
      ++t.recovered;
      if (o.verbose) std::printf("%s", r.logs.c_str());
      std::printf(
          "round %d: OK in %.1f s: %s; restarts %d; parameters identical; no process left\n", round,
          secs, r.note.c_str(), r.restarts);
    } else {
      t.failed_rounds.push_back(round);
      std::printf("round %d: FAILED in %.1f s (%s) -- replay: ddprun-fault --seed %llu --round %d",
                  round, secs, r.note.c_str(), static_cast<unsigned long long>(o.seed), round);
      if (o.kinds.size() != kAllKinds.size()) {
        std::string kinds;
        for (auto k : o.kinds) kinds += std::string(kinds.empty() ? "" : ",") + kind_name(k);
        std::printf(" --faults %s", kinds.c_str());
      }
      std::printf("\n");
      for (const auto& p : r.problems) std::printf("  - %s\n", p.c_str());
      std::printf("%s", r.logs.c_str());
    }
    std::fflush(stdout);
  }

  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "\nsummary: seed %llu, rounds %d, recovered %d, parameter mismatches %d, "
      "restart-count mismatches %d, orphans %d, wall %.0f s\nfaults:",
      static_cast<unsigned long long>(o.seed), t.rounds, t.recovered, t.mismatches,
      t.restart_mismatches, t.orphans, wall);
  for (const auto& [kind, n] : t.by_kind) std::printf(" %s %d", kind.c_str(), n);
  std::printf("\n");
  if (!t.failed_rounds.empty()) {
    std::printf("failed rounds:");
    for (int round : t.failed_rounds) std::printf(" %d", round);
    std::printf("\n");
  }
  return t.recovered == t.rounds ? 0 : 1;
}

}  // namespace
}  // namespace ddprun::fault

int main(int argc, char** argv) {
  using namespace ddprun::fault;
  Options o;
  std::string kinds;
  CLI::App app{"Fault injection for ddprun: a multi-node ddp_train job per round, one fault"};
  app.add_option("--rounds", o.rounds, "rounds to run")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of every draw (printed, to replay a failure)");
  app.add_option("--round", o.only_round, "run only this round of the seed's sequence")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--faults", kinds,
                 "comma-separated kinds: worker_kill, agent_kill, worker_hang, daemon_kill, "
                 "partition, snapshot_corrupt, disk_full (default: all)");
  app.add_option("--nodes", o.nodes, "agents (nodes)")->check(CLI::Range(2, 6));
  app.add_option("--nproc", o.nproc, "workers per agent")->check(CLI::Range(1, 8));
  app.add_option("--epochs", o.epochs, "epochs of ddp_train")->check(CLI::Range(6, 100));
  app.add_option("--dataset_size", o.dataset, "samples of ddp_train")
      ->check(CLI::Range(64, 1 << 20));
  app.add_option("--watchdog_timeout", o.watchdog_s, "seconds, for worker_hang")
      ->check(CLI::Range(1, 120));
  app.add_flag("--verbose", o.verbose,
               "print the end of every agent's output, not only on failure");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!kinds.empty()) {
    o.kinds.clear();
    for (const std::string& k : ddprun::testing::lines_of([&] {
           std::string s = kinds;
           std::replace(s.begin(), s.end(), ',', '\n');
           return s;
         }())) {
      const auto it = std::find_if(kAllKinds.begin(), kAllKinds.end(),
                                   [&](FaultKind f) { return k == kind_name(f); });
      if (it == kAllKinds.end()) {
        std::fprintf(stderr, "ddprun-fault: unknown fault kind '%s'\n", k.c_str());
        return 64;
      }
      o.kinds.push_back(*it);
    }
  }
  if (::geteuid() != 0)
    std::fprintf(stderr,
                 "ddprun-fault: warning: not root: partition (network namespaces) and disk_full "
                 "(tmpfs) rounds will fail\n");
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun-fault: %s\n", e.what());
    return 70;
  }
}
