// Gradient synchronisation, the distributed sampler and snapshots: the SDK's second libtorch
// translation unit (libtorch headers cost 20-30 s of compile time per file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>

#include "ddprun/sdk.h"
#include "ddprun/sdk/snapshot_structure.h"
#include "torch_compat.h"

namespace ddprun::sdk {

// ---------------------------------------------------------------------------------------------
// GradientSync

namespace {

/// One flat buffer of gradients that travels as a single all_reduce.
struct Bucket {
  std::vector<size_t> params;   // indices into Impl::params
  std::vector<int64_t> offset;  // element offset of each in `flat`
  torch::Tensor flat;
  size_t pending = 0;  // overlap mode: gradients not yet copied in this backward
  bool launched = false;
  PendingWork work;
};

/// Tensors grouped into flat chunks of one dtype each, at most `cap` bytes (or one tensor).
std::vector<std::vector<size_t>> chunk_by_dtype(const std::vector<torch::Tensor>& tensors,
                                                size_t cap) {
  std::vector<std::vector<size_t>> chunks;
  std::vector<size_t> bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t b = tensors[i].numel() * tensors[i].element_size();
    bool placed = false;
    // Only the newest chunk of a dtype takes more tensors, so order within dtype is preserved.
    for (size_t c = chunks.size(); c-- > 0;) {
      if (tensors[chunks[c].front()].scalar_type() != tensors[i].scalar_type() ||
          tensors[chunks[c].front()].device() != tensors[i].device())
        continue;
      if (bytes[c] + b <= cap) {
        chunks[c].push_back(i);
        bytes[c] += b;
        placed = true;
      }
      break;
    }
    if (!placed) {
      chunks.push_back({i});
      bytes.push_back(b);
    }
  }
  return chunks;
}

}  // namespace

struct GradientSync::Impl {
  std::shared_ptr<ProcessGroup> group;
  torch::nn::Module* module = nullptr;
  GradientSyncOptions options;
  std::vector<torch::Tensor> params;  // reverse registration order: roughly backward's order
  std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, slot)
  std::vector<Bucket> buckets;
  std::vector<bool> seen;  // overlap mode: gradient arrived in this backward
  std::vector<std::pair<torch::Tensor, unsigned>> hooks;
  std::mutex mu;
  size_t next_launch = 0;
  bool stepped = false;  // a synchronize() completed in this process (reported as first_step)
  bool said_no_gradient = false;  // overlap mode: a synchronize() without a backward was told

  void build_buckets() {
    for (auto& p : module->parameters(/*recurse=*/true))
      if (p.requires_grad()) params.push_back(p);
    std::reverse(params.begin(), params.end());
    where.resize(params.size());
    seen.assign(params.size(), false);
    for (const auto& chunk : chunk_by_dtype(params, options.bucket_cap_bytes)) {
      Bucket b;
      int64_t n = 0;
      for (size_t i : chunk) {
        where[i] = {buckets.size(), b.params.size()};
        b.params.push_back(i);
        b.offset.push_back(n);
        n += params[i].numel();
      }
      b.flat = torch::zeros({n}, params[chunk.front()].options().requires_grad(false));
      b.pending = b.params.size();
      buckets.push_back(std::move(b));
    }
  }

  torch::Tensor slot(Bucket& b, size_t k) {
    const torch::Tensor& p = params[b.params[k]];
    return b.flat.narrow(0, b.offset[k], p.numel()).view(p.sizes());
  }

  // Buckets start strictly in index order so every rank issues the same sequence of
  // collectives, whatever order its gradients arrived in. Called with `mu` held.
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.work = group->all_reduce_async(b.flat, ReduceOp::Sum);
      b.launched = true;
    }
  }

  void on_gradient(size_t i, const torch::Tensor& grad) {
    torch::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mu);
    auto [bi, k] = where[i];
    Bucket& b = buckets[bi];
    if (b.launched || seen[i]) return;  // a second gradient before synchronize(): ignored
    slot(b, k).copy_(grad);
    seen[i] = true;
    if (--b.pending == 0) launch_ready();
  }

  void finish_and_copy_back() {
    torch::NoGradGuard no_grad;
    const double world = static_cast<double>(group->world_size());
    for (Bucket& b : buckets) {
      b.work.wait();
      b.flat.div_(world);
      for (size_t k = 0; k < b.params.size(); ++k) {
        torch::Tensor& p = params[b.params[k]];
        if (p.grad().defined())
          p.mutable_grad().copy_(slot(b, k));
        else
          p.mutable_grad() = slot(b, k).clone();
      }
      b.launched = false;
      b.pending = b.params.size();
    }
    next_launch = 0;
    seen.assign(params.size(), false);
  }
};

