// The C++ examples on the worker SDK under the real ddprun: replicas stay identical, the result
// matches single-process training, a killed rank resumes from the snapshot, an exception reaches
// the failure report, a checkpoint request (SIGUSR1) saves a snapshot that a rerun resumes
// from. No libtorch here: the workers write their parameters as raw float32.
#include <sys/syscall.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "rendezvous/free_port.h"
#include "tests/integration/rdzv_fixtures.h"
#include "tests/support/subprocess.h"

using namespace ddprun::testing;

namespace {

constexpr std::chrono::seconds kLimit{180};

std::vector<std::string> ddprun_train(int nproc, const std::vector<std::string>& flags,
                                      const std::vector<std::string>& args) {
  std::vector<std::string> argv{DDPRUN_BIN, "--standalone", "--nproc_per_node",
                                std::to_string(nproc)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--no_python");
  argv.push_back(DDP_TRAIN_BIN);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<float> floats_in(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string why(const CommandResult& r) {
  return (r.timed_out ? "ddprun did not finish in time and was killed\n" : "") + r.out + r.err;
}

}  // namespace

TEST_CASE("after training every rank's parameters are bitwise identical", "[sdk][integration]") {
  for (int world : {2, 3}) {
    TempDir dir;
    auto r = run_command(
        ddprun_train(world, {},
                     {"2", "1", "--dataset_size", "600", "--dump_params", dir.path() + "/params"}),
        {}, kLimit);
    INFO("world size " << world << "\n" << why(r));
    REQUIRE(r.exit_code == 0);
    const std::vector<float> rank0 = floats_in(dir.path() + "/params.rank0");
    REQUIRE(rank0.size() == 20 * 64 + 64 + 64 + 1);
    for (int rank = 1; rank < world; ++rank) {
      const std::string other = read_file(dir.path() + "/params.rank" + std::to_string(rank));
      CHECK(other == read_file(dir.path() + "/params.rank0"));
      CHECK(has(r.out, "[default" + std::to_string(rank) + "]:rank " + std::to_string(rank) +
                           ": parameters identical to rank 0: True"));
    }
    // 600 samples over `world` ranks, batch 32.
    const int steps = (600 / world + 31) / 32;
    CHECK(has(r.out, "[default0]:[CPU0] Epoch 1 | Batchsize: 32 | Steps: " + std::to_string(steps) +
                         " | Loss: "));
  }
}

TEST_CASE("W ranks with batch b end where one process with batch W*b ends", "[sdk][integration]") {
  struct Case {
    int world;
    int batch;
    int dataset;
  };
  // Dataset sizes divisible by W*b: no sampler padding, so both runs see the same batches.
  for (const Case c : {Case{2, 16, 1024}, Case{3, 10, 960}}) {
    TempDir dir;
    auto train = [&](int world, int batch, const std::string& out, bool overlap) {
      std::vector<std::string> args{"3",
                                    "1",
                                    "--dataset_size",
                                    std::to_string(c.dataset),
                                    "--batch_size",
                                    std::to_string(batch),
                                    "--dump_params",
                                    out};
      if (overlap) args.push_back("--overlap");
      return run_command(ddprun_train(world, {}, args), {}, kLimit);
    };
    auto single = train(1, c.world * c.batch, dir.path() + "/one", false);
    INFO("W=" << c.world << " b=" << c.batch << "\n" << why(single));
    REQUIRE(single.exit_code == 0);
    auto many = train(c.world, c.batch, dir.path() + "/many", false);
    INFO(why(many));
    REQUIRE(many.exit_code == 0);

    const std::vector<float> a = floats_in(dir.path() + "/one.rank0");
    const std::vector<float> b = floats_in(dir.path() + "/many.rank0");
    REQUIRE(a.size() == 1409);
    REQUIRE(b.size() == a.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    INFO("largest difference " << worst);
    CHECK(worst <= 1e-5);
    // Both trained the same number of steps per epoch.
    CHECK(has(single.out, "Steps: 32 | Loss: "));
    CHECK(has(many.out, "[default0]:[CPU0] Epoch 2 | Batchsize: " + std::to_string(c.batch) +
                            " | Steps: 32 | Loss: "));

    if (c.world == 2) {
      // Overlapping the all-reduce with backward reduces the same buckets in the same order.
      auto overlapped = train(2, c.batch, dir.path() + "/ovl", true);
      INFO(why(overlapped));
      REQUIRE(overlapped.exit_code == 0);
      CHECK(read_file(dir.path() + "/ovl.rank0") == read_file(dir.path() + "/many.rank0"));
      CHECK(read_file(dir.path() + "/ovl.rank1") == read_file(dir.path() + "/many.rank0"));
    }
  }
}

TEST_CASE("a rank killed mid-epoch restarts from the last snapshot and the job finishes",
          "[sdk][integration]") {
  TempDir dir;
  const std::string base = dir.path() + "/snap.pt";
  auto r = run_command(ddprun_train(2, {"--max_restarts", "1"},
                                    {"4", "1", "--snapshot_path", base, "--fail_rank", "1",
                                     "--fail_epoch", "2", "--fail_kill"}),
                       {}, kLimit);
  INFO(why(r));
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "[default1]:[CPU1] injected failure at epoch 2, step 16"));
  CHECK(has(r.err, "restarting workers: restart 1 of 1"));
  CHECK(has(r.out, "[default0]:[CPU0] Resuming training from snapshot at Epoch 2"));
  CHECK(has(r.out, "[default1]:[CPU1] Resuming training from snapshot at Epoch 2"));
  CHECK(has(r.out, "[default1]:[CPU1] Epoch 3 | Batchsize: 32 | Steps: 32"));
  CHECK(has(r.out, "[default1]:rank 1: parameters identical to rank 0: True"));
  // Epochs 0 and 1 ran once: the second attempt did not start over.
  CHECK(r.out.find("[default0]:[CPU0] Epoch 0 ") == r.out.rfind("[default0]:[CPU0] Epoch 0 "));

  // The newest snapshot is the last epoch's; the tool reads it without a process group.
  auto tool = run_command({SNAPSHOT_TOOL_BIN, base + ".000004"}, {}, std::chrono::seconds(60));
  INFO(tool.out << tool.err);
  CHECK(tool.exit_code == 0);
  CHECK(has(tool.out, "  epoch      : 4\n"));
  CHECK(has(tool.out, "  world_size : 2\n"));
  CHECK(has(tool.out, "(verified)"));
  CHECK(has(tool.out, "fc1.weight"));
  CHECK(has(tool.out, "Float [64, 20]"));
  // Three kept (the default): 2, 3 and 4.
  CHECK(read_file(base + ".000001").empty());
  CHECK_FALSE(read_file(base + ".000002").empty());
}

TEST_CASE("with --standby_workers a restart hands the new round to standby processes",
          "[sdk][integration][standby]") {
  TempDir dir;
  const std::string base = dir.path() + "/snap.pt";
  const std::string events = dir.path() + "/events.jsonl";
  const std::string trigger = dir.path() + "/fail-now";
  // Small epochs, many of them: rank 1 fails when the test says so, once standbys exist.
  Subprocess job(ddprun_train(2,
                              {"--max_restarts", "1", "--standby_workers", "--event_log", events},
                              {"3000", "100", "--dataset_size", "256", "--snapshot_path", base,
                               "--fail_rank", "1", "--fail_kill", "--fail_when_file", trigger}));
  auto event_lines = [&] {
    std::vector<nlohmann::json> out;
    std::istringstream in(read_file(events));
    for (std::string line; std::getline(in, line);)
      if (auto j = nlohmann::json::parse(line, nullptr, false); j.is_object()) out.push_back(j);
    return out;
  };
  auto count = [&](const std::string& name) {
    int n = 0;
    for (const auto& e : event_lines()) n += e["event"] == name;
    return n;
  };
  // Fail once the standbys exist and a snapshot has been saved.
  auto ready = [&] {
    bool saved = false;
    for (const auto& f : std::filesystem::directory_iterator(dir.path()))
      saved = saved || f.path().filename().string().rfind("snap.pt.0", 0) == 0;
    return count("standbys_started") == 1 && saved;
  };
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  while (!ready() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(ready());
  std::ofstream(trigger) << "now";
  auto r = job.wait(kLimit);
  INFO(why(r));
  CHECK(r.exit_code == 0);
  CHECK(has(r.err, "restarting workers: restart 1 of 1"));
  CHECK(has(r.out, "[default1]:[CPU1] Resuming training from snapshot at Epoch"));
  CHECK(has(r.out, "[default1]:rank 1: parameters identical to rank 0: True"));

  std::vector<int> from_standby;
  std::vector<pid_t> standby_pids;
  for (const auto& e : event_lines()) {
    if (e["event"] == "workers_started") from_standby.push_back(e["from_standby"].get<int>());
    if (e["event"] == "standbys_started")
      for (const auto& pid : e["pids"]) standby_pids.push_back(pid.get<pid_t>());
  }
  // The first group started afresh; after the failure both ranks were standbys.
  CHECK(from_standby == std::vector<int>{0, 2});
  // Standbys started after the restart too, and none outlives the job.
  CHECK(standby_pids.size() == 4);
  for (pid_t pid : standby_pids) CHECK_FALSE(process_alive(pid));
}

TEST_CASE("a spare's C++ standbys load while it waits and take over a lost node's ranks",
          "[sdk][integration][standby][spares]") {
  // One node's worth of job (--nnodes 1:1) on the daemon, and a second agent: a spare.
  Daemon daemon;
  TempDir dir;
  auto agent = [&](const std::string& name) {
    return std::make_unique<Subprocess>(
        std::vector<std::string>{DDPRUN_BIN,
                                 "--rdzv_backend",
                                 "c10d",
                                 "--rdzv_endpoint",
                                 "127.0.0.1:" + std::to_string(daemon.port),
                                 "--rdzv_id",
                                 "spare-standbys",
                                 "--nnodes",
                                 "1:1",
                                 "--nproc_per_node",
                                 "2",
                                 "--max_restarts",
                                 "1",
                                 "--standby_workers",
                                 "--event_log",
                                 dir.path() + "/" + name + ".jsonl",
                                 "--no_python",
                                 DDP_TRAIN_BIN,
                                 "3000",
                                 "100",
                                 "--dataset_size",
                                 "256"});
  };
  auto events_of = [&](const std::string& name, const std::string& event) {
    std::vector<nlohmann::json> found;
    std::istringstream in(read_file(dir.path() + "/" + name + ".jsonl"));
    for (std::string line; std::getline(in, line);)
      if (auto j = nlohmann::json::parse(line, nullptr, false);
          j.is_object() && j["event"] == event)
        found.push_back(j);
    return found;
  };
  auto active = agent("active");
  REQUIRE(wait_until([&] { return !events_of("active", "workers_started").empty(); }, kLimit));
  auto spare = agent("spare");
  // No round for it: its standbys start a while after it does, and load meanwhile.
  REQUIRE(wait_until([&] { return !events_of("spare", "standbys_started").empty(); }, kLimit));
  CHECK(events_of("spare", "workers_started").empty());
  // Loaded: each waits in read() for its hand-over (WorkerContext::from_env). A standby still
  // loading libtorch when the hand-over comes is not waited for beyond kHandoverAckTimeout, which
  // a loaded machine can take: that is what the test would see, not the spare's readiness.
  const nlohmann::json started = events_of("spare", "standbys_started").front();
  std::vector<pid_t> standbys;
  for (const auto& pid : started["pids"]) standbys.push_back(pid.get<pid_t>());
  REQUIRE(standbys.size() == 2);
  REQUIRE(wait_until(
      [&] {
        return std::all_of(standbys.begin(), standbys.end(), [](pid_t pid) {
          const std::string fd = environment_of(pid, "DDPRUN_STANDBY_FD");
          return !fd.empty() && blocked_in_syscall(pid, SYS_read, std::stol(fd));
        });
      },
      kLimit));
  active->send(SIGKILL);  // the node is lost (its workers die with their agent)
  active->wait(kLimit);
  REQUIRE(wait_until([&] { return !events_of("spare", "workers_started").empty(); }, kLimit));
  // Both of the lost node's ranks went to standbys that had loaded while the spare waited.
  CHECK(events_of("spare", "workers_started").front()["from_standby"] == 2);
  spare->send(SIGTERM);
  auto r = spare->wait(kLimit);
  INFO(why(r));
  CHECK(r.exit_code == 128 + SIGTERM);
}

TEST_CASE("a checkpoint request on one rank stops every rank at the same step mid-epoch",
          "[sdk][integration]") {
  // 2048 samples over 2 ranks, batch 32: 32 steps an epoch. Rank 1 alone asks after global step
  // 40 (step 8 of epoch 1); rank 0 must stop there too and save.
  TempDir dir;
  const std::string base = dir.path() + "/snap.pt";
  auto whole = run_command(ddprun_train(2, {}, {"3", "1", "--dump_params", dir.path() + "/whole"}),
                           {}, kLimit);
  INFO(why(whole));
  REQUIRE(whole.exit_code == 0);

  auto first =
      run_command(ddprun_train(2, {},
                               {"3", "1", "--snapshot_path", base, "--request_checkpoint_rank", "1",
                                "--request_checkpoint_step", "40", "--poll_checkpoint_every", "8",
                                "--dump_params", dir.path() + "/cut"}),
                  {}, kLimit);
  INFO(why(first));
  REQUIRE(first.exit_code == 0);
  CHECK(has(first.out,
            "[default0]:[CPU0] checkpoint requested: saved snapshot at epoch 1 step 40 "
            "(step 8 of the epoch) to " +
                base + ".000002, exiting"));
  CHECK(has(first.out,
            "[default1]:[CPU1] checkpoint requested: stopped at epoch 1 step 40, exiting"));
  // Neither rank trained on: no end of epoch 1, no final comparison.
  CHECK_FALSE(has(first.out, "Epoch 1 | Batchsize"));
  CHECK_FALSE(has(first.out, "parameters identical"));
  CHECK(read_file(dir.path() + "/cut.rank0").empty());

  auto tool = run_command({SNAPSHOT_TOOL_BIN, base + ".000002"}, {}, std::chrono::seconds(60));
  INFO(tool.out << tool.err);
  CHECK(tool.exit_code == 0);
  CHECK(has(tool.out, "  epoch      : 1\n  step       : 40\n  epoch_step : 8\n"));
  CHECK(has(tool.out, "(verified)"));

  // The resumed run skips the 8 batches it had done and ends bit for bit where the
  // uninterrupted run ended.
  auto second = run_command(
      ddprun_train(2, {},
                   {"3", "1", "--snapshot_path", base, "--dump_params", dir.path() + "/resumed"}),
      {}, kLimit);
  INFO(why(second));
  REQUIRE(second.exit_code == 0);
  CHECK(has(second.out,
            "[default0]:[CPU0] Resuming training from snapshot at Epoch 1, step 8 of the epoch"));
  CHECK(has(second.out, "[default1]:[CPU1] Epoch 2 | Batchsize: 32 | Steps: 32"));
  CHECK_FALSE(has(second.out, "Epoch 0 | Batchsize"));
  const std::string resumed = read_file(dir.path() + "/resumed.rank0");
  REQUIRE_FALSE(resumed.empty());
  CHECK(resumed == read_file(dir.path() + "/whole.rank0"));
  CHECK(read_file(dir.path() + "/resumed.rank1") == resumed);
}

TEST_CASE("SIGUSR1 to ddprun makes the trainer save a snapshot and exit 0, and a rerun resumes",
          "[sdk][integration]") {
  TempDir dir;
  const std::string base = dir.path() + "/snap.pt";
  // Far more epochs than the test waits for, and no snapshot of its own before epoch 1000:
  // the only way this run ends in time with a snapshot is the notice.
  Subprocess job(ddprun_train(2, {}, {"1000", "1000", "--snapshot_path", base}));
  REQUIRE(job.wait_for_output("[default0]:[CPU0] Epoch 1 | Batchsize", kLimit));
  job.send(SIGUSR1);
  auto r = job.wait(kLimit);
  INFO(why(r));
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(has(r.err, "forwarding SIGUSR1 to the workers"));
  CHECK_FALSE(has(r.err, "restarting workers"));
  static const std::regex kSaved(
      R"(\[default0\]:\[CPU0\] checkpoint requested: saved snapshot at epoch (\d+) step (\d+) \(step (\d+) of the epoch\) to (\S+), exiting)");
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, kSaved));
  const std::string epoch = m[1], step = m[2], epoch_step = m[3];
  CHECK(m[4] == base + ".000001");
  CHECK(has(r.out, "[default1]:[CPU1] checkpoint requested: stopped at epoch " + epoch + " step " +
                       step + ", exiting"));
  CHECK(read_file(base + ".000002").empty());

  auto tool = run_command({SNAPSHOT_TOOL_BIN, base + ".000001"}, {}, std::chrono::seconds(60));
  INFO(tool.out << tool.err);
  CHECK(tool.exit_code == 0);
  CHECK(has(tool.out, "  epoch      : " + epoch + "\n  step       : " + step +
                          "\n  epoch_step : " + epoch_step + "\n  world_size : 2\n"));

  // A second job (as after the requeue) resumes there and finishes the epoch it was in.
  const std::string total = std::to_string(std::stoi(epoch) + 1);
  auto rerun =
      run_command(ddprun_train(2, {}, {total, "1000", "--snapshot_path", base}), {}, kLimit);
  INFO(why(rerun));
  CHECK(rerun.exit_code == 0);
  CHECK(has(rerun.out, "[default0]:[CPU0] Resuming training from snapshot at Epoch " + epoch));
  CHECK(has(rerun.out, "[default0]:[CPU0] Epoch " + epoch + " | Batchsize: 32"));
  CHECK(has(rerun.out, "[default1]:rank 1: parameters identical to rank 0: True"));
}

TEST_CASE("the snapshot tool refuses a file that is not a snapshot", "[sdk][integration]") {
  TempDir dir;
  const std::string junk = dir.path() + "/junk.pt";
  {
    std::vector<std::string> argv{"/bin/sh", "-c", "printf 'PK not a zip' > " + junk};
    REQUIRE(run_command(argv).exit_code == 0);
  }
  auto tool = run_command({SNAPSHOT_TOOL_BIN, junk}, {}, std::chrono::seconds(60));
  CHECK(tool.exit_code == 1);
  CHECK(has(tool.out, junk + ": INVALID: unreadable (torn or corrupt)"));
}

TEST_CASE("a C++ worker's exception appears in ddprun's failure report", "[sdk][integration]") {
  auto r = run_command(ddprun_train(2, {}, {"2", "1", "--fail_rank", "1", "--fail_epoch", "0"}), {},
                       kLimit);
  INFO(why(r));
  CHECK(r.exit_code == 1);
  CHECK(has(r.err, "ddp_train FAILED"));
  const auto report = r.err.find("ddp_train FAILED");
  REQUIRE(report != std::string::npos);
  const std::string text = r.err.substr(report);
  CHECK(has(text, "rank      : 1 (local_rank: 1)"));
  CHECK(has(text, "std::runtime_error: injected failure on rank 1 at epoch 0"));
  CHECK(has(text, "error.json"));
}

TEST_CASE("ranks whose models differ stop at GradientSync, the differing one naming the tensor",
          "[sdk][integration]") {
  // Rank 1 builds a wider hidden layer than rank 0, as DDP's construction check would catch.
  auto r = run_command(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--no_python", "/bin/sh", "-c",
       std::string("exec ") + DDP_TRAIN_BIN + " 1 1 --hidden $((16 + 8 * LOCAL_RANK))"},
      {}, kLimit);
  INFO(why(r));
  CHECK(r.exit_code == 1);
  CHECK(has(r.err,
            "GradientSync: rank 1's model does not match rank 0's: 'fc1.weight' is [24, 20] "
            "Float here, and the tensor in its place on rank 0 is [16, 20] Float: every rank "
            "must build the same model"));
}

