#include "launcher/cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <random>
#include <string_view>
#include <tuple>
#include <utility>

#include <CLI/CLI.hpp>

#include "common/check.h"
#include "common/exit_codes.h"
#include "common/signals.h"
#include "common/strings.h"
#include "common/version.h"
#include "etcd/client.h"
#include "launcher/slurm.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/limits.h"

namespace ddprun::launcher {
namespace {

using common::parse_bool;
using common::parse_double;
using common::parse_int;
using common::split;
using common::to_lower;
using common::trim;

/// A check of one flag: nullopt when the value is good, else the usage error (common/result.h).
using Check = std::optional<common::Error>;

constexpr std::string_view kNodes = "Nodes and workers";
constexpr std::string_view kRendezvous = "Rendezvous";
constexpr std::string_view kSupervision = "Supervision";
constexpr std::string_view kProgram = "How workers are started";
constexpr std::string_view kLogs = "Logs";
constexpr std::string_view kSlurm = "SLURM";

constexpr std::array<std::string_view, 6> kGroups = {kNodes,   kRendezvous, kSupervision,
                                                     kProgram, kLogs,       kSlurm};

/// Stands in for an empty "--flag=" value while CLI11 parses (see prepare_for_cli11).
constexpr std::string_view kEmptyValueMarker = "\001ddprun-empty-value\001";

constexpr std::string_view kDefaultSignals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

/// Where a row's help shows its default (help_of).
constexpr std::string_view kDefaultPlaceholder = "{default}";

/// Where one option's text came from, so errors can name the flag or the PET_ variable.
struct RawValue {
  std::string text;
  std::string label;  ///< "--nproc-per-node" as typed, "PET_NPROC_PER_NODE", or "--name" (default)
  bool from_env = false;
  bool given = false;  ///< false: text is the default
  bool on = false;     ///< a switch: given on the command line, or its PET_ variable true
};

/// "--nnodes 4:2" or "PET_NNODES=4:2": how an error message names a value.
std::string describe(const RawValue& value) {
  // Escaped: a value with control characters must not reach the terminal raw.
  const std::string text = common::printable(value.text);
  if (value.from_env) return value.label + "=" + text;
  return value.label + " " + (text.empty() ? std::string("\"\"") : text);
}

/// A switch is named without its value when it came from the command line.
std::string describe_switch(const RawValue& value) {
  return value.from_env ? describe(value) : value.label;
}

Check parse_nnodes(const RawValue& v, LaunchConfig& config) {
  const std::string fix = ": expected N or MIN:MAX, e.g. 2 or 1:4";
  std::vector<std::string> parts = split(v.text, ':');
  if (parts.size() > 2) return common::Error{describe(v) + fix};
  auto min_nodes = parse_int(trim(parts.front()));
  auto max_nodes = parts.size() == 2 ? parse_int(trim(parts.back())) : min_nodes;
  if (!min_nodes || !max_nodes) return common::Error{describe(v) + fix};
  if (*min_nodes < 1 || *max_nodes < 1)
    return common::Error{describe(v) + ": needs at least 1 node"};
  if (*min_nodes > *max_nodes) {
    return common::Error{describe(v) + ": the minimum (" + std::to_string(*min_nodes) +
                         ") is larger than the maximum (" + std::to_string(*max_nodes) + ")"};
  }
  if (*max_nodes > 1'000'000) return common::Error{describe(v) + ": at most 1000000 nodes"};
  config.min_nodes = static_cast<int>(*min_nodes);
  config.max_nodes = static_cast<int>(*max_nodes);
  return std::nullopt;
}

Check parse_nproc_per_node(const RawValue& v, LaunchConfig& config) {
  const std::string lowered = to_lower(trim(v.text));
  if (lowered == "cpu") {
    config.nproc_kind = NprocKind::Cpu;
  } else if (lowered == "gpu") {
    config.nproc_kind = NprocKind::Gpu;
  } else if (lowered == "auto") {
    config.nproc_kind = NprocKind::Auto;
  } else if (lowered == "xpu") {
    return common::Error{describe(v) +
                         ": ddprun cannot count Intel XPUs on this node; give the number of "
                         "workers, e.g. --nproc_per_node 4"};
  } else {
    auto count = parse_int(lowered);
    if (!count || *count < 1 || *count > 1'000'000) {
      return common::Error{describe(v) + ": expected a positive integer, cpu, gpu or auto"};
    }
    config.nproc_kind = NprocKind::Count;
    config.nproc_per_node = static_cast<int>(*count);
  }
  return std::nullopt;
}

Check parse_node_rank(const RawValue& v, LaunchConfig& config) {
  if (!v.given) return std::nullopt;
  auto rank = parse_int(trim(v.text));
  if (!rank || *rank < 0) return common::Error{describe(v) + ": expected a node rank, 0 or more"};
  if (*rank >= config.max_nodes) {
    return common::Error{describe(v) + ": must be less than the number of nodes (" +
                         std::to_string(config.max_nodes) + "); node ranks run 0.." +
                         std::to_string(config.max_nodes - 1)};
  }
  config.node_rank = static_cast<int>(*rank);
  return std::nullopt;
}

Check parse_rdzv_backend(const RawValue& v, LaunchConfig& config) {
  if (config.standalone) return std::nullopt;  // --standalone chose c10d
  const std::string lowered = to_lower(trim(v.text));
  // torchrun's etcd backends speak etcd's v2 API, which etcd 3.4 keeps off by default and 3.6
  // drops; ddprun's etcd backend is etcd-v3 (docs/design.md#rendezvous-on-etcd-v3).
  if (lowered == "etcd" || lowered == "etcd-v2") {
    return common::Error{describe(v) +
                         ": etcd's v2 API is not supported (etcd 3.4 serves it only with "
                         "--enable-v2, 3.6 not at all); use --rdzv_backend etcd-v3, ddprun's "
                         "backend on etcd's v3 API, with the same --rdzv_endpoint"};
  }
  if (lowered != "static" && lowered != "c10d" && lowered != "etcd-v3")
    return common::Error{describe(v) + ": expected static, c10d or etcd-v3"};
  config.rdzv_backend = lowered;
  return std::nullopt;
}

bool valid_port(std::string_view text) {
  auto port = parse_int(text);
  return port && *port >= 1 && *port <= 65535;
}

bool valid_host(std::string_view host) {
  if (host.empty()) return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
           c == ':' || c == '%';
  });
}

Check parse_rdzv_endpoint(const RawValue& v, LaunchConfig& config) {
  if (!v.given || config.standalone) return std::nullopt;
  const std::string endpoint = trim(v.text);
  if (config.rdzv_backend == "etcd-v3") {
    // Every etcd member's client URL, host:port[,host:port...]; the client fails over.
    auto members = etcd::parse_members(endpoint);
    if (!members)
      return common::Error{describe(v) + ": " + members.error().message +
                           "; expected host:port[,host:port...], each etcd member's client URL"};
    config.rdzv_endpoint = endpoint;
    return std::nullopt;
  }
  const std::string fix = ": expected host:port, [ipv6]:port or host, e.g. head:29400";
  auto split = rdzv::split_endpoint(endpoint);
  if (auto* error = std::get_if<rdzv::EndpointError>(&split)) {
    switch (*error) {
      case rdzv::EndpointError::MissingBracket:
        return common::Error{describe(v) + ": missing ']'" + fix};
      case rdzv::EndpointError::BareIpv6:
        return common::Error{describe(v) +
                             ": put an IPv6 address in brackets, e.g. [fd00::1]:29400"};
      case rdzv::EndpointError::Malformed:
        break;
    }
    return common::Error{describe(v) + fix};
  }
  const auto& [host, port] = std::get<rdzv::EndpointParts>(split);
  if (!valid_host(host)) return common::Error{describe(v) + fix};
  if (port && !valid_port(*port)) return common::Error{describe(v) + ": the port must be 1..65535"};
  config.rdzv_endpoint = endpoint;
  return std::nullopt;
}

