#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun::launcher {

/// ddprun's flags: one row each in launcher/cli.cpp's kOptions, in this order (that of --help).
enum class Flag : std::size_t {
  Nnodes,
  NprocPerNode,
  VirtualLocalRank,
  NumaBinding,
  NodeRank,
  Standalone,
  RdzvBackend,
  RdzvEndpoint,
  RdzvId,
  RdzvConf,
  MasterAddr,
  MasterPort,
  AgentStore,
  LocalAddr,
  MaxRestarts,
  MonitorInterval,
  ShutdownTimeout,
  SignalsToHandle,
  WatchdogTimeout,
  RestartBackoff,
  RestartBackoffReset,
  RestartWindow,
  CrashLoopStop,
  QuarantineAfter,
  QuarantineCooldown,
  ProgressFile,
  FatalExitCodes,
  HealthCheck,
  HealthCheckTimeout,
  HealthCheckInterval,
  StandbyWorkers,
  StandbyPreload,
  StandbyCuda,
  Cleanup,
  StartMethod,
  Role,
  Module,
  NoPython,
  RunPath,
  LocalRankArg,
  LogDir,
  EventLog,
  MetricsPort,
  MetricsHost,
  Redirects,
  Tee,
  LocalRanksFilter,
  DedupOutput,
  DuplicateStdoutFilters,
  DuplicateStderrFilters,
  LogsSpecs,
  EventLogHandler,
  NoSlurmFanout,
};
constexpr std::size_t kFlagCount = static_cast<std::size_t>(Flag::NoSlurmFanout) + 1;

/// A flag's spellings as CLI11 takes them ("--rdzv_endpoint,--rdzv-endpoint"), and its PET_
/// variable ("PET_RDZV_ENDPOINT"): for `ddprun status`, which shares some of them.
std::string flag_spellings(Flag flag);
std::string flag_env_name(Flag flag);

/// Reads one environment variable; nullopt when unset. Injected so parsing stays pure.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// The user asked for --help or --version: print text (it ends with a newline) to stdout as-is
/// and exit 0.
struct InfoRequest {
  std::string text;
};

/// A bad flag, value or PET_ variable: one line naming the value and the fix (exit kExitUsage).
struct UsageError {
  std::string message;
};

/// ddprun runs outside srun on a multi-node SLURM allocation: rerun it as `srun_args ddprun
/// args` (one ddprun per node) after printing the notice.
struct SlurmFanOut {
  std::vector<std::string> srun_args;  ///< "srun", "--nodes=2", "--ntasks=2", ...
  std::vector<std::string> args;       ///< ddprun's own arguments, unchanged
  std::string notice;                  ///< one line saying what happens and how to stop it
};

using ParseResult = std::variant<LaunchConfig, InfoRequest, UsageError, SlurmFanOut>;

/// The configuration of a command line that sets no flag: every default, from the flag table
/// (launcher/cli.cpp's kOptions); a LaunchConfig{} holds zeroes.
LaunchConfig default_launch_config();

/// Parses ddprun's command line (argv[0] excluded) and PET_<NAME> variables into a validated
/// LaunchConfig. Flags win over PET_ variables, which win over what a SLURM job step supplies
/// (SLURM_* variables, read through the same env; see launcher/slurm.h); everything from the
/// script on is untouched.
ParseResult parse_command_line(const std::vector<std::string>& args, const EnvLookup& env);

}  // namespace ddprun::launcher
