// ProcessGroup over c10d: the store bootstrap and the collectives. One of the SDK's two libtorch
// translation units (the other is training.cpp).
#include <cstdio>
#include <exception>
#include <mutex>
#include <set>
#include <stdexcept>

#include "ddprun/sdk.h"
#include "ddprun/sdk/connect_probe.h"
#include "torch_compat.h"

namespace ddprun::sdk {

std::string backend_name(Backend b) { return b == Backend::Nccl ? "nccl" : "gloo"; }

struct PendingWork::Impl {
  c10::intrusive_ptr<compat::Work> work;
  std::vector<torch::Tensor> tensors;  // c10d takes them by reference: keep them alive
};

void PendingWork::wait() {
  if (!impl_) return;
  impl_->work->wait();
  impl_.reset();
}

struct ProcessGroup::Impl {
  WorkerContext ctx;
  Backend backend = Backend::Gloo;
  torch::Device device = torch::kCPU;  // where this group's collectives take their tensors
  std::chrono::milliseconds timeout{};
  c10::intrusive_ptr<c10d::Store> store;  // prefixed; what the group and the shutdown use
  c10::intrusive_ptr<compat::CollectiveBackend> pg;

  PendingWork start(c10::intrusive_ptr<compat::Work> work, std::vector<torch::Tensor> tensors) {
    auto impl = std::make_shared<PendingWork::Impl>();
    impl->work = std::move(work);
    impl->tensors = std::move(tensors);
    return PendingWork(std::move(impl));
  }
};

namespace {

/// The ranks that have a ProcessGroup alive (or being created) in this process, by store
/// address and rank: a second group of the same rank would meet the first one's keys in the
/// store. (Tests run several ranks as threads of one process.)
std::mutex groups_mu;
std::set<std::string> groups_alive;

std::string group_key(const WorkerContext& ctx) {
  return ctx.master_addr + ":" + std::to_string(ctx.master_port) + "/" + std::to_string(ctx.rank);
}

void forget_group(const std::string& key) {
  std::lock_guard<std::mutex> lock(groups_mu);
  groups_alive.erase(key);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Product:
      return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

void check_rank(int peer, int world_size, const char* what) {
  if (peer < 0 || peer >= world_size)
    throw std::invalid_argument(std::string(what) + " rank " + std::to_string(peer) +
                                " is not in [0, " + std::to_string(world_size) + ")");
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::create(const WorkerContext& ctx,
                                                   const ProcessGroupOptions& options) {
  // One group per rank, as torch.distributed's default group: a second one would meet the
  // first's keys in the store and fail with a socket error that names nothing.
  const std::string key = group_key(ctx);
  {
    std::lock_guard<std::mutex> lock(groups_mu);
    if (!groups_alive.insert(key).second)
      throw std::logic_error(
          "ProcessGroup::create: rank " + std::to_string(ctx.rank) +
          " already has a process group (one per rank, as torch.distributed's default "
          "group): share the std::shared_ptr the first create returned");
  }
  struct ForgetOnFailure {
    const std::string& key;
    bool created = false;
    ~ForgetOnFailure() {
      if (!created) forget_group(key);
    }
  } forget_on_failure{key};
  auto impl = std::make_unique<Impl>();
  impl->ctx = ctx;
  impl->timeout = options.timeout;
  impl->backend = options.device.is_cuda() ? Backend::Nccl : Backend::Gloo;
  impl->device = options.device;
  if (options.device.is_cuda() && !options.device.has_index())
    impl->device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ctx.local_rank));
  if (!options.device.is_cpu() && !options.device.is_cuda())
    throw std::invalid_argument("ProcessGroup: device " + options.device.str() +
                                " is neither CPU nor CUDA");

  // The store. Without the agent's store (ddprun, and torchrun's default for c10d) rank 0
  // hosts one at MASTER_ADDR:MASTER_PORT and the others connect to it; with it, everyone is a
  // client of the agent's store and keeps to this attempt's prefix.
  const bool hosts_store = !ctx.use_agent_store && ctx.rank == 0;
  // Clients connect once the store listens (its own retry would first sleep a second); a store
  // that never comes is reported by the TCPStore client below, with its own message.
  if (!hosts_store) wait_for_listener(ctx.master_addr, ctx.master_port, options.timeout);
  c10::intrusive_ptr<c10d::Store> tcp = compat::make_tcp_store(
      ctx.master_addr, ctx.master_port, hosts_store, ctx.world_size, options.timeout);
  const std::string prefix =
      ctx.use_agent_store ? agent_store_prefix(ctx.restart_count) : std::string("ddprun");
  impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);