namespace {

/// A module's parameters and buffers, in broadcast_state's order, with their names.
std::vector<std::pair<std::string, torch::Tensor>> named_state(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : module.named_parameters(true)) state.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) state.emplace_back(b.key(), b.value());
  return state;
}

/// The state's layout as numbers: per tensor its dtype, rank and sizes.
std::vector<int64_t> layout_of(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  std::vector<int64_t> layout;
  for (const auto& [name, t] : state) {
    layout.push_back(static_cast<int64_t>(t.scalar_type()));
    layout.push_back(t.dim());
    for (const int64_t size : t.sizes()) layout.push_back(size);
  }
  return layout;
}

std::string shape_text(const std::vector<int64_t>& layout, size_t at) {
  std::string text = "[";
  for (int64_t d = 0; d < layout[at + 1]; ++d)
    text += (d ? ", " : "") + std::to_string(layout[at + 2 + static_cast<size_t>(d)]);
  return text + "] " + std::string(c10::toString(static_cast<c10::ScalarType>(layout[at])));
}

/// Where this rank's layout first parts from rank 0's (`theirs`, padded with -1 to at least
/// this rank's length), in words.
std::string first_difference(const std::vector<std::pair<std::string, torch::Tensor>>& state,
                             const std::vector<int64_t>& mine, const std::vector<int64_t>& theirs) {
  size_t at = 0;
  for (const auto& [name, t] : state) {
    const size_t width = 2 + static_cast<size_t>(mine[at + 1]);
    const auto from = [at](const std::vector<int64_t>& v) {
      return v.begin() + static_cast<std::ptrdiff_t>(at);
    };
    if (!std::equal(from(mine), from(mine) + static_cast<std::ptrdiff_t>(width), from(theirs))) {
      const bool known = theirs[at] >= 0 && theirs[at + 1] >= 0 &&
                         at + 2 + static_cast<size_t>(theirs[at + 1]) <= theirs.size();
      return "'" + name + "' is " + shape_text(mine, at) + " here, and " +
             (known ? "the tensor in its place on rank 0 is " + shape_text(theirs, at)
                    : std::string("rank 0 has no tensor in its place"));
    }
    at += width;
  }
  return "rank 0 has more parameters and buffers than this rank's " + std::to_string(state.size());
}

}  // namespace

void GradientSync::check_same_model() {
  ProcessGroup& group = *impl_->group;
  if (group.world_size() == 1) return;
  const auto state = named_state(*impl_->module);
  const std::vector<int64_t> mine = layout_of(state);
  const auto on_device = [&](std::vector<int64_t> values) {
    return torch::tensor(values, torch::kInt64).to(group.device());
  };
  // The longest layout, then rank 0's padded to it: every rank compares its own.
  torch::Tensor longest = on_device({static_cast<int64_t>(mine.size())});
  group.all_reduce(longest, ReduceOp::Max);
  const auto length = static_cast<size_t>(longest.cpu().item<int64_t>());
  if (length == 0) return;  // no rank has a tensor (every rank sees the same maximum)
  std::vector<int64_t> padded = mine;
  padded.resize(length, -1);
  torch::Tensor theirs = on_device(padded);
  group.broadcast(theirs, 0);
  const torch::Tensor theirs_cpu = theirs.cpu();
  const std::vector<int64_t> rank0(theirs_cpu.data_ptr<int64_t>(),
                                   theirs_cpu.data_ptr<int64_t>() + theirs_cpu.numel());
  const bool differs = rank0 != padded;
  torch::Tensor any = on_device({differs ? 1 : 0});
  group.all_reduce(any, ReduceOp::Max);
  if (any.cpu().item<int64_t>() == 0) return;
  // Every rank stops, the one that differs naming what: DDP's check, as torch.nn.parallel does.
  const std::string fix =
      ": every rank must build the same model (the same layers, sizes and dtypes) before "
      "GradientSync";
  if (differs)
    throw std::runtime_error(
        "GradientSync: rank " + std::to_string(group.rank()) +
        "'s model does not match rank 0's: " + first_difference(state, mine, rank0) + fix);
  // The ranks that can name the tensor fail first, so the launcher's root cause is theirs.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  throw std::runtime_error(
      "GradientSync: another rank's model does not match rank 0's (that "
      "rank's error names the parameter)" +
      fix);
}

