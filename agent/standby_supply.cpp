#include "agent/standby_supply.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <utility>

#include "agent/python_zygote.h"
#include "agent/standby_pool.h"
#include "agent/worker_command.h"
#include "common/log.h"
#include "common/standby_protocol.h"
#include "common/strings.h"

namespace ddprun::agent {
namespace asio = boost::asio;

namespace {

/// How long a group waits for the Python zygote to import torch before it starts without it
/// (a fresh interpreter per worker would spend as long importing the same modules).
constexpr std::chrono::seconds kZygoteReadyTimeout{60};
/// How long a standby's or the zygote's death by a stop signal waits to be told, in case the
/// agent's own copy of that signal comes (warn_unless_stopping).
constexpr std::chrono::seconds kSignalledWarningDelay{1};

}  // namespace

struct StandbySupply::Impl {
  Impl(asio::io_context& io_, ProcessLauncher& launcher_, const common::Clock& clock_,
       DeadlineTimers& timers, StandbySettings settings_,
       std::function<void(EventName, const nlohmann::json&)> emit_)
      : io(io_),
        launcher(launcher_),
        clock(clock_),
        settings(std::move(settings_)),
        emit(std::move(emit_)),
        standby_timer(timers.make()),
        zygote_timer(timers.make()),
        zygote_wait(io_),
        pool(launcher_),
        fork_timer(timers.make()),
        ack_timer(timers.make()),
        quiet_timer(timers.make()) {
    if (!settings.python_bootstrap.empty())
      pool.set_exit_hint("a Python standby imports torch and waits in ddprun's bootstrap (" +
                         settings.python_bootstrap + "); " + zygote_hint());
  }

  std::string zygote_hint() const {
    return "exit code 3 means " + settings.spec.argv.front() +
           " cannot import torch: set PYTHON_EXEC to an interpreter that can";
  }

  bool zygote_ready() const {
    return zygote != nullptr && zygote->state() == PythonZygote::State::Ready;
  }

  /// A standby for every local rank that has none: forked by the zygote when it runs (the
  /// answers come as the loop turns: settle_forks), else started at once (fork and exec).
  void start_standbys(const std::string& executable) {
    if (!pool.enabled() || executable.empty()) return;
    if (zygote_ready()) return fork_standbys();
    nlohmann::json started = nlohmann::json::array();
    for (int local = 0; local < settings.spec.local_world_size; ++local) {
      if (pool.has(local)) continue;
      ProcessSpec ps{
          executable,
          settings.python_bootstrap.empty()
              ? argv_for_local_rank(settings.spec.argv, local)
              : build_python_standby_command(argv_for_local_rank(settings.spec.argv, local),
                                             settings.python_bootstrap, settings.python),
          to_envp(build_standby_env(settings.agent_env, settings.spec, local, settings.run_id))};
      if (settings.cleanup != nullptr) ps.cgroup_procs_fd = settings.cleanup->standby_procs_fd();
      ps.stdin_fd = settings.stdin_fd;
      if (std::string why = pool.start(local, std::move(ps)); !why.empty())
        spdlog::warn("cannot start a standby for local rank {}: {}", local, why);
      else
        started.push_back(pool.pid_of(local));
    }
    if (!started.empty())
      emit(EventName::StandbysStarted,
           {{"count", started.size()}, {"pids", started}, {"forked", false}});
  }

  /// One fork request per local rank without a standby, all sent at once; the zygote answers
  /// them in order.
  void fork_standbys() {
    for (int local = 0; local < settings.spec.local_world_size && zygote_ready(); ++local) {
      if (pool.has(local) || forking.count(local) > 0) continue;
      ProcessSpec ps{
          "",
          {},
          to_envp(build_standby_env(settings.agent_env, settings.spec, local, settings.run_id))};
      EnvMap start_env = parse_envp(ps.envp);
      auto channel = open_channel(ps, SOCK_STREAM, common::kStandbyFdVariable, 1 << 20);
      if (!channel) {
        spdlog::warn("cannot start a standby for local rank {}: {}", local,
                     channel.error().message);
        continue;
      }
      int agent_fd = *channel;
      const std::string why = zygote->request_fork(local, ps);
      close_fd(ps.inherit_fd);  // in the request now (or not needed)
      if (!why.empty()) {
        close_fd(agent_fd);
        spdlog::warn("cannot start a standby for local rank {}: {}", local, why);
        continue;
      }
      forking.emplace(local, Forking{agent_fd, std::move(start_env)});
    }
    // A zygote that went while the requests were sent answers the rest with why.
    if (!zygote_ready()) return settle_forks(zygote->on_replies());
    if (forking.empty()) return forks_settled();
    await_replies();
    fork_timer->arm(clock.now() + kZygoteForkTimeout, [this] {
      if (!stopped && !forking.empty()) settle_forks(zygote->time_out());
    });
  }

