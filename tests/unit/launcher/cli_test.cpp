#include "launcher/cli.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <map>
#include <optional>
#include <string>
#include <vector>

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using ddprun::launcher::EnvLookup;
using ddprun::launcher::InfoRequest;
using ddprun::launcher::LaunchConfig;
using ddprun::launcher::NprocKind;
using ddprun::launcher::parse_command_line;
using ddprun::launcher::ParseResult;
using ddprun::launcher::StdStreams;
using ddprun::launcher::UsageError;

namespace {

using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

EnvLookup env_from(Env vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

/// Describes a result for failure messages.
std::string show(const ParseResult& result) {
  if (auto* error = std::get_if<UsageError>(&result)) return "UsageError: " + error->message;
  if (auto* info = std::get_if<InfoRequest>(&result)) return "InfoRequest: " + info->text;
  return "LaunchConfig";
}

LaunchConfig parse_ok(const Args& args, const Env& env = {}) {
  ParseResult result = parse_command_line(args, env_from(env));
  INFO(show(result));
  REQUIRE(std::holds_alternative<LaunchConfig>(result));
  return std::get<LaunchConfig>(result);
}

std::string parse_error(const Args& args, const Env& env = {}) {
  ParseResult result = parse_command_line(args, env_from(env));
  INFO(show(result));
  REQUIRE(std::holds_alternative<UsageError>(result));
  const std::string message = std::get<UsageError>(result).message;
  CHECK(message.find('\n') == std::string::npos);  // one line
  return message;
}

std::string parse_info(const Args& args) {
  ParseResult result = parse_command_line(args, env_from({}));
  INFO(show(result));
  REQUIRE(std::holds_alternative<InfoRequest>(result));
  return std::get<InfoRequest>(result).text;
}

}  // namespace

TEST_CASE("a bare script gets torchrun's defaults", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"train.py"});
  CHECK(config.min_nodes == 1);
  CHECK(config.max_nodes == 1);
  CHECK(config.nproc_kind == NprocKind::Count);
  CHECK(config.nproc_per_node == 1);
  CHECK_FALSE(config.standalone);
  CHECK(config.rdzv_backend == "static");
  CHECK(config.rdzv_endpoint.empty());
  CHECK(config.rdzv_id == "none");
  CHECK(config.rdzv_conf.empty());
  CHECK_FALSE(config.node_rank.has_value());
  CHECK(config.master_addr == "127.0.0.1");
  CHECK_FALSE(config.master_port.has_value());
  CHECK(config.local_addr.empty());
  CHECK(config.max_restarts == 0);
  CHECK(config.monitor_interval == Approx(0.1));
  CHECK(config.shutdown_timeout == Approx(30.0));
  CHECK(config.start_method == "spawn");
  CHECK(config.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(config.role == "default");
  CHECK_FALSE(config.module);
  CHECK_FALSE(config.no_python);
  CHECK(config.log_dir.empty());
  CHECK(config.redirects.all == StdStreams::None);
  CHECK(config.redirects.per_rank.empty());
  CHECK(config.tee.all == StdStreams::None);
  CHECK_FALSE(config.local_ranks_filter.has_value());
  CHECK(config.script == "train.py");
  CHECK(config.script_args.empty());
}

// The flag/value pairs below read best one pair per line.
// clang-format off
TEST_CASE("every option is accepted in its underscored spelling", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"--nnodes", "2",
                                        "--nproc_per_node", "4",
                                        "--rdzv_backend", "c10d",
                                        "--rdzv_endpoint", "head:29400",
                                        "--rdzv_id", "job7",
                                        "--rdzv_conf", "join_timeout=60",
                                        "--node_rank", "1",
                                        "--master_addr", "10.0.0.1",
                                        "--master_port", "29501",
                                        "--local_addr", "10.0.0.2",
                                        "--max_restarts", "3",
                                        "--monitor_interval", "0.5",
                                        "--start_method", "fork",
                                        "--role", "trainer",
                                        "--log_dir", "/tmp/logs",
                                        "--redirects", "3",
                                        "--tee", "1",
                                        "--local_ranks_filter", "0,2",
                                        "--signals_to_handle", "SIGTERM",
                                        "--shutdown_timeout", "5",
                                        "--no_python",
                                        "train.py"});
  CHECK(config.min_nodes == 2);
  CHECK(config.max_nodes == 2);
  CHECK(config.nproc_per_node == 4);
  CHECK(config.rdzv_backend == "c10d");
  CHECK(config.rdzv_endpoint == "head:29400");
  CHECK(config.rdzv_id == "job7");
  CHECK(config.rdzv_conf.at("join_timeout") == "60");
  CHECK(config.node_rank == 1);
  CHECK(config.master_addr == "10.0.0.1");
  CHECK(config.master_port == 29501);
  CHECK(config.local_addr == "10.0.0.2");
  CHECK(config.max_restarts == 3);
  CHECK(config.monitor_interval == Approx(0.5));
  CHECK(config.start_method == "fork");
  CHECK(config.role == "trainer");
  CHECK(config.log_dir == "/tmp/logs");
  CHECK(config.redirects.all == StdStreams::All);
  CHECK(config.tee.all == StdStreams::Out);
  CHECK(config.local_ranks_filter == std::set<int>{0, 2});
  CHECK(config.signals_to_handle == std::vector<int>{SIGTERM});
  CHECK(config.shutdown_timeout == Approx(5.0));
  CHECK(config.no_python);
}

TEST_CASE("every option is accepted in its dashed spelling", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"--nproc-per-node", "4",
                                        "--rdzv-backend", "c10d",
                                        "--rdzv-endpoint", "head:29400",
                                        "--rdzv-id", "job7",
                                        "--rdzv-conf", "is_host=1",
                                        "--nnodes", "1:3",
                                        "--node-rank", "2",
                                        "--master-addr", "10.0.0.1",
                                        "--master-port", "29501",
                                        "--local-addr", "10.0.0.2",
                                        "--max-restarts", "3",
                                        "--monitor-interval", "0.5",
                                        "--start-method", "forkserver",
                                        "--log-dir", "/tmp/logs",
                                        "--local-ranks-filter", "1",
                                        "--signals-to-handle", "SIGUSR1",
                                        "--shutdown-timeout", "0",
                                        "--no-python",
                                        "train.py"});
  CHECK(config.nproc_per_node == 4);
  CHECK(config.rdzv_backend == "c10d");
  CHECK(config.rdzv_endpoint == "head:29400");
  CHECK(config.rdzv_id == "job7");
  CHECK(config.rdzv_conf.at("is_host") == "1");
  CHECK(config.node_rank == 2);
  CHECK(config.master_addr == "10.0.0.1");
  CHECK(config.master_port == 29501);
  CHECK(config.local_addr == "10.0.0.2");
  CHECK(config.max_restarts == 3);
  CHECK(config.monitor_interval == Approx(0.5));
  CHECK(config.start_method == "forkserver");
  CHECK(config.log_dir == "/tmp/logs");
  CHECK(config.local_ranks_filter == std::set<int>{1});
  CHECK(config.signals_to_handle == std::vector<int>{SIGUSR1});
  CHECK(config.shutdown_timeout == Approx(0.0));
  CHECK(config.no_python);
}

// clang-format on