GradientSync::GradientSync(std::shared_ptr<ProcessGroup> group, torch::nn::Module& module,
                           GradientSyncOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->group = std::move(group);
  impl_->module = &module;
  impl_->options = options;
  impl_->build_buckets();
  check_same_model();
  broadcast_state();
  if (options.overlap_with_backward) {
    Impl* impl = impl_.get();
    for (size_t i = 0; i < impl->params.size(); ++i) {
      torch::Tensor& p = impl->params[i];
      const unsigned pos =
          p.register_hook([impl, i](const torch::Tensor& grad) { impl->on_gradient(i, grad); });
      impl->hooks.emplace_back(p, pos);
    }
  }
}

GradientSync::~GradientSync() {
  for (auto& [p, pos] : impl_->hooks) p.remove_hook(pos);
}

void GradientSync::broadcast_state() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> state;
  for (auto& p : impl_->module->parameters(true)) state.push_back(p);
  for (auto& b : impl_->module->buffers(true)) state.push_back(b);
  if (impl_->group->world_size() == 1) return;
  for (const auto& chunk : chunk_by_dtype(state, impl_->options.bucket_cap_bytes)) {
    std::vector<torch::Tensor> flat_parts;
    for (size_t i : chunk) flat_parts.push_back(state[i].detach().reshape({-1}));
    torch::Tensor flat = torch::cat(flat_parts);
    impl_->group->broadcast(flat, 0);
    int64_t at = 0;
    for (size_t i : chunk) {
      const int64_t n = state[i].numel();
      state[i].copy_(flat.narrow(0, at, n).view(state[i].sizes()));
      at += n;
    }
  }
}

void GradientSync::synchronize() {
  Impl& s = *impl_;
  {
    torch::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.options.overlap_with_backward) {
      // No gradient at all since the last call: synchronize() came before backward(), and the
      // replicas would part. Said once; the step still goes on with zeros, on every rank alike.
      if (!s.said_no_gradient && !s.params.empty() &&
          std::none_of(s.seen.begin(), s.seen.end(), [](bool seen) { return seen; })) {
        s.said_no_gradient = true;
        std::fprintf(stderr,
                     "[ddprun sdk] warning: GradientSync::synchronize() found no gradient from a "
                     "backward since its last call: call it after loss.backward() and before the "
                     "optimizer's step\n");
      }
      // Parameters that got no gradient in this backward contribute zeros, as in DDP with
      // find_unused_parameters; their buckets start now, still in index order.
      for (Bucket& b : s.buckets) {
        if (b.launched) continue;
        for (size_t k = 0; k < b.params.size(); ++k)
          if (!s.seen[b.params[k]]) s.slot(b, k).zero_();
        b.pending = 0;
      }
    } else {
      for (Bucket& b : s.buckets) {
        for (size_t k = 0; k < b.params.size(); ++k) {
          const torch::Tensor& g = s.params[b.params[k]].grad();
          if (g.defined())
            s.slot(b, k).copy_(g);
          else
            s.slot(b, k).zero_();
        }
        b.pending = 0;
      }
    }
    s.launch_ready();
  }
  s.finish_and_copy_back();
  // The agent's event log marks the first step after a (re)start; later steps feed its watchdog.
  if (!s.stepped) {
    s.stepped = true;
    report_to_agent("first_step");
  }
  report_progress();
}

std::vector<size_t> GradientSync::bucket_bytes() const {
  std::vector<size_t> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.flat.numel() * b.flat.element_size());
  return out;
}

