// The libtorch side of the worker SDK in one process: snapshots, the sampler against Debian's
// python3-torch, process groups over loopback, and the GPU path (skipped without a GPU).
// One translation unit: libtorch headers cost 20-30 s per file.
#include <fcntl.h>
#include <unistd.h>

// Before Catch: c10d's headers define a glog-style CHECK, which Catch's then replaces.
#include "worker_sdk/src/torch_compat.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ddprun/sdk.h"
#include "ddprun/sdk/snapshot_structure.h"
#include "rendezvous/free_port.h"
#include "tests/support/subprocess.h"

using namespace ddprun;
using ddprun::testing::TempDir;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(20, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 1))) {
    register_buffer("seen", torch::zeros({3}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

/// One SGD step with momentum, so the optimizer has state worth saving.
void train_step(Net& net, torch::optim::Optimizer& opt, int64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({8, 20});
  opt.zero_grad();
  torch::mse_loss(net->forward(x), torch::ones({8, 1})).backward();
  opt.step();
}

torch::optim::SGD make_sgd(Net& net) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}

bool same_parameters(Net& a, Net& b) {
  auto pa = a->named_parameters();
  auto pb = b->named_parameters();
  for (const auto& item : pa)
    if (!torch::equal(item.value(), pb[item.key()])) return false;
  return true;
}

std::string read_all(const std::string& path) { return ddprun::testing::read_file(path); }

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

sdk::WorkerContext local_context(int rank, int world, int port) {
  sdk::WorkerContext c;
  c.rank = rank;
  c.local_rank = rank;
  c.world_size = world;
  c.local_world_size = world;
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  return c;
}

int free_port() {
  auto port = rdzv::find_free_port("127.0.0.1");
  INFO((!port.ok() ? port.error().message : ""));
  REQUIRE(port.ok());
  return *port;
}

/// Rewrites the zip at `path` with Python's zipfile, record `name` emptied and the rest kept.
void empty_record(const std::string& path, const std::string& name) {
  auto r = ddprun::testing::run_command(
      {"/usr/bin/python3", "-c",
       "import sys, zipfile\n"
       "path, name = sys.argv[1:]\n"
       "with zipfile.ZipFile(path) as z:\n"
       "    items = [(i.filename, z.read(i.filename)) for i in z.infolist()]\n"
       "assert name in [n for n, _ in items], name\n"
       "with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:\n"
       "    for n, data in items:\n"
       "        z.writestr(n, b'' if n == name else data)\n",
       path, name});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
}

/// What this process writes to stderr while it lives.
class StderrCapture {
 public:
  explicit StderrCapture(std::string path) : path_(std::move(path)) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    return ddprun::testing::read_file(path_);
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

std::string bytes_of(const std::string& path) { return ddprun::testing::read_file(path); }

}  // namespace

TEST_CASE("a snapshot round trip restores model, buffers, optimizer state and RNG",
          "[sdk][snapshot]") {
  TempDir dir;
  torch::manual_seed(1);
  Net a;
  auto opt_a = make_sgd(a);
  train_step(a, opt_a, 10);
  a->named_buffers()["seen"].fill_(7);
  sdk::SnapshotStore store(dir.path() + "/snap.pt");
  const std::string path = store.save(*a, opt_a, /*epoch=*/3, /*step=*/17, /*world_size=*/2);
  CHECK(path == dir.path() + "/snap.pt.000001");
  const torch::Tensor rng_after_save = torch::rand({4});

  torch::manual_seed(2);
  Net b;
  auto opt_b = make_sgd(b);
  REQUIRE_FALSE(same_parameters(a, b));
  auto meta = sdk::SnapshotStore(dir.path() + "/snap.pt").load_latest(*b, opt_b);
  REQUIRE(meta);
  CHECK(meta->epoch == 3);
  CHECK(meta->step == 17);
  CHECK(meta->world_size == 2);
  CHECK(same_parameters(a, b));
  CHECK(torch::equal(b->named_buffers()["seen"], torch::full({3}, 7, torch::kLong)));
  // The default generator continues where it was when the snapshot was taken.
  CHECK(torch::equal(torch::rand({4}), rng_after_save));
  // Same momentum buffers: the same next step gives the same parameters.
  train_step(a, opt_a, 11);
  train_step(b, opt_b, 11);
  CHECK(same_parameters(a, b));
}

namespace {

/// Net with fc1 wider, fc2 gone and fc3 added: a snapshot of Net does not fit it.
struct OtherNetImpl : torch::nn::Module {
  OtherNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(20, 32))),
        fc3(register_module("fc3", torch::nn::Linear(32, 1))) {
    register_buffer("seen", torch::zeros({3}, torch::kLong));
  }
  torch::nn::Linear fc1, fc3;
};
TORCH_MODULE(OtherNet);

}  // namespace

