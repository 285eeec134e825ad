// The DDP tutorial's trainer in C++ on ddprun's worker SDK: a small model on synthetic data,
// sharded with DistributedSampler, gradients averaged by GradientSync, a snapshot from rank 0
// every `save_every` epochs, and a restart resumes from the newest valid one. A preemption
// notice (SIGUSR1, forwarded by ddprun) makes every rank stop after the same step, rank 0 save a
// snapshot there, and all exit 0; the next run resumes at that step of the epoch.
//
//   ddprun --standalone --nproc_per_node 2 --no_python build/bin/ddp_train 5 2 --batch_size 32
//
// --device cuda trains on each rank's GPU (cuda:LOCAL_RANK) with NCCL, where the SDK was built
// against a CUDA libtorch; --hidden sets the width of the hidden layer (64, as in the tutorial).
//
// Test and demo switches: --fail_rank R --fail_epoch E makes rank R fail halfway through epoch
// E of the first attempt (an exception, or SIGKILL with --fail_kill), or at the first step of the
// first attempt after the file --fail_when_file names exists; --dump_params FILE writes
// this rank's final parameters as raw float32 to FILE.rank<N>; --request_checkpoint_rank R
// --request_checkpoint_step N makes rank R request a checkpoint (as SIGUSR1 does) after global
// step N.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ddprun/sdk.h"

namespace sdk = ddprun::sdk;

namespace {

struct Args {
  int total_epochs = 0;
  int save_every = 1;
  int batch_size = 32;
  std::string snapshot_path;
  int keep_snapshots = 3;
  int64_t dataset_size = 2048;
  bool overlap = false;
  bool shuffle = true;
  int fail_rank = -1;
  int fail_epoch = 0;
  bool fail_kill = false;
  std::string fail_when_file;
  std::string dump_params;
  int request_checkpoint_rank = -1;
  int64_t request_checkpoint_step = 0;
  int64_t poll_checkpoint_every = 16;
  std::string device = "cpu";
  int64_t hidden = 64;
};

/// The same synthetic regression data on every rank: y = x w + noise.
std::pair<torch::Tensor, torch::Tensor> make_dataset(int64_t size) {
  at::Generator g = at::detail::createCPUGenerator(1234);
  torch::Tensor x = torch::randn({size, 20}, g);
  torch::Tensor w = torch::randn({20, 1}, g);
  torch::Tensor y = torch::matmul(x, w) + 0.01 * torch::randn({size, 1}, g);
  return {x, y};
}

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(20, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

void dump_parameters(const std::string& path, const Net& model) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& p : model->parameters()) {
    torch::Tensor c = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// After a checkpoint request: rank 0 saves where the next run continues, and every rank ends.
int save_and_exit(std::optional<sdk::SnapshotStore>& snapshots, const Net& model,
                  torch::optim::Optimizer& optimizer, sdk::ProcessGroup& group, int64_t epoch,
                  int64_t step, int64_t epoch_step) {
  const int rank = group.rank();
  const char* tag = group.device().is_cuda() ? "GPU" : "CPU";
  if (rank == 0 && snapshots) {
    const std::string path =
        snapshots->save(*model, optimizer, epoch, step, group.world_size(), epoch_step);
    std::printf(
        "[%s0] checkpoint requested: saved snapshot at epoch %lld step %lld (step %lld of the "
        "epoch) to %s, exiting\n",
        tag, static_cast<long long>(epoch), static_cast<long long>(step),
        static_cast<long long>(epoch_step), path.c_str());
  } else if (rank == 0) {
    std::printf("[%s0] checkpoint requested: no --snapshot_path, exiting without a snapshot\n",
                tag);
  } else {
    std::printf("[%s%d] checkpoint requested: stopped at epoch %lld step %lld, exiting\n", tag,
                rank, static_cast<long long>(epoch), static_cast<long long>(step));
  }
  std::fflush(stdout);
  return 0;
}

int run(const Args& args) {
  const sdk::WorkerContext ctx = sdk::WorkerContext::from_env();
  auto group = sdk::ProcessGroup::create(ctx, {.device = torch::Device(args.device)});
  const int rank = group->rank();
  const torch::Device device = group->device();
  const char* tag = device.is_cuda() ? "GPU" : "CPU";

  torch::manual_seed(0);
  auto [x, y] = make_dataset(args.dataset_size);
  x = x.to(device);
  y = y.to(device);
  Net model(args.hidden);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));