// ---------------------------------------------------------------------------------------------
// DistributedSampler

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  if (options_.num_replicas < 1)
    throw std::invalid_argument("DistributedSampler: num_replicas " +
                                std::to_string(options_.num_replicas) +
                                " must be at least 1 (the world size)");
  if (options_.rank < 0 || options_.rank >= options_.num_replicas)
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(options_.rank) +
                                " is not in [0, " + std::to_string(options_.num_replicas) + ")");
  if (options_.dataset_size < 0)
    throw std::invalid_argument("DistributedSampler: negative dataset size");
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const ProcessGroup& group,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : DistributedSampler(SamplerOptions{dataset_size, group.world_size(), group.rank(), shuffle,
                                        seed, drop_last}) {}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    // torch.Generator().manual_seed(seed + epoch), then torch.randperm(n, generator=g).
    at::Generator gen = compat::make_cpu_generator(options_.seed + static_cast<uint64_t>(epoch_));
    torch::Tensor perm = torch::randperm(options_.dataset_size, gen, torch::kLong);
    order.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + perm.numel());
  } else {
    order = identity_order(options_.dataset_size);
  }
  return shard_indices(order, options_);
}

// ---------------------------------------------------------------------------------------------
// Snapshots

namespace {

constexpr const char* kFormat = "ddprun-snapshot";
constexpr int64_t kVersion = 1;

uint64_t hash_tensor(uint64_t h, const std::string& name, const torch::Tensor& t) {
  h = checksum_update(h, name.data(), name.size() + 1);
  const std::string dtype = std::string(c10::toString(t.scalar_type()));
  h = checksum_update(h, dtype.data(), dtype.size() + 1);
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape.insert(shape.begin(), static_cast<int64_t>(shape.size()));
  h = checksum_update(h, shape.data(), shape.size() * sizeof(int64_t));
  torch::Tensor c = t.contiguous();
  return checksum_update(h, c.data_ptr(), c.numel() * c.element_size());
}

torch::Tensor bytes_tensor(const std::string& bytes) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  throw std::system_error(errno, std::generic_category(), what + " " + path);
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw_errno("fsync directory", dir);
}

/// The named entry of a generic dict, or an error naming the key.
const torch::IValue& entry(const c10::impl::GenericDict& d, const std::string& key) {
  auto it = d.find(torch::IValue(key));
  if (it == d.end()) throw std::runtime_error("no \"" + key + "\" entry");
  return it->value();
}

/// The named entry, checked to be of the kind `is` tests (`what` names it): a crafted or
/// foreign file gets an error naming the field, not libtorch's internal assertion.
const torch::IValue& typed_entry(const c10::impl::GenericDict& d, const std::string& key,
                                 bool (torch::IValue::*is)() const, const char* what) {
  const torch::IValue& v = entry(d, key);
  if (!(v.*is)())
    throw std::runtime_error("its \"" + key + "\" entry is " + v.tagKind() + ", not " + what);
  return v;
}
int64_t int_entry(const c10::impl::GenericDict& d, const std::string& key) {
  return typed_entry(d, key, &torch::IValue::isInt, "an integer").toInt();
}
const std::string& string_entry(const c10::impl::GenericDict& d, const std::string& key) {
  return typed_entry(d, key, &torch::IValue::isString, "a string").toStringRef();
}
torch::Tensor tensor_entry(const c10::impl::GenericDict& d, const std::string& key) {
  return typed_entry(d, key, &torch::IValue::isTensor, "a tensor").toTensor();
}

}  // namespace

Snapshot capture_snapshot(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          int64_t epoch, int64_t step, int64_t world_size, int64_t epoch_step) {
  Snapshot s;
  s.meta.epoch = epoch;
  s.meta.step = step;
  s.meta.epoch_step = epoch_step;
  s.meta.world_size = world_size;
  s.meta.saved_at = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  torch::NoGradGuard no_grad;
  // CPU tensors are shared, not copied: a 1 GB model costs no extra 1 GB, and the caller
  // writes the snapshot before it trains on.
  for (const auto& item : module.named_parameters(true))
    s.model.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous());
  for (const auto& item : module.named_buffers(true))
    s.model.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous());
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  s.optimizer = bytes_tensor(bytes.str());
  s.rng_state = compat::default_rng_state().clone();
  return s;
}

