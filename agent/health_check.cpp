#include "agent/health_check.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "agent/failure_report.h"
#include "common/strings.h"

namespace ddprun::agent {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

/// The output kept of a check: its last bytes.
constexpr std::size_t kKeptOutput = 4096;

/// The first line of a small sysfs file, without its newline ("" when unreadable).
std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return common::trim(line);
}

/// The entries of a directory, sorted ("" list when it does not exist).
std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string human_bytes(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

/// Why `dir` cannot take the job's files, or "".
std::string dir_problem(const std::string& dir, std::uint64_t min_free) {
  const std::string probe_template = dir + "/.ddprun-health-XXXXXX";
  std::string probe = probe_template;
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return dir + " is not writable: " + std::strerror(errno);
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) return dir + " is not writable: " + std::strerror(write_errno);
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < min_free)
      return dir + " has " + human_bytes(free_bytes) + " free, less than " + human_bytes(min_free);
  }
  return "";
}

int count_nvidia_gpus(const fs::path& sysfs) {
  int n = 0;
  for (const fs::path& dev : entries(sysfs / "bus/pci/devices")) {
    // Vendor 0x10de (NVIDIA), class 0x03xxxx (a display or 3D controller).
    if (read_line(dev / "vendor") == "0x10de" && read_line(dev / "class").rfind("0x03", 0) == 0)
      ++n;
  }
  return n;
}

std::set<std::string> nics_up(const fs::path& sysfs) {
  std::set<std::string> up;
  for (const fs::path& nic : entries(sysfs / "class/net")) {
    std::error_code ec;
    // Only interfaces of a device: bridges, veths and tunnels come and go with containers.
    if (!fs::exists(nic / "device", ec)) continue;
    if (read_line(nic / "operstate") == "up") up.insert(nic.filename().string());
  }
  return up;
}

std::set<std::string> ib_ports_active(const fs::path& sysfs) {
  std::set<std::string> active;
  for (const fs::path& hca : entries(sysfs / "class/infiniband"))
    for (const fs::path& port : entries(hca / "ports"))
      if (read_line(port / "state").find("ACTIVE") != std::string::npos)
        active.insert(hca.filename().string() + "/" + port.filename().string());
  return active;
}

std::string join_names(const std::set<std::string>& names) {
  return common::join({names.begin(), names.end()}, ", ");
}

}  // namespace

std::vector<std::string> builtin_health_problems(const HealthInputs& inputs,
                                                 HealthBaseline& baseline) {
  std::vector<std::string> problems;
  for (const std::string& dir : inputs.dirs)
    if (std::string p = dir_problem(dir, inputs.min_free_bytes); !p.empty()) problems.push_back(p);
  const fs::path sysfs(inputs.sysfs_root);
  const int gpus = count_nvidia_gpus(sysfs);
  const std::set<std::string> up = nics_up(sysfs);
  const std::set<std::string> active = ib_ports_active(sysfs);
  if (!baseline.taken) {
    baseline = HealthBaseline{true, gpus, up, active};
    return problems;
  }
  if (gpus < baseline.nvidia_gpus)
    problems.push_back(std::to_string(gpus) + " NVIDIA GPU(s) on the PCI bus, " +
                       std::to_string(baseline.nvidia_gpus) + " at the first check");
  std::set<std::string> down, inactive;
  for (const std::string& nic : baseline.nics_up)
    if (!up.count(nic)) down.insert(nic);
  for (const std::string& port : baseline.ib_active)
    if (!active.count(port)) inactive.insert(port);
  if (!down.empty()) problems.push_back("network interface(s) no longer up: " + join_names(down));
  if (!inactive.empty())
    problems.push_back("InfiniBand port(s) no longer ACTIVE: " + join_names(inactive));
  return problems;
}

struct HealthCheckRunner::Impl {
  Impl(asio::io_context& io, ProcessLauncher& launcher, const common::Clock& clock,
       DeadlineTimers& timers, HealthInputs inputs, std::string command,
       std::chrono::milliseconds timeout, EnvMap env)
      : io(io),
        launcher(launcher),
        inputs(std::move(inputs)),
        command(std::move(command)),
        timeout(timeout),
        env(std::move(env)),
        clock(clock),
        timer(timers.make()),
        grace(timers.make()),
        pipes{asio::posix::stream_descriptor(io), asio::posix::stream_descriptor(io)} {}