  int64_t epochs_run = 0;
  int64_t step = 0;
  int64_t epoch_step = 0;  // steps of epoch `epochs_run` already done (a mid-epoch snapshot)
  std::optional<sdk::SnapshotStore> snapshots;
  if (!args.snapshot_path.empty()) {
    snapshots.emplace(args.snapshot_path, args.keep_snapshots);
    if (auto meta = snapshots->load_latest(*model, optimizer)) {
      epochs_run = meta->epoch;
      step = meta->step;
      epoch_step = meta->epoch_step;
      std::printf("[%s%d] Resuming training from snapshot at Epoch %lld", tag, rank,
                  static_cast<long long>(epochs_run));
      if (epoch_step > 0)
        std::printf(", step %lld of the epoch", static_cast<long long>(epoch_step));
      std::printf("\n");
    }
  }
  // After the restore: every rank starts from rank 0's parameters, buffers and progress, even
  // if another rank found a different newest valid snapshot.
  sdk::GradientSync sync(group, *model, {.overlap_with_backward = args.overlap});
  torch::Tensor progress = torch::tensor({epochs_run, step, epoch_step}, torch::kLong).to(device);
  group->broadcast(progress, 0);
  epochs_run = progress[0].item<int64_t>();
  step = progress[1].item<int64_t>();
  epoch_step = progress[2].item<int64_t>();
  sdk::DistributedSampler sampler(args.dataset_size, *group, args.shuffle);

  for (int64_t epoch = epochs_run; epoch < args.total_epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::vector<int64_t> indices = sampler.indices();
    const torch::Tensor order = torch::tensor(indices, torch::kLong).to(device);
    const int64_t steps =
        (static_cast<int64_t>(indices.size()) + args.batch_size - 1) / args.batch_size;
    torch::Tensor loss = torch::zeros({}, device);
    // A mid-epoch snapshot resumes with the same shuffled order, past the batches it had done
    // (exact at the same world size; at another one, the rest of a re-sharded epoch).
    for (int64_t s = epoch == epochs_run ? epoch_step : 0; s < steps; ++s) {
      const bool fail_now =
          rank == args.fail_rank && ctx.restart_count == 0 &&
          (args.fail_when_file.empty() ? epoch == args.fail_epoch && s == steps / 2
                                       : std::filesystem::exists(args.fail_when_file));
      if (fail_now) {
        std::printf("[%s%d] injected failure at epoch %lld, step %lld\n", tag, rank,
                    static_cast<long long>(epoch), static_cast<long long>(s));
        std::fflush(stdout);
        if (args.fail_kill) std::raise(SIGKILL);
        throw std::runtime_error("injected failure on rank " + std::to_string(rank) + " at epoch " +
                                 std::to_string(epoch));
      }
      const int64_t len = std::min<int64_t>(args.batch_size, order.numel() - s * args.batch_size);
      const torch::Tensor batch = order.narrow(0, s * args.batch_size, len);
      optimizer.zero_grad();
      loss = torch::mse_loss(model->forward(x.index_select(0, batch)), y.index_select(0, batch));
      loss.backward();
      sync.synchronize();
      optimizer.step();
      ++step;
      if (rank == args.request_checkpoint_rank && step == args.request_checkpoint_step)
        sdk::request_checkpoint();
      // Every rank asks after the same steps (every --poll_checkpoint_every), so all stop after
      // the same one, whichever rank got the notice and when. Asking is an all-reduce: not
      // after every step of a small model, where it would cost as much as the step's own.
      if (step % args.poll_checkpoint_every == 0 && sdk::any_rank_requested_checkpoint(*group)) {
        const bool epoch_done = s + 1 == steps;
        return save_and_exit(snapshots, model, optimizer, *group, epoch_done ? epoch + 1 : epoch,
                             step, epoch_done ? 0 : s + 1);
      }
    }
    std::printf("[%s%d] Epoch %lld | Batchsize: %d | Steps: %lld | Loss: %.5f\n", tag, rank,
                static_cast<long long>(epoch), args.batch_size, static_cast<long long>(steps),
                loss.item<double>());
    std::fflush(stdout);
    if (rank == 0 && snapshots && (epoch + 1) % args.save_every == 0) {
      const std::string path =
          snapshots->save(*model, optimizer, epoch + 1, step, group->world_size());
      std::printf("Epoch %lld | Training snapshot saved at %s\n", static_cast<long long>(epoch + 1),
                  path.c_str());
      std::fflush(stdout);
    }
  }

