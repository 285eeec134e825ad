#include "ddprun/sdk/preemption.h"

#include <catch2/catch.hpp>
#include <csignal>

using namespace ddprun::sdk;

namespace {

volatile std::sig_atomic_t g_own_handler_calls = 0;
void own_handler(int) { g_own_handler_calls = g_own_handler_calls + 1; }

}  // namespace

TEST_CASE("SIGUSR1 sets the checkpoint flag instead of ending the process", "[sdk][unit]") {
  install_checkpoint_handler();
  clear_checkpoint_request();
  CHECK_FALSE(checkpoint_requested());
  REQUIRE(std::raise(SIGUSR1) == 0);
  CHECK(checkpoint_requested());
  // It stays set until cleared: a notice is not lost because the loop polled late.
  CHECK(checkpoint_requested());
  clear_checkpoint_request();
  CHECK_FALSE(checkpoint_requested());
  // Installing again changes nothing: still one flag set per signal.
  install_checkpoint_handler();
  REQUIRE(std::raise(SIGUSR1) == 0);
  CHECK(checkpoint_requested());
  clear_checkpoint_request();
}

TEST_CASE("a program's own SIGUSR1 handler still runs after the SDK installs its own",
          "[sdk][unit]") {
  struct sigaction mine {};
  mine.sa_handler = own_handler;
  sigemptyset(&mine.sa_mask);
  struct sigaction before {};
  REQUIRE(::sigaction(SIGUSR1, &mine, &before) == 0);
  install_checkpoint_handler();
  clear_checkpoint_request();
  g_own_handler_calls = 0;
  REQUIRE(std::raise(SIGUSR1) == 0);
  CHECK(checkpoint_requested());
  CHECK(g_own_handler_calls == 1);
  clear_checkpoint_request();
  ::sigaction(SIGUSR1, &before, nullptr);
}

TEST_CASE("request_checkpoint sets the flag as the signal does", "[sdk][unit]") {
  clear_checkpoint_request();
  request_checkpoint();
  CHECK(checkpoint_requested());
  clear_checkpoint_request();
}

TEST_CASE("DDPRUN_CHECKPOINT_REQUESTED=1 says a notice came before the worker started",
          "[sdk][unit]") {
  CHECK(checkpoint_requested_in_env({{"DDPRUN_CHECKPOINT_REQUESTED", "1"}}));
  CHECK(checkpoint_requested_in_env({{"DDPRUN_CHECKPOINT_REQUESTED", "true"}}));
  CHECK_FALSE(checkpoint_requested_in_env({{"DDPRUN_CHECKPOINT_REQUESTED", "0"}}));
  CHECK_FALSE(checkpoint_requested_in_env({{"DDPRUN_CHECKPOINT_REQUESTED", "later"}}));
  CHECK_FALSE(checkpoint_requested_in_env({{"RANK", "0"}}));
}