TEST_CASE("outside a launcher a worker names the missing variable", "[sdk][integration]") {
  auto r =
      run_command({"/usr/bin/env", "-i", DDP_TRAIN_BIN, "1", "1"}, {}, std::chrono::seconds(60));
  CHECK(r.exit_code == 1);
  CHECK(has(r.err, "RANK is not set: start this program with ddprun or torchrun"));
}

TEST_CASE("ranks pass tensors around a ring with send and recv", "[sdk][integration]") {
  auto r = run_command(
      {DDPRUN_BIN, "--standalone", "--nproc_per_node", "3", "--no_python", SEND_RECV_BIN}, {},
      kLimit);
  INFO(why(r));
  REQUIRE(r.exit_code == 0);
  CHECK(has(r.out, "[default0]:rank 0 received 200 from rank 2"));
  CHECK(has(r.out, "[default1]:rank 1 received 0 from rank 0"));
  CHECK(has(r.out, "[default2]:rank 2 received 100 from rank 1"));
  for (int rank = 0; rank < 3; ++rank)
    CHECK(has(r.out, "rank " + std::to_string(rank) + ": all_reduce sum of ranks = 3 (gloo: ok)"));
}

TEST_CASE(
    "libtorch's own store client trains through ddprun's agent store, in its version's dialect",
    "[sdk][integration]") {
  // The SDK's ranks are clients of the agent's store (TORCHELASTIC_USE_AGENT_STORE=True) through
  // libtorch's C++ TCPStore: torch 2.x's client (Debian 13's 2.6, without libuv) speaks the
  // protocol's 2.x dialect, 1.13's the older one, and ddprun's server says which it heard.
  const std::string dialect = DDPRUN_TORCH_MAJOR >= 2 ? "2.x" : "1.13";
  auto r = run_command({DDPRUN_BIN, "--standalone", "--nproc_per_node", "2", "--agent_store", "on",
                        "--no_python", DDP_TRAIN_BIN, "2", "1", "--dataset_size", "256"},
                       {{"LOGLEVEL", "DEBUG"}}, kLimit);
  INFO(why(r));
  REQUIRE(r.exit_code == 0);
  CHECK(has(r.out + r.err, "speaks the torch " + dialect + " dialect"));
  CHECK(has(r.out, "rank 1: parameters identical to rank 0: True"));
}

