// The health gate's built-in checks against fake sysfs trees, and its runner with real commands.
#include "agent/health_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "tests/support/fake_deadline_timers.h"
#include "tests/support/subprocess.h"

using namespace ddprun::agent;
namespace fs = std::filesystem;
using ddprun::testing::TempDir;

namespace {

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

/// A sysfs tree with `gpus` NVIDIA GPUs (and one other PCI device), NICs and IB ports.
struct FakeSysfs {
  TempDir dir;
  fs::path root{dir.path()};

  void gpu(const std::string& slot, const std::string& vendor = "0x10de",
           const std::string& cls = "0x030200") {
    write(root / "bus/pci/devices" / slot / "vendor", vendor);
    write(root / "bus/pci/devices" / slot / "class", cls);
  }
  void nic(const std::string& name, const std::string& state, bool device = true) {
    write(root / "class/net" / name / "operstate", state);
    if (device) fs::create_directories(root / "class/net" / name / "device");
  }
  void ib(const std::string& hca, int port, const std::string& state) {
    write(root / "class/infiniband" / hca / "ports" / std::to_string(port) / "state", state);
  }
  HealthInputs inputs() const {
    HealthInputs in;
    in.sysfs_root = root.string();
    return in;
  }
};

}  // namespace

TEST_CASE("the first check only takes the baseline of GPUs, NICs and InfiniBand ports",
          "[agent][unit][health]") {
  FakeSysfs sys;
  sys.gpu("0000:17:00.0");
  sys.gpu("0000:65:00.0");
  sys.gpu("0000:00:02.0", "0x8086", "0x030000");  // not NVIDIA
  sys.gpu("0000:3b:00.0", "0x10de", "0x040300");  // NVIDIA audio: not a GPU
  sys.nic("eth0", "up");
  sys.nic("eth1", "down");
  sys.nic("veth12", "up", false);  // virtual: not watched
  sys.ib("mlx5_0", 1, "4: ACTIVE");
  sys.ib("mlx5_1", 1, "1: DOWN");
  HealthBaseline baseline;
  CHECK(builtin_health_problems(sys.inputs(), baseline).empty());
  CHECK(baseline.taken);
  CHECK(baseline.nvidia_gpus == 2);
  CHECK(baseline.nics_up == std::set<std::string>{"eth0"});
  CHECK(baseline.ib_active == std::set<std::string>{"mlx5_0/1"});
  CHECK(builtin_health_problems(sys.inputs(), baseline).empty());  // nothing changed
}

TEST_CASE("a GPU off the bus, a NIC down or a port no longer ACTIVE fails later checks",
          "[agent][unit][health]") {
  FakeSysfs sys;
  sys.gpu("0000:17:00.0");
  sys.gpu("0000:65:00.0");
  sys.nic("eth0", "up");
  sys.nic("veth12", "up", false);
  sys.ib("mlx5_0", 1, "4: ACTIVE");
  HealthBaseline baseline;
  REQUIRE(builtin_health_problems(sys.inputs(), baseline).empty());
  fs::remove_all(sys.root / "bus/pci/devices/0000:65:00.0");
  sys.nic("eth0", "down");
  sys.nic("veth12", "down", false);  // a container's interface going away is not a problem
  sys.ib("mlx5_0", 1, "1: DOWN");
  const auto problems = builtin_health_problems(sys.inputs(), baseline);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0] == "1 NVIDIA GPU(s) on the PCI bus, 2 at the first check");
  CHECK(problems[1] == "network interface(s) no longer up: eth0");
  CHECK(problems[2] == "InfiniBand port(s) no longer ACTIVE: mlx5_0/1");
  // Back again: healthy again.
  sys.gpu("0000:65:00.0");
  sys.nic("eth0", "up");
  sys.ib("mlx5_0", 1, "4: ACTIVE");
  CHECK(builtin_health_problems(sys.inputs(), baseline).empty());
}

TEST_CASE("a directory the job writes to must be writable and have room", "[agent][unit][health]") {
  FakeSysfs sys;
  TempDir logs;
  HealthInputs in = sys.inputs();
  in.dirs = {logs.path()};
  HealthBaseline baseline;
  CHECK(builtin_health_problems(in, baseline).empty());
  in.min_free_bytes = ~0ull;  // more than any disk has
  auto problems = builtin_health_problems(in, baseline);
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains(logs.path() + " has ") && Catch::Contains("MiB free"));
  in.min_free_bytes = 0;
  in.dirs = {logs.path() + "/missing"};
  problems = builtin_health_problems(in, baseline);
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains("is not writable: No such file or directory"));
}

