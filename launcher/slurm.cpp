#include "launcher/slurm.h"

#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>

#include "common/strings.h"
#include "rendezvous/endpoint.h"

namespace ddprun::launcher {
namespace {

/// More names than any cluster has: a typo such as n[1-9999999] fails instead of eating memory.
constexpr size_t kMaxHostlistNames = 100'000;

/// The batch step's id as SLURM numbers it (SLURM_BATCH_SCRIPT); "batch" in some versions.
constexpr std::string_view kBatchStepId = "4294967294";
/// The extern step (SLURM_EXTERN_CONT): processes adopted into the job, not started by srun.
constexpr std::string_view kExternStepId = "4294967295";

std::string at_char(size_t index) { return "at character " + std::to_string(index + 1); }

bool all_digits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// "7" padded to width with zeros: "007".
std::string padded(long long value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

/// The numbers inside one pair of brackets, "01-04,07", as strings with their padding.
/// `offset` is where the text starts in the whole list, for error positions.
common::Result<std::vector<std::string>> expand_ranges(std::string_view text, size_t offset) {
  using common::Error;
  std::vector<std::string> out;
  if (text.empty()) return Error{"empty brackets " + at_char(offset - 1) + "; expected e.g. [1-4]"};
  size_t start = 0;
  for (const std::string& piece : common::split(text, ',')) {
    const size_t where = offset + start;
    start += piece.size() + 1;
    if (piece.empty()) return Error{"empty range " + at_char(where) + " inside brackets"};
    const size_t dash = piece.find('-');
    const std::string lo_text = piece.substr(0, dash);
    const std::string hi_text = dash == std::string::npos ? lo_text : piece.substr(dash + 1);
    if (!all_digits(lo_text) || !all_digits(hi_text) || lo_text.size() > 18 ||
        hi_text.size() > 18) {
      return Error{"'" + piece + "' " + at_char(where) +
                   " is not a number or a range of numbers such as 01-04"};
    }
    const long long lo = *common::parse_int(lo_text);
    const long long hi = *common::parse_int(hi_text);
    if (hi < lo) return Error{"range " + piece + " " + at_char(where) + " runs backwards"};
    if (static_cast<unsigned long long>(hi - lo) >= kMaxHostlistNames) {
      return Error{"range " + piece + " " + at_char(where) + " has more than " +
                   std::to_string(kMaxHostlistNames) + " names"};
    }
    for (long long n = lo; n <= hi; ++n) out.push_back(padded(n, lo_text.size()));
  }
  return out;
}

/// One comma-free item such as "gpu[01-04]" or "a[1-2]b[3-4]": every combination of its
/// bracket groups, the leftmost varying slowest.
std::optional<common::Error> expand_item(std::string_view list, size_t begin, size_t end,
                                         std::vector<std::string>& names) {
  if (begin == end)
    return common::Error{"empty node name " + at_char(begin) + " (two commas, or one at an end)"};
  std::vector<std::string> partial{""};
  size_t i = begin;
  while (i < end) {
    if (list[i] != '[') {
      const size_t next = std::min(list.find('[', i), end);
      for (std::string& name : partial) name += list.substr(i, next - i);
      i = next;
      continue;
    }
    const size_t close = list.find(']', i);  // balanced: checked by the caller
    auto numbers = expand_ranges(list.substr(i + 1, close - i - 1), i + 1);
    if (!numbers) return numbers.error();
    const std::vector<std::string>& values = *numbers;
    if (partial.size() * values.size() + names.size() > kMaxHostlistNames) {
      return common::Error{"the list expands to more than " + std::to_string(kMaxHostlistNames) +
                           " names"};
    }
    std::vector<std::string> combined;
    combined.reserve(partial.size() * values.size());
    for (const std::string& prefix : partial)
      for (const std::string& value : values) combined.push_back(prefix + value);
    partial = std::move(combined);
    i = close + 1;
  }
  names.insert(names.end(), partial.begin(), partial.end());
  return std::nullopt;
}

std::optional<int> parse_count(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  auto value = common::parse_int(common::trim(*text));
  if (!value || *value < 0 || *value > 1'000'000) return std::nullopt;
  return static_cast<int>(*value);
}

/// The first of several variables that is set, and its name.
std::pair<std::optional<std::string>, std::string> first_set(
    const SlurmEnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto value = env(name); value && !common::trim(*value).empty()) return {value, name};
  return {std::nullopt, ""};
}

/// Reads a count variable; an error when it is set but not a count.
std::optional<std::string> read_count(const SlurmEnvLookup& env,
                                      std::initializer_list<const char*> names,
                                      std::optional<int>& out, std::string& used) {
  auto [text, name] = first_set(env, names);
  if (!text) return std::nullopt;
  out = parse_count(text);
  if (!out) return name + "=" + *text + ": expected a count; is this a SLURM job's environment?";
  used = name;
  return std::nullopt;
}

/// Whether a --nnodes text asks for more than one node ("2", "1:4"); unparsable texts count as
/// more, and the command-line parser reports them.
bool asks_several_nodes(const std::string& nnodes) {
  const std::string text = common::trim(nnodes);
  return text != "1" && text != "1:1";
}

/// --nnodes "N" or "MIN:MAX" as (min, max); nullopt for anything else (the flag's own check
/// reports that later).
std::optional<std::pair<long long, long long>> nnodes_range(const std::string& nnodes) {
  const std::string text = common::trim(nnodes);
  const auto colon = text.find(':');
  const auto min = common::parse_int(text.substr(0, colon));
  const auto max = colon == std::string::npos ? min : common::parse_int(text.substr(colon + 1));
  if (!min || !max) return std::nullopt;
  return std::make_pair(*min, *max);
}

bool is_shell_safe(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
         std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
}

}  // namespace

common::Result<std::vector<std::string>> parse_hostlist(std::string_view hostlist) {
  std::vector<std::string> names;
  if (hostlist.empty()) return common::Error{std::string("the node list is empty")};
  size_t item_begin = 0;
  int depth = 0;
  size_t open_at = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (i < hostlist.size() && std::isspace(static_cast<unsigned char>(c))) {
      return common::Error{"unexpected space " + at_char(i)};
    }
    if (c == '[') {
      if (depth > 0)
        return common::Error{"'[' " + at_char(i) + " inside brackets; brackets do not nest"};
      depth = 1;
      open_at = i;
    } else if (c == ']') {
      if (depth == 0) return common::Error{"']' " + at_char(i) + " has no matching '['"};
      depth = 0;
    } else if (c == ',' && depth == 0) {
      if (auto why = expand_item(hostlist, item_begin, i, names)) return *why;
      item_begin = i + 1;
    }
    if (i == hostlist.size() && depth > 0)
      return common::Error{"'[' " + at_char(open_at) + " is never closed"};
  }
  return names;
}