TEST_CASE("the --flag=value form works in both spellings", "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--nproc_per_node=3", "--nnodes=1:2", "--rdzv-backend=c10d",
                "--rdzv_endpoint=[fd00::1]:29400", "--redirects=0:1,1:2", "train.py"});
  CHECK(config.nproc_per_node == 3);
  CHECK(config.min_nodes == 1);
  CHECK(config.max_nodes == 2);
  CHECK(config.rdzv_backend == "c10d");
  CHECK(config.rdzv_endpoint == "[fd00::1]:29400");
  CHECK(config.redirects.for_rank(1) == StdStreams::Err);
}

TEST_CASE("short options -m, -r and -t take the same values as their long forms",
          "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"-r", "2", "-t3", "-m", "pkg.train"});
  CHECK(config.redirects.all == StdStreams::Err);
  CHECK(config.tee.all == StdStreams::All);
  CHECK(config.module);
  CHECK(config.script == "pkg.train");
}

TEST_CASE("the last of a repeated option wins", "[launcher][unit]") {
  CHECK(parse_ok({"--nproc_per_node", "2", "--nproc-per-node", "5", "train.py"}).nproc_per_node ==
        5);
}

TEST_CASE("a PET_ variable is used when the flag is absent", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"train.py"}, {{"PET_NNODES", "1:4"},
                                                      {"PET_NPROC_PER_NODE", "gpu"},
                                                      {"PET_RDZV_BACKEND", "c10d"},
                                                      {"PET_RDZV_ENDPOINT", "head:1234"},
                                                      {"PET_RDZV_ID", "env_job"},
                                                      {"PET_RDZV_CONF", "close_timeout=9"},
                                                      {"PET_NODE_RANK", "3"},
                                                      {"PET_MASTER_ADDR", "master"},
                                                      {"PET_MASTER_PORT", "4000"},
                                                      {"PET_LOCAL_ADDR", "me"},
                                                      {"PET_MAX_RESTARTS", "7"},
                                                      {"PET_MONITOR_INTERVAL", "2"},
                                                      {"PET_START_METHOD", "fork"},
                                                      {"PET_ROLE", "worker"},
                                                      {"PET_MODULE", "1"},
                                                      {"PET_LOG_DIR", "/logs"},
                                                      {"PET_REDIRECTS", "1"},
                                                      {"PET_TEE", "0:3"},
                                                      {"PET_LOCAL_RANKS_FILTER", "0"},
                                                      {"PET_SIGNALS_TO_HANDLE", "TERM,15,INT"},
                                                      {"PET_SHUTDOWN_TIMEOUT", "12.5"}});
  CHECK(config.min_nodes == 1);
  CHECK(config.max_nodes == 4);
  CHECK(config.nproc_kind == NprocKind::Gpu);
  CHECK(config.rdzv_backend == "c10d");
  CHECK(config.rdzv_endpoint == "head:1234");
  CHECK(config.rdzv_id == "env_job");
  CHECK(config.rdzv_conf.at("close_timeout") == "9");
  CHECK(config.node_rank == 3);
  CHECK(config.master_addr == "master");
  CHECK(config.master_port == 4000);
  CHECK(config.local_addr == "me");
  CHECK(config.max_restarts == 7);
  CHECK(config.monitor_interval == Approx(2.0));
  CHECK(config.start_method == "fork");
  CHECK(config.role == "worker");
  CHECK(config.module);
  CHECK(config.log_dir == "/logs");
  CHECK(config.redirects.all == StdStreams::Out);
  CHECK(config.tee.for_rank(0) == StdStreams::All);
  CHECK(config.tee.for_rank(1) == StdStreams::None);
  CHECK(config.local_ranks_filter == std::set<int>{0});
  CHECK(config.signals_to_handle == std::vector<int>{SIGTERM, SIGINT});
  CHECK(config.shutdown_timeout == Approx(12.5));
}

TEST_CASE("a flag wins over its PET_ variable, even an invalid one", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"--nproc-per-node", "2", "--nnodes=3", "train.py"},
                                       {{"PET_NPROC_PER_NODE", "8"}, {"PET_NNODES", "abc"}});
  CHECK(config.nproc_per_node == 2);
  CHECK(config.max_nodes == 3);
}

TEST_CASE("boolean PET_ variables take 1, 0, true or false", "[launcher][unit]") {
  CHECK(parse_ok({"train.py"}, {{"PET_NO_PYTHON", "1"}}).no_python);
  CHECK(parse_ok({"train.py"}, {{"PET_NO_PYTHON", "true"}}).no_python);
  CHECK_FALSE(parse_ok({"train.py"}, {{"PET_NO_PYTHON", "0"}}).no_python);
  CHECK_FALSE(parse_ok({"train.py"}, {{"PET_STANDALONE", "false"}}).standalone);
  CHECK(parse_ok({"train.py"}, {{"PET_STANDALONE", "1"}}).standalone);
  CHECK(parse_ok({"--no_python", "train.py"}, {{"PET_NO_PYTHON", "0"}}).no_python);
}

TEST_CASE("a boolean PET_ variable with another value is an error naming it", "[launcher][unit]") {
  const std::string message = parse_error({"train.py"}, {{"PET_STANDALONE", "yes"}});
  CHECK_THAT(message, StartsWith("PET_STANDALONE=yes"));
  CHECK_THAT(message, Contains("1, 0, true or false"));
}

TEST_CASE("an error in a PET_ variable names the variable, not the flag", "[launcher][unit]") {
  CHECK_THAT(parse_error({"train.py"}, {{"PET_NNODES", "abc"}}), StartsWith("PET_NNODES=abc: "));
  CHECK_THAT(parse_error({"train.py"}, {{"PET_MAX_RESTARTS", "-2"}}),
             StartsWith("PET_MAX_RESTARTS=-2: must be 0 or more"));
  CHECK_THAT(parse_error({"-m", "pkg"}, {{"PET_RUN_PATH", "1"}}),
             StartsWith("PET_RUN_PATH=1 and -m cannot be combined"));
  CHECK_THAT(parse_error({"train.py"}, {{"PET_LOCAL_RANK_ARG", "x"}}),
             StartsWith("PET_LOCAL_RANK_ARG=x: expected"));
}

TEST_CASE("an error names the flag in the spelling the user typed", "[launcher][unit]") {
  CHECK(parse_error({"--nproc-per-node", "abc", "train.py"}) ==
        "--nproc-per-node abc: expected a positive integer, cpu, gpu or auto");
  CHECK(parse_error({"--nproc_per_node=abc", "train.py"}) ==
        "--nproc_per_node abc: expected a positive integer, cpu, gpu or auto");
}

TEST_CASE("the option --nnodes takes N or MIN:MAX", "[launcher][unit]") {
  const LaunchConfig fixed = parse_ok({"--nnodes", "3", "train.py"});
  CHECK(fixed.min_nodes == 3);
  CHECK(fixed.max_nodes == 3);
  const LaunchConfig elastic = parse_ok({"--nnodes", "2:5", "train.py"});
  CHECK(elastic.min_nodes == 2);
  CHECK(elastic.max_nodes == 5);
}

TEST_CASE("the option --nnodes rejects each malformed form with the value and the fix",
          "[launcher][unit]") {
  CHECK(parse_error({"--nnodes", "4:2", "train.py"}) ==
        "--nnodes 4:2: the minimum (4) is larger than the maximum (2)");
  CHECK(parse_error({"--nnodes", "0", "train.py"}) == "--nnodes 0: needs at least 1 node");
  CHECK(parse_error({"--nnodes", "0:2", "train.py"}) == "--nnodes 0:2: needs at least 1 node");
  CHECK(parse_error({"--nnodes", "-1", "train.py"}) == "--nnodes -1: needs at least 1 node");
  CHECK_THAT(parse_error({"--nnodes", "abc", "train.py"}), StartsWith("--nnodes abc: expected"));
  CHECK_THAT(parse_error({"--nnodes", "1:2:3", "train.py"}),
             StartsWith("--nnodes 1:2:3: expected N or MIN:MAX"));
  CHECK_THAT(parse_error({"--nnodes", "1:", "train.py"}), StartsWith("--nnodes 1:: expected"));
  CHECK_THAT(parse_error({"--nnodes", "", "train.py"}), StartsWith("--nnodes \"\": expected"));
}

