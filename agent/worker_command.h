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

/// True when the request runs under the Python interpreter (`python -u [-m] script`), as
/// build_worker_command decides.
bool runs_under_python(const CommandRequest& req,
                       const std::function<bool(const std::string&)>& is_executable_file);

/// The command of a Python standby (--standby_workers): `python -u <bootstrap> [--zygote]
/// [--preload=a,b] -- <script or -m module> args`, from the worker's `python -u ...` command;
/// with `zygote`, the node's zygote that forks the standbys (agent/python_zygote.h).
std::vector<std::string> build_python_standby_command(const std::vector<std::string>& worker_argv,
                                                      const std::string& bootstrap,
                                                      const std::vector<std::string>& preload,
                                                      bool zygote = false);

/// True when Python source imports torch at the start of a line (`import torch`, `import
/// torch.distributed as dist`, `from torch import nn`, `import os, torch`): what
/// --standby_workers=auto looks for before it has a script's interpreter import torch ahead.
bool source_imports_torch(const std::string& source);

/// The Python source --standby_workers=auto reads for a request: the script, or for -m the
/// module's file (or its package's __main__.py) under `cwd`. "" when there is none.
std::string python_source_of(const CommandRequest& req, const std::string& cwd);

/// The Python standby bootstrap that ships with ddprun, found from the path of the running
/// ddprun executable: `<dir of ddprun>/../share/ddprun/ddprun_standby.py`, the same in the
/// build tree and in an installed tree. "" when it is not there.
std::string find_python_bootstrap(const std::string& ddprun_executable);

/// True when `path` names a regular file the current user may execute.
bool is_executable_file(const std::string& path);

/// The PATH that worker commands are searched in: the environment's, else "/usr/bin:/bin".
std::string search_path(const std::map<std::string, std::string>& env);

/// Resolves a program name through PATH (names with a '/' are taken as they are).
/// Returns "" when nothing executable is found.
std::string resolve_executable(const std::string& name, const std::string& path_env);

}  // namespace ddprun::agent