TEST_CASE("under torchrun's static rendezvous the trainer joins the agent's store",
          "[sdk][integration][python]") {
  // torchrun then sets TORCHELASTIC_USE_AGENT_STORE=True: the ranks are clients of the store
  // its agent hosts on MASTER_PORT, under /worker/attempt_0.
  auto port = ddprun::rdzv::find_free_port("127.0.0.1");
  REQUIRE(port.ok());
  auto r = run_command({"/usr/bin/python3",
                        std::string(DDPRUN_SOURCE_DIR) + "/bench/torchrun_shim.py",
                        "--nnodes",
                        "1",
                        "--nproc_per_node",
                        "2",
                        "--rdzv_backend",
                        "static",
                        "--node_rank",
                        "0",
                        "--master_addr",
                        "127.0.0.1",
                        "--master_port",
                        std::to_string(*port),
                        "--no_python",
                        DDP_TRAIN_BIN,
                        "2",
                        "1",
                        "--dataset_size",
                        "256"},
                       {}, kLimit);
  INFO(why(r));
  REQUIRE(r.exit_code == 0);
  CHECK(has(r.out, "[CPU1] Epoch 1 | Batchsize: 32 | Steps: 4"));
  CHECK(has(r.out, "rank 0: parameters identical to rank 0: True"));
  CHECK(has(r.out, "rank 1: parameters identical to rank 0: True"));
}