TEST_CASE("a snapshot of another model is refused naming the file and every difference",
          "[sdk][snapshot]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt");
  const std::string path = store.save(*net, opt, 1, 10, 1);
  OtherNet other;
  torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor before = other->fc1->weight.clone();
  std::string error;
  try {
    store.load_latest(*other, other_opt);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  CHECK(error ==
        "cannot resume from snapshot " + path +
            ": the snapshot does not fit this model: 'fc1.weight' is [64, 20] in it and [32, 20] "
            "in the model; 'fc1.bias' is [64] in it and [32] in the model; the model's "
            "'fc3.weight' is not in it; the model's 'fc3.bias' is not in it; its 'fc2.bias' is "
            "not in the model; and 1 more (saved by another model: resume it with the model "
            "that saved it, or give this model a snapshot series of its own)");
  // Nothing was copied.
  CHECK(torch::equal(other->fc1->weight, before));

  // The same model with another optimizer: libtorch's reason in one line, with the file.
  Net same;
  torch::optim::Adam adam(same->parameters(), torch::optim::AdamOptions(0.1));
  const torch::Tensor same_before = same->fc1->weight.clone();
  error.clear();
  try {
    store.load_latest(*same, adam);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.rfind("cannot resume from snapshot " + path +
                        ": the snapshot's optimizer state does not fit this optimizer",
                    0) == 0);
  CHECK(error.find('\n') == std::string::npos);
  CHECK(torch::equal(same->fc1->weight, same_before));  // the model too is as it was
}

TEST_CASE("resuming inside an epoch at another world size says so on rank 0 only",
          "[sdk][snapshot]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt");
  store.save(*net, opt, /*epoch=*/3, /*step=*/40, /*world_size=*/4);
  const std::string inside = store.save(*net, opt, 3, 56, 4, /*epoch_step=*/16);
  // What each load printed, in a job of the given world size, as the given rank.
  auto notes = [&](const char* world, const char* rank) {
    ::setenv("WORLD_SIZE", world, 1);
    ::setenv("RANK", rank, 1);
    std::string text;
    {
      StderrCapture capture(dir.path() + "/stderr");
      REQUIRE(store.load_latest(*net, opt));
      text = capture.text();
    }
    ::unsetenv("WORLD_SIZE");
    ::unsetenv("RANK");
    return text;
  };
  CHECK(notes("2", "0") ==
        "[ddprun sdk] note: snapshot " + inside +
            " was saved inside epoch 3 by a job of 4 ranks and this job has 2: the rest of that "
            "epoch is split anew, so some of its samples are seen twice or not at all "
            "(docs/sdk.md#preemption)\n");
  CHECK(notes("2", "1").empty());  // one line per job, not per rank
  CHECK(notes("4", "0").empty());  // the same world size continues exactly
}

TEST_CASE("only the newest snapshots are kept", "[sdk][snapshot]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt", /*keep_last=*/2);
  for (int epoch = 1; epoch <= 5; ++epoch) store.save(*net, opt, epoch, epoch * 10, 1);
  CHECK(store.files() ==
        std::vector<std::string>{dir.path() + "/s.pt.000005", dir.path() + "/s.pt.000004"});
  auto meta = store.load_latest(*net, opt);
  REQUIRE(meta);
  CHECK(meta->epoch == 5);
}

