#include "ddprun/sdk/context.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "common/env.h"
#include "common/standby_protocol.h"
#include "common/strings.h"
#include "ddprun/sdk/agent_report.h"
#include "ddprun/sdk/preemption.h"

namespace ddprun::sdk {
namespace {

constexpr const char* kHowToStart = "start this program with ddprun or torchrun";

/// Reads an integer variable into `out`; returns the error text or "".
std::string read_int(const EnvMap& env, const std::string& name, bool required, long long min,
                     long long max, int& out) {
  auto it = env.find(name);
  if (it == env.end()) {
    if (required) return name + " is not set: " + kHowToStart;
    return "";
  }
  std::optional<long long> v = common::parse_int(common::trim(it->second));
  if (!v) return name + "=\"" + it->second + "\" is not an integer: " + kHowToStart;
  if (*v < min || *v > max)
    return name + "=" + it->second + " is out of range [" + std::to_string(min) + ", " +
           std::to_string(max) + "]";
  out = static_cast<int>(*v);
  return "";
}

}  // namespace

std::variant<WorkerContext, std::string> parse_worker_context(const EnvMap& env) {
  WorkerContext c;
  constexpr long long kMaxInt = 1 << 30;
  struct IntVar {
    const char* name;
    bool required;
    long long min;
    long long max;
    int* out;
  };
  const IntVar ints[] = {
      {"RANK", true, 0, kMaxInt, &c.rank},
      {"LOCAL_RANK", true, 0, kMaxInt, &c.local_rank},
      {"WORLD_SIZE", true, 1, kMaxInt, &c.world_size},
      {"LOCAL_WORLD_SIZE", true, 1, kMaxInt, &c.local_world_size},
      {"MASTER_PORT", true, 1, 65535, &c.master_port},
      {"GROUP_RANK", false, 0, kMaxInt, &c.group_rank},
      {"TORCHELASTIC_RESTART_COUNT", false, 0, kMaxInt, &c.restart_count},
      {"TORCHELASTIC_MAX_RESTARTS", false, 0, kMaxInt, &c.max_restarts},
  };
  for (const IntVar& v : ints)
    if (std::string err = read_int(env, v.name, v.required, v.min, v.max, *v.out); !err.empty())
      return err;
  auto addr = env.find("MASTER_ADDR");
  if (addr == env.end() || common::trim(addr->second).empty())
    return std::string("MASTER_ADDR is not set: ") + kHowToStart;
  c.master_addr = common::trim(addr->second);
  if (c.rank >= c.world_size)
    return "RANK=" + std::to_string(c.rank) +
           " is not below WORLD_SIZE=" + std::to_string(c.world_size);
  if (c.local_rank >= c.local_world_size)
    return "LOCAL_RANK=" + std::to_string(c.local_rank) +
           " is not below LOCAL_WORLD_SIZE=" + std::to_string(c.local_world_size);
  if (auto it = env.find("TORCHELASTIC_RUN_ID"); it != env.end()) c.run_id = it->second;
  if (auto it = env.find("TORCHELASTIC_ERROR_FILE"); it != env.end()) c.error_file = it->second;
  if (auto it = env.find("TORCHELASTIC_USE_AGENT_STORE"); it != env.end()) {
    const std::string v = common::to_lower(common::trim(it->second));
    if (v == "true" || v == "1") {
      c.use_agent_store = true;
    } else if (v != "false" && v != "0" && !v.empty()) {
      return "TORCHELASTIC_USE_AGENT_STORE=\"" + it->second + "\" is neither True nor False";
    }
  }
  return c;
}

std::variant<EnvMap, std::string> parse_standby_handover(const std::string& message) {
  auto doc = nlohmann::json::parse(message, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("env") || !doc["env"].is_object())
    return std::string("not an object with an \"env\" object");
  EnvMap env;
  for (const auto& [key, value] : doc["env"].items()) {
    if (!value.is_string() || key.empty() || key.find('=') != std::string::npos)
      return "bad variable \"" + key + "\"";
    env.emplace(key, value.get<std::string>());
  }
  return env;
}

std::variant<EnvMap, StandbyReleased, std::string> receive_standby_handover(int fd) {
  std::string message;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return "reading the standby hand-over from ddprun: " + why;
    }
    if (n == 0) break;
    message.append(chunk, static_cast<size_t>(n));
  }
  if (message.empty()) {
    ::close(fd);
    return StandbyReleased{};
  }
  auto env = parse_standby_handover(message);
  if (auto* why = std::get_if<std::string>(&env)) {
    ::close(fd);
    return "bad standby hand-over from ddprun: " + *why;
  }
  // The agent waits for this byte before it counts this process as the worker. MSG_NOSIGNAL:
  // an agent already gone must not kill us with SIGPIPE (PDEATHSIG does that job).
  const char ack = common::kStandbyAck;
  ssize_t sent;
  do {
    sent = ::send(fd, &ack, 1, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  ::close(fd);
  return std::get<EnvMap>(std::move(env));
}

namespace {

/// A standby process (ddprun --standby_workers) waits here, with its libraries loaded, until
/// the agent hands it the environment of the worker it becomes (agent/standby_pool.h). An end
/// of file without a message means the agent no longer needs it.
void become_worker_if_standby() {
  const char* fd_text = std::getenv(common::kStandbyFdVariable);
  if (fd_text == nullptr) return;
  const std::optional<long long> fd = common::parse_int(fd_text);
  if (!fd || *fd < 0 || *fd > 1'000'000)
    throw std::runtime_error(std::string(common::kStandbyFdVariable) + "=\"" + fd_text +
                             "\" is not a descriptor: it is set by ddprun only");
  auto received = receive_standby_handover(static_cast<int>(*fd));
  if (std::holds_alternative<StandbyReleased>(received))
    ::_exit(0);  // never became a worker: nothing to clean up or report
  if (auto* why = std::get_if<std::string>(&received)) throw std::runtime_error(*why);
  ::clearenv();
  for (const auto& [key, value] : std::get<EnvMap>(received))
    ::setenv(key.c_str(), value.c_str(), 1);
}

}  // namespace

WorkerContext WorkerContext::from_env() {
  static std::once_flag standby;
  std::call_once(standby, become_worker_if_standby);
  auto parsed = parse_worker_context(current_environment());
  if (auto* err = std::get_if<std::string>(&parsed)) throw std::runtime_error(*err);
  // The first call marks, in the agent's event log, the end of process start-up (exec and
  // the loading of libtorch) and the start of the process group's set-up.
  static std::once_flag reported;
  std::call_once(reported, [] { report_to_agent("worker_main"); });
  // From here on a preemption notice (SIGUSR1) sets checkpoint_requested() instead of killing.
  install_checkpoint_handler();
  return std::get<WorkerContext>(parsed);
}

std::string agent_store_prefix(int restart_count) {
  return "/worker/attempt_" + std::to_string(restart_count);
}

EnvMap current_environment() { return common::current_environment(); }

}  // namespace ddprun::sdk
