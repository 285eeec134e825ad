#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ddprun::testing {
namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "ddprun-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

Subprocess::Subprocess(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& extra_env) {
  std::string tmpl = (fs::temp_directory_path() / "ddprun-proc-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : extra_env) env[k] = v;
  std::vector<std::string> envs;
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const std::string out = dir_ + "/out", err = dir_ + "/err";
  pid_ = ::fork();
  if (pid_ == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int n = ::open("/dev/null", O_RDONLY);
    ::dup2(n, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  if (pid_ < 0) throw std::runtime_error("fork failed");
}

Subprocess::~Subprocess() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

CommandResult Subprocess::wait(std::chrono::milliseconds limit) {
  CommandResult r;
  if (reaped_) {
    r.exit_code = exit_code_;
    r.timed_out = timed_out_;
    r.out = out_so_far();
    r.err = err_so_far();
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (true) {
    pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reaped_ = true;
  r.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  exit_code_ = r.exit_code;
  timed_out_ = r.timed_out;
  r.out = out_so_far();
  r.err = err_so_far();
  return r;
}

std::string Subprocess::out_so_far() const { return read_file(dir_ + "/out"); }
std::string Subprocess::err_so_far() const { return read_file(dir_ + "/err"); }

void Subprocess::send(int sig) {
  if (!reaped_) ::kill(pid_, sig);
}

bool Subprocess::wait_for_output(const std::string& text, std::chrono::milliseconds limit) const {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (out_so_far().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

CommandResult run_command(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& extra_env,
                          std::chrono::milliseconds limit) {
  Subprocess p(argv, extra_env);
  return p.wait(limit);
}

bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie has ended; only its parent's wait is missing.
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat.size()) return false;
  return stat[close_paren + 2] != 'Z';
}

bool blocked_in_syscall(pid_t pid, long number, long first_argument) {
  // "<number> <arguments in hex...>" while blocked in a call; "running" or nothing otherwise.
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/syscall"));
  long current = -1;
  std::string argument;
  return static_cast<bool>(in >> current >> argument) && current == number &&
         std::strtol(argument.c_str(), nullptr, 16) == first_argument;
}

std::string environment_of(pid_t pid, const std::string& name) {
  const std::string environ = read_file("/proc/" + std::to_string(pid) + "/environ");
  const std::string prefix = name + "=";
  for (std::size_t at = 0; at < environ.size();) {
    const std::size_t end = std::min(environ.find('\0', at), environ.size());
    if (environ.compare(at, prefix.size(), prefix) == 0)
      return environ.substr(at + prefix.size(), end - at - prefix.size());
    at = end + 1;
  }
  return "";
}

}  // namespace ddprun::testing

namespace ddprun::testing {

std::string describe_process_tree(pid_t root) {
  std::map<pid_t, pid_t> parent;
  std::map<pid_t, std::string> state;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 4 > stat.size()) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string st;
    long ppid = 0;
    rest >> st >> ppid;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    parent[pid] = static_cast<pid_t>(ppid);
    state[pid] = st;
  }
  std::vector<pid_t> tree{root};
  for (size_t i = 0; i < tree.size(); ++i)
    for (const auto& [pid, pp] : parent)
      if (pp == tree[i]) tree.push_back(pid);
  std::ostringstream out;
  for (pid_t pid : tree) {
    std::string cmd = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    out << "pid " << pid << " ppid " << parent[pid] << " state " << state[pid] << " wchan "
        << read_file("/proc/" + std::to_string(pid) + "/wchan") << " : " << cmd << "\n";
  }
  return out.str();
}

CommandResult run_command_diagnosed(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& extra_env,
                                    std::chrono::milliseconds limit) {
  Subprocess p(argv, extra_env);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (process_alive(p.pid()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::string tree;
  if (process_alive(p.pid())) {
    tree = describe_process_tree(p.pid());
    // SIGABRT makes a Python started with PYTHONFAULTHANDLER=1 print every thread's stack.
    std::istringstream lines(tree);
    for (std::string word, pid_text; lines >> word >> pid_text;) {
      std::string rest;
      std::getline(lines, rest);
      if (word == "pid" && std::stol(pid_text) != p.pid() &&
          rest.find("python") != std::string::npos)
        ::kill(static_cast<pid_t>(std::stol(pid_text)), SIGABRT);
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  CommandResult r = p.wait(std::chrono::milliseconds(100));
  if (!tree.empty()) {
    // Also at once, on the test's own stderr, with the last 120 lines the command wrote there: a
    // long failure message may be cut where CI shows it, and its head is what survives.
    size_t from = r.err.size();
    for (int lines = 0; from > 0 && lines <= 120;)
      if (r.err[--from] == '\n') ++lines;
    std::cerr << "--- " << argv.at(0) << " still ran at the time limit:\n"
              << tree << "--- the end of its stderr:\n"
              << r.err.substr(from) << "\n---" << std::endl;
    r.err += "\n--- still running at the time limit:\n" + tree;
  }
  return r;
}

}  // namespace ddprun::testing