namespace {

/// Runs one check of `command` on a real event loop and reaps like the agent does (or, with
/// `reap` false, as an agent would whose check the kernel keeps from exiting).
HealthResult check_once(HealthCheckRunner& runner, ProcessLauncher& launcher,
                        boost::asio::io_context& io, bool reap = true) {
  std::optional<HealthResult> result;
  runner.run([&](HealthResult r) { result = std::move(r); });
  for (int i = 0; i < 2000 && !result; ++i) {
    io.run_for(std::chrono::milliseconds(10));
    io.restart();
    if (reap)
      for (const ProcessExit& e : launcher.reap()) runner.on_exit(e.pid, e.status);
  }
  REQUIRE(result);
  return *result;
}

}  // namespace

TEST_CASE("the check command passes with exit 0, fails otherwise, and is killed at the timeout",
          "[agent][unit][health]") {
  FakeSysfs sys;
  boost::asio::io_context io;
  PosixProcessLauncher launcher;
  ddprun::common::SteadyClock clock;
  const auto timers = steady_deadline_timers(io, clock);
  {
    HealthCheckRunner ok(io, launcher, clock, *timers, sys.inputs(), "echo fine",
                         std::chrono::seconds(10), {});
    const HealthResult r = check_once(ok, launcher, io);
    CHECK(r.ok);
    CHECK(r.output == "fine\n");
  }
  {
    HealthCheckRunner bad(io, launcher, clock, *timers, sys.inputs(),
                          "echo 'nvme0 degraded' >&2; exit 4", std::chrono::seconds(10),
                          {{"PATH", "/usr/bin:/bin"}});
    const HealthResult r = check_once(bad, launcher, io);
    CHECK_FALSE(r.ok);
    CHECK(r.why == "the health check `echo 'nvme0 degraded' >&2; exit 4` failed with exit code 4");
    CHECK(r.output == "nvme0 degraded\n");
  }
  {
    HealthCheckRunner slow(io, launcher, clock, *timers, sys.inputs(), "sleep 30",
                           std::chrono::milliseconds(300), {});
    const HealthResult r = check_once(slow, launcher, io);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.why, Catch::Contains("ran past --health_check_timeout"));
    CHECK(r.ms < 10'000);
  }
  {
    // The built-in checks come first: a failing one means the command does not run.
    HealthInputs in = sys.inputs();
    in.dirs = {"/nonexistent-ddprun-dir"};
    HealthCheckRunner gated(io, launcher, clock, *timers, in, "echo ran", std::chrono::seconds(10),
                            {});
    const HealthResult r = check_once(gated, launcher, io);
    CHECK_FALSE(r.ok);
    CHECK(r.output.empty());
    CHECK_THAT(r.why, Catch::Contains("/nonexistent-ddprun-dir is not writable"));
  }
}

