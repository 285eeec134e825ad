#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

/// How the user asked the script to be run.
struct CommandRequest {
  std::string script;
  std::vector<std::string> script_args;
  bool module = false;                  ///< -m
  bool no_python = false;               ///< --no_python
  std::string python_exec = "python3";  ///< PYTHON_EXEC, else python3
};

/// Builds a worker's argv: `python -u script args`, `python -u -m module args`, or the script
/// itself with --no_python or when it is an executable that is not a .py file.
/// `is_executable_file` is injected so the rule is testable without a file system.
std::vector<std::string> build_worker_command(
    const CommandRequest& req, const std::function<bool(const std::string&)>& is_executable_file);

/// True when `path` names a regular file the current user may execute.
bool is_executable_file(const std::string& path);

/// The PATH that worker commands are searched in: the environment's, else "/usr/bin:/bin".
std::string search_path(const std::map<std::string, std::string>& env);

/// Resolves a program name through PATH (names with a '/' are taken as they are).
/// Returns "" when nothing executable is found.
std::string resolve_executable(const std::string& name, const std::string& path_env);

}  // namespace ddprun::agent