  /// Ends the check that runs now: its pipes closed, a command still running killed and left
  /// to the agent's reaping (on_exit() takes it), `done` posted with `result` when given.
  void end(std::optional<HealthResult> result) {
    ++generation;  // read handlers still queued belong to the check that ended
    timer->cancel();
    grace->cancel();
    for (auto& pipe : pipes) {
      boost::system::error_code ignored;
      pipe.close(ignored);
    }
    if (pid > 0 && !exited) {
      launcher.signal_group(pid, SIGKILL);
      discarded.insert(pid);
    }
    pid = -1;
    auto callback = std::move(done);
    done = nullptr;
    if (!result || !callback) return;
    result->output = kept_output();
    result->ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock.now() - started).count();
    asio::post(io,
               [callback = std::move(callback), result = std::move(*result)] { callback(result); });
  }

  /// How the command's check ended, from what is known now.
  HealthResult verdict() const {
    HealthResult result;
    if (timed_out) {
      result.ok = false;
      result.why = "the health check ran past --health_check_timeout (" +
                   format_ms(timeout.count()) + ") and was killed";
    } else if (!status.ok()) {
      result.ok = false;
      result.why = "the health check `" + command + "` failed with " + describe_exit(status);
      // The shell's own codes: the check did not run, which no node repair cures.
      if (status.signal == 0 && status.code == 127)
        result.why += " (the shell found no such command: check --health_check)";
      else if (status.signal == 0 && status.code == 126)
        result.why += " (a command could not be executed: check --health_check)";
    }
    return result;
  }

  static std::string format_ms(long long ms) {
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    return std::to_string(ms) + " ms";
  }

  /// The check ends once its command has exited and both pipes are at their end (all its
  /// output read), or a moment after the exit when something it started still holds a pipe.
  void maybe_end() {
    if (exited && eof[0] && eof[1]) end(verdict());
  }

  void keep(const char* data, std::size_t n) {
    output.append(data, n);
    if (output.size() > kKeptOutput) {
      const std::size_t cut = output.size() - kKeptOutput;
      dropped += cut;
      dropped_line_end = output[cut - 1] == '\n';  // what is kept starts a line
      output.erase(0, cut);
    }
  }

  /// The output as the log shows it: when its start was dropped, from the first whole line
  /// on (a line cut at its start would read as something the check never printed), after a
  /// line that says how much went.
  std::string kept_output() const {
    if (dropped == 0) return output;
    std::size_t from = 0;
    bool cut_line = false;  // what is kept is the end of one line longer than all of it
    if (!dropped_line_end) {
      from = output.find('\n');
      if (from == std::string::npos || from + 1 == output.size()) {
        from = 0;
        cut_line = true;
      } else {
        ++from;
      }
    }
    const std::size_t gone = dropped + from;
    return "(" + std::to_string(gone) + (gone == 1 ? " byte" : " bytes") +
           " of earlier output not kept)\n" + (cut_line ? "..." : "") + output.substr(from);
  }

  void read(std::size_t which) {
    auto& pipe = pipes[which];
    pipe.async_read_some(
        asio::buffer(buffers[which]),
        [this, which, gen = generation](const boost::system::error_code& ec, std::size_t n) {
          if (gen != generation) return;
          if (n > 0) keep(buffers[which].data(), n);
          if (!ec) return read(which);
          eof[which] = true;
          maybe_end();
        });
  }

  /// After the exit (or the timeout's kill), at most this long for the output still on its way.
  static constexpr std::chrono::milliseconds kGrace{500};

  void arm_grace() {
    grace->arm(clock.now() + kGrace, [this, gen = generation] {
      if (gen == generation) end(verdict());
    });
  }

  asio::io_context& io;
  ProcessLauncher& launcher;
  HealthInputs inputs;
  std::string command;
  std::chrono::milliseconds timeout;
  EnvMap env;
  HealthBaseline baseline;
  const common::Clock& clock;
  std::unique_ptr<DeadlineTimer> timer;
  std::unique_ptr<DeadlineTimer> grace;
  std::array<asio::posix::stream_descriptor, 2> pipes;
  std::array<std::array<char, 4096>, 2> buffers{};
  std::array<bool, 2> eof{};
  std::string output;
  std::size_t dropped = 0;        ///< bytes of output dropped from its start (over kKeptOutput)
  bool dropped_line_end = false;  ///< the last byte dropped ended a line
  /// Where the command goes (place()): a cgroup's procs, the watcher's pipe.
  int cgroup_procs_fd = -1;
  int watcher_fd = -1;
  pid_t pid = -1;
  bool exited = false;
  ExitStatus status{};
  bool timed_out = false;
  std::uint64_t generation = 0;
  /// Commands killed and no longer waited for (a stop, or a check stuck past its timeout in
  /// the kernel): on_exit() takes their exits.
  std::set<pid_t> discarded;
  common::TimePoint started;
  std::function<void(HealthResult)> done;
};

