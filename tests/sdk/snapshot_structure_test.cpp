// Snapshots with a sound checksum path but a crafted structure, against the real reader: the
// snapshot tool and SnapshotStore::load_latest must refuse them before libtorch reads past a
// storage, and resume falls back to the previous snapshot. Also: files the SDK writes, and the
// same files re-saved by Python's torch.save, pass the structure check.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "ddprun/sdk.h"
#include "ddprun/sdk/snapshot_structure.h"
#include "tests/support/subprocess.h"

// After libtorch: glog's CHECK would replace Catch's.
#include <catch2/catch.hpp>

using namespace ddprun;
using ddprun::testing::TempDir;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(20, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 1))) {
    register_buffer("seen", torch::zeros({3}, torch::kLong));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

torch::optim::SGD make_sgd(Net& net) {
  return torch::optim::SGD(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
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