  /// The zygote's ready message (or its end) while it imports.
  void await_ready() {
    zygote_wait.async_wait(asio::posix::stream_descriptor::wait_read,
                           [this](const boost::system::error_code& ec) {
                             if (ec || stopped || zygote_settled) return;
                             const PythonZygote::State state = zygote->on_readable();
                             if (state == PythonZygote::State::Starting) return await_ready();
                             settle(state);
                           });
  }

  void await_replies() {
    if (awaiting_replies) return;
    awaiting_replies = true;
    zygote_wait.async_wait(asio::posix::stream_descriptor::wait_read,
                           [this](const boost::system::error_code& ec) {
                             awaiting_replies = false;
                             if (ec || stopped) return;
                             settle_forks(zygote->on_replies());
                           });
  }

  /// The zygote's answers: each fork is its rank's standby, or the rank has none this time.
  void settle_forks(std::vector<PythonZygote::Forked> answers) {
    for (auto& answer : answers) {
      auto it = forking.find(answer.tag);
      if (it == forking.end()) continue;  // not asked for by this supply: never happens
      Forking f = std::move(it->second);
      forking.erase(it);
      if (answer.result) {
        const LaunchedProcess& process = *answer.result;
        pool.adopt(answer.tag, process, f.agent_fd, std::move(f.start_env));
        if (pool.pid_of(answer.tag) == process.pid) forked.push_back(process.pid);
      } else {
        close_fd(f.agent_fd);
        spdlog::warn("cannot start a standby for local rank {}: {}", answer.tag,
                     answer.result.error().message);
      }
    }
    if (!forking.empty()) return await_replies();
    fork_timer->cancel();
    forks_settled();
  }

  /// No fork request is out: say which standbys were forked, and go on with what waited.
  void forks_settled() {
    if (!forked.empty())
      emit(EventName::StandbysStarted,
           {{"count", forked.size()}, {"pids", forked}, {"forked", true}});
    forked = nlohmann::json::array();
    if (auto next = std::exchange(after_forks, nullptr)) next();
  }

  /// Hands the standbys of the ranks in `envs` their workers' environments: the acks are
  /// awaited on the loop (await_ack), under one deadline.
  void send_hand_over(const std::map<int, EnvMap>& envs) {
    // A Python standby forked from the zygote has the script's arguments as written; the worker
    // of each local rank gets its own (${local_rank} substituted) in the hand-over, and the
    // command line its fresh start would have, to show in ps.
    std::map<int, PythonHandover> python;
    if (!settings.python_bootstrap.empty())
      for (const auto& [local_rank, env] : envs)
        python[local_rank] = {standby_script_argv(settings.spec.argv, local_rank),
                              argv_for_local_rank(settings.spec.argv, local_rank)};
    // Without a cgroup the watcher learns each standby's session (each leads its own)
    // before the standby can run the script, so that what the script starts there goes too
    // should the agent die right after the hand-over. Here, not before hand_over(): a standby
    // forked from the zygote for this hand-over is known only once its fork was answered.
    if (settings.cleanup != nullptr)
      for (const auto& [local_rank, env] : envs)
        if (pool.has(local_rank)) settings.cleanup->track(pool.pid_of(local_rank));
    // Every standby is sent its message at once; the deadline bounds the whole hand-over.
    for (const auto& [local_rank, fd] : pool.begin_hand_over(envs, handover_warnings, python)) {
      auto wait = std::make_unique<asio::posix::stream_descriptor>(io);
      const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      boost::system::error_code ec;
      if (copy >= 0) wait->assign(copy, ec);
      if (copy < 0 || ec) {
        if (copy >= 0) ::close(copy);
        continue;  // not watched: settled at the deadline, as a standby that never answered
      }
      ack_waits.emplace(local_rank, std::move(wait));
    }
    if (pool.awaiting_acks() == 0) return end_hand_over();
    for (const auto& [local_rank, wait] : ack_waits) await_ack(local_rank);
    ack_timer->arm(clock.now() + kHandoverAckTimeout, [this, generation = handover_generation] {
      if (handed && generation == handover_generation) end_hand_over();
    });
  }

