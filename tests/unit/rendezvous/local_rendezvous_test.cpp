#include "rendezvous/local_rendezvous.h"

#include <catch2/catch.hpp>
#include <deque>

using namespace ddprun::rdzv;

namespace {

struct ManualLoop {
  std::deque<std::function<void()>> queue;
  std::function<void(std::function<void()>)> poster() {
    return [this](std::function<void()> fn) { queue.push_back(std::move(fn)); };
  }
  void run() {
    while (!queue.empty()) {
      auto fn = std::move(queue.front());
      queue.pop_front();
      fn();
    }
  }
};

}  // namespace

TEST_CASE("a single-node round makes this node rank 0 of 1 with a free port", "[rdzv][unit]") {
  ManualLoop loop;
  LocalRendezvous rdzv("c10d", "job", "127.0.0.1", std::nullopt, loop.poster());
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous(3, [&](RendezvousResult r) { got = r; });
  CHECK_FALSE(got);  // completes asynchronously, like a networked round
  loop.run();
  REQUIRE(got);
  auto* info = std::get_if<RendezvousInfo>(&*got);
  REQUIRE(info);
  CHECK(info->group_rank == 0);
  CHECK(info->group_world_size == 1);
  CHECK(info->restart_count == 3);
  CHECK(info->master_port > 0);
  CHECK(rdzv.backend() == "c10d");
  CHECK(rdzv.run_id() == "job");
}

TEST_CASE("an explicit master port is used as given", "[rdzv][unit]") {
  ManualLoop loop;
  LocalRendezvous rdzv("static", "none", "127.0.0.1", 29555, loop.poster());
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous(0, [&](RendezvousResult r) { got = r; });
  loop.run();
  CHECK(std::get<RendezvousInfo>(*got).master_port == 29555);
}

TEST_CASE("an address that cannot be bound is a state error naming it", "[rdzv][unit]") {
  ManualLoop loop;
  LocalRendezvous rdzv("static", "none", "no-such-host.invalid", std::nullopt, loop.poster());
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous(0, [&](RendezvousResult r) { got = r; });
  loop.run();
  auto* err = std::get_if<RendezvousError>(&*got);
  REQUIRE(err);
  CHECK(err->message.find("no-such-host.invalid") != std::string::npos);
}