TEST_CASE("a save removes the temporary file a writer killed during its save left behind",
          "[sdk][snapshot]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt");
  store.save(*net, opt, 1, 10, 1);
  // The writer of snapshot 2 was SIGKILLed mid-save; after the restart the series goes on.
  const std::string stale = dir.path() + "/s.pt.000002.tmp-999999";
  write_all(stale, "half a zip");
  const std::string other = dir.path() + "/notes.txt.tmp-1";  // not the series': kept
  write_all(other, "x");
  store.save(*net, opt, 2, 20, 1);
  CHECK_FALSE(std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(other));
  CHECK(store.files().size() == 2);
}

TEST_CASE("a torn snapshot is skipped with a warning and the previous one is loaded",
          "[sdk][snapshot]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt");
  store.save(*net, opt, 1, 10, 1);
  const std::string newest = store.save(*net, opt, 2, 20, 1);
  const std::string bytes = read_all(newest);
  write_all(newest, bytes.substr(0, bytes.size() / 2));

  auto read = sdk::read_snapshot_file(newest);
  REQUIRE(std::holds_alternative<std::string>(read));
  CHECK(std::get<std::string>(read).find("torn or corrupt") != std::string::npos);
  write_all(dir.path() + "/s.pt.000003", "");
  CHECK(std::get<std::string>(sdk::read_snapshot_file(dir.path() + "/s.pt.000003")) ==
        "empty file (torn write)");

  auto meta = store.load_latest(*net, opt);
  REQUIRE(meta);
  CHECK(meta->epoch == 1);
}

TEST_CASE("a save that runs out of space fails naming the file and keeps the previous snapshot",
          "[sdk][snapshot]") {
  // A 1 MiB tmpfs holds the small first snapshot but not a second of about 4 MiB.
  TempDir dir;
  const std::string mnt = dir.path() + "/small";
  std::filesystem::create_directory(mnt);
  const std::string mount = "mount -t tmpfs -o size=1m ddprun-test " + mnt;
  INFO("this test needs root to mount a tmpfs (" << mount << ")");
  REQUIRE(std::system(mount.c_str()) == 0);
  struct Unmount {
    std::string path;
    ~Unmount() { std::system(("umount " + path).c_str()); }
  } unmount{mnt};

  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(mnt + "/s.pt");
  store.save(*net, opt, 1, 10, 1);
  torch::nn::Linear big(1024, 1024);  // 4 MiB of parameters
  auto big_opt = torch::optim::SGD(big->parameters(), 0.1);
  sdk::SnapshotStore big_store(mnt + "/s.pt");
  try {
    big_store.save(*big, big_opt, 2, 20, 1);
    FAIL("a 4 MiB snapshot was saved on a 1 MiB tmpfs");
  } catch (const std::system_error& e) {
    CHECK(e.code() == std::errc::no_space_on_device);
    CHECK_THAT(e.what(), Catch::Contains(mnt + "/s.pt.000002.tmp-"));
  }
  // No temporary file is left behind, and the first snapshot still loads.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(mnt))
    names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"s.pt.000001"});
  auto meta = store.load_latest(*net, opt);
  REQUIRE(meta);
  CHECK(meta->epoch == 1);
}

TEST_CASE("a snapshot with a flipped byte in its tensor data is refused", "[sdk][snapshot]") {
  TempDir dir;
  torch::manual_seed(3);
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt");
  store.save(*net, opt, 1, 10, 1);
  const std::string newest = store.save(*net, opt, 2, 20, 1);
  // The zip stores tensors uncompressed: find fc1.weight's bytes and flip one bit in them.
  std::string bytes = read_all(newest);
  const torch::Tensor w = net->fc1->weight.detach().contiguous();
  const std::string needle(static_cast<const char*>(w.data_ptr()), 64);
  const auto at = bytes.find(needle);
  REQUIRE(at != std::string::npos);
  bytes[at + 40] = static_cast<char>(bytes[at + 40] ^ 0x04);
  write_all(newest, bytes);

  auto read = sdk::read_snapshot_file(newest);
  REQUIRE(std::holds_alternative<std::string>(read));
  INFO(std::get<std::string>(read));
  // Either miniz's CRC or the content checksum catches it; both say corrupt.
  CHECK(std::get<std::string>(read).find("corrupt") != std::string::npos);
  auto meta = store.load_latest(*net, opt);
  REQUIRE(meta);
  CHECK(meta->epoch == 1);
}