  /// Starting -> Ready or Gone: standbys come from the zygote, or there are none.
  void settle(PythonZygote::State state, const std::string& why = "") {
    if (zygote_settled) return;
    zygote_settled = true;
    zygote_timer->cancel();
    const bool ready = state == PythonZygote::State::Ready;
    if (ready) {
      // What a fresh interpreter per rank would draw anew (--standby_workers=off), every rank
      // forked from the zygote shares: said, not refused (a telemetry session id is common).
      if (const auto& names = zygote->shared_os_draws(); !names.empty())
        spdlog::info(
            "the standbys share what {} drew from the OS as imported (an id or key: the same in "
            "every rank); --standby_workers=off gives each rank its own",
            common::join(names, ", "));
      // zygote_wait stays open: the answers to fork requests arrive on it.
      emit(EventName::ZygoteReady,
           {{"pid", zygote->pid()},
            {"import_ms",
             std::chrono::duration<double, std::milli>(clock.now() - zygote_started).count()}});
    } else {
      // What the zygote could not import, a standby cannot either.
      const std::string failure = why.empty() ? zygote->failure() : why;
      spdlog::warn(
          "no standbys: the Python zygote (pid {}) failed: {}{}; workers start afresh",
          zygote->pid(), failure,
          failure.find("cannot import torch") != std::string::npos ? "; " + zygote_hint() : "");
      boost::system::error_code ignored;
      zygote_wait.close(ignored);
      pool.disable();
    }
    if (on_settled) on_settled(ready);
  }

  asio::io_context& io;
  ProcessLauncher& launcher;
  const common::Clock& clock;
  StandbySettings settings;
  std::function<void(EventName, const nlohmann::json&)> emit;
  std::unique_ptr<DeadlineTimer> standby_timer;
  std::unique_ptr<DeadlineTimer> zygote_timer;
  asio::posix::stream_descriptor zygote_wait;  ///< a copy of the zygote's control socket
  /// The Python zygote, when one was started (start_zygote); the pool's standbys are its forks.
  std::unique_ptr<PythonZygote> zygote;
  StandbyPool pool;
  bool zygote_settled = false;  ///< ready, or failed before it was
  common::TimePoint zygote_started;
  std::function<void(bool)> on_settled;
  bool stopped = false;

  // Fork requests out to the zygote, by local rank: the agent's end of each standby's
  // hand-over socket and the environment it starts with, until the zygote answers.
  struct Forking {
    int agent_fd = -1;
    EnvMap start_env;
  };
  std::map<int, Forking> forking;
  std::unique_ptr<DeadlineTimer> fork_timer;
  bool awaiting_replies = false;
  nlohmann::json forked = nlohmann::json::array();  ///< pids forked since the last event
  std::function<void()> after_forks;  ///< a hand-over waiting for the forks to be answered

  // The hand-over under way: a wait on a copy of each standby's socket, and its deadline.
  std::map<int, std::unique_ptr<asio::posix::stream_descriptor>> ack_waits;
  std::unique_ptr<DeadlineTimer> ack_timer;
  std::function<void(std::map<int, LaunchedProcess>)> handed;
  std::vector<std::string> handover_warnings;

  uint64_t handover_generation = 0;  ///< a wait's completion for an earlier hand-over is stale

  /// The agent stops on a signal (quiet()): what ends with it says nothing.
  bool quiet = false;
  std::unique_ptr<DeadlineTimer> quiet_timer;
  std::vector<std::string> held_warnings;