TEST_CASE("the option --nproc_per_node takes a count, cpu, gpu or auto", "[launcher][unit]") {
  const LaunchConfig count = parse_ok({"--nproc_per_node", "8", "train.py"});
  CHECK(count.nproc_kind == NprocKind::Count);
  CHECK(count.nproc_per_node == 8);
  CHECK(parse_ok({"--nproc_per_node", "cpu", "train.py"}).nproc_kind == NprocKind::Cpu);
  CHECK(parse_ok({"--nproc_per_node", "gpu", "train.py"}).nproc_kind == NprocKind::Gpu);
  CHECK(parse_ok({"--nproc_per_node", "auto", "train.py"}).nproc_kind == NprocKind::Auto);
  CHECK(parse_error({"--nproc_per_node", "0", "train.py"}) ==
        "--nproc_per_node 0: expected a positive integer, cpu, gpu or auto");
  CHECK(parse_error({"--nproc_per_node", "abc", "train.py"}) ==
        "--nproc_per_node abc: expected a positive integer, cpu, gpu or auto");
}

TEST_CASE("arguments after the script pass through untouched, even ddprun's own flags",
          "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--nproc_per_node", "2", "train.py", "--nnodes", "5", "-m", "--help", "--version",
                "--", "--foo=bar", "--nproc_per_node", "abc", ""});
  CHECK(config.nproc_per_node == 2);
  CHECK(config.max_nodes == 1);
  CHECK_FALSE(config.module);
  CHECK(config.script == "train.py");
  CHECK(config.script_args == Args{"--nnodes", "5", "-m", "--help", "--version", "--", "--foo=bar",
                                   "--nproc_per_node", "abc", ""});
}

TEST_CASE("a leading -- before the script is skipped", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"--nproc_per_node", "2", "--", "train.py", "--", "-x"});
  CHECK(config.script == "train.py");
  CHECK(config.script_args == Args{"--", "-x"});
  CHECK(parse_ok({"--", "-weird-name.py"}).script == "-weird-name.py");
}

TEST_CASE("the option --standalone sets up a local c10d rendezvous with a fresh id",
          "[launcher][unit]") {
  const LaunchConfig first = parse_ok({"--standalone", "--nproc_per_node", "4", "train.py"});
  CHECK(first.standalone);
  CHECK(first.rdzv_backend == "c10d");
  CHECK(first.rdzv_endpoint == "localhost:0");
  CHECK(first.rdzv_id != "none");
  CHECK(first.rdzv_id.size() >= 16);
  const LaunchConfig second = parse_ok({"--standalone", "train.py"});
  CHECK(second.rdzv_id != first.rdzv_id);
}

TEST_CASE("the option --standalone overrides explicit rendezvous flags, as torchrun does",
          "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"--standalone", "--rdzv_backend", "etcd", "--rdzv_endpoint",
                                        "elsewhere:1", "--rdzv_id", "mine", "train.py"});
  CHECK(config.rdzv_backend == "c10d");
  CHECK(config.rdzv_endpoint == "localhost:0");
  CHECK(config.rdzv_id != "mine");
}

TEST_CASE("the option --standalone with more than one node is an error", "[launcher][unit]") {
  CHECK(parse_error({"--standalone", "--nnodes", "2", "train.py"}) ==
        "--standalone runs a single node; drop --nnodes 2 or use --rdzv_endpoint");
  CHECK_THAT(parse_error({"train.py"}, {{"PET_STANDALONE", "1"}, {"PET_NNODES", "1:3"}}),
             StartsWith("PET_STANDALONE=1 runs a single node; drop PET_NNODES=1:3"));
  CHECK(parse_ok({"--standalone", "--nnodes", "1", "train.py"}).max_nodes == 1);
}

TEST_CASE("the rendezvous backend is static or c10d or etcd-v3 and etcd v2 is refused",
          "[launcher][unit]") {
  const std::string v2 =
      ": etcd's v2 API is not supported (etcd 3.4 serves it only with --enable-v2, 3.6 not at "
      "all); use --rdzv_backend etcd-v3, ddprun's backend on etcd's v3 API, with the same "
      "--rdzv_endpoint";
  CHECK(parse_error({"--rdzv_backend", "etcd", "train.py"}) == "--rdzv_backend etcd" + v2);
  CHECK(parse_error({"--rdzv_backend", "etcd-v2", "train.py"}) == "--rdzv_backend etcd-v2" + v2);
  CHECK(parse_error({"--rdzv_backend", "zookeeper", "train.py"}) ==
        "--rdzv_backend zookeeper: expected static, c10d or etcd-v3");
  const auto config = parse_ok({"--rdzv_backend", "ETCD-V3", "--rdzv_endpoint",
                                "e1:2379,e2:2379,e3", "--nnodes", "2", "train.py"});
  CHECK(config.rdzv_backend == "etcd-v3");
  CHECK(config.rdzv_endpoint == "e1:2379,e2:2379,e3");
}

TEST_CASE("etcd-v3 needs its members and takes etcd_user with etcd_password_file",
          "[launcher][unit]") {
  CHECK(parse_error({"--rdzv_backend", "etcd-v3", "train.py"}) ==
        "--rdzv_backend etcd-v3 needs --rdzv_endpoint host:port[,host:port...] (the etcd "
        "members)");
  CHECK_THAT(
      parse_error({"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1:2379,e2:x", "train.py"}),
      StartsWith("--rdzv_endpoint e1:2379,e2:x: "));
  const std::vector<std::string> etcd{"--rdzv_backend", "etcd-v3", "--rdzv_endpoint", "e1"};
  auto with = [&](const std::string& conf) {
    std::vector<std::string> args = etcd;
    args.insert(args.end(), {"--rdzv_conf", conf, "train.py"});
    return args;
  };
  CHECK(parse_error(with("etcd_user=ddp")) ==
        "--rdzv_conf etcd_user=ddp: etcd_user and etcd_password_file go together (the etcd user "
        "and a file holding its password)");
  CHECK(parse_ok(with("etcd_user=ddp,etcd_password_file=/p")).rdzv_conf.at("etcd_user") == "ddp");
  // torchrun's etcd TLS keys would leave the job on plain HTTP: named with ddprun's spelling.
  CHECK(parse_error(with("cacert=/ca.pem")) ==
        "--rdzv_conf cacert=/ca.pem: cacert is torchrun's etcd spelling; etcd-v3 takes "
        "tls_ca=FILE (TLS follows from tls_ca: no protocol=https needed)");
  CHECK_THAT(parse_error(with("key=/k")), Contains("key is torchrun's etcd spelling; etcd-v3 "
                                                   "takes tls_key=FILE"));
  CHECK_THAT(parse_error(with("protocol=HTTPS")),
             Contains("protocol=https is torchrun's etcd spelling; etcd-v3 speaks TLS when given "
                      "tls_ca=FILE"));
  CHECK(parse_ok(with("protocol=http")).rdzv_conf.at("protocol") == "http");
  CHECK_THAT(parse_error(with("secret_file=/s")),
             Contains("secret_file is the c10d rendezvous's; with etcd-v3"));
  CHECK_THAT(parse_error({"--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1", "--rdzv_conf",
                          "etcd_user=u,etcd_password_file=/p", "train.py"}),
             Contains("etcd_user is for --rdzv_backend etcd-v3 only"));
}