Check parse_rdzv_conf(const RawValue& v, LaunchConfig& config) {
  static const std::array<std::string_view, 5> kSecondsKeys = {
      "join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval",
      "connect_timeout"};
  for (const std::string& piece : split(v.text, ',')) {
    const std::string pair = trim(piece);
    if (pair.empty()) continue;  // "a=1," is accepted, as torchrun does
    const size_t eq = pair.find('=');
    const std::string key = eq == std::string::npos ? "" : trim(pair.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : trim(pair.substr(eq + 1));
    if (key.empty() || value.empty()) {
      return common::Error{describe(v) + ": malformed pair '" + pair +
                           "'; expected key=value,key2=value2"};
    }
    // The server's own ranges (rendezvous/limits.h), so a value accepted here is never
    // refused later by the server with a wire-protocol message.
    const rdzv::SettingLimit* limit = rdzv::find_setting_limit(key);
    if (std::find(kSecondsKeys.begin(), kSecondsKeys.end(), key) != kSecondsKeys.end()) {
      auto seconds = parse_double(value);
      if (!seconds || !(*seconds > 0)) {
        return common::Error{describe(v) + ": " + key + "=" + value +
                             " must be a positive number of seconds"};
      }
      const double ms = *seconds * 1000.0;
      if (limit && (ms < static_cast<double>(limit->min) || ms > static_cast<double>(limit->max)))
        return common::Error{describe(v) + ": " + key + "=" + value + " is out of range: allowed " +
                             rdzv::describe_range(*limit)};
      if (!limit && ms > static_cast<double>(rdzv::kDayMs))
        return common::Error{describe(v) + ": " + key + "=" + value +
                             " is out of range: allowed up to 86400 seconds"};
    } else if (key == "keep_alive_max_attempt") {
      auto attempts = parse_int(value);
      if (!attempts || *attempts < 1) {
        return common::Error{describe(v) + ": " + key + "=" + value +
                             " must be a positive integer"};
      }
      if (limit && (*attempts < limit->min || *attempts > limit->max))
        return common::Error{describe(v) + ": " + key + "=" + value + " is out of range: allowed " +
                             rdzv::describe_range(*limit)};
    } else if (key == "is_host") {
      if (!parse_bool(value)) {
        return common::Error{describe(v) + ": is_host=" + value + " must be 1, 0, true or false"};
      }
    }
    config.rdzv_conf[key] = value;
  }
  const bool etcd = config.rdzv_backend == "etcd-v3";
  const bool user = config.rdzv_conf.count("etcd_user") > 0;
  const bool password = config.rdzv_conf.count("etcd_password_file") > 0;
  if ((user || password) && !etcd)
    return common::Error{describe(v) + ": " + (user ? "etcd_user" : "etcd_password_file") +
                         " is for --rdzv_backend etcd-v3 only"};
  if (user != password)
    return common::Error{describe(v) +
                         ": etcd_user and etcd_password_file go together (the "
                         "etcd user and a file holding its password)"};
  if (etcd && config.rdzv_conf.count("secret_file"))
    return common::Error{describe(v) +
                         ": secret_file is the c10d rendezvous's; with etcd-v3 etcd checks "
                         "who may join: give etcd_user and etcd_password_file"};
  // torchrun's etcd rendezvous takes TLS as protocol, cacert, cert and key: silently ignored,
  // they would leave an etcd-v3 job on plain HTTP.
  for (const auto& [torchrun_key, ours] :
       {std::pair{"cacert", "tls_ca"}, std::pair{"cert", "tls_cert"}, std::pair{"key", "tls_key"}})
    if (etcd && config.rdzv_conf.count(torchrun_key))
      return common::Error{describe(v) + ": " + torchrun_key +
                           " is torchrun's etcd spelling; etcd-v3 takes " + ours +
                           "=FILE (TLS follows from tls_ca: no protocol=https needed)"};
  if (etcd && to_lower(trim(config.rdzv_conf.count("protocol") ? config.rdzv_conf["protocol"]
                                                               : "")) == "https")
    return common::Error{describe(v) +
                         ": protocol=https is torchrun's etcd spelling; etcd-v3 speaks TLS when "
                         "given tls_ca=FILE (the CA of etcd's certificate)"};
  if (etcd && config.rdzv_conf.count("is_host"))
    return common::Error{describe(v) +
                         ": is_host means nothing with etcd-v3 (no node hosts "
                         "the rendezvous; etcd holds it): drop it"};
  return std::nullopt;
}

/// A host name or address: no spaces or control characters (it goes into MASTER_ADDR, logs
/// and the status table).
Check check_host(const RawValue& v, const std::string& addr) {
  if (common::has_control_characters(addr) || addr.find(' ') != std::string::npos)
    return common::Error{describe(v) +
                         ": a host name or address has no spaces or control characters"};
  return std::nullopt;
}

Check parse_master_addr(const RawValue& v, LaunchConfig& config) {
  const std::string addr = trim(v.text);
  if (addr.empty())
    return common::Error{describe(v) + ": needs a host name or address, e.g. 10.0.0.1"};
  if (auto bad = check_host(v, addr)) return bad;
  config.master_addr = addr;
  return std::nullopt;
}

Check parse_local_addr(const RawValue& v, LaunchConfig& config) {
  const std::string addr = trim(v.text);
  if (auto bad = check_host(v, addr)) return bad;
  // It becomes MASTER_ADDR as it is: an address in brackets ([::1]) or a URL is none.
  if (!addr.empty() && !valid_host(addr))
    return common::Error{describe(v) +
                         ": expected a host name or an address without brackets (letters, "
                         "digits and . - _ : %), e.g. 10.0.0.2 or fe80::1%eth0"};
  config.local_addr = addr;  // empty: the address the connection leaves from
  return std::nullopt;
}

Check parse_master_port(const RawValue& v, LaunchConfig& config) {
  if (!v.given) return std::nullopt;
  const std::string text = trim(v.text);
  if (!valid_port(text)) return common::Error{describe(v) + ": expected a port 1..65535"};
  config.master_port = static_cast<int>(*parse_int(text));
  return std::nullopt;
}

Check parse_metrics_port(const RawValue& v, LaunchConfig& config) {
  if (!v.given) return std::nullopt;
  const std::string text = trim(v.text);
  if (!valid_port(text)) return common::Error{describe(v) + ": expected a port 1..65535"};
  config.metrics_port = static_cast<int>(*parse_int(text));
  return std::nullopt;
}

Check parse_metrics_host(const RawValue& v, LaunchConfig& config) {
  config.metrics_host = trim(v.text);
  if (config.metrics_host.empty())
    return common::Error{describe(v) + ": needs a host name or address, e.g. 127.0.0.1"};
  return std::nullopt;
}

Check parse_max_restarts(const RawValue& v, LaunchConfig& config) {
  auto restarts = parse_int(trim(v.text));
  if (!restarts) return common::Error{describe(v) + ": expected a whole number, 0 or more"};
  if (*restarts < 0) return common::Error{describe(v) + ": must be 0 or more"};
  if (*restarts > 1'000'000'000) return common::Error{describe(v) + ": at most 1000000000"};
  config.max_restarts = static_cast<int>(*restarts);
  return std::nullopt;
}

Check parse_monitor_interval(const RawValue& v, LaunchConfig& config) {
  auto seconds = parse_double(trim(v.text));
  if (!seconds || *seconds <= 0)
    return common::Error{describe(v) + ": expected a positive number of seconds"};
  config.monitor_interval = *seconds;
  return std::nullopt;
}

Check parse_shutdown_timeout(const RawValue& v, LaunchConfig& config) {
  auto seconds = parse_double(trim(v.text));
  if (!seconds || *seconds < 0)
    return common::Error{describe(v) + ": expected a number of seconds, 0 or more"};
  config.shutdown_timeout = *seconds;
  return std::nullopt;
}

/// SECONDS or SECONDS:MAX, each 0 to a day, MAX not under SECONDS (`first` names SECONDS in
/// that message, `fix` shows the form); without MAX, `default_max` (at least SECONDS).
common::Result<std::pair<double, double>> parse_seconds_range(const RawValue& v,
                                                              const std::string& fix,
                                                              const std::string& first,
                                                              std::optional<double> default_max) {
  const std::vector<std::string> parts = split(trim(v.text), ':');
  if (parts.size() > 2) return common::Error{describe(v) + fix};
  auto base = parse_double(trim(parts.front()));
  auto max = parts.size() == 2 ? parse_double(trim(parts.back())) : default_max;
  if (parts.size() == 1 && !max) max = base;
  if (!base || !max || *base < 0 || *max < 0) return common::Error{describe(v) + fix};
  if (*base > 86400 || *max > 86400)
    return common::Error{describe(v) + ": at most 86400 seconds (a day)"};
  if (parts.size() == 2 && *max < *base)
    return common::Error{describe(v) + ": the maximum (" + trim(parts.back()) +
                         ") is shorter than the " + first + " (" + trim(parts.front()) + ")"};
  return std::pair<double, double>{*base, std::max(*max, *base)};
}

Check parse_restart_backoff(const RawValue& v, LaunchConfig& config) {
  auto range = parse_seconds_range(v, ": expected SECONDS or SECONDS:MAX, e.g. 1:30 (0: no pause)",
                                   "first pause", 30.0);
  if (!range.ok()) return range.error();
  std::tie(config.restart_backoff, config.restart_backoff_max) = *range;
  return std::nullopt;
}

Check parse_restart_backoff_reset(const RawValue& v, LaunchConfig& config) {
  auto seconds = parse_double(trim(v.text));
  if (!seconds || *seconds < 0 || *seconds > 30 * 86400)
    return common::Error{describe(v) + ": expected a number of seconds, 0 to 2592000"};
  config.restart_backoff_reset = *seconds;
  return std::nullopt;
}

Check parse_restart_window(const RawValue& v, LaunchConfig& config) {
  auto seconds = parse_double(trim(v.text));
  // At most 24 days: the window travels in milliseconds as a 32-bit integer.
  if (!seconds || *seconds < 0 || *seconds > 24 * 86400)
    return common::Error{describe(v) +
                         ": expected a number of seconds, 0 (the whole job) to 2073600"};
  config.restart_window = *seconds;
  return std::nullopt;
}

Check parse_crash_loop_stop(const RawValue& v, LaunchConfig& config) {
  auto n = parse_int(trim(v.text));
  if (!n || *n < 0 || *n == 1 || *n > 1'000'000)
    return common::Error{describe(v) +
                         ": expected 0 (off) or a number of failures in a row from 2 to 1000000"};
  config.crash_loop_stop = static_cast<int>(*n);
  return std::nullopt;
}

Check parse_quarantine_after(const RawValue& v, LaunchConfig& config) {
  auto n = parse_int(trim(v.text));
  if (!n || *n < 0 || *n > 1'000'000)
    return common::Error{describe(v) +
                         ": expected 0 (off) or a number of failures in a row from 1 to 1000000"};
  config.quarantine_after = static_cast<int>(*n);
  return std::nullopt;
}

Check parse_quarantine_cooldown(const RawValue& v, LaunchConfig& config) {
  // SECONDS alone keeps the default maximum, as --restart_backoff's does: each quarantine of
  // the same node still doubles.
  auto range = parse_seconds_range(v, ": expected SECONDS or SECONDS:MAX, e.g. 30:600",
                                   "first cooldown", 600.0);
  if (!range.ok()) return range.error();
  std::tie(config.quarantine_cooldown, config.quarantine_cooldown_max) = *range;
  return std::nullopt;
}

Check parse_fatal_exit_codes(const RawValue& v, LaunchConfig& config) {
  config.fatal_exit_codes.clear();
  const std::string text = trim(v.text);
  if (text.empty()) return std::nullopt;
  for (const std::string& part : split(text, ',')) {
    auto code = parse_int(trim(part));
    if (!code || *code < 1 || *code > 255)
      return common::Error{describe(v) + ": '" + trim(part) +
                           "' is no failing exit code: expected codes from 1 to 255, e.g. 3,42"};
    config.fatal_exit_codes.push_back(static_cast<int>(*code));
  }
  std::sort(config.fatal_exit_codes.begin(), config.fatal_exit_codes.end());
  config.fatal_exit_codes.erase(
      std::unique(config.fatal_exit_codes.begin(), config.fatal_exit_codes.end()),
      config.fatal_exit_codes.end());
  return std::nullopt;
}

Check parse_health_check(const RawValue& check, LaunchConfig& config) {
  config.health_check = trim(check.text);
  if (config.health_check.empty())
    return common::Error{describe(check) +
                         ": expected builtin, off, or a command to run with /bin/sh -c"};
  for (const char c : config.health_check) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\t')
      return common::Error{describe(check) + ": a command must not contain control characters"};
  }
  // A command that starts with a path must name a program that can run: found now, not after
  // the first failed check.
  const std::string& cmd = config.health_check;
  const std::string program = cmd.substr(0, cmd.find_first_of(" \t"));
  if (program.find('/') != std::string::npos &&
      program.find_first_of("$`'\"\\;|&<>(){}*?[]~=") == std::string::npos) {
    struct stat st {};
    if (::stat(program.c_str(), &st) != 0)
      return common::Error{describe(check) + ": " + program + ": " + std::strerror(errno)};
    if (!S_ISREG(st.st_mode) || ::access(program.c_str(), X_OK) != 0)
      return common::Error{describe(check) + ": " + program +
                           " is not an executable file (chmod +x it, or run it with sh " + program +
                           ")"};
  }
  return std::nullopt;
}

/// --health_check_timeout and --health_check_interval: more than 0, at most a day.
Check parse_check_seconds(const RawValue& v, double& out) {
  auto s = parse_double(trim(v.text));
  if (!s || *s <= 0 || *s > 86400)
    return common::Error{describe(v) +
                         ": expected a number of seconds, more than 0 and at most 86400"};
  out = *s;
  return std::nullopt;
}

Check parse_health_check_timeout(const RawValue& v, LaunchConfig& config) {
  return parse_check_seconds(v, config.health_check_timeout);
}

Check parse_health_check_interval(const RawValue& v, LaunchConfig& config) {
  return parse_check_seconds(v, config.health_check_interval);
}

Check parse_watchdog_timeout(const RawValue& v, LaunchConfig& config) {
  auto seconds = parse_double(trim(v.text));
  if (!seconds || *seconds < 0)
    return common::Error{describe(v) + ": expected a number of seconds, 0 (off) or more"};
  config.watchdog_timeout = *seconds;
  return std::nullopt;
}

Check parse_signals_to_handle(const RawValue& v, LaunchConfig& config) {
  std::vector<int> signals;
  for (const std::string& piece : split(v.text, ',')) {
    const std::string item = trim(piece);
    if (item.empty()) {
      return common::Error{describe(v) +
                           ": expected a comma-separated list of signals, e.g. SIGTERM,SIGINT"};
    }
    auto signum = common::parse_signal(item);
    if (!signum) return common::Error{describe(v) + ": unknown signal " + item};
    if (*signum == SIGKILL || *signum == SIGSTOP) {
      return common::Error{describe(v) + ": " + common::signal_name(*signum) +
                           " cannot be caught by any process; drop it"};
    }
    if (*signum == SIGCHLD) {
      return common::Error{describe(v) + ": SIGCHLD is how ddprun watches its workers; drop it"};
    }
    if (std::find(signals.begin(), signals.end(), *signum) == signals.end()) {
      signals.push_back(*signum);
    }
  }
  config.signals_to_handle = std::move(signals);
  return std::nullopt;
}

Check parse_standby_workers(const RawValue& v, LaunchConfig& config) {
  config.standby_workers_given = v.given;
  const std::string text = to_lower(trim(v.text));
  // A bare flag (or PET_STANDBY_WORKERS=1) is on, as before the value existed.
  if (text.empty() || text == "on") {
    config.standby_workers = StandbyMode::On;
  } else if (text == "off") {
    config.standby_workers = StandbyMode::Off;
  } else if (text == "auto") {
    config.standby_workers = StandbyMode::Auto;
  } else if (auto on = parse_bool(text)) {
    config.standby_workers = *on ? StandbyMode::On : StandbyMode::Off;
  } else {
    return common::Error{(v.from_env ? describe(v) : v.label + "=" + v.text) +
                         ": expected off, on or auto (bare " + v.label + " is on)"};
  }
  return std::nullopt;
}

Check parse_agent_store(const RawValue& v, LaunchConfig& config) {
  const std::string text = to_lower(trim(v.text));
  auto on = text == "on" || text == "off" ? std::optional<bool>(text == "on") : parse_bool(text);
  if (!on) return common::Error{describe(v) + ": expected on or off"};
  config.agent_store = *on;
  return std::nullopt;
}

Check parse_cleanup(const RawValue& v, LaunchConfig& config) {
  auto mode = agent::parse_cleanup_mode(to_lower(trim(v.text)));
  if (!mode) return common::Error{describe(v) + ": expected auto, cgroup or subreaper"};
  config.cleanup = *mode;
  return std::nullopt;
}

Check parse_start_method(const RawValue& v, LaunchConfig& config) {
  const std::string method = trim(v.text);
  if (method != "spawn" && method != "fork" && method != "forkserver") {
    return common::Error{describe(v) + ": expected spawn, fork or forkserver"};
  }
  config.start_method = method;
  return std::nullopt;
}

Check parse_role(const RawValue& v, LaunchConfig& config) {
  const std::string role = trim(v.text);
  if (role.empty()) return common::Error{describe(v) + ": the role needs a name, e.g. trainer"};
  config.role = role;
  return std::nullopt;
}

std::optional<StdStreams> parse_std_value(std::string_view text) {
  auto value = parse_int(trim(text));
  if (!value || *value < 0 || *value > 3) return std::nullopt;
  return static_cast<StdStreams>(*value);
}

Check parse_std_spec(const RawValue& v, StdSpec& spec) {
  const std::string fix =
      ": expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per local rank like 0:1,1:2";
  const std::string text = trim(v.text);
  if (text.find(':') == std::string::npos) {
    auto value = parse_std_value(text);
    if (!value) return common::Error{describe(v) + fix};
    spec = StdSpec{*value, {}};
    return std::nullopt;
  }
  StdSpec parsed;
  for (const std::string& pair : split(text, ',')) {
    std::vector<std::string> parts = split(pair, ':');
    if (parts.size() != 2) return common::Error{describe(v) + fix};
    auto rank = parse_int(trim(parts[0]));
    auto value = parse_std_value(parts[1]);
    if (!rank || *rank < 0 || *rank > 1'000'000 || !value) return common::Error{describe(v) + fix};
    if (!parsed.per_rank.emplace(static_cast<int>(*rank), *value).second) {
      return common::Error{describe(v) + ": local rank " + std::to_string(*rank) +
                           " is given twice"};
    }
  }
  spec = std::move(parsed);
  return std::nullopt;
}

Check parse_redirects(const RawValue& v, LaunchConfig& config) {
  return parse_std_spec(v, config.redirects);
}

Check parse_tee(const RawValue& v, LaunchConfig& config) { return parse_std_spec(v, config.tee); }

Check parse_dedup_output(const RawValue& v, LaunchConfig& config) {
  auto seconds = parse_double(trim(v.text));
  if (!seconds || *seconds < 0 || *seconds > 60)
    return common::Error{describe(v) + ": expected a number of seconds from 0 (off) to 60, e.g. 1"};
  config.dedup_output = *seconds;
  return std::nullopt;
}

Check parse_local_ranks_filter(const RawValue& v, LaunchConfig& config) {
  const std::string text = trim(v.text);
  if (text.empty()) return std::nullopt;  // "" means no filter, as in torchrun
  std::set<int> ranks;
  for (const std::string& piece : split(text, ',')) {
    auto rank = parse_int(trim(piece));
    if (!rank || *rank < 0 || *rank > 1'000'000) {
      return common::Error{describe(v) + ": expected comma-separated local ranks, e.g. 0,2"};
    }
    ranks.insert(static_cast<int>(*rank));
  }
  config.local_ranks_filter = std::move(ranks);
  return std::nullopt;
}

/// torchrun's comma_separated_list: "a,b" is two texts, ",," a literal comma.
Check parse_duplicate_filters(const RawValue& v, std::vector<std::string>& filters) {
  filters.clear();
  std::string current;
  const std::string& text = v.text;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      current += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      current += ',';
      ++i;
    } else {
      if (!current.empty()) filters.push_back(current);
      current.clear();
    }
  }
  if (!current.empty()) filters.push_back(current);
  return std::nullopt;
}