common::Result<SlurmJob> read_slurm_job(const SlurmEnvLookup& env) {
  SlurmJob job;
  auto [job_id, job_var] = first_set(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job_id) return job;
  job.job_id = common::trim(*job_id);
  auto [step_id, step_var] = first_set(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  if (step_id) job.step_id = common::trim(*step_id);
  const bool batch_step = job.step_id.empty() || job.step_id == "batch" ||
                          job.step_id == kBatchStepId || job.step_id == "extern" ||
                          job.step_id == kExternStepId;
  job.context = batch_step ? SlurmContext::BatchScript : SlurmContext::Step;

  std::string ignored;
  if (auto why = read_count(env, {"SLURM_NODEID"}, job.node_id, ignored))
    return common::Error{*why};
  if (auto why = read_count(env, {"SLURM_PROCID"}, job.proc_id, ignored))
    return common::Error{*why};
  if (job.context == SlurmContext::Step) {
    if (auto why = read_count(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"},
                              job.num_nodes, job.num_nodes_var))
      return common::Error{*why};
    if (auto why = read_count(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"},
                              job.num_tasks, job.num_tasks_var))
      return common::Error{*why};
    auto [list, list_var] =
        first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
    if (list) {
      job.nodelist = common::trim(*list);
      job.nodelist_var = list_var;
    }
  } else {
    // The batch script sees SLURM_NNODES too, but only the job's count means anything here.
    if (auto why = read_count(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}, job.num_nodes,
                              job.num_nodes_var))
      return common::Error{*why};
    auto [list, list_var] = first_set(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
    if (list) {
      job.nodelist = common::trim(*list);
      job.nodelist_var = list_var;
    }
    if (auto cpus = env("SLURM_JOB_CPUS_PER_NODE"))
      job.min_cpus_per_node = min_cpus_per_node(*cpus);
  }
  return job;
}

std::optional<int> slurm_gpus_on_node(const SlurmEnvLookup& env) {
  if (!env("SLURM_JOB_ID") && !env("SLURM_JOBID")) return std::nullopt;
  return parse_count(env("SLURM_GPUS_ON_NODE"));
}

common::Result<SlurmFill> slurm_defaults(const SlurmJob& job, const UserChoices& user) {
  SlurmFill fill;
  if (job.context != SlurmContext::Step) return fill;
  const std::string step_nodes =
      job.num_nodes ? std::to_string(*job.num_nodes) + " nodes (" + job.num_nodes_var + ")" : "";
  if (user.standalone) {
    if (job.num_nodes && *job.num_nodes > 1)
      fill.warnings.push_back("--standalone under srun on " + step_nodes +
                              ": every node runs a job of its own, whose WORLD_SIZE counts "
                              "that node's workers only; leave out --standalone to run one job "
                              "across the nodes");
    return fill;
  }
  if (job.num_tasks && job.num_nodes && *job.num_tasks > *job.num_nodes) {
    const std::string copies = "srun started " + std::to_string(*job.num_tasks) +
                               " copies of ddprun on " + std::to_string(*job.num_nodes) +
                               " node(s) (" + job.num_tasks_var + "=" +
                               std::to_string(*job.num_tasks) + ")";
    // Each copy fails alike: the first says what to run, the others only which they are.
    if (job.proc_id && *job.proc_id > 0)
      return common::Error{copies + "; this is copy " + std::to_string(*job.proc_id) +
                           ", and copy 0 says what to run instead"};
    const std::string n = std::to_string(*job.num_nodes);
    // --nodes and --ntasks too: srun takes SLURM_NTASKS from the allocation otherwise, and
    // then ignores --ntasks-per-node=1.
    return common::Error{copies +
                         "; ddprun starts the workers itself, so run one per node: srun "
                         "--nodes=" +
                         n + " --ntasks=" + n + " --ntasks-per-node=1 ddprun ..."};
  }
  auto add = [&fill, &user](const std::string& option, const std::string& value,
                            const std::string& source) {
    if (!user.given(option)) fill.values.push_back({option, value, source});
  };
  if (job.num_nodes) add("nnodes", std::to_string(*job.num_nodes), job.num_nodes_var);
  const auto range = user.nnodes ? nnodes_range(*user.nnodes) : std::nullopt;
  const bool several =
      user.nnodes ? asks_several_nodes(*user.nnodes) : job.num_nodes && *job.num_nodes > 1;
  // --master_addr configures torchrun's static rendezvous: a script that gives it keeps that
  // (as torchrun would), with --node_rank from SLURM.
  const std::string chosen_backend = common::to_lower(common::trim(user.rdzv_backend.value_or("")));
  const bool stays_static =
      chosen_backend == "static" || (!user.rdzv_backend && user.given("master_addr"));
  // Spares need a rendezvous that numbers the nodes: several nodes asked for, not static.
  const bool spares =
      several && !stays_static && range && job.num_nodes && range->second < *job.num_nodes;
  if (job.node_id && spares && !user.given("node_rank")) {
    // A node numbered past the job's last place is one of the spares: the rendezvous numbers
    // the nodes (docs/usage.md#spares-and-quarantine).
    fill.notes.push_back("--node_rank left to the rendezvous (this step has " + step_nodes +
                         " for --nnodes " + common::trim(*user.nnodes) +
                         ": the nodes past it wait as spares)");
  } else if (job.node_id) {
    add("node_rank", std::to_string(*job.node_id), "SLURM_NODEID");
  }
  if (range && job.num_nodes && range->first > *job.num_nodes && !user.given("rdzv_id"))
    fill.warnings.push_back("--nnodes " + common::trim(*user.nnodes) +
                            " asks for more nodes than this step has (" + step_nodes +
                            "): the rendezvous waits for nodes this step does not start, until "
                            "its join_timeout; give --nnodes " +
                            std::to_string(*job.num_nodes) +
                            " or run the step on more nodes (srun --nodes)");
  add("rdzv_id", job.job_id, "SLURM_JOB_ID");

  if (!several) return fill;
  if (!user.rdzv_backend && user.given("master_addr")) return fill;
  add("rdzv_backend", "c10d", "SLURM");
  const bool c10d = !user.rdzv_backend || chosen_backend == "c10d";
  if (!c10d || user.given("rdzv_endpoint") || job.nodelist.empty()) return fill;
  auto nodes = parse_hostlist(job.nodelist);
  if (!nodes) {
    return common::Error{job.nodelist_var + "=" + job.nodelist + ": " + nodes.error().message +
                         "; pass --rdzv_endpoint host:port"};
  }
  fill.endpoint_node = nodes->front();
  fill.values.push_back(
      {"rdzv_endpoint", format_endpoint(fill.endpoint_node, rdzv::kDefaultPort), job.nodelist_var});
  return fill;
}

FanOutDecision decide_fanout(const SlurmJob& job, const std::vector<std::string>& args,
                             bool single_node_requested, bool node_rank_given, bool fanout_disabled,
                             const std::string& disabled_by) {
  FanOutDecision decision;
  if (job.context != SlurmContext::BatchScript || !job.num_nodes || *job.num_nodes <= 1 ||
      single_node_requested) {
    return decision;
  }
  const std::string n = std::to_string(*job.num_nodes);
  decision.srun_args = {"srun", "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1"};
  // A step gets one CPU per task unless told otherwise; ddprun's workers need the node's.
  if (job.min_cpus_per_node && *job.min_cpus_per_node > 1)
    decision.srun_args.push_back("--cpus-per-task=" + std::to_string(*job.min_cpus_per_node));
  std::string line;
  for (const std::string& arg : decision.srun_args) line += arg + " ";
  line += "ddprun";
  for (const std::string& arg : args) line += " " + shell_quote(arg);
  const std::string where = "ddprun runs outside srun on a " + n + "-node allocation (SLURM job " +
                            job.job_id + ", " + job.num_nodes_var + "=" + n + ")";
  if (node_rank_given) {
    decision.action = FanOutDecision::Action::Refuse;
    decision.message = where +
                       " and --node_rank would give every node the same rank; drop --node_rank "
                       "(srun supplies SLURM_NODEID) and run: " +
                       line;
    return decision;
  }
  if (fanout_disabled) {
    decision.action = FanOutDecision::Action::Refuse;
    decision.message = where + ", so only one node would start (" + disabled_by +
                       " stops the automatic srun); run one ddprun per node instead: " + line;
    return decision;
  }
  decision.action = FanOutDecision::Action::FanOut;
  decision.message =
      where + ": starting one ddprun per node with: " + line + " (--no_slurm_fanout stops instead)";
  return decision;
}

std::optional<int> min_cpus_per_node(std::string_view text) {
  std::optional<int> fewest;
  for (const std::string& item : common::split(common::trim(text), ',')) {
    // "72" or "72(x2)": a count, and how many nodes in a row have it.
    const std::string count = item.substr(0, item.find('('));
    if (item.size() > count.size()) {
      const std::string repeat = item.substr(count.size());
      if (repeat.size() < 4 || repeat.compare(0, 2, "(x") != 0 || repeat.back() != ')' ||
          !all_digits(repeat.substr(2, repeat.size() - 3)))
        return std::nullopt;
    }
    auto value = parse_count(count);
    if (!value || *value < 1) return std::nullopt;
    if (!fewest || *value < *fewest) fewest = value;
  }
  return fewest;
}

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && std::all_of(arg.begin(), arg.end(), is_shell_safe)) return arg;
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'')
      quoted += "'\\''";
    else
      quoted += c;
  }
  return quoted + "'";
}

