#pragma once
// Every difference between the libtorch versions the SDK builds against lives here: Debian 12's
// libtorch-dev 1.13 (CPU, c10d with Gloo), Debian 13's libtorch-dev 2.6 (CPU, Gloo, no libuv)
// and CUDA builds of libtorch 2.x (pip's torch through CMAKE_PREFIX_PATH), which add c10d's
// NCCL process group.
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <torch/version.h>

#include <string_view>

#if defined(DDPRUN_SDK_HAVE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/CPUGeneratorImpl.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace ddprun::sdk::compat {

/// c10d's handle of an asynchronous operation (c10d::Work in 1.13 and 2.x; 1.12 and older
/// called it ProcessGroup::Work).
using Work = c10d::Work;

/// What ProcessGroupGloo and ProcessGroupNCCL derive from: c10d::ProcessGroup in 1.13;
/// c10d::Backend from 2.0, where ProcessGroup became a dispatcher over backends.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

/// True when this build can create NCCL process groups.
inline constexpr bool kHaveNccl =
#if defined(DDPRUN_SDK_HAVE_C10D_NCCL)
    true;
#else
    false;
#endif

/// A TCPStore: the server (hosting it in this process) or a client.
inline c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port,
                                                      bool is_server, int world_size,
                                                      std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = is_server;
  o.numWorkers = static_cast<std::size_t>(world_size);
  // Clients may still be starting: connect() retries until the timeout; nobody waits for all
  // workers here, ProcessGroupGloo's own rendezvous does.
  o.waitWorkers = false;
  o.timeout = timeout;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // From 2.4 a TCPStore, server or client, asks for the libuv backend by default, and a torch
  // built without libuv (Debian 13's 2.6) refuses that before it binds or connects. Such a
  // torch does not say so in its C++ API, and the refusal is a plain c10::Error: it is told
  // apart by its text, and the store is made again with the socket backend every torch has.
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const c10::Error& e) {
    if (!o.useLibUV ||
        std::string_view(e.what_without_backtrace()).find("libuv") == std::string_view::npos)
      throw;
    o.useLibUV = false;
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

/// A Gloo process group over `store`, on the interface GLOO_SOCKET_IFNAME names, else on the
/// address this host's name resolves to (loopback when it does not), as torch does.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

/// A CPU generator seeded like torch.Generator().manual_seed(seed).
inline at::Generator make_cpu_generator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

/// The default CPU generator's state, and setting it back.
inline torch::Tensor default_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
inline void set_default_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// A value pickled the way torch::pickle_save (and torch.save) store it in their zip container:
/// the pickle of the structure, and the tensors it refers to, each to be stored as its own
/// record `data/<index>` beside `data.pkl`.
struct PickledValue {
  std::vector<char> pickle;
  std::vector<at::Tensor> tensors;
};

inline PickledValue pickle_tensors_apart(const torch::IValue& value) {
  PickledValue out;
  // Without type tags (the last argument): torch 2.6's torch.load reads only allowed globals by
  // default (weights_only=True), and torch.jit._pickle.restore_type_tag, which tags each dict
  // with its type, is not one of them. libtorch's own reader needs no tags.
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) {
        out.pickle.insert(out.pickle.end(), data, data + size);
      },
      nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  out.tensors = pickler.tensorData();
  return out;
}

/// The bytes torch.load reads for a CPU tensor's record: its whole storage, not a copy.
inline std::pair<const void*, size_t> tensor_record_bytes(const at::Tensor& tensor) {
  const at::Storage& storage = tensor.storage();
  return {storage.data(), storage.nbytes()};
}

}  // namespace ddprun::sdk::compat