TEST_CASE("c10d across several nodes needs an endpoint", "[launcher][unit]") {
  CHECK(parse_error({"--rdzv_backend", "c10d", "--nnodes", "2", "train.py"}) ==
        "--rdzv_backend c10d with --nnodes 2 needs --rdzv_endpoint host:port");
  CHECK(parse_ok({"--rdzv_backend", "c10d", "--nnodes", "2", "--rdzv_endpoint", "head", "train.py"})
            .rdzv_endpoint == "head");
  CHECK(parse_ok({"--nnodes", "2", "train.py"}).rdzv_backend == "static");
}

TEST_CASE("the rendezvous endpoint accepts host, host:port and [ipv6]:port", "[launcher][unit]") {
  CHECK(parse_ok({"--rdzv_endpoint", "head", "train.py"}).rdzv_endpoint == "head");
  CHECK(parse_ok({"--rdzv_endpoint", "10.1.2.3:29400", "train.py"}).rdzv_endpoint ==
        "10.1.2.3:29400");
  CHECK(parse_ok({"--rdzv_endpoint", "[::1]:65535", "train.py"}).rdzv_endpoint == "[::1]:65535");
  CHECK(parse_ok({"--rdzv_endpoint", "[::1]", "train.py"}).rdzv_endpoint == "[::1]");
}

TEST_CASE("a bad rendezvous endpoint is an error naming it", "[launcher][unit]") {
  CHECK(parse_error({"--rdzv_endpoint", "head:0", "train.py"}) ==
        "--rdzv_endpoint head:0: the port must be 1..65535");
  CHECK(parse_error({"--rdzv_endpoint", "head:65536", "train.py"}) ==
        "--rdzv_endpoint head:65536: the port must be 1..65535");
  CHECK_THAT(parse_error({"--rdzv_endpoint", "head:http", "train.py"}),
             StartsWith("--rdzv_endpoint head:http: the port"));
  CHECK_THAT(parse_error({"--rdzv_endpoint", ":29400", "train.py"}),
             StartsWith("--rdzv_endpoint :29400: expected host:port"));
  CHECK_THAT(parse_error({"--rdzv_endpoint", "fd00::1:29400", "train.py"}), Contains("brackets"));
  CHECK_THAT(parse_error({"--rdzv_endpoint", "[::1:29400", "train.py"}), Contains("missing ']'"));
}

TEST_CASE("the option --rdzv_conf is parsed into key/value pairs", "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--rdzv_conf",
                "join_timeout=600, last_call_timeout=1.5,close_timeout=2,keep_alive_interval=5,"
                "keep_alive_max_attempt=3,is_host=false,custom=x,",
                "train.py"});
  CHECK(config.rdzv_conf == std::map<std::string, std::string>{{"join_timeout", "600"},
                                                               {"last_call_timeout", "1.5"},
                                                               {"close_timeout", "2"},
                                                               {"keep_alive_interval", "5"},
                                                               {"keep_alive_max_attempt", "3"},
                                                               {"is_host", "false"},
                                                               {"custom", "x"}});
}

TEST_CASE("a malformed or out-of-range --rdzv_conf entry is an error naming it",
          "[launcher][unit]") {
  CHECK_THAT(parse_error({"--rdzv_conf", "join_timeout=60,oops", "train.py"}),
             StartsWith("--rdzv_conf join_timeout=60,oops: malformed pair 'oops'"));
  CHECK_THAT(parse_error({"--rdzv_conf", "=5", "train.py"}), Contains("malformed pair '=5'"));
  CHECK_THAT(parse_error({"--rdzv_conf", "a=", "train.py"}), Contains("malformed pair 'a='"));
  CHECK_THAT(parse_error({"--rdzv_conf", "join_timeout=0", "train.py"}),
             Contains("join_timeout=0 must be a positive number"));
  CHECK_THAT(parse_error({"--rdzv_conf", "last_call_timeout=soon", "train.py"}),
             Contains("last_call_timeout=soon must be a positive number"));
  CHECK_THAT(parse_error({"--rdzv_conf", "keep_alive_max_attempt=1.5", "train.py"}),
             Contains("keep_alive_max_attempt=1.5 must be a positive integer"));
  CHECK_THAT(parse_error({"--rdzv_conf", "is_host=maybe", "train.py"}),
             Contains("is_host=maybe must be 1, 0, true or false"));
}

TEST_CASE("the option --node_rank must be 0 or more and below the node count", "[launcher][unit]") {
  CHECK(parse_ok({"--nnodes", "4", "--node_rank", "3", "train.py"}).node_rank == 3);
  CHECK_THAT(parse_error({"--node_rank", "-1", "train.py"}), StartsWith("--node_rank -1: "));
  CHECK_THAT(parse_error({"--nnodes", "2", "--node_rank", "2", "train.py"}),
             StartsWith("--node_rank 2: must be less than the number of nodes (2)"));
}

TEST_CASE("numeric supervision options are range-checked", "[launcher][unit]") {
  CHECK(parse_error({"--max_restarts", "-1", "train.py"}) ==
        "--max_restarts -1: must be 0 or more");
  CHECK_THAT(parse_error({"--max_restarts", "two", "train.py"}),
             StartsWith("--max_restarts two: expected a whole number"));
  CHECK_THAT(parse_error({"--monitor_interval", "0", "train.py"}),
             StartsWith("--monitor_interval 0: expected a positive number"));
  CHECK_THAT(parse_error({"--shutdown_timeout", "-1", "train.py"}),
             StartsWith("--shutdown_timeout -1: expected a number of seconds"));
  CHECK(parse_error({"--master_port", "0", "train.py"}) ==
        "--master_port 0: expected a port 1..65535");
  CHECK(parse_error({"--master_port", "70000", "train.py"}) ==
        "--master_port 70000: expected a port 1..65535");
  CHECK_THAT(parse_error({"--start_method", "thread", "train.py"}),
             StartsWith("--start_method thread: expected spawn, fork or forkserver"));
  CHECK_THAT(parse_error({"--role", "", "train.py"}), StartsWith("--role \"\": "));
}

TEST_CASE("the option --redirects and --tee take one value or per-rank pairs", "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--redirects", "0:1,1:2", "--tee", "3", "--nproc_per_node", "3", "train.py"});
  CHECK(config.redirects.for_rank(0) == StdStreams::Out);
  CHECK(config.redirects.for_rank(1) == StdStreams::Err);
  CHECK(config.redirects.for_rank(2) == StdStreams::None);
  CHECK(config.tee.for_rank(0) == StdStreams::All);
  CHECK(config.tee.for_rank(5) == StdStreams::All);
}

TEST_CASE("a malformed --redirects or --tee value is an error naming it", "[launcher][unit]") {
  CHECK_THAT(parse_error({"--redirects", "4", "train.py"}),
             StartsWith("--redirects 4: expected 0 (none)"));
  CHECK_THAT(parse_error({"-r", "0:5", "train.py"}), StartsWith("-r 0:5: expected"));
  CHECK_THAT(parse_error({"--tee", "3,0:1", "train.py"}), StartsWith("--tee 3,0:1: expected"));
  CHECK_THAT(parse_error({"--tee", "x:1", "train.py"}), StartsWith("--tee x:1: expected"));
  CHECK_THAT(parse_error({"--tee", "0:1,0:2", "train.py"}),
             StartsWith("--tee 0:1,0:2: local rank 0 is given twice"));
}

