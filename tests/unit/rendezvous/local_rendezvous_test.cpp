#include "rendezvous/local_rendezvous.h"

#include <catch2/catch.hpp>

using namespace ddprun::rdzv;

namespace {

/// The agent's event loop and clock.
struct Loop {
  boost::asio::io_context io;
  ddprun::common::SteadyClock clock;
  /// Runs what is ready, and a timer that is due (a kept-out node's join timeout); bounded.
  void run() {
    io.restart();
    io.run_for(std::chrono::seconds(5));
  }
};

/// A single-node job's settings with `max_restarts` and the default failure policy.
RdzvSettings restarts(int max_restarts) {
  RdzvSettings settings;
  settings.max_restarts = max_restarts;
  return settings;
}

}  // namespace

TEST_CASE("a single-node round makes this node rank 0 of 1 with a free port", "[rdzv][unit]") {
  Loop loop;
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, restarts(0));
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
  CHECK_FALSE(got);  // completes asynchronously, like a networked round
  loop.run();
  REQUIRE(got);
  auto* info = std::get_if<RendezvousInfo>(&*got);
  REQUIRE(info);
  CHECK(info->group_rank == 0);
  CHECK(info->group_world_size == 1);
  CHECK(info->restart_count == 0);
  CHECK(info->round == 0);
  CHECK(info->master_port > 0);
  CHECK(rdzv.backend() == "c10d");
  CHECK(rdzv.run_id() == "job");
}

TEST_CASE("an explicit master port is used as given", "[rdzv][unit]") {
  Loop loop;
  LocalRendezvous rdzv(loop.io, loop.clock, "static", "none", "127.0.0.1", 29555, restarts(0));
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
  loop.run();
  CHECK(std::get<RendezvousInfo>(*got).master_port == 29555);
}

TEST_CASE("an address that cannot be bound is a state error naming it", "[rdzv][unit]") {
  Loop loop;
  // 192.0.2.1 (TEST-NET-1) is on no interface of this machine, and a literal needs no lookup.
  LocalRendezvous rdzv(loop.io, loop.clock, "static", "none", "192.0.2.1", std::nullopt,
                       restarts(0));
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
  loop.run();
  auto* err = std::get_if<RendezvousError>(&*got);
  REQUIRE(err);
  CHECK(err->message.find("192.0.2.1") != std::string::npos);
}

TEST_CASE("a single node's failures restart it while the budget lasts, then close the job",
          "[rdzv][unit]") {
  Loop loop;
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, restarts(2));
  std::vector<Notice> notices;
  rdzv.set_notice_handler([&](Notice n) { notices.push_back(n); });
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
  loop.run();
  REQUIRE(std::holds_alternative<RendezvousInfo>(*got));
  for (int expected = 1; expected <= 2; ++expected) {
    rdzv.report_failure(WorkersFailed{expected - 1, "rank 1 exited with 3", 3, 0});
    loop.run();
    REQUIRE(notices.size() == static_cast<size_t>(expected));
    auto* restart = std::get_if<Restart>(&notices.back());
    REQUIRE(restart);
    CHECK(restart->counted);
    CHECK(restart->restart_count == expected);
    // The reason is the rendezvous server's, as on a multi-node job.
    CHECK_THAT(restart->reason, Catch::StartsWith("worker failure on node "));
    CHECK_THAT(restart->reason, Catch::EndsWith(": rank 1 exited with 3"));
    got.reset();
    rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
    loop.run();
    CHECK(std::get<RendezvousInfo>(*got).restart_count == expected);
    CHECK(std::get<RendezvousInfo>(*got).round == expected);
  }
  rdzv.report_failure(WorkersFailed{2, "rank 1 was killed by SIGKILL", 0, 9});
  loop.run();
  auto* closed = std::get_if<Closed>(&notices.back());
  REQUIRE(closed);
  CHECK(closed->outcome == JobOutcomeKind::Failed);
  CHECK(closed->signal == 9);
  CHECK_THAT(closed->message, Catch::Contains("rank 1 was killed by SIGKILL"));
  CHECK_THAT(closed->message, Catch::EndsWith("; no restart left: 2 of --max_restarts 2 used"));
}