Check parse_duplicate_stdout_filters(const RawValue& v, LaunchConfig& config) {
  return parse_duplicate_filters(v, config.duplicate_stdout_filters);
}

Check parse_duplicate_stderr_filters(const RawValue& v, LaunchConfig& config) {
  return parse_duplicate_filters(v, config.duplicate_stderr_filters);
}

/// A uuid4-style id, so two standalone jobs on one host never share a rendezvous.
std::string random_run_id() {
  std::random_device device;
  std::array<unsigned, 16> bytes{};
  for (unsigned& byte : bytes) byte = device() & 0xffU;
  bytes[6] = (bytes[6] & 0x0fU) | 0x40U;
  bytes[8] = (bytes[8] & 0x3fU) | 0x80U;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
    id += kHex[bytes[i] >> 4];
    id += kHex[bytes[i] & 0x0fU];
  }
  return id;
}

/// The parsers of the flags that are their text, trimmed or not, or a switch.
template <auto Field>
Check set_text(const RawValue& v, LaunchConfig& config) {
  config.*Field = v.text;
  return std::nullopt;
}

template <auto Field>
Check set_switch(const RawValue& v, LaunchConfig& config) {
  config.*Field = v.on;
  return std::nullopt;
}

Check parse_standalone(const RawValue& v, LaunchConfig& config) {
  config.standalone = v.on;
  if (!config.standalone) return std::nullopt;
  // torchrun overrides any explicit rendezvous flags under --standalone; so do we.
  config.rdzv_backend = "c10d";
  config.rdzv_endpoint = "localhost:0";
  config.rdzv_id = random_run_id();
  return std::nullopt;
}

