#include "agent/policy.h"

#include <catch2/catch.hpp>

#include "common/exit_codes.h"

using namespace ddprun::agent;

TEST_CASE("a group keeps running while no worker has failed", "[agent][unit]") {
  CHECK(decide({2, 0, 0}) == Action::Monitor);
  CHECK(decide({1, 1, 0}) == Action::Monitor);
  CHECK(group_state({1, 1, 0}) == WorkerState::Healthy);
}

TEST_CASE("one failed worker stops the whole group", "[agent][unit]") {
  CHECK(decide({3, 0, 1}) == Action::StopGroup);
  CHECK(decide({0, 3, 1}) == Action::StopGroup);
  CHECK(group_state({3, 0, 1}) == WorkerState::Failed);
}

TEST_CASE("the group succeeds when every worker exited 0", "[agent][unit]") {
  CHECK(decide({0, 4, 0}) == Action::Succeed);
  CHECK(group_state({0, 4, 0}) == WorkerState::Succeeded);
}

TEST_CASE("the exit status maps each ending to its documented code", "[agent][unit]") {
  using namespace ddprun::common;
  CHECK(job_exit_code(JobOutcome::of(JobEnd::Succeeded)) == 0);
  CHECK(job_exit_code(JobOutcome::workers_failed({3, 0}, 0)) == 3);
  CHECK(job_exit_code(JobOutcome::workers_failed({0, 9}, 0)) == 137);
  CHECK(job_exit_code(JobOutcome::workers_failed({3, 0}, 2)) == kExitRestartsExhausted);
  CHECK(job_exit_code(JobOutcome::signalled(15)) == 143);
  CHECK(job_exit_code(JobOutcome::of(JobEnd::RendezvousFailed)) == kExitRendezvous);
  CHECK(job_exit_code(JobOutcome::of(JobEnd::Internal)) == kExitInternal);
}

TEST_CASE("wait statuses decode to codes and signals", "[agent][unit]") {
  CHECK(ExitStatus::from_wait_status(3 << 8).code == 3);
  CHECK(ExitStatus::from_wait_status(9).signal == 9);
  CHECK(ExitStatus{0, 11}.shell_code() == 139);
  CHECK(ExitStatus{0, 0}.ok());
}