void restore_snapshot(const Snapshot& snapshot, torch::nn::Module& module,
                      torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> saved(snapshot.model.begin(), snapshot.model.end());
  // Every difference is found before anything is copied, as load_state_dict(strict=True)
  // does: a snapshot of another model changes nothing, and the error lists what differs.
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (auto& item : module.named_parameters(true)) targets.emplace_back(item.key(), item.value());
  for (auto& item : module.named_buffers(true)) targets.emplace_back(item.key(), item.value());
  std::vector<std::string> differences;
  for (const auto& [name, target] : targets) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      differences.push_back("the model's '" + name + "' is not in it");
    } else {
      if (it->second.sizes() != target.sizes())
        differences.push_back("'" + name + "' is " + c10::str(it->second.sizes()) + " in it and " +
                              c10::str(target.sizes()) + " in the model");
      saved.erase(it);
    }
  }
  for (const auto& [name, tensor] : saved)
    differences.push_back("its '" + name + "' is not in the model");
  if (!differences.empty()) {
    const std::size_t shown = std::min<std::size_t>(differences.size(), 5);
    std::string why;
    for (std::size_t i = 0; i < shown; ++i) why += (i > 0 ? "; " : "") + differences[i];
    if (shown < differences.size())
      why += "; and " + std::to_string(differences.size() - shown) + " more";
    throw std::runtime_error("the snapshot does not fit this model: " + why +
                             " (saved by another model: resume it with the model that saved "
                             "it, or give this model a snapshot series of its own)");
  }
  // The optimizer before the model: one of another kind then leaves the model as it was.
  torch::serialize::InputArchive archive;
  const torch::Tensor opt = snapshot.optimizer.contiguous();
  try {
    archive.load_from(static_cast<const char*>(opt.data_ptr()), static_cast<size_t>(opt.numel()));
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    // libtorch's own text runs to dozens of lines of its stack: its first line says what.
    std::string first = e.what_without_backtrace();
    first.resize(std::min(first.find('\n'), first.size()));
    throw std::runtime_error(
        "the snapshot's optimizer state does not fit this optimizer (another kind of optimizer, "
        "or other parameter groups?): " +
        first);
  }
  std::map<std::string, torch::Tensor> by_name(snapshot.model.begin(), snapshot.model.end());
  for (auto& [name, target] : targets) target.copy_(by_name.at(name));
  if (snapshot.rng_state.defined()) compat::set_default_rng_state(snapshot.rng_state);
}

std::string snapshot_checksum(const Snapshot& s) {
  // Each tensor gets its own digest; the digests are folded in order. Digests are independent,
  // so large snapshots hash on two threads (memory bandwidth, not the disk, is then the limit).
  std::vector<std::pair<std::string, torch::Tensor>> parts = s.model;
  parts.emplace_back("optimizer", s.optimizer);
  parts.emplace_back("rng_state", s.rng_state);
  std::vector<uint64_t> digests(parts.size());
  auto hash_range = [&](size_t first, size_t step) {
    for (size_t i = first; i < parts.size(); i += step)
      digests[i] = hash_tensor(kChecksumStart, parts[i].first, parts[i].second);
  };
  size_t bytes = 0;
  for (const auto& part : parts) bytes += part.second.numel() * part.second.element_size();
  if (bytes >= (size_t{16} << 20) && parts.size() > 1) {
    std::thread other(hash_range, 1, 2);
    hash_range(0, 2);
    other.join();
  } else {
    hash_range(0, 1);
  }
  uint64_t h = kChecksumStart;
  const int64_t meta[] = {s.meta.epoch, s.meta.step, s.meta.world_size, s.meta.saved_at};
  h = checksum_update(h, meta, sizeof meta);
  // Only a mid-epoch snapshot hashes epoch_step, so epoch-boundary files (and files written
  // before it existed) keep their checksums.
  if (s.meta.epoch_step != 0) h = checksum_update(h, &s.meta.epoch_step, sizeof s.meta.epoch_step);
  return checksum_hex(checksum_update(h, digests.data(), digests.size() * sizeof(uint64_t)));
}