  /// A standby or the zygote killed by a stop signal most often got the job's own (SLURM, a
  /// terminal or a container runtime signals every process of the job), which may reach the
  /// agent a moment later: its warning waits kSignalledWarningDelay, and is dropped if the
  /// agent stops by then. Anything else is said at once.
  void warn_unless_stopping(std::string warning, const ExitStatus& status) {
    if (warning.empty() || quiet) return;
    const int sig = status.signal;
    if (sig != SIGTERM && sig != SIGINT && sig != SIGHUP && sig != SIGQUIT) {
      spdlog::warn("{}", warning);
      return;
    }
    held_warnings.push_back(std::move(warning));
    quiet_timer->arm(clock.now() + kSignalledWarningDelay, [this] {
      if (!quiet)
        for (const std::string& held : held_warnings) spdlog::warn("{}", held);
      held_warnings.clear();
    });
  }

  void await_ack(int local_rank) {
    auto it = ack_waits.find(local_rank);
    if (it == ack_waits.end()) return;
    it->second->async_wait(
        asio::posix::stream_descriptor::wait_read,
        [this, local_rank, generation = handover_generation](const boost::system::error_code& ec) {
          if (ec || !handed || generation != handover_generation) return;  // that one ended
          if (!pool.on_ack_readable(local_rank, handover_warnings)) return await_ack(local_rank);
          ack_waits.erase(local_rank);
          if (ack_waits.empty()) end_hand_over();
        });
  }

