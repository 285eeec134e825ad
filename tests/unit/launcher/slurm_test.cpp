#include "launcher/slurm.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

using Catch::Matchers::Contains;
using namespace ddprun::launcher;

namespace {

using Names = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

Names expand(const std::string& list) {
  auto result = parse_hostlist(list);
  if (!result) FAIL(list << ": " << result.error().message);
  return *result;
}

std::string hostlist_error(const std::string& list) {
  auto result = parse_hostlist(list);
  INFO(list);
  REQUIRE_FALSE(result.ok());
  return result.error().message;
}

SlurmEnvLookup lookup(Env vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

SlurmJob job_from(const Env& vars) {
  auto result = read_slurm_job(lookup(vars));
  if (!result) FAIL(result.error().message);
  return *result;
}

/// srun's environment for task `node` of a two-node step of job 77 (as SLURM 22.05 sets it).
Env srun_task(int node, const std::string& nodelist = "gpu[01-02]") {
  return {{"SLURM_JOB_ID", "77"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_STEP_NODELIST", nodelist}};
}

/// The batch script's environment on a two-node allocation (no step id).
Env batch_script(int nodes = 2) {
  return {{"SLURM_JOB_ID", "78"},
          {"SLURM_NODEID", "0"},
          {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_JOB_NUM_NODES", std::to_string(nodes)},
          {"SLURM_NTASKS", "8"},
          {"SLURM_JOB_NODELIST", "n[1-2]"}};
}

UserChoices nothing_given() {
  UserChoices user;
  user.given = [](std::string_view) { return false; };
  return user;
}

std::map<std::string, std::string> values_of(const SlurmFill& fill) {
  std::map<std::string, std::string> out;
  for (const auto& item : fill.values) out[item.option] = item.value;
  return out;
}

SlurmFill fill_ok(const SlurmJob& job, const UserChoices& user) {
  auto result = slurm_defaults(job, user);
  if (!result) FAIL(result.error().message);
  return *result;
}

}  // namespace

TEST_CASE("a hostlist range expands with the zero padding of its lower bound",
          "[launcher][slurm][unit]") {
  CHECK(expand("gpu[01-04,07]") == Names{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"});
  CHECK(expand("n[8-11]") == Names{"n8", "n9", "n10", "n11"});
  CHECK(expand("rack[001-002]") == Names{"rack001", "rack002"});
}

TEST_CASE("a hostlist mixes ranges and plain names separated by commas",
          "[launcher][slurm][unit]") {
  CHECK(expand("n[1-2],login") == Names{"n1", "n2", "login"});
  CHECK(expand("login,n[3,5-6],gpu-a.b") == Names{"login", "n3", "n5", "n6", "gpu-a.b"});
  CHECK(expand("single") == Names{"single"});
  CHECK(expand("n[7]") == Names{"n7"});
}

TEST_CASE("a hostlist name with several bracket groups expands to every combination",
          "[launcher][slurm][unit]") {
  CHECK(expand("a[1-2]b[3-4]") == Names{"a1b3", "a1b4", "a2b3", "a2b4"});
  CHECK(expand("rack[1-2]-node[01,03]x") ==
        Names{"rack1-node01x", "rack1-node03x", "rack2-node01x", "rack2-node03x"});
}

TEST_CASE("a malformed hostlist is refused with what is wrong and where",
          "[launcher][slurm][unit]") {
  CHECK_THAT(hostlist_error("gpu[01-04"), Contains("'[' at character 4 is never closed"));
  CHECK_THAT(hostlist_error("gpu01]"), Contains("']' at character 6 has no matching '['"));
  CHECK_THAT(hostlist_error("n[1-[2]]"), Contains("brackets do not nest"));
  CHECK_THAT(hostlist_error("n[4-2]"), Contains("range 4-2 at character 3 runs backwards"));
  CHECK_THAT(hostlist_error("n[a-b]"), Contains("'a-b' at character 3 is not a number"));
  CHECK_THAT(hostlist_error("n[1-]"), Contains("is not a number"));
  CHECK_THAT(hostlist_error("n[]"), Contains("empty brackets"));
  CHECK_THAT(hostlist_error("n[1,,2]"), Contains("empty range"));
  CHECK_THAT(hostlist_error("a,,b"), Contains("empty node name at character 3"));
  CHECK_THAT(hostlist_error("a,b,"), Contains("empty node name"));
  CHECK_THAT(hostlist_error("a, b"), Contains("unexpected space at character 3"));
  CHECK_THAT(hostlist_error(""), Contains("empty"));
  CHECK_THAT(hostlist_error("n[1-9999999]"), Contains("more than 100000 names"));
  CHECK_THAT(hostlist_error("a[1-1000]b[1-1000]"), Contains("more than 100000 names"));
}

TEST_CASE("the SLURM context is a step under srun and the batch script outside it",
          "[launcher][slurm][unit]") {
  CHECK(job_from({}).context == SlurmContext::None);
  const SlurmJob step = job_from(srun_task(1));
  CHECK(step.context == SlurmContext::Step);
  CHECK(step.node_id == 1);
  CHECK(step.num_nodes == 2);
  CHECK(step.nodelist == "gpu[01-02]");
  CHECK(job_from(batch_script()).context == SlurmContext::BatchScript);
  Env batch_step = batch_script();
  batch_step["SLURM_STEP_ID"] = "4294967294";
  CHECK(job_from(batch_step).context == SlurmContext::BatchScript);
  batch_step["SLURM_STEP_ID"] = "batch";
  CHECK(job_from(batch_step).context == SlurmContext::BatchScript);
}

TEST_CASE("a SLURM count variable that is not a number is named in the error",
          "[launcher][slurm][unit]") {
  Env env = srun_task(0);
  env["SLURM_NODEID"] = "first";
  auto result = read_slurm_job(lookup(env));
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(result.error().message, Contains("SLURM_NODEID=first: expected a count"));
}

TEST_CASE("under srun the options left out come from the job, endpoint on the first node",
          "[launcher][slurm][unit]") {
  const SlurmFill fill = fill_ok(job_from(srun_task(1)), nothing_given());
  auto values = values_of(fill);
  CHECK(values["nnodes"] == "2");
  CHECK(values["node_rank"] == "1");
  CHECK(values["rdzv_id"] == "77");
  CHECK(values["rdzv_backend"] == "c10d");
  CHECK(values["rdzv_endpoint"] == "gpu01:29400");
  CHECK(fill.endpoint_node == "gpu01");
  for (const auto& item : fill.values)
    if (item.option == "node_rank") CHECK(item.source == "SLURM_NODEID");
}

TEST_CASE("under srun options the user gave are never replaced by SLURM's",
          "[launcher][slurm][unit]") {
  const std::set<std::string_view> given{"nnodes", "node_rank", "rdzv_id", "rdzv_endpoint"};
  UserChoices user;
  user.given = [&given](std::string_view name) { return given.count(name) > 0; };
  user.nnodes = "2:4";
  const SlurmFill fill = fill_ok(job_from(srun_task(0)), user);
  auto values = values_of(fill);
  CHECK(values.count("nnodes") == 0);
  CHECK(values.count("node_rank") == 0);
  CHECK(values.count("rdzv_id") == 0);
  CHECK(values.count("rdzv_endpoint") == 0);
  CHECK(values["rdzv_backend"] == "c10d");
  CHECK(fill.endpoint_node.empty());
}

TEST_CASE("under srun a static backend chosen by the user gets no derived endpoint",
          "[launcher][slurm][unit]") {
  UserChoices user = nothing_given();
  user.given = [](std::string_view name) { return name == "rdzv_backend"; };
  user.rdzv_backend = "static";
  auto values = values_of(fill_ok(job_from(srun_task(0)), user));
  CHECK(values.count("rdzv_backend") == 0);
  CHECK(values.count("rdzv_endpoint") == 0);
  CHECK(values["node_rank"] == "0");
}

TEST_CASE("a one-node step and --standalone get no network rendezvous from SLURM",
          "[launcher][slurm][unit]") {
  Env one = srun_task(0, "n1");
  one["SLURM_NNODES"] = one["SLURM_STEP_NUM_NODES"] = one["SLURM_JOB_NUM_NODES"] = "1";
  one["SLURM_STEP_NUM_TASKS"] = one["SLURM_NTASKS"] = "1";
  auto values = values_of(fill_ok(job_from(one), nothing_given()));
  CHECK(values["nnodes"] == "1");
  CHECK(values.count("rdzv_endpoint") == 0);
  CHECK(values.count("rdzv_backend") == 0);

  UserChoices standalone = nothing_given();
  standalone.standalone = true;
  CHECK(fill_ok(job_from(srun_task(0)), standalone).values.empty());
}

TEST_CASE("srun with several ddprun tasks per node is refused with the one-per-node line",
          "[launcher][slurm][unit]") {
  Env env = srun_task(0);
  env["SLURM_STEP_NUM_TASKS"] = "8";
  auto result = slurm_defaults(job_from(env), nothing_given());
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(result.error().message, Contains("srun started 8 copies of ddprun on 2 node"));
  // --nodes and --ntasks too: srun would take SLURM_NTASKS=8 from the allocation otherwise.
  CHECK_THAT(result.error().message,
             Contains("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ddprun ..."));
  // The other copies fail too, saying only which they are: one copy prints the fix.
  env["SLURM_PROCID"] = "5";
  auto other = slurm_defaults(job_from(env), nothing_given());
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().message ==
        "srun started 8 copies of ddprun on 2 node(s) (SLURM_STEP_NUM_TASKS=8); this is copy 5, "
        "and copy 0 says what to run instead");
}

TEST_CASE("a step with more nodes than --nnodes allows leaves the node rank to the rendezvous",
          "[launcher][slurm][unit]") {
  // The spare recipe: three nodes for --nnodes 2 (docs/usage.md#spares-and-quarantine).
  Env env = srun_task(2, "n[1-3]");
  env["SLURM_NNODES"] = env["SLURM_STEP_NUM_NODES"] = env["SLURM_JOB_NUM_NODES"] = "3";
  env["SLURM_STEP_NUM_TASKS"] = env["SLURM_NTASKS"] = "3";
  UserChoices user;
  user.given = [](std::string_view name) { return name == "nnodes"; };
  user.nnodes = "2";
  const SlurmFill fill = fill_ok(job_from(env), user);
  auto values = values_of(fill);
  CHECK(values.count("node_rank") == 0);
  CHECK(values["rdzv_backend"] == "c10d");
  CHECK(values["rdzv_endpoint"] == "n1:29400");
  CHECK(fill.notes ==
        std::vector<std::string>{"--node_rank left to the rendezvous (this step has 3 nodes "
                                 "(SLURM_STEP_NUM_NODES) for --nnodes 2: the nodes past it wait as "
                                 "spares)"});
  CHECK(fill.warnings.empty());
  // An elastic range whose maximum covers the step keeps SLURM's node rank.
  user.nnodes = "2:3";
  CHECK(values_of(fill_ok(job_from(env), user))["node_rank"] == "2");
  // A static rendezvous has no spares: the node rank stays SLURM's (the extra node is refused).
  user.nnodes = "2";
  user.given = [](std::string_view name) { return name == "nnodes" || name == "master_addr"; };
  const SlurmFill fixed = fill_ok(job_from(env), user);
  CHECK(values_of(fixed)["node_rank"] == "2");
  CHECK(fixed.notes.empty());
  // Nor does --nnodes 1, one job per node.
  user.nnodes = "1";
  user.given = [](std::string_view name) { return name == "nnodes"; };
  CHECK(values_of(fill_ok(job_from(env), user))["node_rank"] == "2");
}

TEST_CASE("settings that fit the step badly are warned of, not refused",
          "[launcher][slurm][unit]") {
  UserChoices user;
  user.given = [](std::string_view name) { return name == "nnodes"; };
  user.nnodes = "4";
  const SlurmFill more = fill_ok(job_from(srun_task(0)), user);
  CHECK(more.warnings ==
        std::vector<std::string>{
            "--nnodes 4 asks for more nodes than this step has (2 nodes (SLURM_STEP_NUM_NODES)): "
            "the rendezvous waits for nodes this step does not start, until its join_timeout; "
            "give --nnodes 2 or run the step on more nodes (srun --nodes)"});
  // With its own --rdzv_id the job may gather nodes of other steps or jobs: no warning.
  user.given = [](std::string_view name) { return name == "nnodes" || name == "rdzv_id"; };
  CHECK(fill_ok(job_from(srun_task(0)), user).warnings.empty());

  UserChoices standalone = nothing_given();
  standalone.standalone = true;
  const SlurmFill alone = fill_ok(job_from(srun_task(0)), standalone);
  CHECK(alone.values.empty());
  CHECK(alone.warnings ==
        std::vector<std::string>{"--standalone under srun on 2 nodes (SLURM_STEP_NUM_NODES): every "
                                 "node runs a job of its own, whose WORLD_SIZE counts that node's "
                                 "workers only; leave out --standalone to run one job across the "
                                 "nodes"});
}

TEST_CASE("under srun --master_addr keeps torchrun's static rendezvous with SLURM's node rank",
          "[launcher][slurm][unit]") {
  UserChoices user;
  user.given = [](std::string_view name) { return name == "master_addr"; };
  auto values = values_of(fill_ok(job_from(srun_task(1)), user));
  CHECK(values.count("rdzv_backend") == 0);
  CHECK(values.count("rdzv_endpoint") == 0);
  CHECK(values["node_rank"] == "1");
  CHECK(values["nnodes"] == "2");
}

TEST_CASE("a malformed SLURM node list is named when the endpoint depends on it",
          "[launcher][slurm][unit]") {
  auto result = slurm_defaults(job_from(srun_task(0, "gpu[01-02")), nothing_given());
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(result.error().message,
             Contains("SLURM_STEP_NODELIST=gpu[01-02: '[' at character 4 is never closed"));
}

TEST_CASE("the batch script of a multi-node job reruns ddprun under srun, one per node",
          "[launcher][slurm][unit]") {
  const std::vector<std::string> args{"--nnodes=2", "--nproc_per_node", "4",
                                      "train.py",   "--note",           "two words"};
  auto decision = decide_fanout(job_from(batch_script()), args, false, false, false, "");
  CHECK(decision.action == FanOutDecision::Action::FanOut);
  CHECK(decision.srun_args ==
        std::vector<std::string>{"srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"});
  CHECK_THAT(decision.message,
             Contains("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ddprun --nnodes=2 "
                      "--nproc_per_node 4 train.py --note 'two words'"));
  CHECK_THAT(decision.message, Contains("--no_slurm_fanout"));
}

TEST_CASE("with fan-out disabled the batch script stops with the corrected srun line",
          "[launcher][slurm][unit]") {
  auto decision = decide_fanout(job_from(batch_script(3)), {"--nnodes=3", "train.py"}, false, false,
                                true, "PET_NO_SLURM_FANOUT=1");
  CHECK(decision.action == FanOutDecision::Action::Refuse);
  CHECK_THAT(decision.message, Contains("PET_NO_SLURM_FANOUT=1"));
  CHECK_THAT(decision.message,
             Contains("srun --nodes=3 --ntasks=3 --ntasks-per-node=1 ddprun --nnodes=3 train.py"));
}

TEST_CASE("a batch script that fixes --node_rank is refused rather than fanned out",
          "[launcher][slurm][unit]") {
  auto decision =
      decide_fanout(job_from(batch_script()), {"--node_rank", "0", "t.py"}, false, true, false, "");
  CHECK(decision.action == FanOutDecision::Action::Refuse);
  CHECK_THAT(decision.message, Contains("drop --node_rank"));
}

TEST_CASE("ddprun runs where it is on one node, under srun, or when one node is asked for",
          "[launcher][slurm][unit]") {
  const std::vector<std::string> args{"train.py"};
  using Action = FanOutDecision::Action;
  CHECK(decide_fanout(job_from({}), args, false, false, false, "").action == Action::RunHere);
  CHECK(decide_fanout(job_from(batch_script(1)), args, false, false, false, "").action ==
        Action::RunHere);
  CHECK(decide_fanout(job_from(srun_task(0)), args, false, false, false, "").action ==
        Action::RunHere);
  CHECK(decide_fanout(job_from(batch_script()), args, true, false, false, "").action ==
        Action::RunHere);
}

TEST_CASE("a node name DNS knows is kept, else SLURM's NodeAddr is used",
          "[launcher][slurm][unit]") {
  auto never = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  auto by_dns = resolve_node_address(
      "gpu01", [](const std::string& name) { return name == "gpu01"; }, never);
  REQUIRE(by_dns.ok());
  CHECK(by_dns->host == "gpu01");
  CHECK(by_dns->how == "DNS");

  auto by_scontrol = resolve_node_address(
      "n1", [](const std::string&) { return false; },
      [](const std::string& node) -> std::optional<std::string> {
        if (node == "n1") return "10.0.0.7";
        return std::nullopt;
      });
  REQUIRE(by_scontrol.ok());
  CHECK(by_scontrol->host == "10.0.0.7");

  auto neither = resolve_node_address(
      "n9", [](const std::string&) { return false; }, never);
  REQUIRE_FALSE(neither.ok());
  CHECK_THAT(neither.error().message, Contains("n9"));
  CHECK_THAT(neither.error().message, Contains("--rdzv_endpoint"));
}

TEST_CASE("NodeAddr is read from one-line scontrol output", "[launcher][slurm][unit]") {
  CHECK(parse_node_addr("NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 "
                        "NodeHostName=vm Version=22.05.8\n") == "127.0.0.1");
  CHECK(parse_node_addr("NodeName=n1 NodeHostName=vm\n") == std::nullopt);
  CHECK(parse_node_addr("Node n1 not found\n") == std::nullopt);
  CHECK(parse_node_addr("") == std::nullopt);
}

TEST_CASE("endpoints put IPv6 literals in brackets and arguments are shell-quoted when needed",
          "[launcher][slurm][unit]") {
  CHECK(format_endpoint("n1", 29400) == "n1:29400");
  CHECK(format_endpoint("fd00::1", 29400) == "[fd00::1]:29400");
  CHECK(shell_quote("--nnodes=2") == "--nnodes=2");
  CHECK(shell_quote("two words") == "'two words'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
}

TEST_CASE("SLURM_GPUS_ON_NODE counts GPUs only inside a SLURM job", "[launcher][slurm][unit]") {
  CHECK(slurm_gpus_on_node(lookup({{"SLURM_JOB_ID", "5"}, {"SLURM_GPUS_ON_NODE", "4"}})) == 4);
  CHECK(slurm_gpus_on_node(lookup({{"SLURM_GPUS_ON_NODE", "4"}})) == std::nullopt);
  CHECK(slurm_gpus_on_node(lookup({{"SLURM_JOB_ID", "5"}})) == std::nullopt);
}

TEST_CASE("the fan-out gives each ddprun every CPU the job has on a node",
          "[launcher][slurm][unit]") {
  Env env = batch_script();
  env["SLURM_JOB_CPUS_PER_NODE"] = "8(x2)";
  auto decision = decide_fanout(job_from(env), {"t.py"}, false, false, false, "");
  CHECK(decision.srun_args == std::vector<std::string>{"srun", "--nodes=2", "--ntasks=2",
                                                       "--ntasks-per-node=1", "--cpus-per-task=8"});
  CHECK_THAT(decision.message, Contains("--ntasks-per-node=1 --cpus-per-task=8 ddprun t.py"));
}

TEST_CASE("SLURM_JOB_CPUS_PER_NODE gives the fewest CPUs of any node", "[launcher][slurm][unit]") {
  CHECK(min_cpus_per_node("72(x2),36") == 36);
  CHECK(min_cpus_per_node("4") == 4);
  CHECK(min_cpus_per_node("16,8(x3),32") == 8);
  CHECK(min_cpus_per_node("") == std::nullopt);
  CHECK(min_cpus_per_node("4(x)") == std::nullopt);
  CHECK(min_cpus_per_node("four") == std::nullopt);
  CHECK(min_cpus_per_node("4(x2") == std::nullopt);
}
