// Test helper: libtorch's TCPStore client against a store at HOST PORT, for the calls that
// torch 1.13's Python API lacks: check() and watchKey(). Exits 0 when every answer is torch's;
// else prints what differed and exits 1. A libtorch without watchKey (2.x: Store::watchKey
// throws "watchKey is deprecated") prints "watchKey: not in this libtorch" and checks the rest.
#include "worker_sdk/src/torch_compat.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

int failures = 0;

void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++failures;
}

/// What one watch callback saw: "old->new", with "-" for an absent value.
struct Seen {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> events;

  void add(const c10::optional<std::string>& old_value,
           const c10::optional<std::string>& new_value) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back((old_value ? *old_value : "-") + "->" + (new_value ? *new_value : "-"));
    changed.notify_all();
  }

  /// Waits (at most 10 s) for the n-th event and returns it ("" when none came).
  std::string nth(std::size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_for(lock, std::chrono::seconds(10), [&] { return events.size() > n; });
    return events.size() > n ? events[n] : "";
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: torch_store_client HOST PORT\n");
    return 2;
  }
  auto store_ptr =
      ddprun::sdk::compat::make_tcp_store(argv[1], std::atoi(argv[2]),
                                          /*is_server=*/false, 1, std::chrono::seconds(20));
  c10d::Store& store = *store_ptr;

  store.set("present", bytes("1"));
  expect(store.check({"present"}), "check of a present key");
  expect(!store.check({"present", "absent"}), "check with an absent key");

  Seen seen;
  auto callback = [&seen](c10::optional<std::string> old_value,
                          c10::optional<std::string> new_value) { seen.add(old_value, new_value); };
  try {
    store.watchKey("wk", callback);
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("watchKey is deprecated") == std::string::npos)
      throw;
    std::printf("watchKey: not in this libtorch\n");
    return failures == 0 ? 0 : 1;
  }
  store.set("wk", bytes("a"));
  const std::string created = seen.nth(0);
  expect(created == "-->a", ("watch: created (" + created + ")").c_str());
  store.watchKey("wk", callback);
  store.set("wk", bytes("b"));
  const std::string updated = seen.nth(1);
  expect(updated == "a->b", ("watch: updated (" + updated + ")").c_str());
  store.watchKey("wk", callback);
  store.deleteKey("wk");
  const std::string deleted = seen.nth(2);
  expect(deleted.rfind("b->", 0) == 0, ("watch: deleted (" + deleted + ")").c_str());
  return failures == 0 ? 0 : 1;
}