TEST_CASE("a snapshot whose content does not match its recorded checksum is refused",
          "[sdk][snapshot]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  sdk::Snapshot s = sdk::capture_snapshot(*net, opt, 4, 40, 1);
  const std::string path = dir.path() + "/s.pt.000001";
  sdk::write_snapshot_file(path, s);
  REQUIRE(std::holds_alternative<sdk::Snapshot>(sdk::read_snapshot_file(path)));
  // Rewrite the file with the same recorded checksum but one changed weight: a bit flip that
  // the zip layer cannot see, since its records are consistent.
  torch::IValue doc = torch::pickle_load([&] {
    std::string b = read_all(path);
    return std::vector<char>(b.begin(), b.end());
  }());
  auto dict = doc.toGenericDict();
  auto model = dict.at("model").toGenericDict();
  torch::Tensor changed = model.at("fc2.bias").toTensor().clone();
  changed.add_(1e-3);
  model.insert_or_assign("fc2.bias", changed);
  const std::vector<char> out = torch::pickle_save(doc);
  write_all(path, std::string(out.begin(), out.end()));
  auto read = sdk::read_snapshot_file(path);
  REQUIRE(std::holds_alternative<std::string>(read));
  CHECK(std::get<std::string>(read).find("checksum mismatch (corrupt)") == 0);
}

TEST_CASE("a snapshot with a field of the wrong type is refused naming the field",
          "[sdk][snapshot][security]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  const std::string path = dir.path() + "/s.pt.000001";
  sdk::write_snapshot_file(path, sdk::capture_snapshot(*net, opt, 4, 40, 1));
  const std::string original = read_all(path);
  auto rewrite = [&](const std::string& key, torch::IValue value) {
    torch::IValue doc = torch::pickle_load(std::vector<char>(original.begin(), original.end()));
    doc.toGenericDict().insert_or_assign(key, std::move(value));
    const std::vector<char> out = torch::pickle_save(doc);
    write_all(path, std::string(out.begin(), out.end()));
    auto read = sdk::read_snapshot_file(path);
    REQUIRE(std::holds_alternative<std::string>(read));
    return std::get<std::string>(read);
  };
  // A tuple, as Python's pickle writes a list or tuple (a c10 int list is refused earlier, by
  // the structure check, which allows no call of torch's list builders).
  const std::string tuple =
      rewrite("world_size",
              c10::ivalue::Tuple::create({torch::IValue(int64_t{1}), torch::IValue(int64_t{2})}));
  CHECK(tuple == "unreadable (torn or corrupt): its \"world_size\" entry is Tuple, not an integer");
  CHECK(tuple.find("INTERNAL ASSERT") == std::string::npos);
  CHECK(rewrite("checksum", torch::IValue(int64_t{7}))
            .find("\"checksum\" entry is Int, not a string") != std::string::npos);
  CHECK(rewrite("optimizer", torch::IValue("x"))
            .find("\"optimizer\" entry is String, not a tensor") != std::string::npos);
}

TEST_CASE("Python's torch.load reads a snapshot as a dict of tensors", "[sdk][snapshot][python]") {
  TempDir dir;
  torch::manual_seed(4);
  Net net;
  auto opt = make_sgd(net);
  const std::string path = sdk::SnapshotStore(dir.path() + "/s.pt").save(*net, opt, 6, 60, 3);
  const double sum = net->fc1->weight.to(torch::kDouble).sum().item<double>();
  auto r = ddprun::testing::run_command(
      {"/usr/bin/python3", "-c",
       "import sys, torch\n"
       "d = torch.load(sys.argv[1])\n"
       "print(d['format'], d['epoch'], d['step'], d['world_size'])\n"
       "print(sorted(d['model']))\n"
       "print(tuple(d['model']['fc1.weight'].shape), d['model']['fc1.weight'].dtype)\n"
       "print('%.6f' % d['model']['fc1.weight'].double().sum().item())\n",
       path},
      {}, std::chrono::seconds(120));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  std::ostringstream expect;
  expect << "ddprun-snapshot 6 60 3\n['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight', "
            "'seen']\n(64, 20) torch.float32\n"
         << std::fixed << std::setprecision(6) << sum << "\n";
  CHECK(r.out == expect.str());
}