TEST_CASE("a check's output is kept to its last byte, and a check never waits for its command",
          "[agent][unit][health]") {
  FakeSysfs sys;
  boost::asio::io_context io;
  PosixProcessLauncher launcher;
  ddprun::common::SteadyClock clock;
  const auto timers = steady_deadline_timers(io, clock);
  {
    // Output written just before the exit, on both pipes, is all there.
    HealthCheckRunner chatty(io, launcher, clock, *timers, sys.inputs(),
                             "i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); done; "
                             "echo last-out; echo last-err >&2; exit 3",
                             std::chrono::seconds(10), {});
    for (int round = 0; round < 5; ++round) {
      const HealthResult r = check_once(chatty, launcher, io);
      CHECK_FALSE(r.ok);
      CHECK(r.output.size() <= 4096);
      CHECK_THAT(r.output, Catch::Contains("last-out\n"));
      CHECK_THAT(r.output, Catch::Contains("last-err\n"));
      CHECK_THAT(r.output, Catch::Contains("line299\n"));
    }
  }
  {
    // Over 4 KiB: whole lines from where it was cut, after a line that says how much went (a
    // line cut at its start, "2" of "4182", read as output the check never printed).
    HealthCheckRunner long_out(io, launcher, clock, *timers, sys.inputs(), "seq 1 5000; exit 1",
                               std::chrono::seconds(10), {});
    const HealthResult r = check_once(long_out, launcher, io);
    std::vector<std::string> lines;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(lines.size() > 100);
    CHECK_THAT(lines[0], Catch::Matches("\\([0-9]+ bytes of earlier output not kept\\)"));
    const int first = std::stoi(lines[1]);
    CHECK(first > 1);
    for (std::size_t i = 1; i < lines.size(); ++i) CHECK(lines[i] == std::to_string(first + i - 1));
    CHECK(lines.back() == "5000");
    // The bytes said dropped and those kept make the whole output.
    std::size_t total = 0;
    for (int n = 1; n <= 5000; ++n) total += std::to_string(n).size() + 1;
    const std::size_t said = std::stoul(lines[0].substr(1));
    CHECK(said + r.output.size() - lines[0].size() - 1 == total);
  }
  {
    // Cut where a line starts: every kept line is whole, none is dropped beyond the cut.
    HealthCheckRunner even(io, launcher, clock, *timers, sys.inputs(),
                           "i=0; while [ $i -lt 1000 ]; do printf '%07d\\n' $i; i=$((i+1)); "
                           "done; exit 1",
                           std::chrono::seconds(10), {});
    const HealthResult r = check_once(even, launcher, io);
    CHECK(r.output.rfind("(3904 bytes of earlier output not kept)\n0000488\n", 0) == 0);
    CHECK(r.output.size() ==
          std::string("(3904 bytes of earlier output not kept)\n").size() + 4096);
  }
  {
    // A check that cannot run says so: no repair of the node cures a typo.
    HealthCheckRunner typo(io, launcher, clock, *timers, sys.inputs(), "no-such-check-xyz",
                           std::chrono::seconds(10), {{"PATH", "/usr/bin:/bin"}});
    const HealthResult r = check_once(typo, launcher, io);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.why, Catch::EndsWith("failed with exit code 127 (the shell found no such "
                                      "command: check --health_check)"));
  }
  {
    // An exit the agent never sees (a command stuck in the kernel) still ends the check at
    // its timeout; the exit, when it comes, is taken and dropped.
    HealthCheckRunner stuck(io, launcher, clock, *timers, sys.inputs(), "sleep 30",
                            std::chrono::milliseconds(200), {});
    const HealthResult r = check_once(stuck, launcher, io, /*reap=*/false);
    CHECK_FALSE(r.ok);
    CHECK(r.why == "the health check ran past --health_check_timeout (200 ms) and was killed");
    bool taken = false;
    for (int i = 0; i < 500 && !taken; ++i) {
      for (const ProcessExit& e : launcher.reap()) taken = stuck.on_exit(e.pid, e.status) || taken;
      if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(taken);
  }
  {
    // stop() kills a running check without waiting; its exit is taken later, `done` never runs.
    HealthCheckRunner stopped(io, launcher, clock, *timers, sys.inputs(), "sleep 30",
                              std::chrono::seconds(10), {});
    bool called = false;
    stopped.run([&](HealthResult) { called = true; });
    io.run_for(std::chrono::milliseconds(50));
    io.restart();
    stopped.stop();
    bool taken = false;
    for (int i = 0; i < 500 && !taken; ++i) {
      io.run_for(std::chrono::milliseconds(10));
      io.restart();
      for (const ProcessExit& e : launcher.reap())
        taken = stopped.on_exit(e.pid, e.status) || taken;
      if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(taken);
    CHECK_FALSE(called);
  }
}

TEST_CASE("a check's timeout is on the agent's clock", "[agent][unit][health]") {
  FakeSysfs sys;
  boost::asio::io_context io;
  PosixProcessLauncher launcher;
  ddprun::testing::FakeClock clock;
  ddprun::testing::FakeDeadlineTimers timers(clock, io);
  HealthCheckRunner slow(io, launcher, clock, timers, sys.inputs(), "sleep 30",
                         std::chrono::seconds(30), {});
  std::optional<HealthResult> result;
  slow.run([&](HealthResult r) { result = std::move(r); });
  // Runs the loop and reaps for up to `rounds` times 10 ms of real time. The loop may have
  // nothing to wait on (the pipes closed, the grace is on the fake clock) while the killed
  // command is not yet reapable: then it sleeps instead.
  const auto settle = [&](int rounds) {
    for (int i = 0; i < rounds && !result; ++i) {
      if (io.run_for(std::chrono::milliseconds(10)) == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      io.restart();
      for (const ProcessExit& e : launcher.reap()) slow.on_exit(e.pid, e.status);
    }
  };
  settle(20);
  timers.advance(std::chrono::seconds(29));
  settle(20);
  CHECK_FALSE(result);  // 29 s of 30: the command still runs
  timers.advance(std::chrono::seconds(1));
  settle(500);
  REQUIRE(result);
  CHECK_FALSE(result->ok);
  CHECK(result->why == "the health check ran past --health_check_timeout (30 s) and was killed");
  CHECK(result->ms == 30'000);  // the agent's clock's, not the seconds this test took
}