  /// Every rank settled, or the deadline passed: what took over are workers.
  void end_hand_over() {
    ++handover_generation;
    ack_timer->cancel();
    for (auto& [local_rank, wait] : ack_waits) {
      boost::system::error_code ignored;
      wait->close(ignored);  // a copy: the standby's socket stays the pool's
    }
    ack_waits.clear();
    auto workers = pool.end_hand_over(kHandoverAckTimeout, handover_warnings);
    for (const auto& line : std::exchange(handover_warnings, {})) spdlog::warn("{}", line);
    if (auto done = std::exchange(handed, nullptr)) done(std::move(workers));
  }
};

StandbySupply::StandbySupply(asio::io_context& io, ProcessLauncher& launcher,
                             const common::Clock& clock, DeadlineTimers& timers,
                             StandbySettings settings,
                             std::function<void(EventName, const nlohmann::json&)> emit)
    : impl_(std::make_unique<Impl>(io, launcher, clock, timers, std::move(settings),
                                   std::move(emit))) {}

StandbySupply::~StandbySupply() { stop(); }

bool StandbySupply::start_zygote(std::function<void(bool ready)> settled) {
  Impl& s = *impl_;
  const StandbySettings& opt = s.settings;
  // The zygote's forks are adopted by the agent as a child subreaper (GroupCleanup); without
  // one, standbys start one interpreter each.
  if (!opt.enabled || opt.python_bootstrap.empty() || opt.cleanup == nullptr) return false;
  const std::string executable =
      resolve_executable(opt.spec.argv.front(), search_path(opt.agent_env));
  if (executable.empty()) return false;  // the first launch reports the missing command
  ProcessSpec ps{executable,
                 build_python_standby_command(opt.spec.argv, opt.python_bootstrap, opt.python,
                                              /*zygote=*/true),
                 to_envp(build_standby_env(opt.agent_env, opt.spec, 0, opt.run_id))};
  ps.cgroup_procs_fd = opt.cleanup->standby_procs_fd();
  ps.stdin_fd = opt.stdin_fd;
  s.zygote = std::make_unique<PythonZygote>(s.launcher);
  if (std::string why = s.zygote->start(std::move(ps)); !why.empty()) {
    spdlog::warn("cannot start the Python zygote: {}; standbys start one interpreter each", why);
    s.zygote.reset();
    return false;
  }
  s.on_settled = std::move(settled);
  s.zygote_started = s.clock.now();
  s.emit(EventName::ZygoteStarted, {{"pid", s.zygote->pid()}});
  s.zygote_wait.assign(::fcntl(s.zygote->control_fd(), F_DUPFD_CLOEXEC, 0));
  s.await_ready();
  s.zygote_timer->arm(s.clock.now() + kZygoteReadyTimeout, [&s] {
    if (s.stopped || s.zygote->state() != PythonZygote::State::Starting) return;
    s.zygote->stop();
    s.settle(PythonZygote::State::Gone,
             "it was not ready within " + std::to_string(kZygoteReadyTimeout.count()) + " s");
  });
  return true;
}

void StandbySupply::hand_over(const std::string& executable, const std::map<int, EnvMap>& envs,
                              std::function<void(std::map<int, LaunchedProcess>)> done) {
  Impl& s = *impl_;
  if (!s.settings.enabled || executable.empty() || s.stopped || s.handed) return done({});
  s.handed = std::move(done);
  // With a zygote, the ranks without a standby get one now (a fork each): the first group
  // imports torch once, not once per worker. The hand-over waits for the zygote's answers.
  if (s.zygote_ready()) s.start_standbys(executable);
  if (!s.forking.empty()) {
    s.after_forks = [&s, envs] { s.send_hand_over(envs); };
    return;
  }
  s.send_hand_over(envs);
}

bool StandbySupply::handing_over() const { return impl_->handed != nullptr; }

void StandbySupply::schedule(const std::string& executable) {
  Impl& s = *impl_;
  if (!s.settings.enabled || executable.empty()) return;
  s.standby_timer->arm(s.clock.now() + s.settings.delay, [&s, executable] {
    if (!s.stopped) s.start_standbys(executable);
  });
}

void StandbySupply::prewarm() {
  const StandbySettings& opt = impl_->settings;
  if (!opt.enabled || !opt.python_bootstrap.empty() || opt.spec.argv.empty()) return;
  schedule(resolve_executable(opt.spec.argv.front(), search_path(opt.agent_env)));
}

bool StandbySupply::on_exit(pid_t pid, const ExitStatus& status) {
  Impl& s = *impl_;
  if (s.pool.on_exit(pid, status)) {
    s.warn_unless_stopping(s.pool.take_warning(), status);
    return true;
  }
  if (s.zygote == nullptr || !s.zygote->on_exit(pid, status)) return false;
  // The zygote was reaped: while it starts, as a failure; once it ran, standbys start one
  // interpreter each from now on.
  if (s.stopped) return true;
  if (!s.zygote_settled) {
    s.settle(PythonZygote::State::Gone);
  } else {
    if (s.pool.enabled())
      s.warn_unless_stopping(
          fmt::format("the Python zygote (pid {}) ended: {}; standbys start one interpreter "
                      "each from now on",
                      s.zygote->pid(), s.zygote->failure()),
          status);
    boost::system::error_code ignored;
    s.zygote_wait.close(ignored);
    if (!s.forking.empty()) s.settle_forks(s.zygote->on_replies());
  }
  return true;
}

std::set<pid_t> StandbySupply::pids() const {
  const Impl& s = *impl_;
  std::set<pid_t> pids;
  for (int local = 0; local < s.settings.spec.local_world_size; ++local)
    if (s.pool.has(local)) pids.insert(s.pool.pid_of(local));
  if (s.zygote != nullptr && s.zygote->state() != PythonZygote::State::Gone)
    pids.insert(s.zygote->pid());
  return pids;
}

void StandbySupply::quiet() {
  Impl& s = *impl_;
  s.quiet = true;
  s.held_warnings.clear();
  s.quiet_timer->cancel();
}

void StandbySupply::stop() {
  Impl& s = *impl_;
  quiet();
  if (s.stopped) return;
  s.stopped = true;
  s.standby_timer->cancel();
  s.zygote_timer->cancel();
  boost::system::error_code ignored;
  s.zygote_wait.close(ignored);
  s.handed = nullptr;
  s.after_forks = nullptr;
  s.fork_timer->cancel();
  for (auto& [local_rank, f] : s.forking) close_fd(f.agent_fd);
  s.forking.clear();
  ++s.handover_generation;
  s.ack_timer->cancel();
  for (auto& [local_rank, wait] : s.ack_waits) wait->close(ignored);
  s.ack_waits.clear();
  s.pool.clear();
  if (s.zygote != nullptr) s.zygote->stop();
}

}  // namespace ddprun::agent