namespace {

/// Writes to a file on its own thread, so that the zip's CRC pass and the checksum run while
/// the kernel copies earlier bytes into the page cache: the save then costs about the slower of
/// the two instead of their sum.
///
///   caller thread:  CRC record 0 -> queue -> CRC record 1 -> queue -> ... checksum -> pickle
///   writer thread:                  write record 0 ------> write record 1 ------> ...
///
/// Bytes inside `stable` ranges (the snapshot's tensor storages, alive until finish()) are
/// queued by pointer; anything else (zip headers, the pickle) is copied.
class BackgroundFileWriter {
 public:
  BackgroundFileWriter(int fd, std::string path, std::vector<std::pair<const char*, size_t>> stable)
      : fd_(fd), path_(std::move(path)), stable_(std::move(stable)) {
    std::sort(stable_.begin(), stable_.end());
    thread_ = std::thread([this] { run(); });
  }
  BackgroundFileWriter(const BackgroundFileWriter&) = delete;
  BackgroundFileWriter& operator=(const BackgroundFileWriter&) = delete;
  ~BackgroundFileWriter() { finish_quietly(); }

  /// Queues `size` bytes. After a failed write the bytes are dropped: the zip writer must not
  /// see a short write, or its destructor throws while finishing the file.
  void write(const void* data, size_t size) {
    Chunk chunk;
    chunk.data = static_cast<const char*>(data);
    chunk.size = size;
    if (failed()) return;
    if (!is_stable(chunk.data, size)) chunk.owned.assign(chunk.data, size);
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(chunk));
    ready_.notify_one();
  }

  /// True once a write has failed; finish() then throws its error.
  bool failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_ != 0;
  }

  /// Waits until every queued byte is written; throws the first write error, naming the file.
  void finish() {
    finish_quietly();
    if (error_ != 0) {
      errno = error_;
      throw_errno("write", path_);
    }
  }

 private:
  struct Chunk {
    const char* data = nullptr;
    size_t size = 0;
    std::string owned;  // used instead of `data` when not empty
  };

  bool is_stable(const char* p, size_t size) const {
    auto it = std::upper_bound(stable_.begin(), stable_.end(), std::make_pair(p, SIZE_MAX));
    if (it == stable_.begin()) return false;
    --it;
    return p >= it->first && p + size <= it->first + it->second;
  }

  void run() {
    for (;;) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return !queue_.empty() || closing_; });
        if (queue_.empty()) return;
        chunk = std::move(queue_.front());
        queue_.pop_front();
        if (error_ != 0) continue;  // drain without writing
      }
      const char* p = chunk.owned.empty() ? chunk.data : chunk.owned.data();
      size_t left = chunk.owned.empty() ? chunk.size : chunk.owned.size();
      while (left > 0) {
        const ssize_t n = ::write(fd_, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          std::lock_guard<std::mutex> lock(mutex_);
          error_ = errno;
          queue_.clear();
          break;
        }
        p += n;
        left -= static_cast<size_t>(n);
      }
    }
  }

  void finish_quietly() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
      ready_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

  const int fd_;
  const std::string path_;
  std::vector<std::pair<const char*, size_t>> stable_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Chunk> queue_;
  bool closing_ = false;
  int error_ = 0;
  std::thread thread_;
};

/// The snapshot as torch::pickle_save lays it out (tensor records, then data.pkl), written to
/// `fd` by a writer thread. The checksum goes into data.pkl, which comes last, so it is computed
/// while the writer thread is still writing the tensor records.
void write_snapshot_zip(Snapshot& snapshot, const std::string& tmp, int fd) {
  auto make_doc = [&] {
    c10::Dict<std::string, torch::Tensor> model;
    for (const auto& [name, t] : snapshot.model) model.insert(name, t);
    c10::impl::GenericDict doc(c10::StringType::get(), c10::AnyType::get());
    doc.insert("format", std::string(kFormat));
    doc.insert("version", kVersion);
    doc.insert("epoch", snapshot.meta.epoch);
    doc.insert("step", snapshot.meta.step);
    doc.insert("epoch_step", snapshot.meta.epoch_step);
    doc.insert("world_size", snapshot.meta.world_size);
    doc.insert("saved_at", snapshot.meta.saved_at);
    doc.insert("model", model);
    doc.insert("optimizer", snapshot.optimizer);
    doc.insert("rng_state", snapshot.rng_state);
    doc.insert("checksum", snapshot.meta.checksum);
    return compat::pickle_tensors_apart(torch::IValue(doc));
  };
  // A first pickle only lists the tensors in record order; the checksum is not known yet.
  const std::vector<at::Tensor> tensors = make_doc().tensors;
  std::vector<std::pair<const char*, size_t>> stable;
  for (const auto& t : tensors) {
    auto [data, size] = compat::tensor_record_bytes(t);
    stable.emplace_back(static_cast<const char*>(data), size);
  }
  BackgroundFileWriter file(fd, tmp, stable);
  caffe2::serialize::PyTorchStreamWriter zip([&](const void* data, size_t size) {
    file.write(data, size);
    return size;
  });
  for (size_t i = 0; i < tensors.size() && !file.failed(); ++i)
    zip.writeRecord("data/" + std::to_string(i), stable[i].first, stable[i].second);
  if (!file.failed()) {
    snapshot.meta.checksum = snapshot_checksum(snapshot);
    const compat::PickledValue final_doc = make_doc();
    zip.writeRecord("data.pkl", final_doc.pickle.data(), final_doc.pickle.size());
    zip.writeEndOfFile();
  }
  file.finish();
}

}  // namespace