TEST_CASE("a failure report for an earlier round is ignored", "[rdzv][unit]") {
  Loop loop;
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, restarts(2));
  std::vector<Notice> notices;
  rdzv.set_notice_handler([&](Notice n) { notices.push_back(n); });
  rdzv.next_rendezvous([](RendezvousResult) {});
  loop.run();
  rdzv.report_failure(WorkersFailed{0, "rank 0 exited with 1", 1, 0});
  loop.run();
  rdzv.next_rendezvous([](RendezvousResult) {});
  loop.run();
  rdzv.report_failure(WorkersFailed{0, "rank 0 exited with 1 (again)", 1, 0});
  loop.run();
  CHECK(notices.size() == 1);
}

TEST_CASE("a single node's success closes the job, and nothing follows a leave", "[rdzv][unit]") {
  Loop loop;
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, restarts(0));
  std::vector<Notice> notices;
  rdzv.set_notice_handler([&](Notice n) { notices.push_back(n); });
  rdzv.next_rendezvous([](RendezvousResult) {});
  loop.run();
  rdzv.report_success();
  loop.run();
  REQUIRE(notices.size() == 1);
  CHECK(std::get<Closed>(notices[0]).outcome == JobOutcomeKind::Succeeded);
  bool called = false;
  rdzv.next_rendezvous([&](RendezvousResult) { called = true; });
  rdzv.leave("received SIGTERM");
  loop.run();
  CHECK_FALSE(called);
}

TEST_CASE("a round asked for after the job closed fails as closed", "[rdzv][unit]") {
  Loop loop;
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, restarts(0));
  rdzv.next_rendezvous([](RendezvousResult) {});
  loop.run();
  rdzv.report_success();
  loop.run();
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
  loop.run();
  REQUIRE(got);
  auto* err = std::get_if<RendezvousError>(&*got);
  REQUIRE(err);
  CHECK(err->kind == RendezvousErrorKind::Closed);
}

TEST_CASE("a single node kept out by its health check past the join timeout ends the job",
          "[rdzv][unit][health]") {
  Loop loop;
  RdzvSettings settings = restarts(0);
  settings.join_timeout = std::chrono::milliseconds(200);
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, settings);
  std::vector<Notice> notices;
  rdzv.set_notice_handler([&](Notice n) { notices.push_back(n); });
  rdzv.keep_out("gpu0: ECC errors");
  loop.run();  // until the join timeout's timer has run
  REQUIRE(notices.size() == 1);
  const auto* closed = std::get_if<Closed>(&notices[0]);
  REQUIRE(closed);
  CHECK(closed->outcome == JobOutcomeKind::TimedOut);
  CHECK_THAT(closed->message, Catch::StartsWith("join timeout"));
  CHECK_THAT(closed->message, Catch::Contains("gpu0: ECC errors"));
  CHECK(loop.io.stopped());  // nothing is left armed once the job has ended
}

TEST_CASE("a single node whose check passes in time trains, and no deadline holds the loop",
          "[rdzv][unit][health]") {
  Loop loop;
  RdzvSettings settings = restarts(0);
  settings.join_timeout = std::chrono::seconds(60);
  LocalRendezvous rdzv(loop.io, loop.clock, "c10d", "job", "127.0.0.1", std::nullopt, settings);
  std::vector<Notice> notices;
  rdzv.set_notice_handler([&](Notice n) { notices.push_back(n); });
  rdzv.keep_out("gpu0: ECC errors");
  loop.io.restart();
  loop.io.poll();  // the kept-out join, and its timer armed for the join timeout
  CHECK_FALSE(loop.io.stopped());
  std::optional<RendezvousResult> got;
  rdzv.next_rendezvous([&](RendezvousResult r) { got = r; });
  loop.run();
  REQUIRE(got);
  CHECK(std::holds_alternative<RendezvousInfo>(*got));
  CHECK(notices.empty());
  // run() returned because no work was left, not at its bound: the timer went with the round.
  CHECK(loop.io.stopped());
}