common::Result<NodeAddress> resolve_node_address(
    const std::string& node, const std::function<bool(const std::string&)>& resolves,
    const std::function<std::optional<std::string>(const std::string&)>& node_addr) {
  if (resolves(node)) return NodeAddress{node, "DNS"};
  if (auto addr = node_addr(node); addr && !addr->empty() && *addr != node) {
    return NodeAddress{*addr, "NodeAddr from scontrol"};
  }
  return common::Error{
      "the rendezvous node " + node +
      " (the first of the SLURM node list) has no DNS address and `scontrol show node " + node +
      "` gave no NodeAddr; pass --rdzv_endpoint host:port"};
}

std::optional<std::string> parse_node_addr(std::string_view scontrol_output) {
  constexpr std::string_view kKey = "NodeAddr=";
  for (size_t at = scontrol_output.find(kKey); at != std::string_view::npos;
       at = scontrol_output.find(kKey, at + 1)) {
    // A whole word only: not the tail of some other key.
    if (at > 0 && !std::isspace(static_cast<unsigned char>(scontrol_output[at - 1]))) continue;
    const size_t begin = at + kKey.size();
    size_t end = begin;
    while (end < scontrol_output.size() &&
           !std::isspace(static_cast<unsigned char>(scontrol_output[end])))
      ++end;
    if (end == begin) return std::nullopt;
    return std::string(scontrol_output.substr(begin, end - begin));
  }
  return std::nullopt;
}

std::string format_endpoint(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool host_resolves(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  return rc == 0;
}

std::optional<std::string> scontrol_node_addr(const std::string& node) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execlp("scontrol", "scontrol", "show", "node", "-o", node.c_str(),
             static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  char buffer[4096];
  while (output.size() < 1'000'000) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  ::kill(pid, SIGKILL);  // a no-op when scontrol already exited; it is still our unreaped child
  int status = 0;
  ::waitpid(pid, &status, 0);
  return parse_node_addr(output);
}

}  // namespace ddprun::launcher