HealthCheckRunner::HealthCheckRunner(asio::io_context& io, ProcessLauncher& launcher,
                                     const common::Clock& clock, DeadlineTimers& timers,
                                     HealthInputs inputs, std::string command,
                                     std::chrono::milliseconds timeout, EnvMap env)
    : impl_(std::make_unique<Impl>(io, launcher, clock, timers, std::move(inputs),
                                   std::move(command), timeout, std::move(env))) {}

HealthCheckRunner::~HealthCheckRunner() { stop(); }

void HealthCheckRunner::place(int cgroup_procs_fd, int watcher_fd) {
  impl_->cgroup_procs_fd = cgroup_procs_fd;
  impl_->watcher_fd = watcher_fd;
}

void HealthCheckRunner::run(std::function<void(HealthResult)> done) {
  Impl& m = *impl_;
  stop();
  m.done = std::move(done);
  m.output.clear();
  m.dropped = 0;
  m.dropped_line_end = false;
  m.timed_out = false;
  m.exited = false;
  m.status = ExitStatus{};
  m.eof = {false, false};
  m.started = m.clock.now();
  const std::vector<std::string> problems = builtin_health_problems(m.inputs, m.baseline);
  if (!problems.empty()) {
    std::string why;
    for (const std::string& p : problems) why += (why.empty() ? "" : "; ") + p;
    return m.end(HealthResult{false, why, "", 0});
  }
  if (m.command.empty()) return m.end(HealthResult{});
  ProcessSpec spec;
  spec.executable = "/bin/sh";
  spec.argv = {"/bin/sh", "-c", m.command};
  for (const auto& [name, value] : m.env) spec.envp.push_back(name + "=" + value);
  spec.cgroup_procs_fd = m.cgroup_procs_fd;
  spec.watcher_fd = m.watcher_fd;
  auto launched = m.launcher.launch(spec);
  if (!launched)
    return m.end(HealthResult{
        false, "the health check could not start: " + launched.error().message, "", 0});
  const LaunchedProcess& p = *launched;
  m.pid = p.pid;
  m.pipes[0].assign(p.stdout_fd);
  m.pipes[1].assign(p.stderr_fd);
  m.read(0);
  m.read(1);
  m.timer->arm(m.clock.now() + m.timeout, [&m, gen = m.generation] {
    if (gen != m.generation || m.exited) return;
    // Past the timeout: the whole group goes. Its exit, reaped as usual, ends the check; a
    // command the kernel holds (a hung mount) ends it after the grace without its exit.
    m.timed_out = true;
    m.launcher.signal_group(m.pid, SIGKILL);
    m.arm_grace();
  });
}

bool HealthCheckRunner::on_exit(pid_t pid, ExitStatus status) {
  Impl& m = *impl_;
  if (pid <= 0) return false;
  if (m.discarded.erase(pid) > 0) return true;
  if (pid != m.pid || m.exited) return false;
  m.launcher.signal_group(pid, SIGKILL);  // whatever it left in its group
  m.exited = true;
  m.status = status;
  m.timer->cancel();
  if (!m.timed_out) m.arm_grace();  // after a timeout, its grace runs already
  m.maybe_end();
  return true;
}

void HealthCheckRunner::stop() { impl_->end(std::nullopt); }

}  // namespace ddprun::agent