void write_snapshot_file(const std::string& path, Snapshot snapshot) {
  // Temporary file in the same directory, fsync, rename over, fsync the directory: a reader
  // sees the old file or the whole new one, even after a power cut.
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("create", tmp);
  try {
    write_snapshot_zip(snapshot, tmp, fd);
    if (::fsync(fd) != 0) throw_errno("fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) throw_errno("close", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    throw_errno("rename to", path);
  }
  fsync_directory(snapshot_directory(path));
}

std::variant<Snapshot, std::string> read_snapshot_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open: " + std::string(std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) return std::string("empty file (torn write)");
  // libtorch trusts the zip directory and data.pkl's tensor views: a damaged or crafted file
  // (a storage record emptied) would make it read outside a storage. Refused here instead.
  // A whole archive whose pickle is not a snapshot's and holds no snapshot's format marker is
  // most likely another torch.save file (a state_dict, a tensor), not a damaged snapshot.
  const auto unreadable = [&](const std::string& why, bool whole_archive) {
    const std::string_view all(bytes.data(), bytes.size());
    if (whole_archive && all.find(kFormat) == std::string_view::npos)
      return std::string("not a ddprun snapshot: a whole archive without the format \"") + kFormat +
             "\" (another torch.save file?): " + why;
    return "unreadable (torn or corrupt): " + why;
  };
  auto structure = check_snapshot_structure(std::string_view(bytes.data(), bytes.size()));
  if (auto* err = std::get_if<std::string>(&structure))
    return unreadable(*err, err->rfind("data.pkl at byte ", 0) == 0);
  Snapshot s;
  std::string actual;
  try {
    torch::IValue v = torch::pickle_load(bytes);
    if (!v.isGenericDict()) return std::string("not a dict: not a ddprun snapshot");
    const c10::impl::GenericDict d = v.toGenericDict();
    // A copy (one reference count): GCC 14 takes a reference returned by a call with a
    // temporary argument (the key) for a dangling one (-Wdangling-reference).
    const torch::IValue format = entry(d, "format");
    if (!format.isString() || format.toStringRef() != kFormat)
      return std::string("not a ddprun snapshot (no format \"") + kFormat + "\")";
    if (int_entry(d, "version") != kVersion)
      return "snapshot version " + std::to_string(int_entry(d, "version")) +
             " is not the supported " + std::to_string(kVersion);
    s.meta.epoch = int_entry(d, "epoch");
    s.meta.step = int_entry(d, "step");
    // Absent in files written before mid-epoch snapshots existed: an epoch boundary.
    if (d.contains(torch::IValue("epoch_step"))) s.meta.epoch_step = int_entry(d, "epoch_step");
    s.meta.world_size = int_entry(d, "world_size");
    s.meta.saved_at = int_entry(d, "saved_at");
    s.meta.checksum = string_entry(d, "checksum");
    for (const auto& item :
         typed_entry(d, "model", &torch::IValue::isGenericDict, "a dict").toGenericDict()) {
      if (!item.key().isString() || !item.value().isTensor())
        throw std::runtime_error("its \"model\" entry maps " + item.key().tagKind() + " to " +
                                 item.value().tagKind() + ", not names to tensors");
      s.model.emplace_back(item.key().toStringRef(), item.value().toTensor());
    }
    s.optimizer = tensor_entry(d, "optimizer");
    s.rng_state = tensor_entry(d, "rng_state");
    actual = snapshot_checksum(s);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return unreadable(what, true);
  }
  if (actual != s.meta.checksum)
    return "checksum mismatch (corrupt): recorded " + s.meta.checksum + ", content " + actual;
  return s;
}