TEST_CASE("a file torch.save wrote for something else is not a snapshot, not a corrupt one",
          "[sdk][snapshot][python]") {
  TempDir dir;
  auto r = ddprun::testing::run_command(
      {"/usr/bin/python3", "-c",
       "import sys, torch\n"
       "torch.save({'a': torch.ones(3)}, sys.argv[1] + '/dict.pt')\n"
       "torch.save(torch.nn.Linear(2, 2).state_dict(), sys.argv[1] + '/state_dict.pt')\n",
       dir.path()},
      {}, std::chrono::seconds(120));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (const std::string name : {"dict.pt", "state_dict.pt"}) {
    auto read = sdk::read_snapshot_file(dir.path() + "/" + name);
    REQUIRE(std::holds_alternative<std::string>(read));
    INFO(std::get<std::string>(read));
    CHECK(std::get<std::string>(read).rfind(
              "not a ddprun snapshot: a whole archive without the format \"ddprun-snapshot\" "
              "(another torch.save file?): ",
              0) == 0);
  }
}

TEST_CASE("the sampler gives the same index lists as python3-torch's DistributedSampler",
          "[sdk][sampler][python]") {
  // Grid: dataset size x replicas x shuffle x seed x epoch x drop_last, every rank.
  const std::vector<int64_t> sizes{0, 1, 5, 10, 17, 64, 101};
  const std::vector<int> replicas{1, 2, 3, 4, 7};
  const std::vector<uint64_t> seeds{0, 42};
  const std::vector<int64_t> epochs{0, 1, 7};
  std::ostringstream py;
  py << "import torch\nfrom torch.utils.data.distributed import DistributedSampler\n"
        "for n in [0, 1, 5, 10, 17, 64, 101]:\n"
        " for r in [1, 2, 3, 4, 7]:\n"
        "  for shuffle in [False, True]:\n"
        "   for seed in [0, 42]:\n"
        "    for epoch in [0, 1, 7]:\n"
        "     for drop in [False, True]:\n"
        "      for rank in range(r):\n"
        "       s = DistributedSampler(range(n), num_replicas=r, rank=rank, shuffle=shuffle,"
        " seed=seed, drop_last=drop)\n"
        "       s.set_epoch(epoch)\n"
        "       print(' '.join(map(str, list(s))))\n";
  auto r = ddprun::testing::run_command({"/usr/bin/python3", "-c", py.str()}, {},
                                        std::chrono::seconds(120));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::istringstream lines(r.out);
  size_t compared = 0, nonempty = 0;
  for (int64_t n : sizes)
    for (int reps : replicas)
      for (bool shuffle : {false, true})
        for (uint64_t seed : seeds)
          for (int64_t epoch : epochs)
            for (bool drop : {false, true})
              for (int rank = 0; rank < reps; ++rank) {
                std::string line;
                REQUIRE(std::getline(lines, line));
                sdk::DistributedSampler sampler(
                    sdk::SamplerOptions{n, reps, rank, shuffle, seed, drop});
                sampler.set_epoch(epoch);
                std::string mine;
                for (int64_t i : sampler.indices())
                  mine += (mine.empty() ? "" : " ") + std::to_string(i);
                INFO("n=" << n << " replicas=" << reps << " rank=" << rank << " shuffle=" << shuffle
                          << " seed=" << seed << " epoch=" << epoch << " drop_last=" << drop);
                REQUIRE(mine == line);
                CHECK(static_cast<int64_t>(sampler.indices().size()) == sampler.size());
                ++compared;
                nonempty += !line.empty();
              }
  std::string extra;
  CHECK_FALSE(std::getline(lines, extra));
  CHECK(compared == 7 * (1 + 2 + 3 + 4 + 7) * 2 * 2 * 3 * 2);
  CHECK(nonempty > compared / 2);
}