Check parse_rdzv_id(const RawValue& v, LaunchConfig& config) {
  if (config.standalone) return std::nullopt;  // --standalone chose a fresh one
  config.rdzv_id = v.text;
  if (config.rdzv_id.size() > rdzv::kMaxIdentifierBytes)
    return common::Error{"--rdzv_id of " + std::to_string(config.rdzv_id.size()) +
                         " bytes: at most " + std::to_string(rdzv::kMaxIdentifierBytes)};
  // The id names a directory under --log_dir and keys of the rendezvous (etcd's among them).
  if (common::has_control_characters(config.rdzv_id) ||
      config.rdzv_id.find('/') != std::string::npos || config.rdzv_id == "." ||
      config.rdzv_id == "..")
    return common::Error{describe(v) +
                         ": a job id names a directory under --log_dir and the job's keys: no "
                         "'/', no control characters, not '.' or '..' (e.g. my_job-1)"};
  return std::nullopt;
}

Check parse_local_rank_arg(const RawValue& v, LaunchConfig& config) {
  if (!v.given) return std::nullopt;
  const std::string spelling = trim(v.text);
  if (spelling != "local-rank" && spelling != "local_rank")
    return common::Error{describe(v) +
                         ": expected local-rank (the script parses --local-rank, as "
                         "torch.distributed.launch 2.x passes it) or local_rank (--local_rank, "
                         "torch 1.x)"};
  config.local_rank_arg = spelling;
  return std::nullopt;
}

Check parse_numa_binding(const RawValue& v, LaunchConfig& config) {
  if (!v.given) return std::nullopt;
  const std::string mode = trim(v.text);
  if (mode != "node" && mode != "socket" && mode != "exclusive" && mode != "core-complex")
    return common::Error{describe(v) + ": expected node, socket, exclusive or core-complex"};
  if (mode != "node")
    return common::Error{describe(v) +
                         ": only node is implemented by ddprun; use --numa_binding node"};
  config.numa_binding = mode;
  return std::nullopt;
}

Check parse_standby_preload(const RawValue& v, LaunchConfig& config) {
  config.standby_preload.clear();
  for (const std::string& piece : split(v.text, ',')) {
    const std::string name = trim(piece);
    if (name.empty()) continue;
    const bool valid = std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
    });
    if (!valid || name.front() == '.' || std::isdigit(static_cast<unsigned char>(name.front())))
      return common::Error{
          describe(v) + ": \"" + name +
          "\" is not a Python module name; expected e.g. numpy,torchvision.models"};
    config.standby_preload.push_back(name);
  }
  return std::nullopt;
}

Check parse_standby_cuda(const RawValue& v, LaunchConfig& config) {
  const std::string text = to_lower(trim(v.text));
  if (text == "off")
    config.standby_cuda = agent::StandbyCuda::Off;
  else if (text == "context")
    config.standby_cuda = agent::StandbyCuda::Context;
  else if (text == "warm")
    config.standby_cuda = agent::StandbyCuda::Warm;
  else
    return common::Error{describe(v) + ": expected off, context or warm"};
  return std::nullopt;
}

Check parse_logs_specs(const RawValue& v, LaunchConfig&) {
  if (trim(v.text) == "default") return std::nullopt;
  return common::Error{describe(v) +
                       ": ddprun loads no torchrun.logs_specs plugins; drop it or use default "
                       "(logs are laid out as torchrun's DefaultLogsSpecs does: --log_dir, "
                       "--redirects, --tee)"};
}

Check parse_event_log_handler(const RawValue& v, LaunchConfig&) {
  if (trim(v.text) == "null") return std::nullopt;
  return common::Error{describe(v) +
                       ": ddprun has no torchrun event handlers; drop it or use null, and pass "
                       "--event_log PATH for ddprun's recovery timeline"};
}

/// One row per flag: drives the CLI11 parser, the PET_ fallback, the default, the parser into
/// LaunchConfig and the --help text. A new flag is one row, one parser and one field.
struct OptionSpec {
  Flag id;  ///< kOptions[id] is this row (checked below)
  /// Sets the flag's field of LaunchConfig from its text (the default's when neither the flag
  /// nor PET_ is set). Rows are parsed in table order, so a parser may read what rows above it
  /// set: --node_rank reads --nnodes, the rendezvous rows read --standalone and
  /// --rdzv_backend. Rules that involve flags in either order are check_combinations'.
  Check (*parse)(const RawValue& value, LaunchConfig& config);
  std::string_view name;        ///< canonical, underscored, no dashes: "nproc_per_node"
  std::string_view short_name;  ///< one letter or ""
  bool is_switch;               ///< takes no value (--standalone); PET_ value is 1/0/true/false
  std::string_view metavar;
  std::string_view default_text;  ///< parsed like a user value when neither flag nor PET_ is set
  std::string_view group;
  std::string_view help;
  /// A switch that also takes a value, only as --name=VALUE (so `--name script.py` still reads
  /// the script): --standby_workers=auto.
  bool value_after_equals = false;
};