namespace {

/// Whether this process is global rank 0 (or runs outside a launcher): the one that says what
/// concerns the whole job once.
bool is_global_rank_zero() {
  const char* rank = std::getenv("RANK");
  return rank == nullptr || std::string_view(rank) == "0";
}

}  // namespace

SnapshotStore::SnapshotStore(std::string base_path, int keep_last)
    : base_(std::move(base_path)), keep_last_(keep_last < 1 ? 1 : keep_last) {
  // Global rank 0 saves: a path it cannot write is said now, not only at its first save an
  // epoch in. A warning, not an error: a series opened only to load (a read-only copy) is fine.
  if (is_global_rank_zero()) {
    if (auto why = snapshot_directory_problem(base_))
      std::fprintf(stderr, "[ddprun sdk] warning: %s; save() will fail\n", why->c_str());
  }
}

std::vector<std::string> SnapshotStore::files() const {
  std::vector<std::string> out;
  for (int64_t seq : newest_first(list_snapshots(base_).seqs))
    out.push_back(snapshot_file_name(base_, seq));
  return out;
}

std::string SnapshotStore::save(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                int64_t epoch, int64_t step, int64_t world_size,
                                int64_t epoch_step) {
  std::filesystem::create_directories(snapshot_directory(base_));
  SnapshotListing listing = list_snapshots(base_);
  std::vector<int64_t>& seqs = listing.seqs;
  const int64_t next = seqs.empty() ? 1 : *std::max_element(seqs.begin(), seqs.end()) + 1;
  const std::string path = snapshot_file_name(base_, next);
  write_snapshot_file(path,
                      capture_snapshot(module, optimizer, epoch, step, world_size, epoch_step));
  seqs.push_back(next);
  std::error_code ec;
  for (int64_t old : snapshots_to_prune(seqs, keep_last_))
    std::filesystem::remove(snapshot_file_name(base_, old), ec);
  // A temporary file left by a writer killed during its save (a SIGKILL, a node lost): one
  // process saves a series at a time, and this one has just finished, so any other is stale.
  for (const std::string& temporary : listing.temporaries) std::filesystem::remove(temporary, ec);
  return path;
}

std::optional<SnapshotMeta> SnapshotStore::load_latest(torch::nn::Module& module,
                                                       torch::optim::Optimizer& optimizer) {
  for (const std::string& path : files()) {
    auto read = read_snapshot_file(path);
    if (auto* err = std::get_if<std::string>(&read)) {
      std::fprintf(stderr, "[ddprun sdk] warning: skipping snapshot %s: %s\n", path.c_str(),
                   err->c_str());
      continue;
    }
    const Snapshot& s = std::get<Snapshot>(read);
    try {
      restore_snapshot(s, module, optimizer);
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot resume from snapshot " + path + ": " + e.what());
    }
    // Inside an epoch, the position carries over as a count of batches, which another world
    // size splits differently (docs/sdk.md#preemption): said once, by global rank 0.
    const char* world = std::getenv("WORLD_SIZE");
    if (s.meta.epoch_step > 0 && world != nullptr && std::to_string(s.meta.world_size) != world &&
        is_global_rank_zero())
      std::fprintf(stderr,
                   "[ddprun sdk] note: snapshot %s was saved inside epoch %lld by a job of %lld "
                   "ranks and this job has %s: the rest of that epoch is split anew, so some of "
                   "its samples are seen twice or not at all (docs/sdk.md#preemption)\n",
                   path.c_str(), static_cast<long long>(s.meta.epoch),
                   static_cast<long long>(s.meta.world_size), world);
    report_to_agent("snapshot_loaded", {{"epoch", s.meta.epoch}, {"step", s.meta.step}});
    return s.meta;
  }
  return std::nullopt;
}

}  // namespace ddprun::sdk
