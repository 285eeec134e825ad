#pragma once
// ddprun's worker SDK: what a C++ training program needs to run under ddprun or torchrun, as a
// Python script gets it from torch.distributed. See docs/sdk.md.
//
//   auto ctx = WorkerContext::from_env();             // RANK, WORLD_SIZE, MASTER_ADDR, ...
//   auto pg = ProcessGroup::create(ctx);              // Gloo on CPU (NCCL on CUDA builds)
//   auto model = ...; auto opt = ...;
//   SnapshotStore snaps("ckpt/snapshot.pt");
//   auto resumed = snaps.load_latest(*model, *opt);   // every rank, newest valid snapshot
//   GradientSync sync(pg, *model);                    // broadcasts rank 0's state
//   DistributedSampler sampler(n, *pg);
//   for (epoch...) { sampler.set_epoch(epoch); for (batch...) { loss.backward();
//     sync.synchronize(); opt->step(); if (any_rank_requested_checkpoint(*pg)) {
//     save mid-epoch on rank 0; return; } } if (pg->rank() == 0) snaps.save(...); }
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ddprun/sdk/agent_report.h"
#include "ddprun/sdk/context.h"
#include "ddprun/sdk/preemption.h"
#include "ddprun/sdk/record.h"
#include "ddprun/sdk/sampler_plan.h"
#include "ddprun/sdk/snapshot_files.h"

namespace ddprun::sdk {

/// The collective library behind a ProcessGroup.
enum class Backend { Gloo, Nccl };

/// "gloo" or "nccl", as torch.distributed.get_backend() says.
std::string backend_name(Backend b);

/// Reduction of all_reduce.
enum class ReduceOp { Sum, Min, Max, Product };

/// How to create a process group.
struct ProcessGroupOptions {
  /// CPU uses Gloo; CUDA uses NCCL through c10d, only where libtorch was built with CUDA.
  torch::Device device = torch::kCPU;
  /// For store connections and for each collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

/// A pending asynchronous collective; wait() blocks until it is done and rethrows its error.
/// On NCCL, as torch's Work.wait(), it orders the current CUDA stream after the collective and
/// returns: reading the result (item(), a copy to the CPU) waits for it, and NCCL's errors end
/// the process through c10d's watchdog.
class PendingWork {
 public:
  struct Impl;
  PendingWork() = default;
  explicit PendingWork(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool valid() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<Impl> impl_;
};

/// The ranks of one training job and collectives between them (torch.distributed's default
/// group). Created from the launcher's environment; the store is bootstrapped as torchrun's
/// workers do (rank 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT, or every rank joins the
/// agent's store under "/worker/attempt_<n>" when TORCHELASTIC_USE_AGENT_STORE is True).
class ProcessGroup {
 public:
  struct Impl;
  /// Connects every rank; blocks until all WORLD_SIZE ranks have joined (or the timeout).
  static std::shared_ptr<ProcessGroup> create(const WorkerContext& ctx,
                                              const ProcessGroupOptions& options = {});
  /// Every rank says it is done; rank 0 keeps hosting the store until all have (bounded by
  /// the timeout), so no rank loses the store while it still needs it. While an exception
  /// unwinds, the group is left open for the process's exit instead (see record()).
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  Backend backend() const;
  /// The device of the group's collectives (CPU for Gloo, this rank's GPU for NCCL).
  torch::Device device() const;
  const WorkerContext& context() const;

  void barrier();
  /// Replaces `tensor` on every rank with `src`'s.
  void broadcast(torch::Tensor& tensor, int src = 0);
  /// Reduces `tensor` in place across ranks.
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  /// Starts an all_reduce; the tensor must stay alive and untouched until wait().
  PendingWork all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  /// Point-to-point; a send completes when `dst` has received it. `tag` matches pairs.
  void send(torch::Tensor& tensor, int dst, int tag = 0);
  void recv(torch::Tensor& tensor, int src, int tag = 0);
  PendingWork send_async(torch::Tensor& tensor, int dst, int tag = 0);
  PendingWork recv_async(torch::Tensor& tensor, int src, int tag = 0);