TEST_CASE("the option --local_ranks_filter selects ranks; an empty value means no filter",
          "[launcher][unit]") {
  CHECK(parse_ok({"--local_ranks_filter", "2,0,2", "train.py"}).local_ranks_filter ==
        std::set<int>{0, 2});
  CHECK_FALSE(parse_ok({"--local_ranks_filter=", "train.py"}).local_ranks_filter.has_value());
  CHECK_THAT(parse_error({"--local_ranks_filter", "0,x", "train.py"}),
             StartsWith("--local_ranks_filter 0,x: expected comma-separated local ranks"));
  CHECK_THAT(parse_error({"--local_ranks_filter", "-1", "train.py"}),
             StartsWith("--local_ranks_filter -1: "));
}

TEST_CASE("the option --signals_to_handle takes names or numbers", "[launcher][unit]") {
  CHECK(
      parse_ok({"--signals_to_handle", "SIGUSR1, term,2,SIGTERM", "train.py"}).signals_to_handle ==
      std::vector<int>{SIGUSR1, SIGTERM, SIGINT});
}

TEST_CASE("the option --signals_to_handle refuses signals that cannot be handled",
          "[launcher][unit]") {
  CHECK(parse_error({"--signals_to_handle", "SIGTERM,SIGKILL", "train.py"}) ==
        "--signals_to_handle SIGTERM,SIGKILL: SIGKILL cannot be caught by any process; drop it");
  CHECK_THAT(parse_error({"--signals_to_handle", "STOP", "train.py"}),
             Contains("SIGSTOP cannot be caught"));
  CHECK_THAT(parse_error({"--signals_to_handle", "SIGCHLD", "train.py"}),
             StartsWith("--signals_to_handle SIGCHLD: SIGCHLD"));
  CHECK(parse_error({"--signals_to_handle", "SIGTERM,SIGFOO", "train.py"}) ==
        "--signals_to_handle SIGTERM,SIGFOO: unknown signal SIGFOO");
  CHECK_THAT(parse_error({"--signals_to_handle", "", "train.py"}),
             StartsWith("--signals_to_handle \"\": expected"));
}

TEST_CASE("the option --run_path runs the script with runpy; with -m or --no_python it is refused",
          "[launcher][unit]") {
  CHECK(parse_ok({"--run_path", "train.py"}).run_path);
  CHECK(parse_ok({"--run-path", "train.py"}).run_path);
  CHECK(parse_ok({"train.py"}, {{"PET_RUN_PATH", "1"}}).run_path);
  CHECK_FALSE(parse_ok({"train.py"}).run_path);
  CHECK_THAT(parse_error({"--run_path", "-m", "pkg"}),
             StartsWith("--run_path and -m cannot be combined"));
  CHECK_THAT(parse_error({"--run_path", "--no_python", "x"}),
             StartsWith("--run_path and --no_python cannot be combined"));
}

TEST_CASE("the option --local_rank_arg takes local-rank or local_rank", "[launcher][unit]") {
  CHECK(parse_ok({"--local_rank_arg", "local-rank", "train.py"}).local_rank_arg == "local-rank");
  CHECK(parse_ok({"--local-rank-arg=local_rank", "train.py"}).local_rank_arg == "local_rank");
  CHECK(parse_ok({"train.py"}).local_rank_arg.empty());
  CHECK_THAT(parse_error({"--local_rank_arg", "rank", "train.py"}),
             StartsWith("--local_rank_arg rank: expected local-rank") &&
                 Contains("or local_rank (--local_rank, torch 1.x)"));
}

TEST_CASE("the option -m and --no_python cannot be combined", "[launcher][unit]") {
  const std::string message = parse_error({"-m", "--no_python", "pkg"});
  CHECK_THAT(message, StartsWith("-m and --no_python cannot be combined"));
  CHECK_THAT(parse_error({"--module", "train.py"}, {{"PET_NO_PYTHON", "1"}}),
             StartsWith("--module and PET_NO_PYTHON=1 cannot be combined"));
}

TEST_CASE("start-method and other accepted-for-compatibility flags do not change the script",
          "[launcher][unit]") {
  const LaunchConfig config = parse_ok(
      {"--start_method", "spawn", "--monitor_interval", "5", "-m", "pkg.main", "--lr", "0.1"});
  CHECK(config.module);
  CHECK(config.script == "pkg.main");
  CHECK(config.script_args == Args{"--lr", "0.1"});
}

TEST_CASE("an unknown option before the script is an error pointing at --help",
          "[launcher][unit]") {
  CHECK(parse_error({"--foo", "train.py"}) == "unknown option --foo: see ddprun --help");
  CHECK(parse_error({"--foo=bar", "train.py"}) == "unknown option --foo: see ddprun --help");
  CHECK(parse_error({"--nnodes", "2", "--foo", "--", "train.py"}) ==
        "unknown option --foo: see ddprun --help");
  CHECK(parse_error({"-x", "train.py"}) == "unknown option -x: see ddprun --help");
}

TEST_CASE("an option missing its value is an error naming it", "[launcher][unit]") {
  CHECK(parse_error({"--nnodes"}) == "--nnodes needs a value: see ddprun --help");
}

TEST_CASE("a missing script is an error showing the usage", "[launcher][unit]") {
  const std::string expected = "missing the training script: ddprun [options] train.py [args...]";
  CHECK(parse_error({}) == expected);
  CHECK(parse_error({"--nproc_per_node", "2"}) == expected);
  CHECK(parse_error({"--nproc_per_node", "2", "--"}) == expected);
}

TEST_CASE("the option --help prints grouped options, examples and exit codes", "[launcher][unit]") {
  const std::string help = parse_info({"--help"});
  CHECK_THAT(help, StartsWith("Usage: ddprun"));
  CHECK_THAT(help, Contains("Examples:"));
  CHECK_THAT(help, Contains("ddprun --standalone --nproc_per_node 4 train.py --epochs 10"));
  CHECK_THAT(help, Contains("ddprun --nnodes 2 --nproc_per_node 2 --node_rank 0 --rdzv_id my_job "
                            "--rdzv_backend c10d --rdzv_endpoint head:29400 train.py"));
  CHECK_THAT(help, Contains("ddprun --nproc_per_node 2 --no_python ./my_binary"));
  CHECK_THAT(help, Contains("Rendezvous:"));
  CHECK_THAT(help, Contains("--signals_to_handle"));
  CHECK_THAT(help, Contains("64 usage"));
  CHECK_THAT(help, Contains("75 restart budget"));
  CHECK(parse_info({"-h"}) == help);
  CHECK(parse_info({"--nproc_per_node", "2", "--help", "train.py"}) == help);
}

TEST_CASE("the option --help wins over errors elsewhere on the command line", "[launcher][unit]") {
  CHECK_THAT(parse_info({"--nnodes", "4:2", "--help"}), Contains("Examples:"));
}

TEST_CASE("the option --version prints ddprun and its version", "[launcher][unit]") {
  const std::string version = parse_info({"--version"});
  CHECK_THAT(version, StartsWith("ddprun "));
  CHECK(version.size() > std::string("ddprun \n").size());
}

