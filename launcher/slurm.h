#pragma once
// SLURM awareness: what ddprun reads from a SLURM job's environment. Everything here but the
// two lookups at the bottom (DNS, scontrol) is pure; parse_command_line calls the pure parts with
// its EnvLookup, launch() resolves the endpoint's address. See docs/usage.md, section "SLURM".
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/result.h"

namespace ddprun::launcher {

/// Reads one environment variable; nullopt when unset (the same shape as cli.h's EnvLookup).
using SlurmEnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Expands a SLURM hostlist ("gpu[01-04,07]", "n[1-2],login", "a[1-2]b[3-4]") into node names,
/// in SLURM's order; zero-padded ranges keep their width. Returns an error message saying what
/// is wrong and where when the list is malformed.
common::Result<std::vector<std::string>> parse_hostlist(std::string_view hostlist);

/// Where ddprun runs relative to SLURM.
enum class SlurmContext {
  None,         ///< no SLURM_JOB_ID: not in a SLURM job
  BatchScript,  ///< in an allocation but outside srun: an sbatch script or an salloc shell
  Step,         ///< a task started by srun (SLURM_STEP_ID set)
};

/// The SLURM variables ddprun uses, read and checked.
struct SlurmJob {
  SlurmContext context = SlurmContext::None;
  std::string job_id;
  std::string step_id;
  std::optional<int> node_id;    ///< SLURM_NODEID: this node's index in the step (or job)
  std::optional<int> num_nodes;  ///< nodes of the step under srun, of the job outside it
  std::string num_nodes_var;     ///< which variable num_nodes came from
  std::optional<int> num_tasks;  ///< tasks of the step (SLURM_STEP_NUM_TASKS or SLURM_NTASKS)
  std::string num_tasks_var;
  std::optional<int> proc_id;  ///< SLURM_PROCID: this task's index in the step
  /// Outside srun: the fewest CPUs the job has on any of its nodes (SLURM_JOB_CPUS_PER_NODE,
  /// "72(x2),36" gives 36); nullopt when unset or unreadable.
  std::optional<int> min_cpus_per_node;
  std::string nodelist;      ///< the step's (or job's) hostlist, unexpanded
  std::string nodelist_var;  ///< which variable nodelist came from
};

/// Reads the SLURM variables through env; an error names a malformed variable and its value.
common::Result<SlurmJob> read_slurm_job(const SlurmEnvLookup& env);

/// SLURM_GPUS_ON_NODE: the GPUs SLURM allocated to this job on this node; nullopt when unset
/// or not a count. It resolves `--nproc_per_node gpu` inside a job.
std::optional<int> slurm_gpus_on_node(const SlurmEnvLookup& env);

/// What the user gave, as far as the SLURM defaults care: a flag or a PET_ variable counts.
struct UserChoices {
  std::function<bool(std::string_view option)> given;  ///< by canonical name, "nnodes"
  std::optional<std::string> nnodes;                   ///< the text given, nullopt when not
  std::optional<std::string> rdzv_backend;             ///< the text given, nullopt when not
  bool standalone = false;
};

/// One option value supplied by SLURM.
struct SlurmDefault {
  std::string option;  ///< canonical name, "nnodes"
  std::string value;   ///< as a user would type it, "2"
  std::string source;  ///< the variable it came from, "SLURM_NNODES"
};

/// The values SLURM supplies for the options the user left out, under srun.
struct SlurmFill {
  std::vector<SlurmDefault> values;
  /// What else SLURM's job decided, for the same info line ("--node_rank left to the
  /// rendezvous ...").
  std::vector<std::string> notes;
  /// Settings that fit the step badly but may be meant (--standalone on several nodes, more
  /// nodes asked for than the step has), one warning each.
  std::vector<std::string> warnings;
  /// The first node of the nodelist when the rendezvous endpoint is derived from it; its address
  /// is resolved at launch (resolve_node_address). "" when the endpoint is not derived.
  std::string endpoint_node;
};

/// Under srun (one task per node) fills --nnodes, --node_rank, --rdzv_id and, for a multi-node
/// c10d job, --rdzv_backend and --rdzv_endpoint <first node>:29400 where the user gave none.
/// --node_rank is left to the rendezvous when the step has more nodes than --nnodes allows
/// (the rest are spares), and c10d is not chosen when --master_addr was given (torchrun's static
/// rendezvous, which it configures).
/// Nothing outside a step or under --standalone. An error when srun started more than one
/// ddprun per node (each would claim the same node rank) or the nodelist is malformed.
common::Result<SlurmFill> slurm_defaults(const SlurmJob& job, const UserChoices& user);

/// What to do with a ddprun started outside srun.
struct FanOutDecision {
  enum class Action { RunHere, FanOut, Refuse } action = Action::RunHere;
  std::vector<std::string> srun_args;  ///< "srun", "--nodes=2", ... (FanOut and Refuse)
  std::string message;                 ///< the notice (FanOut) or the error (Refuse), one line
};

/// ddprun runs as the batch script's own process (or in an salloc shell) on a multi-node
/// allocation: one launcher for N nodes would wait for nodes that never come. Unless the user
/// asked for a single node (--standalone, --nnodes 1), ddprun reruns itself as
/// `srun --nodes=N --ntasks=N --ntasks-per-node=1 [--cpus-per-task=C] ddprun <args>` (C: the
/// job's CPUs per node, so the one task per node may use all of them for its workers), or,
/// with fan-out disabled, refuses with that line. `args` is ddprun's argv without argv[0].
FanOutDecision decide_fanout(const SlurmJob& job, const std::vector<std::string>& args,
                             bool single_node_requested, bool node_rank_given, bool fanout_disabled,
                             const std::string& disabled_by);

/// The smallest count in a SLURM_JOB_CPUS_PER_NODE value ("72(x2),36" gives 36); nullopt when
/// the text is not of that form.
std::optional<int> min_cpus_per_node(std::string_view text);

/// Quotes one argument for a POSIX shell when it needs quoting.
std::string shell_quote(const std::string& arg);

/// The rendezvous host for a SLURM node and how it was found.
struct NodeAddress {
  std::string host;
  std::string how;  ///< "DNS" or "NodeAddr from scontrol"
};

/// The node's own name when it resolves through DNS, else its NodeAddr from scontrol; an error
/// naming the node and the fix when neither works. The lookups are injected.
common::Result<NodeAddress> resolve_node_address(
    const std::string& node, const std::function<bool(const std::string&)>& resolves,
    const std::function<std::optional<std::string>(const std::string&)>& node_addr);

/// The NodeAddr= value of `scontrol show node -o NAME` output; nullopt when absent.
std::optional<std::string> parse_node_addr(std::string_view scontrol_output);

/// "host:port", with IPv6 literals in brackets.
std::string format_endpoint(const std::string& host, int port);

// Effects, used by launch() only.

/// Whether getaddrinfo finds an address for the name.
bool host_resolves(const std::string& name);

/// Runs `scontrol show node -o NAME` (bounded: 30 s) and returns its NodeAddr.
std::optional<std::string> scontrol_node_addr(const std::string& node);

}  // namespace ddprun::launcher