  if (impl->backend == Backend::Gloo) {
    impl->pg = compat::make_gloo(c10::make_intrusive<c10d::PrefixStore>("default_pg", impl->store),
                                 ctx.rank, ctx.world_size, options.timeout);
  } else {
#if defined(DDPRUN_SDK_HAVE_C10D_NCCL)
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(
        options.device.has_index() ? options.device.index() : ctx.local_rank));
    impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("default_pg", impl->store), ctx.rank, ctx.world_size,
        nccl_options);
#else
    throw std::runtime_error(
        "ProcessGroup: NCCL was requested (device " + options.device.str() +
        ") but this SDK was built against a libtorch without CUDA; build it against a CUDA "
        "libtorch (CMAKE_PREFIX_PATH) or use the CPU device (Gloo)");
#endif
  }
  report_to_agent("pg_ready", {{"world_size", impl->ctx.world_size}});
  auto group = std::make_shared<ProcessGroup>(std::move(impl));
  forget_on_failure.created = true;
  return group;
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  forget_group(group_key(impl_->ctx));  // on every path: a later create may try again
  if (!impl_->store) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding towards record(): keep the connections open until the process exits, so peers
    // notice this rank only after its error file is written, and skip the check-out, which
    // would wait for peers that are blocked waiting for this rank.
    (void)impl_->pg.release();
    (void)impl_->store.release();
    return;
  }
  // Each rank checks out; the last one marks the group finished. Rank 0 hosts the store, so it
  // waits for that mark before the store goes away with this process.
  try {
    if (impl_->store->add("shutdown/count", 1) == impl_->ctx.world_size)
      impl_->store->set("shutdown/all", std::vector<uint8_t>{1});
    if (impl_->ctx.rank == 0 && !impl_->ctx.use_agent_store)
      impl_->store->wait({"shutdown/all"}, impl_->timeout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[ddprun sdk] rank %d: not every rank checked out of the group: %s\n",
                 impl_->ctx.rank, e.what());
  }
  impl_->pg.reset();
}

int ProcessGroup::rank() const { return impl_->ctx.rank; }
int ProcessGroup::world_size() const { return impl_->ctx.world_size; }
Backend ProcessGroup::backend() const { return impl_->backend; }
torch::Device ProcessGroup::device() const { return impl_->device; }
const WorkerContext& ProcessGroup::context() const { return impl_->ctx; }

void ProcessGroup::barrier() {
  c10d::BarrierOptions o;
  // NCCL's barrier runs on a GPU: unless it is named, c10d guesses rank % GPUs, another rank's
  // GPU wherever a node runs fewer ranks than it has GPUs.
  if (impl_->device.is_cuda()) o.device_ids = {impl_->device.index()};
  impl_->pg->barrier(o)->wait();
}

void ProcessGroup::broadcast(torch::Tensor& tensor, int src) {
  check_rank(src, world_size(), "broadcast source");
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  impl_->pg->broadcast(tensors, o)->wait();
}

void ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

PendingWork ProcessGroup::all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  auto work = impl_->pg->allreduce(tensors, o);
  return impl_->start(std::move(work), std::move(tensors));
}

void ProcessGroup::send(torch::Tensor& tensor, int dst, int tag) {
  send_async(tensor, dst, tag).wait();
}

void ProcessGroup::recv(torch::Tensor& tensor, int src, int tag) {
  recv_async(tensor, src, tag).wait();
}

PendingWork ProcessGroup::send_async(torch::Tensor& tensor, int dst, int tag) {
  check_rank(dst, world_size(), "send destination");
  std::vector<torch::Tensor> tensors{tensor};
  auto work = impl_->pg->send(tensors, dst, tag);
  return impl_->start(std::move(work), std::move(tensors));
}

PendingWork ProcessGroup::recv_async(torch::Tensor& tensor, int src, int tag) {
  check_rank(src, world_size(), "recv source");
  std::vector<torch::Tensor> tensors{tensor};
  auto work = impl_->pg->recv(tensors, src, tag);
  return impl_->start(std::move(work), std::move(tensors));
}

bool any_rank_requested_checkpoint(ProcessGroup& group) {
  // One small all-reduce: the largest of the ranks' flags, so one notice stops every rank.
  torch::Tensor flag =
      torch::tensor({checkpoint_requested() ? 1 : 0},
                    torch::TensorOptions().dtype(torch::kInt).device(group.device()));
  group.all_reduce(flag, ReduceOp::Max);
  return flag.item<int>() != 0;
}

}  // namespace ddprun::sdk