// clang-format off
constexpr OptionSpec kOptions[] = {
    {Flag::Nnodes, parse_nnodes,
     "nnodes", "", false, "N|MIN:MAX", "1:1", kNodes,
     "Number of nodes, or an elastic range MIN:MAX (default {default})."},
    {Flag::NprocPerNode, parse_nproc_per_node,
     "nproc_per_node", "", false, "N|cpu|gpu|auto", "1", kNodes,
     "Workers per node: a count, cpu (one per core), gpu (one per GPU) or auto (gpu when there "
     "are GPUs, else cpu) (default {default})."},
    {Flag::VirtualLocalRank, set_switch<&LaunchConfig::virtual_local_rank>,
     "virtual_local_rank", "", true, "", "", kNodes,
     "Every worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES set to its own GPU (the local "
     "rank's entry of ddprun's CUDA_VISIBLE_DEVICES, else the local rank), as torchrun does."},
    {Flag::NumaBinding, parse_numa_binding,
     "numa_binding", "", false, "node", "", kNodes,
     "Bind each worker to the CPUs of its GPU's NUMA node (local rank = GPU index, as in "
     "torchrun; without GPUs, local ranks go round the NUMA nodes). socket, exclusive and "
     "core-complex are refused."},
    {Flag::NodeRank, parse_node_rank,
     "node_rank", "", false, "RANK", "", kNodes,
     "This node's rank, 0..nnodes-1; required on every node by the static rendezvous, honoured "
     "by c10d (default: c10d assigns one; a single node is 0)."},
    {Flag::Standalone, parse_standalone,
     "standalone", "", true, "", "", kRendezvous,
     "Single-node job with a local c10d rendezvous on a free port; sets --rdzv_backend, "
     "--rdzv_endpoint and --rdzv_id for you."},
    {Flag::RdzvBackend, parse_rdzv_backend,
     "rdzv_backend", "", false, "static|c10d|etcd-v3", "static", kRendezvous,
     "Rendezvous backend (default {default}: fixed nodes meeting at --master_addr; etcd-v3: the "
     "rendezvous held in an etcd v3 cluster)."},
    {Flag::RdzvEndpoint, parse_rdzv_endpoint,
     "rdzv_endpoint", "", false, "HOST[:PORT]", "", kRendezvous,
     "Rendezvous address, e.g. head:29400 or [fd00::1]:29400; for etcd-v3 every member, "
     "host:port[,host:port...]."},
    {Flag::RdzvId, parse_rdzv_id,
     "rdzv_id", "", false, "ID", "none", kRendezvous,
     "Job id; every node of one job passes the same id (default {default})."},
    {Flag::RdzvConf, parse_rdzv_conf,
     "rdzv_conf", "", false, "K=V,...", "", kRendezvous,
     "Rendezvous settings: join_timeout (600), last_call_timeout (30), close_timeout (30), "
     "keep_alive_interval (5), connect_timeout (60) in seconds; keep_alive_max_attempt (3); "
     "is_host (0/1); secret_file (the rendezvous's shared secret, also "
     "$DDPRUN_RDZV_SECRET_FILE); tls_ca, tls_cert, tls_key (PEM files: TLS to the "
     "rendezvous); etcd_user, etcd_password_file (etcd-v3: etcd's authentication)."},
    {Flag::MasterAddr, parse_master_addr,
     "master_addr", "", false, "HOST", "127.0.0.1", kRendezvous,
     "Address of the node with rank 0 (static rendezvous); workers get it as MASTER_ADDR "
     "(default {default})."},
    {Flag::MasterPort, parse_master_port,
     "master_port", "", false, "PORT", "", kRendezvous,
     "Port on the master node, 1..65535 (default: a free port chosen by ddprun)."},
    {Flag::AgentStore, parse_agent_store,
     "agent_store", "", false, "on|off", "on", kRendezvous,
     "on: the agent hosts the workers' TCPStore at MASTER_ADDR:MASTER_PORT, bound before they "
     "start (TORCHELASTIC_USE_AGENT_STORE=True); off: worker rank 0 hosts it, as torchrun "
     "1.13 does for c10d (default {default})."},
    {Flag::LocalAddr, parse_local_addr,
     "local_addr", "", false, "HOST", "", kRendezvous,
     "This node's address as the other nodes see it: the rendezvous connection leaves from it "
     "and it is MASTER_ADDR when this node is group rank 0 (default: the address the "
     "connection leaves from)."},
    {Flag::MaxRestarts, parse_max_restarts,
     "max_restarts", "", false, "N", "0", kSupervision,
     "Restart the whole worker group up to N times after a failure (default {default})."},
    {Flag::MonitorInterval, parse_monitor_interval,
     "monitor_interval", "", false, "SECONDS", "0.1", kSupervision,
     "Accepted for torchrun compatibility; worker exits are noticed at once (default {default})."},
    {Flag::ShutdownTimeout, parse_shutdown_timeout,
     "shutdown_timeout", "", false, "SECONDS", "30", kSupervision,
     "Time workers get between the stop signal and SIGKILL (default {default})."},
    {Flag::SignalsToHandle, parse_signals_to_handle,
     "signals_to_handle", "", false, "SIG,...", kDefaultSignals, kSupervision,
     "Signals that make ddprun stop its workers and exit (default {default})."},
    {Flag::WatchdogTimeout, parse_watchdog_timeout,
     "watchdog_timeout", "", false, "SECONDS", "0", kSupervision,
     "Kill a worker as hung when it made progress (a report through the ddprun SDK, or a line "
     "of output) and then none for this long, after logging its stacks; its group fails like "
     "a crash (default {default}: off)."},
    {Flag::RestartBackoff, parse_restart_backoff,
     "restart_backoff", "", false, "SECONDS[:MAX]", "1:30", kSupervision,
     "Pause before the next round after the same failure in a row (each within "
     "--restart_backoff_reset of its group's start): none after the first, nor after a lost "
     "node or a failure of another kind, then SECONDS, "
     "doubling up to MAX; a stop signal during the pause ends the job at once (default {default}; "
     "0: no pause)."},
    {Flag::RestartBackoffReset, parse_restart_backoff_reset,
     "restart_backoff_reset", "", false, "SECONDS", "60", kSupervision,
     "A group that ran this long before it failed starts the pause schedule afresh (default "
     "{default}; 0: every failure starts it afresh, and only a reported step or --progress_file "
     "counts as progress)."},
    {Flag::RestartWindow, parse_restart_window,
     "restart_window", "", false, "SECONDS", "0", kSupervision,
     "Hold --max_restarts against the restarts of the last SECONDS only, so that a long job "
     "survives occasional failures while a crash loop still stops (default {default}: the "
     "whole job)."},
    {Flag::CrashLoopStop, parse_crash_loop_stop,
     "crash_loop_stop", "", false, "N", "3", kSupervision,
     "End the job with exit 78 (do not requeue) when the same failure (exit code or signal, "
     "exception type) comes N times in a row with no progress in between: no training "
     "step reported, no group that ran --restart_backoff_reset (default {default}; 0: off). "
     "With --max_restarts N or less and no --restart_window, after the whole budget."},
    {Flag::QuarantineAfter, parse_quarantine_after,
     "quarantine_after", "", false, "N", "2", kSupervision,
     "Leave a node out of the job for a while when its workers caused N group failures in a "
     "row (no other node's between), if the job can go on without it: a spare takes its place, "
     "or the round is smaller within --nnodes (default {default}; 0: off)."},
    {Flag::QuarantineCooldown, parse_quarantine_cooldown,
     "quarantine_cooldown", "", false, "SECONDS[:MAX]", "30:600", kSupervision,
     "How long a node's first quarantine lasts; each further one doubles it, up to MAX (600 "
     "when not given). The node then checks itself and joins again as a spare (default "
     "{default})."},
    {Flag::ProgressFile, set_text<&LaunchConfig::progress_file>,
     "progress_file", "", false, "PATH", "", kSupervision,
     "A file the training program rewrites as it gets somewhere (a checkpoint's iteration "
     "file): a group during which it changed made progress, so its failure is no crash loop "
     "(default: none)."},
    {Flag::FatalExitCodes, parse_fatal_exit_codes,
     "fatal_exit_codes", "", false, "CODE,...", "", kSupervision,
     "Worker exit codes that no restart can help: the job ends at once with exit 78 (do not "
     "requeue), whatever is left of --max_restarts (default: none)."},
    {Flag::HealthCheck, parse_health_check,
     "health_check", "", false, "builtin|off|CMD", "builtin", kSupervision,
     "Check this node before it joins each round and keep it out while the check fails, "
     "checking again every --health_check_interval: builtin checks that the log directory "
     "is writable with room and that no GPU, network interface or InfiniBand port present at "
     "the first check has gone; a command (run with /bin/sh -c) is run after them and passes "
     "with exit 0 (default {default})."},
    {Flag::HealthCheckTimeout, parse_health_check_timeout,
     "health_check_timeout", "", false, "SECONDS", "60", kSupervision,
     "A health check command still running after this long is killed and fails (default "
     "{default})."},
    {Flag::HealthCheckInterval, parse_health_check_interval,
     "health_check_interval", "", false, "SECONDS", "30", kSupervision,
     "Wait between a failed health check and the next (default {default})."},
    {Flag::StandbyWorkers, parse_standby_workers,
     "standby_workers", "", true, "[=off|on|auto]", "auto", kSupervision,
     "Keep a standby process per local rank, with the program loaded (a Python script's: "
     "torch and its imports, forked from one interpreter per node that also starts the first "
     "workers), for the next restart: recovery skips process start-up. Bare: on. auto: on for "
     ".py and -m scripts that import torch, where memory allows (default {default}).", true},
    {Flag::StandbyPreload, parse_standby_preload,
     "standby_preload", "", false, "MOD,...", "", kSupervision,
     "Modules a Python standby imports besides torch and the script's top-level imports."},
    {Flag::StandbyCuda, parse_standby_cuda,
     "standby_cuda", "", false, "off|context|warm", "off", kSupervision,
     "What a Python standby makes ready on its GPU (cuda:LOCAL_RANK) while it waits: context, "
     "its CUDA context; warm, that and a first small training step through torch (cuBLAS, the "
     "first kernels). Each waiting standby then holds that GPU memory (default {default})."},
    {Flag::Cleanup, parse_cleanup,
     "cleanup", "", false, "auto|cgroup|subreaper", "auto", kSupervision,
     "How no process a worker started outlives its group or a killed ddprun: cgroup (a cgroup "
     "v2 per group, killed with cgroup.kill, also after a SIGKILL of ddprun), subreaper (every "
     "descendant is killed at the group's end; a SIGKILL of ddprun can leave ones that left "
     "their worker's session (setsid) less than a second before), "
     "auto (cgroup where the cgroup tree is delegated, else subreaper) (default {default})."},
    {Flag::StartMethod, parse_start_method,
     "start_method", "", false, "spawn|fork|forkserver", "spawn", kSupervision,
     "Accepted for torchrun compatibility; workers always start with fork+exec."},
    {Flag::Role, parse_role,
     "role", "", false, "NAME", "default", kSupervision,
     "Role name of the workers, shown in logs (default \"{default}\")."},
    {Flag::Module, set_switch<&LaunchConfig::module>,
     "module", "m", true, "", "", kProgram,
     "Run the script as a Python module: python -u -m <script>."},
    {Flag::NoPython, set_switch<&LaunchConfig::no_python>,
     "no_python", "", true, "", "", kProgram,
     "Run the script as a program, without python -u in front (any executable works)."},
    {Flag::RunPath, set_switch<&LaunchConfig::run_path>,
     "run_path", "", true, "", "", kProgram,
     "Run the script with runpy.run_path(script, run_name=\"__main__\") in each worker (python "
     "-u -c), as torchrun does."},
    {Flag::LocalRankArg, parse_local_rank_arg,
     "local_rank_arg", "", false, "local-rank|local_rank", "", kProgram,
     "For scripts written for torch.distributed.launch: put --local-rank=N (its 2.x spelling) "
     "or --local_rank=N (1.x) after the script, N being the worker's local rank; LOCAL_RANK is "
     "set as always (default: none, as torchrun)."},
    {Flag::LogDir, set_text<&LaunchConfig::log_dir>,
     "log_dir", "", false, "DIR", "", kLogs,
     "Directory for the workers' log files."},
    {Flag::EventLog, set_text<&LaunchConfig::event_log>,
     "event_log", "", false, "PATH", "", kLogs,
     "Append the recovery timeline (rendezvous, starts, failures, teardowns, restarts, and "
     "what workers report) to PATH as JSON lines; see ddprun events summarize."},
    {Flag::MetricsPort, parse_metrics_port,
     "metrics_port", "", false, "PORT", "", kLogs,
     "Serve this agent's Prometheus metrics at http://<metrics_host>:PORT/metrics (workers, "
     "restarts, failures, round, standbys, the last recovery's phases) (default: off)."},
    {Flag::MetricsHost, parse_metrics_host,
     "metrics_host", "", false, "HOST", "127.0.0.1", kLogs,
     "Address the --metrics_port endpoint listens on (default {default}: this host only)."},
    {Flag::Redirects, parse_redirects,
     "redirects", "r", false, "STD", "0", kLogs,
     "Send worker streams to files in --log_dir instead of the console: 0 none, 1 stdout, "
     "2 stderr, 3 both; per local rank as 0:1,1:2 (default {default})."},
    {Flag::Tee, parse_tee,
     "tee", "t", false, "STD", "0", kLogs,
     "Like --redirects, but the streams also stay on the console."},
    {Flag::LocalRanksFilter, parse_local_ranks_filter,
     "local_ranks_filter", "", false, "RANKS", "", kLogs,
     "Show only these local ranks on the console, e.g. 0,2 (default: all)."},
    {Flag::DedupOutput, parse_dedup_output,
     "dedup_output", "", false, "SECONDS", "0", kLogs,
     "Show identical console lines that several local ranks print within SECONDS once, "
     "naming the ranks ([default0-7]:...); log files stay complete (default {default}: off)."},
    {Flag::DuplicateStdoutFilters, parse_duplicate_stdout_filters,
     "duplicate_stdout_filters", "", false, "TEXT,...", "", kLogs,
     "Also copy the workers' stdout lines containing any of these texts (\",,\" is a comma) to "
     "filtered_stdout.log in the attempt's log directory, with their console prefix."},
    {Flag::DuplicateStderrFilters, parse_duplicate_stderr_filters,
     "duplicate_stderr_filters", "", false, "TEXT,...", "", kLogs,
     "Like --duplicate_stdout_filters, for stderr lines, to filtered_stderr.log."},
    {Flag::LogsSpecs, parse_logs_specs,
     "logs_specs", "", false, "default", "default", kLogs,
     "torchrun's log layout plugin: only default (torchrun's DefaultLogsSpecs, the layout "
     "ddprun always uses) is accepted; ddprun loads no torchrun.logs_specs plugins."},
    {Flag::EventLogHandler, parse_event_log_handler,
     "event_log_handler", "", false, "null", "null", kLogs,
     "torchrun's event handler name: only null (the default) is accepted; for ddprun's event "
     "timeline use --event_log."},
    {Flag::NoSlurmFanout, set_switch<&LaunchConfig::no_slurm_fanout>,
     "no_slurm_fanout", "", true, "", "", kSlurm,
     "Outside srun on a multi-node SLURM allocation, stop with the srun line to use instead of "
     "rerunning ddprun under srun (one per node)."},
};
// clang-format on