  // Every rank compares its parameters with rank 0's, bit for bit.
  std::vector<torch::Tensor> flat_parts;
  for (const auto& p : model->parameters()) flat_parts.push_back(p.detach().reshape({-1}));
  torch::Tensor mine = torch::cat(flat_parts);
  torch::Tensor reference = mine.clone();
  group->broadcast(reference, 0);
  const bool same = torch::equal(mine, reference);
  std::printf("rank %d: parameters identical to rank 0: %s\n", rank, same ? "True" : "False");
  if (!args.dump_params.empty())
    dump_parameters(args.dump_params + ".rank" + std::to_string(rank), model);
  return same ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  return sdk::record([&] {
    Args args;
    CLI::App app{"DDP training on ddprun's worker SDK (CPU with Gloo, or GPU with NCCL)"};
    app.add_option("total_epochs", args.total_epochs, "epochs to train")->required();
    app.add_option("save_every", args.save_every, "snapshot every N epochs")
        ->required()
        ->check(CLI::PositiveNumber);
    app.add_option("--batch_size", args.batch_size, "per-rank batch size")
        ->check(CLI::PositiveNumber);
    app.add_option("--snapshot_path", args.snapshot_path,
                   "snapshot series base path (files <path>.000001, ...)");
    app.add_option("--keep_snapshots", args.keep_snapshots, "snapshots to keep")
        ->check(CLI::PositiveNumber);
    app.add_option("--dataset_size", args.dataset_size, "synthetic samples")
        ->check(CLI::PositiveNumber);
    app.add_flag("--overlap", args.overlap, "all-reduce buckets during backward");
    app.add_flag("!--no_shuffle", args.shuffle, "read the data in order");
    app.add_option("--fail_rank", args.fail_rank, "rank that fails in the first attempt");
    app.add_option("--fail_epoch", args.fail_epoch, "epoch in which --fail_rank fails");
    app.add_flag("--fail_kill", args.fail_kill, "fail by SIGKILL instead of an exception");
    app.add_option("--fail_when_file", args.fail_when_file,
                   "--fail_rank fails once this file exists (instead of --fail_epoch)");
    app.add_option("--dump_params", args.dump_params, "write final parameters to FILE.rank<N>");
    app.add_option("--poll_checkpoint_every", args.poll_checkpoint_every,
                   "ask the ranks about a checkpoint request after every N-th step (default 16)")
        ->check(CLI::PositiveNumber);
    app.add_option("--request_checkpoint_rank", args.request_checkpoint_rank,
                   "rank that requests a checkpoint (as SIGUSR1 does)");
    app.add_option("--request_checkpoint_step", args.request_checkpoint_step,
                   "global step after which --request_checkpoint_rank requests it");
    app.add_option("--device", args.device,
                   "cpu (Gloo) or cuda (NCCL, GPU LOCAL_RANK; cuda:N for GPU N)")
        ->check(CLI::Validator(
            [](std::string& value) -> std::string {
              if (value == "cpu" || value == "cuda" ||
                  (value.rfind("cuda:", 0) == 0 && value.size() > 5 &&
                   value.find_first_not_of("0123456789", 5) == std::string::npos))
                return "";
              return "--device " + value + " is neither cpu, cuda nor cuda:N";
            },
            "cpu|cuda|cuda:N", "device"));
    app.add_option("--hidden", args.hidden, "width of the hidden layer (default 64)")
        ->check(CLI::PositiveNumber);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    return run(args);
  });
}
