#include "agent/worker_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include "common/strings.h"

namespace ddprun::agent {

std::vector<std::string> build_worker_command(
    const CommandRequest& req, const std::function<bool(const std::string&)>& is_executable_file) {
  std::vector<std::string> argv;
  const bool is_py = req.script.size() >= 3 && req.script.ends_with(".py");
  if (req.no_python || (!req.module && !is_py && is_executable_file(req.script))) {
    argv.push_back(req.script);
  } else {
    argv = {req.python_exec, "-u"};
    if (req.module) argv.push_back("-m");
    argv.push_back(req.script);
  }
  argv.insert(argv.end(), req.script_args.begin(), req.script_args.end());
  return argv;
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string search_path(const std::map<std::string, std::string>& env) {
  auto it = env.find("PATH");
  return it == env.end() || it->second.empty() ? "/usr/bin:/bin" : it->second;
}

std::string resolve_executable(const std::string& name, const std::string& path_env) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  for (const std::string& dir : common::split(path_env, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
  }
  return "";
}

}  // namespace ddprun::agent