constexpr bool rows_in_flag_order() {
  for (std::size_t i = 0; i < std::size(kOptions); ++i)
    if (static_cast<std::size_t>(kOptions[i].id) != i) return false;
  return std::size(kOptions) == kFlagCount;
}
static_assert(rows_in_flag_order(), "kOptions has one row per Flag, in Flag's order");

/// A help that shows the default takes it from the row: "{default}", once.
constexpr bool defaults_shown_from_rows() {
  for (const OptionSpec& spec : kOptions) {
    const size_t at = spec.help.find(kDefaultPlaceholder);
    if (at == std::string_view::npos) continue;
    if (spec.default_text.empty() ||
        spec.help.find(kDefaultPlaceholder, at + 1) != std::string_view::npos)
      return false;
  }
  return true;
}
static_assert(defaults_shown_from_rows(), "a help's {default} needs the row's default, once");

const OptionSpec& row(Flag flag) { return kOptions[static_cast<std::size_t>(flag)]; }

/// Every flag's raw value, by Flag.
struct RawValues {
  std::array<RawValue, kFlagCount> values;
  RawValue& operator[](Flag flag) { return values[static_cast<std::size_t>(flag)]; }
  const RawValue& operator[](Flag flag) const { return values[static_cast<std::size_t>(flag)]; }
};

/// The row's default, as if the user had typed it.
RawValue default_value(const OptionSpec& spec) {
  RawValue value;
  value.label = "--" + std::string(spec.name);
  value.text = std::string(spec.default_text);
  return value;
}

/// The flag whose canonical name is `name` (SLURM's defaults name flags that way).
Flag flag_named(std::string_view name) {
  const auto* found = std::find_if(std::begin(kOptions), std::end(kOptions),
                                   [name](const OptionSpec& spec) { return spec.name == name; });
  DDPRUN_CHECK(found != std::end(kOptions), "a flag name that is not in kOptions");
  return found->id;
}