TEST_CASE("an empty --flag= value is empty and does not swallow the script", "[launcher][unit]") {
  const LaunchConfig config = parse_ok({"--log_dir=", "--rdzv-id=", "train.py", "--rdzv_id="});
  CHECK(config.log_dir.empty());
  CHECK(config.rdzv_id.empty());
  CHECK(config.script == "train.py");
  CHECK(config.script_args == Args{"--rdzv_id="});
  CHECK(parse_error({"--nnodes=", "train.py"}) ==
        "--nnodes \"\": expected N or MIN:MAX, e.g. 2 or 1:4");
}

TEST_CASE("a short option takes its value as -r3, -r 3 or -r=3", "[launcher][unit]") {
  CHECK(parse_ok({"-r3", "train.py"}).redirects.all == StdStreams::All);
  CHECK(parse_ok({"-r", "3", "train.py"}).redirects.all == StdStreams::All);
  CHECK(parse_ok({"-r=3", "train.py"}).redirects.all == StdStreams::All);
  const LaunchConfig config = parse_ok({"-t=0:2", "train.py", "-t=1", "--log_dir="});
  CHECK(config.tee.for_rank(0) == StdStreams::Err);
  CHECK(config.script_args == Args{"-t=1", "--log_dir="});
}

namespace {

/// srun's environment for task `node` of a two-node step of job 42.
Env srun_env(int node) {
  return {{"SLURM_JOB_ID", "42"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_STEP_NODELIST", "n[1-2]"}};
}

/// The batch script's environment on a two-node allocation.
Env batch_env() {
  return {{"SLURM_JOB_ID", "43"},
          {"SLURM_NODEID", "0"},
          {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_JOB_NODELIST", "n[1-2]"}};
}

}  // namespace

TEST_CASE("under srun the job's nodes, node id and job id fill the options left out",
          "[launcher][slurm][unit]") {
  const LaunchConfig config = parse_ok({"--nproc_per_node", "2", "train.py"}, srun_env(1));
  CHECK(config.min_nodes == 2);
  CHECK(config.max_nodes == 2);
  CHECK(config.node_rank == 1);
  CHECK(config.rdzv_id == "42");
  CHECK(config.rdzv_backend == "c10d");
  CHECK(config.rdzv_endpoint == "n1:29400");
  CHECK(config.slurm.endpoint_node == "n1");
  CHECK(config.slurm.job_id == "42");
  CHECK(config.slurm.values == std::vector<std::string>{"--nnodes 2 (SLURM_STEP_NUM_NODES)",
                                                        "--node_rank 1 (SLURM_NODEID)",
                                                        "--rdzv_id 42 (SLURM_JOB_ID)",
                                                        "--rdzv_backend c10d (SLURM)"});
}

TEST_CASE("under srun flags and PET_ variables win over what SLURM supplies",
          "[launcher][slurm][unit]") {
  Env env = srun_env(1);
  env["PET_RDZV_ID"] = "from_pet";
  const LaunchConfig config = parse_ok(
      {"--nnodes", "1:4", "--node_rank", "0", "--rdzv_endpoint", "head:1234", "train.py"}, env);
  CHECK(config.min_nodes == 1);
  CHECK(config.max_nodes == 4);
  CHECK(config.node_rank == 0);
  CHECK(config.rdzv_id == "from_pet");
  CHECK(config.rdzv_endpoint == "head:1234");
  CHECK(config.slurm.endpoint_node.empty());
  CHECK(config.slurm.values == std::vector<std::string>{"--rdzv_backend c10d (SLURM)"});
}

TEST_CASE("outside SLURM nothing is derived", "[launcher][slurm][unit]") {
  const LaunchConfig config = parse_ok({"train.py"});
  CHECK(config.slurm.values.empty());
  CHECK(config.rdzv_backend == "static");
  CHECK(config.max_nodes == 1);
}

TEST_CASE("a SLURM value that fails validation is named by its variable",
          "[launcher][slurm][unit]") {
  Env env = srun_env(0);
  env["SLURM_STEP_NUM_NODES"] = "0";
  env.erase("SLURM_STEP_NUM_TASKS");
  CHECK_THAT(parse_error({"train.py"}, env),
             Contains("SLURM_STEP_NUM_NODES=0: needs at least 1 node"));
}

TEST_CASE("ddprun in a multi-node batch script asks to be rerun under srun",
          "[launcher][slurm][unit]") {
  const Args args{"--nnodes=2", "--nproc_per_node", "4", "train.py"};
  ParseResult result = parse_command_line(args, env_from(batch_env()));
  INFO(show(result));
  REQUIRE(std::holds_alternative<ddprun::launcher::SlurmFanOut>(result));
  const auto& fan_out = std::get<ddprun::launcher::SlurmFanOut>(result);
  CHECK(fan_out.args == args);
  CHECK(fan_out.srun_args == Args{"srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"});
  CHECK(fan_out.notice.find('\n') == std::string::npos);
}

TEST_CASE("the flag --no_slurm_fanout and PET_NO_SLURM_FANOUT turn the fan-out into an error",
          "[launcher][slurm][unit]") {
  CHECK_THAT(parse_error({"--no_slurm_fanout", "--nnodes=2", "train.py"}, batch_env()),
             Contains("run one ddprun per node instead: srun --nodes=2 --ntasks=2 "
                      "--ntasks-per-node=1 ddprun --no_slurm_fanout --nnodes=2 train.py"));
  Env env = batch_env();
  env["PET_NO_SLURM_FANOUT"] = "1";
  CHECK_THAT(parse_error({"train.py"}, env), Contains("PET_NO_SLURM_FANOUT=1"));
}

TEST_CASE("a batch script asking for one node runs where it is", "[launcher][slurm][unit]") {
  CHECK(parse_ok({"--standalone", "train.py"}, batch_env()).standalone);
  CHECK(parse_ok({"--nnodes", "1", "train.py"}, batch_env()).max_nodes == 1);
}

TEST_CASE("a bad flag in a batch script is reported before any fan-out",
          "[launcher][slurm][unit]") {
  CHECK_THAT(parse_error({"--nnodes", "x", "train.py"}, batch_env()), Contains("--nnodes x"));
}

TEST_CASE("a --rdzv_conf value the server would refuse is refused at once with its range",
          "[launcher][unit]") {
  CHECK(parse_error({"--rdzv_conf", "join_timeout=1e12", "train.py"}) ==
        "--rdzv_conf join_timeout=1e12: join_timeout=1e12 is out of range: allowed 0 to 86400 "
        "seconds");
  CHECK_THAT(parse_error({"--rdzv_conf", "close_timeout=3000000", "train.py"}),
             Contains("close_timeout=3000000 is out of range: allowed 0 to 86400 seconds"));
  CHECK_THAT(parse_error({"--rdzv_conf", "keep_alive_interval=1e-9", "train.py"}),
             Contains("keep_alive_interval=1e-9 is out of range: allowed 0.01 to 3600 seconds"));
  CHECK_THAT(parse_error({"--rdzv_conf", "keep_alive_max_attempt=101", "train.py"}),
             Contains("keep_alive_max_attempt=101 is out of range: allowed 1 to 100"));
  CHECK_THAT(parse_error({"--rdzv_conf", "connect_timeout=1e9", "train.py"}),
             Contains("connect_timeout=1e9 is out of range"));
  CHECK_THAT(parse_error({"--rdzv_conf", "join_timeout=nan", "train.py"}),
             Contains("must be a positive number"));
  CHECK(parse_ok({"--rdzv_conf", "keep_alive_interval=0.01,join_timeout=86400", "train.py"})
            .rdzv_conf.at("join_timeout") == "86400");
}

TEST_CASE("an --rdzv_id longer than the rendezvous accepts is refused", "[launcher][unit]") {
  CHECK(parse_error({"--nnodes", "2", "--rdzv_endpoint", "h:1", "--rdzv_id", std::string(300, 'j'),
                     "train.py"}) == "--rdzv_id of 300 bytes: at most 256");
}

TEST_CASE("the option --standby_workers is on bare, and takes off, on or auto only after =",
          "[launcher][unit][standby]") {
  using ddprun::launcher::StandbyMode;
  // auto by default, which says nothing about a choice the user did not make.
  CHECK(parse_ok({"train.py"}).standby_workers == StandbyMode::Auto);
  CHECK_FALSE(parse_ok({"train.py"}).standby_workers_given);
  CHECK(parse_ok({"--standby_workers=auto", "train.py"}).standby_workers_given);
  // Bare before the script: on, and the next word is still the script.
  LaunchConfig bare = parse_ok({"--standby_workers", "train.py", "--lr", "1"});
  CHECK(bare.standby_workers == StandbyMode::On);
  CHECK(bare.script == "train.py");
  CHECK(bare.script_args == Args{"--lr", "1"});
  CHECK(parse_ok({"--standby_workers=auto", "train.py"}).standby_workers == StandbyMode::Auto);
  CHECK(parse_ok({"--standby-workers=off", "train.py"}).standby_workers == StandbyMode::Off);
  CHECK(parse_ok({"--standby_workers=on", "train.py"}).standby_workers == StandbyMode::On);
  // The last one wins, bare or with a value.
  CHECK(parse_ok({"--standby_workers=auto", "--standby_workers", "train.py"}).standby_workers ==
        StandbyMode::On);
  CHECK(parse_ok({"--standby_workers", "--standby_workers=off", "train.py"}).standby_workers ==
        StandbyMode::Off);
  CHECK(parse_ok({"train.py"}, {{"PET_STANDBY_WORKERS", "auto"}}).standby_workers ==
        StandbyMode::Auto);
  CHECK(parse_ok({"train.py"}, {{"PET_STANDBY_WORKERS", "1"}}).standby_workers == StandbyMode::On);
  // The script's own --standby_workers=off is the script's.
  LaunchConfig passed = parse_ok({"train.py", "--standby_workers=off"});
  CHECK(passed.standby_workers == StandbyMode::Auto);
  CHECK_FALSE(passed.standby_workers_given);
  CHECK(passed.script_args == Args{"--standby_workers=off"});
  CHECK(parse_error({"--standby_workers=sometimes", "train.py"}) ==
        "--standby_workers=sometimes: expected off, on or auto (bare --standby_workers is on)");
  CHECK(parse_error({"train.py"}, {{"PET_STANDBY_WORKERS", "sometimes"}}) ==
        "PET_STANDBY_WORKERS=sometimes: expected off, on or auto (bare PET_STANDBY_WORKERS is "
        "on)");
}

TEST_CASE("the option --standby_preload takes Python module names", "[launcher][unit][standby]") {
  CHECK(parse_ok({"--standby_preload", "numpy, torchvision.models", "train.py"}).standby_preload ==
        Args{"numpy", "torchvision.models"});
  CHECK(parse_ok({"train.py"}).standby_preload.empty());
  CHECK(parse_error({"--standby_preload", "numpy,os.path;rm", "train.py"}) ==
        "--standby_preload numpy,os.path;rm: \"os.path;rm\" is not a Python module name; expected "
        "e.g. numpy,torchvision.models");
}

TEST_CASE("the option --standby_cuda takes off, context or warm", "[launcher][unit][standby]") {
  CHECK(parse_ok({"train.py"}).standby_cuda == ddprun::agent::StandbyCuda::Off);
  CHECK(parse_ok({"--standby_cuda", "context", "train.py"}).standby_cuda ==
        ddprun::agent::StandbyCuda::Context);
  CHECK(parse_ok({"--standby-cuda=WARM", "train.py"}).standby_cuda ==
        ddprun::agent::StandbyCuda::Warm);
  CHECK(parse_ok({"train.py"}, {{"PET_STANDBY_CUDA", "context"}}).standby_cuda ==
        ddprun::agent::StandbyCuda::Context);
  CHECK(parse_error({"--standby_cuda", "eager", "train.py"}) ==
        "--standby_cuda eager: expected off, context or warm");
}

TEST_CASE("an unambiguous abbreviation of a long option is that option as argparse reads it",
          "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--nproc=2", "--redirect=3", "--max_restart", "1", "--rdzv-end", "head:29400",
                "--no-py", "train.sh", "--nproc=7", "--max_restart"});
  CHECK(config.nproc_per_node == 2);
  CHECK(config.redirects.all == StdStreams::All);
  CHECK(config.max_restarts == 1);
  CHECK(config.rdzv_endpoint == "head:29400");
  CHECK(config.no_python);
  CHECK(config.script == "train.sh");
  // The script's arguments are never expanded.
  CHECK(config.script_args == Args{"--nproc=7", "--max_restart"});
}

TEST_CASE("an abbreviation taken as a value is left alone", "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--role", "--nproc", "--rdzv_id", "--tee", "-r", "1", "train.py"});
  CHECK(config.role == "--nproc");
  CHECK(config.rdzv_id == "--tee");
  CHECK(config.redirects.all == StdStreams::Out);
  CHECK(config.tee.all == StdStreams::None);
  CHECK(config.nproc_per_node == 1);
}

