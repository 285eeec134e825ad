#include "agent/health_check.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

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
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
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
  Impl(asio::io_context& io, ProcessLauncher& launcher, HealthInputs inputs, std::string command,
       std::chrono::milliseconds timeout, EnvMap env)
      : io(io),
        launcher(launcher),
        inputs(std::move(inputs)),
        command(std::move(command)),
        timeout(timeout),
        env(std::move(env)),
        timer(io),
        pipes{asio::posix::stream_descriptor(io), asio::posix::stream_descriptor(io)} {}

  void finish(HealthResult result) {
    timer.cancel();
    for (auto& pipe : pipes) {
      drain(pipe);
      boost::system::error_code ignored;
      pipe.close(ignored);
    }
    pid = -1;
    result.output = output;
    result.ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - started)
                    .count();
    auto callback = std::move(done);
    done = nullptr;
    if (callback)
      asio::post(
          io, [callback = std::move(callback), result = std::move(result)] { callback(result); });
  }

  void keep(const char* data, std::size_t n) {
    output.append(data, n);
    if (output.size() > kKeptOutput) output.erase(0, output.size() - kKeptOutput);
  }

  /// What the pipe holds now, without waiting (the command has ended).
  void drain(asio::posix::stream_descriptor& pipe) {
    if (!pipe.is_open()) return;
    boost::system::error_code ec;
    pipe.non_blocking(true, ec);
    std::array<char, 4096> buffer{};
    for (int i = 0; i < 64 && !ec; ++i) {
      const std::size_t n = pipe.read_some(asio::buffer(buffer), ec);
      if (n > 0) keep(buffer.data(), n);
    }
  }

  void read(std::size_t which) {
    auto& pipe = pipes[which];
    pipe.async_read_some(asio::buffer(buffers[which]),
                         [this, which](const boost::system::error_code& ec, std::size_t n) {
                           if (n > 0) keep(buffers[which].data(), n);
                           if (!ec) read(which);
                         });
  }

  asio::io_context& io;
  ProcessLauncher& launcher;
  HealthInputs inputs;
  std::string command;
  std::chrono::milliseconds timeout;
  EnvMap env;
  HealthBaseline baseline;
  asio::steady_timer timer;
  std::array<asio::posix::stream_descriptor, 2> pipes;
  std::array<std::array<char, 4096>, 2> buffers{};
  std::string output;
  pid_t pid = -1;
  bool timed_out = false;
  std::chrono::steady_clock::time_point started;
  std::function<void(HealthResult)> done;
};

HealthCheckRunner::HealthCheckRunner(asio::io_context& io, ProcessLauncher& launcher,
                                     HealthInputs inputs, std::string command,
                                     std::chrono::milliseconds timeout, EnvMap env)
    : impl_(std::make_unique<Impl>(io, launcher, std::move(inputs), std::move(command), timeout,
                                   std::move(env))) {}

HealthCheckRunner::~HealthCheckRunner() { stop(); }

void HealthCheckRunner::run(std::function<void(HealthResult)> done) {
  Impl& m = *impl_;
  stop();
  m.done = std::move(done);
  m.output.clear();
  m.timed_out = false;
  m.started = std::chrono::steady_clock::now();
  const std::vector<std::string> problems = builtin_health_problems(m.inputs, m.baseline);
  if (!problems.empty()) {
    std::string why;
    for (const std::string& p : problems) why += (why.empty() ? "" : "; ") + p;
    return m.finish(HealthResult{false, why, "", 0});
  }
  if (m.command.empty()) return m.finish(HealthResult{});
  ProcessSpec spec;
  spec.executable = "/bin/sh";
  spec.argv = {"/bin/sh", "-c", m.command};
  for (const auto& [name, value] : m.env) spec.envp.push_back(name + "=" + value);
  auto launched = m.launcher.launch(spec);
  if (const auto* why = std::get_if<std::string>(&launched))
    return m.finish(HealthResult{false, "the health check could not start: " + *why, "", 0});
  const LaunchedProcess& p = std::get<LaunchedProcess>(launched);
  m.pid = p.pid;
  m.pipes[0].assign(p.stdout_fd);
  m.pipes[1].assign(p.stderr_fd);
  m.read(0);
  m.read(1);
  m.timer.expires_after(m.timeout);
  m.timer.async_wait([&m](const boost::system::error_code& ec) {
    if (ec || m.pid <= 0) return;
    // Past the timeout: the whole group goes; the exit, reaped as usual, ends the check.
    m.timed_out = true;
    m.launcher.signal_group(m.pid, SIGKILL);
  });
}

bool HealthCheckRunner::on_exit(pid_t pid, ExitStatus status) {
  Impl& m = *impl_;
  if (pid <= 0 || pid != m.pid) return false;
  m.launcher.signal_group(pid, SIGKILL);  // whatever it left in its group
  HealthResult result;
  result.ok = status.ok() && !m.timed_out;
  if (m.timed_out)
    result.why = "the health check ran past --health_check_timeout (" +
                 std::to_string(m.timeout.count() / 1000) + " s) and was killed";
  else if (!status.ok())
    result.why = "the health check `" + m.command + "` failed with " + describe_exit(status);
  m.finish(std::move(result));
  return true;
}

void HealthCheckRunner::stop() {
  Impl& m = *impl_;
  m.done = nullptr;
  m.timer.cancel();
  if (m.pid > 0) {
    m.launcher.signal_group(m.pid, SIGKILL);
    m.launcher.wait(m.pid);
    m.pid = -1;
  }
  for (auto& pipe : m.pipes) {
    boost::system::error_code ignored;
    pipe.close(ignored);
  }
}

}  // namespace ddprun::agent
