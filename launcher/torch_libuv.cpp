#include "launcher/torch_libuv.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "agent/worker_env.h"
#include "common/fd_read.h"

namespace ddprun::launcher {

// One word out: unknown, not-asked, available or missing. `-c` puts the working directory first
// on sys.path; the workers' torch is the installed one, so that entry goes.
const char* const kLibuvProbeProgram = R"py(import sys
del sys.path[0]
import importlib.util, os, re
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    print("unknown")
    sys.exit(0)
try:
    with open(os.path.join(spec.submodule_search_locations[0], "version.py")) as f:
        m = re.search(r"__version__\s*=\s*['\"](\d+)\.(\d+)", f.read())
    if m and (int(m.group(1)), int(m.group(2))) < (2, 4):
        print("not-asked")
        sys.exit(0)
except OSError:
    pass
from datetime import timedelta
try:
    from torch.distributed import TCPStore
except ImportError:
    print("unknown")
    sys.exit(0)
try:
    TCPStore("127.0.0.1", 1, is_master=False, wait_for_workers=False,
             timeout=timedelta(milliseconds=1))
except RuntimeError as e:
    print("missing" if "libuv" in str(e) else "available")
    sys.exit(0)
print("available")
)py";

TorchLibuv parse_libuv_probe(std::string_view output) {
  while (!output.empty() && (output.back() == '\n' || output.back() == ' '))
    output.remove_suffix(1);
  if (output == "not-asked") return TorchLibuv::NotAsked;
  if (output == "available") return TorchLibuv::Available;
  if (output == "missing") return TorchLibuv::Missing;
  return TorchLibuv::Unknown;
}

TorchLibuv probe_torch_libuv(const std::string& interpreter, const common::EnvMap& env,
                             std::chrono::milliseconds timeout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return TorchLibuv::Unknown;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  // launch() blocks the preemption notices until the agent handles them; the probe need not.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> args{interpreter, "-c", kLibuvProbeProgram};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> envp_strings = agent::to_envp(env);
  std::vector<char*> envp;
  for (auto& e : envp_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t child = -1;
  // An interpreter without a slash is looked up on PATH, as the workers' would be.
  const int spawned = ::posix_spawnp(&child, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    return TorchLibuv::Unknown;
  }
  std::string out;
  const bool timed_out =
      common::read_until_end(fds[0], std::chrono::steady_clock::now() + timeout, 4096, out);
  ::close(fds[0]);
  if (timed_out) ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return TorchLibuv::Unknown;
  return parse_libuv_probe(out);
}

bool names_python_interpreter(const std::string& program) {
  const std::string name = program.substr(program.rfind('/') + 1);
  if (name.rfind("python", 0) != 0) return false;
  return name.find_first_not_of("0123456789.", 6) == std::string::npos;
}

LibuvAdaptation adapt_to_libuv(TorchLibuv probed, bool agent_store, const common::EnvMap& env) {
  LibuvAdaptation a;
  if (probed != TorchLibuv::Missing) return a;
  a.agent_store_off = agent_store;
  const auto use_libuv = env.find("USE_LIBUV");
  a.set_use_libuv_0 = use_libuv == env.end() || use_libuv->second != "0";
  std::string did;
  if (a.agent_store_off) did = "turns its agent store off (worker rank 0 hosts the store)";
  if (a.set_use_libuv_0) did += std::string(did.empty() ? "" : " and ") + "sets USE_LIBUV=0";
  if (did.empty()) return a;  // --agent_store off and USE_LIBUV=0 already: nothing to say
  a.info =
      "the workers' torch was built without libuv, which its TCPStore asks for by default: "
      "ddprun " +
      did + " for the workers";
  return a;
}

}  // namespace ddprun::launcher