/// "PET_" plus the upper-case name, as torchrun's env action builds it.
std::string env_name(std::string_view name) {
  std::string out = "PET_";
  for (char c : name) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string dashed(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

/// The CLI11 name list: "--nproc_per_node,--nproc-per-node" (the first is what CLI11 reports).
std::string cli11_names(const OptionSpec& spec) {
  std::string names;
  if (!spec.short_name.empty()) names = "-" + std::string(spec.short_name) + ",";
  names += "--" + std::string(spec.name);
  if (spec.name.find('_') != std::string_view::npos) names += ",--" + dashed(spec.name);
  return names;
}

/// The spelling the user typed last for spec among the option arguments ("-r", "--no-python").
std::string typed_spelling(const OptionSpec& spec, const std::vector<std::string>& option_args) {
  std::string found = "--" + std::string(spec.name);
  const std::string underscored = found;
  const std::string with_dashes = "--" + dashed(spec.name);
  const std::string short_flag =
      spec.short_name.empty() ? std::string() : "-" + std::string(spec.short_name);
  for (const std::string& arg : option_args) {
    if (arg.rfind("--", 0) == 0) {
      const std::string name = arg.substr(0, arg.find('='));
      if (name == underscored || name == with_dashes) found = name;
    } else if (!short_flag.empty() && arg.rfind(short_flag, 0) == 0) {
      found = short_flag;
    }
  }
  return found;
}

/// True for "--rdzv_id", "--rdzv-id" or "-r": a spelling of an option that takes a value.
bool takes_value(const std::string& flag) {
  return std::any_of(std::begin(kOptions), std::end(kOptions), [&flag](const OptionSpec& spec) {
    return !spec.is_switch &&
           (flag == "--" + std::string(spec.name) || flag == "--" + dashed(spec.name) ||
            (!spec.short_name.empty() && flag == "-" + std::string(spec.short_name)));
  });
}

/// True for "--standby_workers" or "--standby-workers": a switch that takes "=VALUE".
bool value_after_equals(const std::string& flag) {
  return std::any_of(std::begin(kOptions), std::end(kOptions), [&flag](const OptionSpec& spec) {
    return spec.value_after_equals &&
           (flag == "--" + std::string(spec.name) || flag == "--" + dashed(spec.name));
  });
}

/// The value of the last "--name=VALUE" for `spec` among the option arguments; "" when the
/// last one is bare.
std::string value_after_equals_of(const OptionSpec& spec,
                                  const std::vector<std::string>& option_args) {
  std::string value;
  for (const std::string& arg : option_args) {
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (name != "--" + std::string(spec.name) && name != "--" + dashed(spec.name)) continue;
    value = eq == std::string::npos ? "" : arg.substr(eq + 1);
  }
  return value;
}

/// The option whose "--name" or "--dashed-name" is exactly `flag` (no value); null when none.
const OptionSpec* option_named(std::string_view flag) {
  for (const OptionSpec& spec : kOptions)
    if (flag == "--" + std::string(spec.name) || flag == "--" + dashed(spec.name)) return &spec;
  return nullptr;
}

/// args with each unambiguous abbreviation of a long option expanded, as argparse (and so
/// torchrun) accepts them: "--nproc=2" is "--nproc_per_node=2". A prefix matching one option,
/// in either spelling, is that option; one matching several is an error naming them. Only
/// ddprun's own options are read: the scan stops at "--" or the script.
std::variant<std::vector<std::string>, UsageError> expand_abbreviations(
    std::vector<std::string> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;  // the script starts here
    if (arg[1] != '-') {
      if (arg.size() == 2 && takes_value(arg)) ++i;  // "-r 3": the next argument is the value
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpec* spec = option_named(name);
    if (spec == nullptr && name.size() > 2) {
      struct Match {
        const OptionSpec* spec;  ///< null for --help and --version
        std::string spelling;    ///< the full spelling the prefix abbreviates
      };
      std::vector<Match> matches;
      for (const OptionSpec& candidate : kOptions) {
        const std::string with_dashes = "--" + dashed(candidate.name);
        const std::string underscored = "--" + std::string(candidate.name);
        if (with_dashes.rfind(name, 0) == 0)
          matches.push_back({&candidate, with_dashes});
        else if (underscored.rfind(name, 0) == 0)
          matches.push_back({&candidate, underscored});
      }
      for (const char* info : {"--help", "--version"})
        if (std::string_view(info).rfind(name, 0) == 0) matches.push_back({nullptr, info});
      if (matches.size() > 1) {
        std::string names;
        for (const Match& match : matches)
          names += (names.empty() ? "" : ", ") +
                   (match.spec == nullptr ? match.spelling : "--" + std::string(match.spec->name));
        return UsageError{"ambiguous option " + name + ": could be " + names +
                          "; spell it out (see ddprun --help)"};
      }
      if (matches.empty()) continue;  // unknown: CLI11 reports it
      arg = matches.front().spelling + (eq == std::string::npos ? "" : arg.substr(eq));
      spec = matches.front().spec;
    }
    if (spec == nullptr) continue;
    if (!spec->is_switch && eq == std::string::npos) ++i;  // "--name VALUE"
  }
  return args;
}

/// args reversed for CLI11 (it pops from the back), with two argparse spellings it reads
/// differently rewritten in place: "--rdzv_id=" (CLI11 would take the next argument as the
/// value; argparse reads "") and "-r=3" (CLI11 reads "=3"; argparse reads "3"). Rewriting never
/// changes the number of arguments, so positions still match args; the script's arguments are
/// taken from args itself, untouched.
std::vector<std::string> prepare_for_cli11(const std::vector<std::string>& args) {
  std::vector<std::string> reversed;
  reversed.reserve(args.size());
  for (auto it = args.rbegin(); it != args.rend(); ++it) {
    std::string arg = *it;
    const size_t eq = arg.find('=');
    if (eq == 2 && arg[0] == '-' && takes_value(arg.substr(0, 2))) arg.erase(2, 1);  // -r=3
    if (eq != std::string::npos && value_after_equals(arg.substr(0, eq)))
      arg.erase(eq);  // --standby_workers=auto: CLI11 sees the switch; the value is read later
    if (eq != std::string::npos && eq + 1 == it->size() && takes_value(it->substr(0, eq))) {
      arg += kEmptyValueMarker;  // undone when the value is read
    }
    reversed.push_back(std::move(arg));
  }
  return reversed;
}

/// The row's help with its default in place of "{default}".
std::string help_of(const OptionSpec& spec) {
  std::string help(spec.help);
  if (const size_t at = help.find(kDefaultPlaceholder); at != std::string::npos)
    help.replace(at, kDefaultPlaceholder.size(), spec.default_text);
  return help;
}

/// Appends text to out, wrapped at width, every line after the first indented by indent.
void append_wrapped(std::string& out, std::string_view text, size_t column, size_t indent,
                    size_t width) {
  for (const std::string& word : split(text, ' ')) {
    if (column > indent && column + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
    } else if (column > indent) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
  }
  out += '\n';
}

std::string help_text() {
  constexpr size_t kIndent = 32;
  constexpr size_t kWidth = 100;
  std::string out =
      "Usage: ddprun [options] training_script [script args...]\n"
      "\n"
      "Starts a group of worker processes on this node and supervises them; a drop-in for\n"
      "torchrun. The script and everything after it are passed to the workers untouched.\n"
      "Each option also has a dashed spelling (--nproc-per-node) and is read from\n"
      "PET_<NAME> (e.g. PET_NPROC_PER_NODE=4) when not given; flags win over PET_ variables.\n";
  for (std::string_view group : kGroups) {
    out += "\n" + std::string(group) + ":\n";
    for (const OptionSpec& spec : kOptions) {
      if (spec.group != group) continue;
      std::string left = "  ";
      if (!spec.short_name.empty()) left += "-" + std::string(spec.short_name) + ", ";
      left += "--" + std::string(spec.name);
      if (!spec.metavar.empty())
        left += (spec.value_after_equals ? "" : " ") + std::string(spec.metavar);
      out += left;
      if (left.size() + 1 >= kIndent) {
        out += "\n" + std::string(kIndent, ' ');
      } else {
        out += std::string(kIndent - left.size(), ' ');
      }
      append_wrapped(out, help_of(spec), kIndent, kIndent, kWidth);
    }
  }
  out +=
      "\nInformation:\n"
      "  -h, --help                    Print this help and exit.\n"
      "  --version                     Print the version and exit.\n"
      "\n"
      "Examples:\n"
      "  # four workers on this machine\n"
      "  ddprun --standalone --nproc_per_node 4 train.py --epochs 10\n"
      "  # two nodes of two workers; run on each node with its own --node_rank\n"
      "  ddprun --nnodes 2 --nproc_per_node 2 --node_rank 0 --rdzv_id my_job --rdzv_backend c10d "
      "--rdzv_endpoint head:29400 train.py\n"
      "  # an elastic job of 2 to 4 nodes meeting at a standalone daemon (ddprun-rdzvd)\n"
      "  ddprun --nnodes 2:4 --nproc_per_node 2 --rdzv_id my_job --rdzv_backend c10d "
      "--rdzv_endpoint rdzv:29400 "
      "train.py\n"
      "  # in an sbatch script: one ddprun per node; nodes, ranks and rendezvous come from SLURM\n"
      "  srun ddprun --nproc_per_node 4 train.py\n"
      "  # any program, not only Python\n"
      "  ddprun --nproc_per_node 2 --no_python ./my_binary\n"
      "  # the jobs, rounds and nodes a rendezvous server holds\n"
      "  ddprun status --rdzv_endpoint head:29400 [--rdzv_id my_job] [--json]\n"
      "\n";
  append_wrapped(out,
                 "Exit codes: " + std::to_string(common::kExitSuccess) +
                     " success; the failing worker's exit code (128+N when it died of signal N); " +
                     std::to_string(common::kExitUsage) +
                     " usage error (bad flag or PET_ variable); " +
                     std::to_string(common::kExitRendezvous) + " rendezvous failure; " +
                     std::to_string(common::kExitInternal) + " internal error; " +
                     std::to_string(common::kExitRestartsExhausted) +
                     " restart budget (--max_restarts) exhausted; " +
                     std::to_string(common::kExitDoNotRequeue) +
                     " do not requeue (a crash loop, --crash_loop_stop, or one of "
                     "--fatal_exit_codes).",
                 0, 0, kWidth);
  return out;
}

/// Rules between flags, checked once every row has parsed.
Check check_combinations(const RawValues& raw, const LaunchConfig& config) {
  if (config.run_path && (config.module || config.no_python)) {
    // torchrun ignores -m and --no_python next to --run_path; say so instead.
    const std::string other = describe_switch(raw[config.module ? Flag::Module : Flag::NoPython]);
    return common::Error{describe_switch(raw[Flag::RunPath]) + " and " + other +
                         " cannot be combined: --run_path runs the script file with "
                         "runpy.run_path under python; keep one"};
  }
  if (config.module && config.no_python)
    return common::Error{describe_switch(raw[Flag::Module]) + " and " +
                         describe_switch(raw[Flag::NoPython]) +
                         " cannot be combined: -m runs python -u -m <script>, --no_python runs "
                         "<script> itself; keep one"};
  if (config.standalone) {
    if (config.max_nodes == 1) return std::nullopt;
    return common::Error{describe_switch(raw[Flag::Standalone]) + " runs a single node; drop " +
                         describe(raw[Flag::Nnodes]) + " or use --rdzv_endpoint"};
  }
  if (config.rdzv_backend == "etcd-v3" && config.rdzv_endpoint.empty())
    return common::Error{describe(raw[Flag::RdzvBackend]) +
                         " needs --rdzv_endpoint host:port[,host:port...] (the etcd members)"};
  if (config.rdzv_backend == "c10d" && config.max_nodes > 1 && config.rdzv_endpoint.empty())
    return common::Error{describe(raw[Flag::RdzvBackend]) + " with " + describe(raw[Flag::Nnodes]) +
                         " needs --rdzv_endpoint host:port"};
  return std::nullopt;
}

/// The rest of parse_command_line once CLI11 has split the options from the script: each
/// row's parser, in table order, then the rules between flags.
ParseResult build_config(const RawValues& raw, std::vector<std::string> script_and_args) {
  LaunchConfig config;
  for (const OptionSpec& spec : kOptions)
    if (auto e = spec.parse(raw[spec.id], config)) return UsageError{e->message};
  if (auto e = check_combinations(raw, config)) return UsageError{e->message};
  config.script = std::move(script_and_args.front());
  script_and_args.erase(script_and_args.begin());
  config.script_args = std::move(script_and_args);
  return config;
}

/// Turns a CLI11 parse error into one line that names the flag and points at --help.
UsageError usage_error_from(const CLI::ParseError& error) {
  const std::string what = error.what();
  if (error.get_name() == "ArgumentMismatch") {
    // CLI11 says "--nnodes: 1 required TEXT missing" when the value is missing.
    const std::string flag = what.substr(0, what.find(':'));
    if (flag.rfind("-", 0) == 0) return UsageError{flag + " needs a value: see ddprun --help"};
  }
  return UsageError{what + ": see ddprun --help"};
}

}  // namespace

ParseResult parse_command_line(const std::vector<std::string>& args_as_typed,
                               const EnvLookup& env) {
  CLI::App app{"ddprun", "ddprun"};
  app.prefix_command();  // the first positional is the script; it and the rest are untouched
  app.set_help_flag("-h,--help");
  app.set_version_flag("--version", common::version_line("ddprun"));
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  // By Flag; CLI11 writes into these (their addresses do not change).
  std::array<std::string, kFlagCount> values;
  std::array<bool, kFlagCount> switches{};
  std::array<CLI::Option*, kFlagCount> options{};
  for (const OptionSpec& spec : kOptions) {
    const auto i = static_cast<std::size_t>(spec.id);
    options[i] = spec.is_switch ? app.add_flag(cli11_names(spec), switches[i])
                                : app.add_option(cli11_names(spec), values[i]);
  }

  auto expanded = expand_abbreviations(args_as_typed);
  if (auto* error = std::get_if<UsageError>(&expanded)) return *error;
  const std::vector<std::string>& args = std::get<std::vector<std::string>>(expanded);
  std::vector<std::string> reversed = prepare_for_cli11(args);
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return InfoRequest{help_text()};
  } catch (const CLI::CallForAllHelp&) {
    return InfoRequest{help_text()};
  } catch (const CLI::CallForVersion&) {
    return InfoRequest{common::version_line("ddprun") + "\n"};
  } catch (const CLI::ParseError& error) {
    return usage_error_from(error);
  }

  const std::vector<std::string> unparsed = app.remaining();
  if (!unparsed.empty() && unparsed.front() != "--" && unparsed.front().size() > 1 &&
      unparsed.front().front() == '-') {
    return UsageError{"unknown option " + unparsed.front().substr(0, unparsed.front().find('=')) +
                      ": see ddprun --help"};
  }
  // Past that check, what CLI11 left is the tail of args from "--" or the script on; take it
  // from args itself so the script's arguments are byte-for-byte what the user passed.
  const auto script_begin = args.end() - static_cast<std::ptrdiff_t>(unparsed.size());
  const std::vector<std::string> option_args(args.begin(), script_begin);
  std::vector<std::string> rest(script_begin, args.end());
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());  // "ddprun [options] -- train.py" is allowed
  }
  if (rest.empty()) {
    return UsageError{"missing the training script: ddprun [options] train.py [args...]"};
  }

  // Flag, then PET_ variable, then default: the same order as torchrun's env action.
  RawValues raw;
  for (const OptionSpec& spec : kOptions) {
    const auto i = static_cast<std::size_t>(spec.id);
    RawValue& value = raw[spec.id];
    if (options[i]->count() > 0) {
      value.label = typed_spelling(spec, option_args);
      value.given = true;
      value.on = spec.is_switch && switches[i];
      if (spec.value_after_equals) value.text = value_after_equals_of(spec, option_args);
      if (!spec.is_switch) {
        value.text = values[i];
        if (value.text == kEmptyValueMarker) value.text.clear();
      }
    } else if (auto from_env = env(env_name(spec.name))) {
      value.label = env_name(spec.name);
      value.text = *from_env;
      value.from_env = true;
      value.given = true;
      if (spec.is_switch && !spec.value_after_equals) {
        auto on = parse_bool(*from_env);
        if (!on) return UsageError{describe(value) + ": expected 1, 0, true or false"};
        value.on = *on;
      }
    } else {
      value = default_value(spec);
    }
  }

  // SLURM comes after flags and PET_ variables: under srun it fills what they left out.
  auto slurm = read_slurm_job(env);
  if (!slurm) return UsageError{slurm.error().message};
  const SlurmJob& job = *slurm;
  UserChoices choices;
  choices.given = [&raw](std::string_view name) { return raw[flag_named(name)].given; };
  if (raw[Flag::Nnodes].given) choices.nnodes = raw[Flag::Nnodes].text;
  if (raw[Flag::RdzvBackend].given) choices.rdzv_backend = raw[Flag::RdzvBackend].text;
  choices.standalone = raw[Flag::Standalone].on;
  auto filled = slurm_defaults(job, choices);
  if (!filled) return UsageError{filled.error().message};
  const SlurmFill& fill = *filled;
  for (const SlurmDefault& item : fill.values) {
    RawValue& value = raw[flag_named(item.option)];
    value = RawValue{};
    value.text = item.value;
    value.label = item.source;
    value.from_env = true;
    value.given = true;
  }

  ParseResult result = build_config(raw, std::move(rest));
  auto* config = std::get_if<LaunchConfig>(&result);
  if (config == nullptr) return result;
  if (!fill.values.empty()) {
    config->slurm.job_id = job.job_id;
    config->slurm.step_id = job.step_id;
    config->slurm.endpoint_node = fill.endpoint_node;
    for (const SlurmDefault& item : fill.values) {
      if (item.option == "rdzv_endpoint") continue;  // launch() reports it once resolved
      config->slurm.values.push_back("--" + item.option + " " + item.value + " (" + item.source +
                                     ")");
    }
  }
  config->slurm.values.insert(config->slurm.values.end(), fill.notes.begin(), fill.notes.end());
  if (!fill.notes.empty()) {
    config->slurm.job_id = job.job_id;
    config->slurm.step_id = job.step_id;
  }
  config->slurm.warnings = fill.warnings;

  const bool single_node =
      config->standalone || (raw[Flag::Nnodes].given && config->max_nodes == 1);
  FanOutDecision fan_out =
      decide_fanout(job, args, single_node, raw[Flag::NodeRank].given, config->no_slurm_fanout,
                    describe_switch(raw[Flag::NoSlurmFanout]));
  switch (fan_out.action) {
    case FanOutDecision::Action::RunHere:
      return result;
    case FanOutDecision::Action::Refuse:
      return UsageError{fan_out.message};
    case FanOutDecision::Action::FanOut:
      return SlurmFanOut{fan_out.srun_args, args, fan_out.message};
  }
  return result;
}

std::string flag_spellings(Flag flag) { return cli11_names(row(flag)); }

std::string flag_env_name(Flag flag) { return env_name(row(flag).name); }

LaunchConfig default_launch_config() {
  LaunchConfig config;
  for (const OptionSpec& spec : kOptions) {
    const Check bad = spec.parse(default_value(spec), config);
    DDPRUN_CHECK(!bad, "every default of the flag table parses");
  }
  return config;
}

}  // namespace ddprun::launcher
