#include "ddprun/sdk/preemption.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

#include "common/strings.h"

namespace ddprun::sdk {
namespace {

// Lock-free, so reading and writing it in a signal handler is safe.
std::atomic<bool> g_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

// The disposition found when the handler was installed; written with the signal blocked.
struct sigaction g_previous {};

void on_checkpoint_signal(int sig, siginfo_t* info, void* context) {
  g_requested.store(true, std::memory_order_relaxed);
  // Chain to the program's own handler; SIG_DFL (terminate) and SIG_IGN are what this replaces.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
}

}  // namespace

bool checkpoint_requested_in_env(const EnvMap& env) {
  auto it = env.find(kCheckpointRequestedEnv);
  if (it == env.end()) return false;
  return common::parse_bool(it->second).value_or(false);
}

void install_checkpoint_handler() {
  static std::once_flag env_read;
  std::call_once(env_read, [] {
    if (checkpoint_requested_in_env(current_environment())) request_checkpoint();
  });
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  struct sigaction current {};
  ::sigaction(kCheckpointSignal, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == on_checkpoint_signal) return;
  // Not installed, or replaced by the program since: install it (again), chaining to what is
  // there now. The signal is blocked meanwhile in this thread, the only one while from_env()
  // runs in a usual program (before the process group starts its threads).
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, kCheckpointSignal);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  g_previous = current;
  struct sigaction sa {};
  sa.sa_sigaction = on_checkpoint_signal;
  // SA_RESTART: a notice must not make a blocking read in a collective fail with EINTR.
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(kCheckpointSignal, &sa, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

bool checkpoint_requested() { return g_requested.load(std::memory_order_relaxed); }

void request_checkpoint() { g_requested.store(true, std::memory_order_relaxed); }

void clear_checkpoint_request() { g_requested.store(false, std::memory_order_relaxed); }

}  // namespace ddprun::sdk