TEST_CASE("a one-rank group forms buckets in reverse parameter order up to the cap", "[sdk][ddp]") {
  const int port = free_port();
  auto group = sdk::ProcessGroup::create(local_context(0, 1, port));
  CHECK(group->rank() == 0);
  CHECK(group->world_size() == 1);
  CHECK(group->backend() == sdk::Backend::Gloo);
  // A second group of the same rank is refused by name, before it touches the store.
  CHECK_THROWS_WITH(sdk::ProcessGroup::create(local_context(0, 1, port)),
                    Catch::Contains("rank 0 already has a process group (one per rank"));
  Net net;
  // fc2.bias 4 B, fc2.weight 256 B, fc1.bias 256 B, fc1.weight 5120 B; buffers are not synced
  // as gradients.
  sdk::GradientSync sync(group, *net, {.bucket_cap_bytes = 600});
  CHECK(sync.bucket_bytes() == std::vector<size_t>{516, 5120});
  sdk::GradientSync one(group, *net);
  CHECK(one.bucket_bytes() == std::vector<size_t>{5636});
}

TEST_CASE("with the agent's store every rank is a client under /worker/attempt_<n>",
          "[sdk][process_group]") {
  const int port = free_port();
  // The SDK's own server (its libuv choice is the one torch_compat.h makes).
  auto agent_store = sdk::compat::make_tcp_store("127.0.0.1", port, /*is_server=*/true, 2,
                                                 std::chrono::seconds(60));

  std::vector<double> sums(2, -1);
  std::vector<std::string> errors(2);
  {
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank)
      ranks.emplace_back([&, rank] {
        try {
          sdk::WorkerContext c = local_context(rank, 2, port);
          c.use_agent_store = true;
          c.restart_count = 3;
          auto group = sdk::ProcessGroup::create(c, {.timeout = std::chrono::seconds(60)});
          torch::Tensor t = torch::full({2}, rank + 1.0);
          group->all_reduce(t);
          sums[rank] = t[1].item<double>();
        } catch (const std::exception& e) {
          errors[rank] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
  }
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(sums == std::vector<double>{3.0, 3.0});
  // Both ranks checked out through the agent's store, under this attempt's prefix.
  CHECK(agent_store->check({"/worker/attempt_3/shutdown/all"}));
  CHECK_FALSE(agent_store->check({"ddprun/shutdown/all"}));
}

TEST_CASE("asking for a CUDA group in a build without CUDA says why", "[sdk][process_group]") {
  if (torch::cuda::is_available()) {
    WARN("skipped: this libtorch has CUDA, so the NCCL path is taken instead");
    SUCCEED();
    return;
  }
  try {
    sdk::ProcessGroup::create(local_context(0, 1, free_port()), {.device = torch::kCUDA});
    FAIL("a CUDA process group was created without CUDA");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    CHECK(what.find("NCCL") != std::string::npos);
    CHECK(what.find("without CUDA") != std::string::npos);
  }
}

TEST_CASE("an NCCL group all-reduces CUDA tensors", "[sdk][gpu]") {
  if (!torch::cuda::is_available()) {
    WARN("skipped: no CUDA device is visible to libtorch (a CPU libtorch, or no GPU)");
    SUCCEED();
    return;
  }
  auto group = sdk::ProcessGroup::create(local_context(0, 1, free_port()),
                                         {.device = torch::Device(torch::kCUDA, 0)});
  CHECK(group->backend() == sdk::Backend::Nccl);
  torch::Tensor t = torch::full({4}, 2.5, torch::TensorOptions().device(torch::kCUDA));
  group->all_reduce(t);
  CHECK(torch::equal(t.cpu(), torch::full({4}, 2.5)));
}

// ---- snapshot structure: crafted files against the real reader -----------------------------
TEST_CASE("a snapshot with an emptied storage record is invalid and resume takes the one before",
          "[sdk][snapshot]") {
  TempDir dir;
  torch::manual_seed(5);
  Net net;
  auto opt = make_sgd(net);
  sdk::SnapshotStore store(dir.path() + "/s.pt");
  store.save(*net, opt, 1, 10, 1);
  const std::string newest = store.save(*net, opt, 2, 20, 1);
  empty_record(newest, "archive/data/0");
  // data/0 is the model's first parameter: fc1.weight, 64 x 20 float32.
  const std::string why =
      "unreadable (torn or corrupt): record archive/data/0 holds 0 bytes but tensor "
      "'model.fc1.weight' (float32, shape [64, 20], offset 0) needs 5120";

  auto tool =
      ddprun::testing::run_command({SNAPSHOT_TOOL_BIN, newest}, {}, std::chrono::seconds(60));
  INFO("ddprun-snapshot exit " << tool.exit_code << "\n" << tool.out << tool.err);
  CHECK(tool.exit_code == 1);
  CHECK(tool.out == newest + ": INVALID: " + why + "\n");

  torch::manual_seed(6);
  Net fresh;
  auto fresh_opt = make_sgd(fresh);
  std::optional<sdk::SnapshotMeta> meta;
  std::string warnings;
  {
    StderrCapture capture(dir.path() + "/stderr");
    meta = sdk::SnapshotStore(dir.path() + "/s.pt").load_latest(*fresh, fresh_opt);
    warnings = capture.text();
  }
  CHECK(warnings == "[ddprun sdk] warning: skipping snapshot " + newest + ": " + why + "\n");
  REQUIRE(meta);
  CHECK(meta->epoch == 1);
  CHECK(meta->step == 10);
  CHECK(torch::equal(fresh->fc1->weight, net->fc1->weight));
}

TEST_CASE("snapshots from the SDK and from Python's torch.save pass the structure check",
          "[sdk][snapshot][python]") {
  TempDir dir;
  Net net;
  auto opt = make_sgd(net);
  const std::string path = sdk::SnapshotStore(dir.path() + "/s.pt").save(*net, opt, 3, 30, 2);
  auto ours = sdk::check_snapshot_structure(bytes_of(path));
  INFO((std::holds_alternative<std::string>(ours) ? std::get<std::string>(ours) : ""));
  REQUIRE(std::holds_alternative<sdk::SnapshotStructure>(ours));
  const auto& s = std::get<sdk::SnapshotStructure>(ours);
  CHECK(s.archive == "archive");
  std::vector<std::string> names;
  for (const auto& t : s.tensors) names.push_back(t.name);
  const std::vector<std::string> expected{"model.fc1.weight", "model.fc1.bias", "model.fc2.weight",
                                          "model.fc2.bias",   "model.seen",     "optimizer",
                                          "rng_state"};
  CHECK(names == expected);
  CHECK((s.tensors[0].sizes == std::vector<int64_t>{64, 20}));
  CHECK(s.tensors[4].dtype == "int64");

  // Python's pickler memoizes and writes short tuples differently, and names the archive
  // after the file.
  const std::string resaved = dir.path() + "/resaved.pt";
  auto r = ddprun::testing::run_command({"/usr/bin/python3", "-c",
                                         "import sys, torch\n"
                                         "torch.save(torch.load(sys.argv[1]), sys.argv[2])\n",
                                         path, resaved},
                                        {}, std::chrono::seconds(120));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto theirs = sdk::check_snapshot_structure(bytes_of(resaved));
  INFO((std::holds_alternative<std::string>(theirs) ? std::get<std::string>(theirs) : ""));
  REQUIRE(std::holds_alternative<sdk::SnapshotStructure>(theirs));
  CHECK(std::get<sdk::SnapshotStructure>(theirs).archive == "resaved");
  names.clear();
  for (const auto& t : std::get<sdk::SnapshotStructure>(theirs).tensors) names.push_back(t.name);
  CHECK(names == expected);
  // And the reader loads it.
  auto read = sdk::read_snapshot_file(resaved);
  INFO((std::holds_alternative<std::string>(read) ? std::get<std::string>(read) : ""));
  CHECK(std::holds_alternative<sdk::Snapshot>(read));
}