  explicit ProcessGroup(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// Whether any rank's checkpoint_requested() is set, agreed by all: a collective (one small
/// all-reduce), so every rank must call it at the same point of its loop, and all get the same
/// answer there. Ranks receive a preemption notice at slightly different steps; deciding on
/// this answer makes them all stop at the same step.
bool any_rank_requested_checkpoint(ProcessGroup& group);

/// Options of GradientSync.
struct GradientSyncOptions {
  /// Gradients travel in flat buckets of about this size (DistributedDataParallel's 25 MB).
  size_t bucket_cap_bytes = 25u * 1024 * 1024;
  /// Start each bucket's all_reduce during backward, as soon as its gradients are all computed.
  /// Then each backward must be followed by synchronize() and start from zeroed gradients
  /// (no accumulation over several backward passes).
  bool overlap_with_backward = false;
};

/// DistributedDataParallel's gradient averaging for a torch::nn::Module, without
/// c10d::Reducer: every rank's model is checked against rank 0's (shapes and dtypes) and rank
/// 0's parameters and buffers are broadcast at construction, and
/// synchronize() (after backward, before the optimizer step) sets every gradient to the mean
/// over ranks. Buckets are formed and reduced in the same order on every rank.
class GradientSync {
 public:
  GradientSync(std::shared_ptr<ProcessGroup> group, torch::nn::Module& module,
               GradientSyncOptions options = {});
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Copies rank 0's parameters and buffers to every rank (also call it after a restore that
  /// not every rank did).
  void broadcast_state();
  /// Averages gradients across ranks; call on every rank after each backward.
  void synchronize();
  /// Bucket count and sizes in bytes, in reduction order (for logs and tests).
  std::vector<size_t> bucket_bytes() const;

  struct Impl;

 private:
  /// Every rank's parameters and buffers have rank 0's names' shapes and dtypes, or every rank
  /// throws (the one that differs naming the first tensor), as DDP checks at construction.
  void check_same_model();
  std::unique_ptr<Impl> impl_;
};

/// torch.utils.data.distributed.DistributedSampler in C++: the same index lists for the same
/// dataset size, replicas, rank, shuffle, seed, epoch and drop_last.
class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);
  /// num_replicas and rank from the group.
  DistributedSampler(int64_t dataset_size, const ProcessGroup& group, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  /// Reshuffles for this epoch (call before each epoch, as in PyTorch).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  /// This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;
  /// Indices per epoch (len(sampler)).
  int64_t size() const { return sampler_num_samples(options_); }

 private:
  SamplerOptions options_;
  int64_t epoch_ = 0;
};

/// What a snapshot holds besides tensors.
struct SnapshotMeta {
  int64_t epoch = 0;  ///< epochs completed
  int64_t step = 0;   ///< optimizer steps completed
  /// Optimizer steps completed in epoch `epoch` when saved inside it (a checkpoint request);
  /// 0 when saved at an epoch boundary.
  int64_t epoch_step = 0;
  int64_t world_size = 0;  ///< of the job that saved it
  int64_t saved_at = 0;    ///< unix seconds
  std::string checksum;    ///< of the content, hex
};

/// The content of one snapshot file.
struct Snapshot {
  SnapshotMeta meta;
  /// Parameters and buffers by their state_dict names.
  std::vector<std::pair<std::string, torch::Tensor>> model;
  /// The optimizer, as torch::serialize::OutputArchive bytes.
  torch::Tensor optimizer;
  /// The default CPU generator's state.
  torch::Tensor rng_state;
};

/// Gathers a snapshot of a module, its optimizer and the default RNG.
Snapshot capture_snapshot(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          int64_t epoch, int64_t step, int64_t world_size, int64_t epoch_step = 0);
/// Loads a snapshot into the module (on the module's device), optimizer and default RNG.
void restore_snapshot(const Snapshot& snapshot, torch::nn::Module& module,
                      torch::optim::Optimizer& optimizer);

/// The content checksum: metadata, then each tensor's name, dtype, shape and bytes.
std::string snapshot_checksum(const Snapshot& snapshot);

/// Writes atomically: a temporary file in the same directory, fsync, rename, fsync of the
/// directory. The file is a torch.save-compatible zip that Python's torch.load reads as a dict.
void write_snapshot_file(const std::string& path, Snapshot snapshot);
/// Reads and verifies a snapshot; an error text for a torn, corrupt or foreign file.
std::variant<Snapshot, std::string> read_snapshot_file(const std::string& path);

/// A series of snapshots "<base>.<seq>" in one directory, keeping the newest `keep_last`.
class SnapshotStore {
 public:
  explicit SnapshotStore(std::string base_path, int keep_last = 3);
  /// Writes the next snapshot in the series and prunes old ones; returns its path. Call it on
  /// global rank 0 only. `epoch_step` > 0 saves inside epoch `epoch` (see SnapshotMeta).
  std::string save(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                   int64_t epoch, int64_t step, int64_t world_size, int64_t epoch_step = 0);
  /// Loads the newest valid snapshot into module and optimizer and returns its metadata;
  /// nullopt when there is none. Invalid files are skipped with a warning on stderr.
  std::optional<SnapshotMeta> load_latest(torch::nn::Module& module,
                                          torch::optim::Optimizer& optimizer);
  /// Paths of the series, newest first.
  std::vector<std::string> files() const;

 private:
  std::string base_;
  int keep_last_;
};

}  // namespace ddprun::sdk
