#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

/// How the user asked the script to be run.
struct CommandRequest {
  std::string script;
  std::vector<std::string> script_args;
  bool module = false;                  ///< -m
  bool no_python = false;               ///< --no_python
  std::string python_exec = "python3";  ///< PYTHON_EXEC, else python3
  bool run_path = false;                ///< --run_path: runpy.run_path(script) in python -u -c
  /// --local_rank_arg: "local-rank" or "local_rank" puts `--<it>=${local_rank}` after the
  /// script, as torch.distributed.launch does (2.x spells it with a dash, 1.x with "_").
  std::string local_rank_arg{};
};

/// The code `python -u -c` runs for --run_path, as torchrun's run_script_path: sys.argv becomes
/// [script, args...] and runpy.run_path(script, run_name="__main__") runs it.
extern const char* const kRunPathCode;

/// Builds a worker's argv: `python -u script args`, `python -u -m module args`, or the script
/// itself with --no_python or when it is a program (is_program_file): an executable that is not
/// a .py file nor a Python script by its "#!" line. Such a program named without a '/' is the
/// one in the working directory, as `python -u script` would read it (`./trainer`); with
/// --no_python a name without a '/' is searched through PATH, as torchrun does.
/// `is_program_file` is injected so the rule is testable without a file system.
std::vector<std::string> build_worker_command(
    const CommandRequest& req, const std::function<bool(const std::string&)>& is_program_file);

/// The argv of the worker of `local_rank`, as torchrun's agent makes each worker's
/// (macros.substitute, Python's string.Template.safe_substitute): `${local_rank}` and
/// `$local_rank` in every argument after the program become the local rank, `$$` becomes `$`,
/// and anything else is kept byte for byte.
std::vector<std::string> argv_for_local_rank(const std::vector<std::string>& argv, int local_rank);

/// For a Python standby forked from the node's zygote, which was started with the script and
/// arguments as written: the script (or module) and arguments the worker of `local_rank` runs
/// instead (argv_for_local_rank of `worker_argv`, the `python -u [-m|-c CODE] script args`
/// command); empty when they are the same.
std::vector<std::string> standby_script_argv(const std::vector<std::string>& worker_argv,
                                             int local_rank);

/// True when the request runs under the Python interpreter (`python -u [-m] script`), as
/// build_worker_command decides.
bool runs_under_python(const CommandRequest& req,
                       const std::function<bool(const std::string&)>& is_program_file);

/// Bytes of room (kPythonStandbyRoomPrefix and as many dots) in a Python standby's arguments.
inline constexpr char kPythonStandbyRoomPrefix[] = "--room=";
inline constexpr std::size_t kPythonStandbyRoom = 4096;

/// --standby_cuda: what a Python standby makes ready on its GPU while it waits
/// (agent/python/ddprun_standby.py, warm_cuda): nothing, the device's CUDA context, or the
/// context and a first small training step through torch (cuBLAS, the first kernels).
enum class StandbyCuda { Off, Context, Warm };

/// What a Python standby does besides importing torch and the script's top-level imports.
struct PythonStandbyOptions {
  std::vector<std::string> preload;  ///< --standby_preload: modules it imports too
  StandbyCuda cuda = StandbyCuda::Off;
};

/// The command of a Python standby (--standby_workers): `python -u <bootstrap> [--zygote]
/// --room=... [--preload=a,b] [--cuda=context|warm] [--run-path] -- <script or -m module>
/// args`, from the worker's `python -u ...` command (--run-path for `python -u -c
/// kRunPathCode script args`); with `zygote`, the node's zygote that forks the standbys
/// (agent/python_zygote.h).
std::vector<std::string> build_python_standby_command(const std::vector<std::string>& worker_argv,
                                                      const std::string& bootstrap,
                                                      const PythonStandbyOptions& options,
                                                      bool zygote = false);

/// True when Python source imports torch at the start of a line (`import torch`, `import
/// torch.distributed as dist`, `from torch import nn`, `import os, torch`): what
/// --standby_workers=auto looks for before it has a script's interpreter import torch ahead.
bool source_imports_torch(const std::string& source);

/// The modules Python source imports by absolute name, in order, each once and at most
/// `limit`: `import a.b as x, c` gives "a.b" and "c"; `from a.b import c, d` gives "a.b",
/// "a.b.c" and "a.b.d" (c and d may be submodules). Relative imports are left out.
std::vector<std::string> imported_modules(const std::string& source, size_t limit = 64);

/// The Python source --standby_workers=auto reads for a request: the script, or for -m the
/// module's file (or its package's __main__.py) under `cwd`. "" when there is none.
std::string python_source_of(const CommandRequest& req, const std::string& cwd);

/// The Python standby bootstrap that ships with ddprun, found from the path of the running
/// ddprun executable: `<dir of ddprun>/../share/ddprun/ddprun_standby.py`, the same in the
/// build tree and in an installed tree. "" when it is not there.
std::string find_python_bootstrap(const std::string& ddprun_executable);

/// True when `path` names a regular file the current user may execute.
bool is_executable_file(const std::string& path);

/// The Python interpreter that the "#!" line at the start of a file (its first bytes) runs, as
/// written there: the program, when its last path component starts with "python"
/// (`#!/opt/conda/bin/python` gives "/opt/conda/bin/python"), or, after `env` and its options
/// and NAME=VALUE settings, the name env looks up (`#!/usr/bin/env -S python3 -u` gives
/// "python3"). nullopt for any other start (`#!/bin/sh python_setup.sh`, an ELF file).
std::optional<std::string> shebang_python(std::string_view start);

/// shebang_python(start) names an interpreter.
bool shebang_runs_python(std::string_view start);

/// True when a file that starts with `start` (its first bytes) is a program the kernel runs: a
/// "#!" line that does not run Python (shebang_runs_python), or a binary (ELF, or any start
/// with a NUL byte: a format binfmt_misc may know). A text file without a "#!" line is not
/// (the kernel refuses it); nor is an empty one.
bool starts_a_program(std::string_view start);

/// True when `path` is an executable file that ddprun runs as a program without --no_python
/// (starts_a_program); any other script runs under `python -u`, as torchrun runs every
/// script: one on a file system where every file is executable too.
bool is_program_file(const std::string& path);

/// The PATH that worker commands are searched in: the environment's, else "/usr/bin:/bin".
std::string search_path(const std::map<std::string, std::string>& env);

/// Resolves a program name through PATH (names with a '/' are taken as they are).
/// Returns "" when nothing executable is found.
std::string resolve_executable(const std::string& name, const std::string& path_env);

}  // namespace ddprun::agent