TEST_CASE("an ambiguous abbreviation is refused naming every option it could be",
          "[launcher][unit]") {
  const std::string message = parse_error({"--no", "train.py"});
  CHECK_THAT(message, StartsWith("ambiguous option --no: could be "));
  CHECK_THAT(message, Contains("--no_python"));
  CHECK_THAT(message, Contains("--no_slurm_fanout"));
  // The dashed and underscored spellings of one option are one option.
  CHECK_THAT(parse_error({"--rdzv", "train.py"}),
             Contains("--rdzv_backend, --rdzv_endpoint, --rdzv_id, --rdzv_conf"));
  CHECK_THAT(parse_error({"--m", "x", "train.py"}), Contains("--master_addr"));
}

TEST_CASE("abbreviations of --help and --version work when unambiguous", "[launcher][unit]") {
  CHECK_THAT(parse_info({"--hel"}), StartsWith("Usage: ddprun"));
  CHECK_THAT(parse_info({"--vers"}), StartsWith("ddprun"));
}

TEST_CASE("torchrun 2.x flags are accepted where ddprun does what they ask", "[launcher][unit]") {
  const LaunchConfig config =
      parse_ok({"--virtual-local-rank", "--duplicate-stdout-filters", "loss,,acc,nan",
                "--duplicate_stderr_filters=NCCL", "--event-log-handler", "null", "train.py"});
  CHECK(config.virtual_local_rank);
  CHECK(config.duplicate_stdout_filters == Args{"loss,acc", "nan"});
  CHECK(config.duplicate_stderr_filters == Args{"NCCL"});
  const LaunchConfig defaults = parse_ok({"train.py"});
  CHECK_FALSE(defaults.virtual_local_rank);
  CHECK(defaults.duplicate_stdout_filters.empty());
  CHECK(parse_ok({"train.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}).virtual_local_rank);
}

TEST_CASE("torchrun 2.x flags ddprun does not implement are refused saying so",
          "[launcher][unit]") {
  CHECK_THAT(parse_error({"--logs-specs", "mine", "train.py"}),
             StartsWith("--logs-specs mine: ddprun loads no torchrun.logs_specs plugins") &&
                 Contains("drop it or use default"));
  // torchrun 2.x registers "default" itself: scripts and sbatch files pass it.
  parse_ok({"--logs_specs", "default", "train.py"});
  parse_ok({"--logs-specs=default", "train.py"});
  CHECK_THAT(parse_error({"--event_log_handler", "console", "train.py"}),
             Contains("--event_log PATH"));
  CHECK_THAT(parse_error({"--numa-binding", "socket", "train.py"}),
             StartsWith("--numa-binding socket: only node is implemented by ddprun"));
  CHECK(parse_ok({"--numa_binding", "node", "train.py"}).numa_binding == "node");
  CHECK_THAT(parse_error({"--numa_binding", "rack", "train.py"}),
             Contains("expected node, socket, exclusive or core-complex"));
}

TEST_CASE("the option --nproc_per_node xpu is refused with what to give instead",
          "[launcher][unit]") {
  CHECK_THAT(parse_error({"--nproc-per-node", "xpu", "train.py"}),
             StartsWith("--nproc-per-node xpu: ddprun cannot count Intel XPUs"));
}

TEST_CASE("the agent's store is on unless --agent_store off says otherwise", "[launcher][unit]") {
  CHECK(parse_ok({"train.py"}).agent_store);
  CHECK_FALSE(parse_ok({"--agent_store", "off", "train.py"}).agent_store);
  CHECK_FALSE(parse_ok({"train.py"}, {{"PET_AGENT_STORE", "0"}}).agent_store);
  CHECK_THAT(parse_error({"--agent_store", "maybe", "train.py"}), Contains("expected on or off"));
}

TEST_CASE("a job id that would leave --log_dir or carries control characters is refused",
          "[launcher][unit][security]") {
  const Args rest{"--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1", "train.py"};
  for (const std::string& id : std::vector<std::string>{"../../x", "a/b", "..", ".", "job\x1b[2J",
                                                        std::string("j\0b", 3)}) {
    Args args{"--rdzv_id", id};
    args.insert(args.end(), rest.begin(), rest.end());
    const std::string message = parse_error(args);
    CHECK(message.find("no '/', no control characters") != std::string::npos);
    CHECK(message.find('\x1b') == std::string::npos);  // quoted escaped, not raw
  }
  CHECK(parse_error({"--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1", "train.py"},
                    {{"PET_RDZV_ID", "x\ny"}})
            .find("PET_RDZV_ID=x\\x0ay") != std::string::npos);
  Args fine{"--rdzv_id", "my_job-1.2:3"};
  fine.insert(fine.end(), rest.begin(), rest.end());
  CHECK(parse_ok(fine).rdzv_id == "my_job-1.2:3");
}

TEST_CASE("a master or local address with control characters or spaces is refused, escaped",
          "[launcher][unit][security]") {
  const std::string message =
      parse_error({"train.py"}, {{"PET_MASTER_ADDR", "10.0.0.1\x1b]0;x\x07"}});
  CHECK(message ==
        "PET_MASTER_ADDR=10.0.0.1\\x1b]0;x\\x07: a host name or address has no spaces or control "
        "characters");
  CHECK(parse_error({"--master_addr", "a b", "train.py"}).find("no spaces") != std::string::npos);
  CHECK(parse_error({"--local_addr", "\x1b[2Jnode", "train.py"}) ==
        "--local_addr \\x1b[2Jnode: a host name or address has no spaces or control characters");
  CHECK(parse_ok({"--local_addr", " 10.0.0.2 ", "train.py"}).local_addr == "10.0.0.2");
  CHECK(parse_error({"--local_addr", "[::1]", "train.py"}).find("without brackets") !=
        std::string::npos);
}

TEST_CASE(
    "the defaults are the flag table's: a command line without flags gets them, --help "
    "shows them",
    "[launcher][unit]") {
  const LaunchConfig defaults = ddprun::launcher::default_launch_config();
  CHECK(defaults.min_nodes == 1);
  CHECK(defaults.max_nodes == 1);
  CHECK(defaults.nproc_kind == NprocKind::Count);
  CHECK(defaults.nproc_per_node == 1);
  CHECK(defaults.rdzv_backend == "static");
  CHECK(defaults.rdzv_id == "none");
  CHECK(defaults.master_addr == "127.0.0.1");
  CHECK(defaults.agent_store);
  CHECK(defaults.shutdown_timeout == 30.0);
  CHECK(defaults.monitor_interval == 0.1);
  CHECK(defaults.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(defaults.restart_backoff == 1.0);
  CHECK(defaults.restart_backoff_max == 30.0);
  CHECK(defaults.restart_backoff_reset == 60.0);
  CHECK(defaults.crash_loop_stop == 3);
  CHECK(defaults.quarantine_after == 2);
  CHECK(defaults.quarantine_cooldown == 30.0);
  CHECK(defaults.quarantine_cooldown_max == 600.0);
  CHECK(defaults.health_check == "builtin");
  CHECK(defaults.health_check_timeout == 60.0);
  CHECK(defaults.health_check_interval == 30.0);
  CHECK(defaults.standby_workers == ddprun::launcher::StandbyMode::Auto);
  CHECK_FALSE(defaults.standby_workers_given);
  CHECK(defaults.role == "default");
  CHECK(defaults.start_method == "spawn");
  CHECK(defaults.metrics_host == "127.0.0.1");
  CHECK(defaults.metrics_port == 0);

  const LaunchConfig parsed = parse_ok({"train.py"});
  CHECK(parsed.shutdown_timeout == defaults.shutdown_timeout);
  CHECK(parsed.rdzv_backend == defaults.rdzv_backend);
  CHECK(parsed.crash_loop_stop == defaults.crash_loop_stop);
  CHECK(parsed.signals_to_handle == defaults.signals_to_handle);
  CHECK(parsed.standby_workers == defaults.standby_workers);
  CHECK(parsed.health_check_interval == defaults.health_check_interval);
  // A bare --quarantine_cooldown keeps the default maximum, as --restart_backoff does.
  const LaunchConfig bare =
      parse_ok({"--quarantine_cooldown", "10", "--restart_backoff", "12", "train.py"});
  CHECK(bare.quarantine_cooldown == 10.0);
  CHECK(bare.quarantine_cooldown_max == 600.0);
  CHECK(bare.restart_backoff_max == 30.0);
  CHECK(parse_ok({"--quarantine_cooldown", "900", "train.py"}).quarantine_cooldown_max == 900.0);

  const std::string help = parse_info({"--help"});
  CHECK_THAT(help, Contains("SIGKILL (default 30)."));
  CHECK_THAT(help, Contains("(default 1:30; 0: no pause)"));
  CHECK_THAT(help, Contains("SIGTERM,SIGINT,SIGHUP,SIGQUIT)."));
  CHECK_THAT(help, !Contains("{default}"));
}

TEST_CASE("the flags ddprun status shares keep their spellings and PET_ variables",
          "[launcher][unit]") {
  using ddprun::launcher::Flag;
  CHECK(ddprun::launcher::flag_spellings(Flag::RdzvEndpoint) == "--rdzv_endpoint,--rdzv-endpoint");
  CHECK(ddprun::launcher::flag_spellings(Flag::Redirects) == "-r,--redirects");
  CHECK(ddprun::launcher::flag_env_name(Flag::RdzvId) == "PET_RDZV_ID");
}
