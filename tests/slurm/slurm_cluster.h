#pragma once
// A real SLURM cluster for one test, from Debian's packages: munged, slurmctld and two slurmd
// as virtual nodes n1 and n2 (both 127.0.0.1, each on its own port), all in a temporary
// directory with its own slurm.conf and munge key. Every daemon is started here, in the
// foreground, and stopped by pid at the end. If SLURM cannot start, the test fails with the
// reason and the daemons' logs.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "rendezvous/free_port.h"
#include "tests/support/subprocess.h"

namespace ddprun::testing {

/// Long enough for a loaded 2-core machine; the daemons come up within a few seconds.
inline constexpr std::chrono::seconds kClusterStartLimit{60};
/// One sbatch --wait of a small job; a healthy one takes a few seconds.
inline constexpr std::chrono::seconds kSlurmJobLimit{120};

/// A job's environment in which `ddprun` on PATH is the one at `ddprun_bin` (just built).
/// rank -> how many times a worker printed it, from "[default0]:RANK=3" lines (srun --label
/// may put "0: " in front).
inline std::map<int, int> ranks_printed(const std::string& out) {
  std::map<int, int> ranks;
  static const std::regex kRank(R"(\[default\d+\]:RANK=(\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kRank); it != std::sregex_iterator();
       ++it)
    ++ranks[std::stoi((*it)[1])];
  return ranks;
}

inline std::map<std::string, std::string> ddprun_on_path(const std::string& ddprun_bin) {
  const std::string bin = std::filesystem::path(ddprun_bin).parent_path().string();
  const char* path = std::getenv("PATH");
  return {{"PATH", bin + ":" + (path != nullptr ? path : "/usr/bin:/bin")}};
}

class SlurmCluster {
 public:
  SlurmCluster() {
    for (const char* tool : {"munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "srun",
                             "scontrol", "scancel", "squeue"}) {
      INFO(
          "SLURM or munge is not installed: run scripts/install-deps.sh (it installs "
          "slurmctld slurmd slurm-client munge)");
      INFO(tool);
      REQUIRE_FALSE(find_tool(tool).empty());
    }
    namespace fs = std::filesystem;
    // munged insists that every directory above its socket is searchable by everyone.
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read |
                                     fs::perms::group_exec | fs::perms::others_read |
                                     fs::perms::others_exec);
    for (const char* sub : {"munge", "socket", "state", "spool", "log"})
      fs::create_directories(dir_.path() + "/" + sub);
    fs::permissions(dir_.path() + "/munge", fs::perms::owner_all);
    fs::permissions(dir_.path() + "/socket", fs::perms::owner_all | fs::perms::group_read |
                                                 fs::perms::group_exec | fs::perms::others_read |
                                                 fs::perms::others_exec);

    const std::string key = dir_.path() + "/munge/munge.key";
    auto made = run_command({find_tool("mungekey"), "--create", "--keyfile=" + key}, {},
                            std::chrono::seconds(30));
    INFO("mungekey: " << made.out << made.err);
    REQUIRE(made.exit_code == 0);
    munge_socket_ = dir_.path() + "/socket/munge.socket";
    munged_ = std::make_unique<Subprocess>(std::vector<std::string>{
        find_tool("munged"), "--foreground", "--force", "--socket=" + munge_socket_,
        "--key-file=" + key, "--pid-file=" + dir_.path() + "/munge/munged.pid",
        "--seed-file=" + dir_.path() + "/munge/munged.seed",
        "--log-file=" + dir_.path() + "/log/munged.log"});
    const bool munge_up = wait_for([this] { return std::filesystem::exists(munge_socket_); });
    INFO("munged did not create its socket: " << munged_->err_so_far()
                                              << read_file(dir_.path() + "/log/munged.log"));
    REQUIRE(munge_up);

    write_config();
    env_["SLURM_CONF"] = conf_;
    slurmctld_ =
        std::make_unique<Subprocess>(std::vector<std::string>{find_tool("slurmctld"), "-D"}, env_);
    for (const char* node : {"n1", "n2"})
      slurmd_.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{find_tool("slurmd"), "-D", "-N", node}, env_));
    std::string last;
    const bool idle = wait_for([this, &last] {
      auto r = run_command({find_tool("sinfo"), "--noheader", "--format=%N %t"}, env_,
                           std::chrono::seconds(20));
      last = r.out + r.err;
      return r.exit_code == 0 && last.find("n[1-2] idle") != std::string::npos;
    });
    INFO("SLURM did not show n1 and n2 idle within " << kClusterStartLimit.count()
                                                     << " s; last sinfo: " << last << logs());
    REQUIRE(idle);
  }

  ~SlurmCluster() {
    // Jobs still running (a test that failed half-way) go first, then the daemons, newest first.
    if (slurmctld_) {
      run_command({find_tool("scancel"), "--user=root"}, env_, std::chrono::seconds(20));
      wait_for(
          [this] {
            auto r =
                run_command({find_tool("squeue"), "--noheader"}, env_, std::chrono::seconds(10));
            return r.exit_code != 0 || r.out.empty();
          },
          std::chrono::seconds(20));
    }
    for (auto& node : slurmd_) stop(node);
    stop(slurmctld_);
    stop(munged_);
  }

  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  /// SLURM_CONF, for the SLURM commands a test runs.
  const std::map<std::string, std::string>& env() const { return env_; }
  const std::string& dir() const { return dir_.path(); }

  /// `sbatch --wait` of a script written to the cluster's directory; the job's output (stdout
  /// and stderr) is in `out`. `extra_env` reaches the job (sbatch exports the environment).
  CommandResult sbatch_wait(const std::string& script,
                            const std::map<std::string, std::string>& extra_env = {}) {
    const std::string path = dir_.path() + "/script" + std::to_string(jobs_ + 1) + ".sbatch";
    std::ofstream(path) << script;
    return sbatch_wait_file(path, dir_.path(), extra_env);
  }

  /// `sbatch --wait` of a script file, run in `workdir`; its output goes to the cluster's
  /// directory whatever the script's #SBATCH --output says.
  CommandResult sbatch_wait_file(const std::string& path, const std::string& workdir,
                                 const std::map<std::string, std::string>& extra_env = {}) {
    const std::string output = dir_.path() + "/job" + std::to_string(++jobs_) + ".out";
    std::map<std::string, std::string> env = env_;
    env.insert(extra_env.begin(), extra_env.end());
    auto r = run_command(
        {find_tool("sbatch"), "--wait", "--chdir=" + workdir, "--output=" + output, path}, env,
        kSlurmJobLimit);
    r.err = r.out + r.err;
    r.out = read_file(output);
    if (r.timed_out) {
      // The job's processes hang under slurmstepd, not under sbatch: show them all.
      auto ps = run_command({"/bin/ps", "-eo", "pid,ppid,stat,etimes,wchan:24,args"}, {},
                            std::chrono::seconds(10));
      r.err += "\nsbatch --wait did not finish within " + std::to_string(kSlurmJobLimit.count()) +
               " s; processes:\n" + ps.out;
    }
    return r;
  }

  /// `sbatch --wait` of a script file started in the background, for a test that acts on the job
  /// while it runs; the job's output goes to `output`. job_id_of() reads its id.
  std::unique_ptr<Subprocess> sbatch_start(const std::string& path, const std::string& workdir,
                                           const std::string& output,
                                           const std::map<std::string, std::string>& extra_env) {
    std::map<std::string, std::string> env = env_;
    env.insert(extra_env.begin(), extra_env.end());
    return std::make_unique<Subprocess>(
        std::vector<std::string>{find_tool("sbatch"), "--wait", "--chdir=" + workdir,
                                 "--output=" + output, path},
        env);
  }

  /// The job id sbatch printed ("Submitted batch job 12"), waiting up to 30 s for it; "" if none.
  static std::string job_id_of(const Subprocess& sbatch) {
    std::string id;
    wait_for(
        [&] {
          const std::string out = sbatch.out_so_far();
          const std::string prefix = "Submitted batch job ";
          const size_t at = out.find(prefix);
          const size_t end = at == std::string::npos ? at : out.find('\n', at);
          if (end != std::string::npos)
            id = out.substr(at + prefix.size(), end - at - prefix.size());
          return !id.empty();
        },
        std::chrono::seconds(30));
    return id;
  }

  /// Starts `sbatch --wait` of the script file `path` (run in the cluster's directory, output to
  /// `output`), waits until `ready` holds for the job's output (checked every 100 ms, at most
  /// 90 s), sends SIGUSR1 to the batch shell as `#SBATCH --signal=B:USR1@N` would (scancel
  /// --signal=USR1 --batch) and waits for the job. Returns sbatch's result; the job's output is
  /// in `output`. REQUIREs each step.
  CommandResult preempt_when(const std::string& path, const std::string& output,
                             const std::map<std::string, std::string>& extra_env,
                             const std::function<bool(const std::string&)>& ready) {
    auto sbatch = sbatch_start(path, dir_.path(), output, extra_env);
    const std::string job = job_id_of(*sbatch);
    INFO("sbatch: " << sbatch->out_so_far() << sbatch->err_so_far());
    REQUIRE_FALSE(job.empty());
    bool is_ready = false;
    for (int i = 0; i < 900 && !is_ready; ++i) {
      is_ready = ready(read_file(output));
      if (!is_ready) ::usleep(100'000);
    }
    INFO("job output:\n" << read_file(output) << logs());
    REQUIRE(is_ready);
    auto signalled = client("scancel", {"--signal=USR1", "--batch", job});
    INFO("scancel: " << signalled.out << signalled.err);
    REQUIRE(signalled.exit_code == 0);
    return sbatch->wait(kSlurmJobLimit);
  }

  /// Runs a SLURM client (scancel, squeue, ...) against this cluster.
  CommandResult client(const std::string& tool, const std::vector<std::string>& args) const {
    std::vector<std::string> argv{find_tool(tool)};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, env_, std::chrono::seconds(30));
  }

  /// The daemons' logs, for failure messages.
  std::string logs() const {
    std::string all;
    for (const char* name : {"slurmctld.log", "slurmd-n1.log", "slurmd-n2.log", "munged.log"})
      all += std::string("\n--- ") + name + " ---\n" + tail(dir_.path() + "/log/" + name);
    if (slurmctld_) all += "\n--- slurmctld stderr ---\n" + slurmctld_->err_so_far();
    return all;
  }

 private:
  /// The absolute path of a SLURM or munge program ("" when missing).
  static std::string find_tool(const std::string& name) {
    for (const char* dir : {"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"}) {
      const std::string path = std::string(dir) + "/" + name;
      if (::access(path.c_str(), X_OK) == 0) return path;
    }
    return "";
  }

  static std::string tail(const std::string& path) {
    const std::string text = read_file(path);
    return text.size() > 3000 ? text.substr(text.size() - 3000) : text;
  }

  /// Polls every 100 ms until done() holds or the limit passes.
  static bool wait_for(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = kClusterStartLimit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      ::usleep(100'000);
    }
    return done();
  }

  static int free_port() {
    auto port = rdzv::find_free_port("127.0.0.1");
    REQUIRE(port.ok());
    return *port;
  }

  /// SIGTERM, then (in Subprocess's destructor) SIGKILL for a daemon that does not stop.
  static void stop(std::unique_ptr<Subprocess>& daemon) {
    if (!daemon) return;
    daemon->send(SIGTERM);
    daemon->wait(std::chrono::seconds(15));
    daemon.reset();
  }

  void write_config() {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    std::string short_host = host;
    short_host = short_host.substr(0, short_host.find('.'));
    const std::string d = dir_.path();
    conf_ = d + "/slurm.conf";
    std::ofstream conf(conf_);
    conf << "ClusterName=ddpruntest\n"
         << "SlurmctldHost=" << short_host << "(127.0.0.1)\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "SlurmctldPort=" << free_port() << "\n"
         << "AuthType=auth/munge\nCredType=cred/munge\n"
         << "AuthInfo=socket=" << munge_socket_ << "\n"
         << "StateSaveLocation=" << d << "/state\n"
         << "SlurmdSpoolDir=" << d << "/spool/%n\n"
         << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
         << "SlurmdPidFile=" << d << "/slurmd-%n.pid\n"
         << "SlurmctldLogFile=" << d << "/log/slurmctld.log\n"
         << "SlurmdLogFile=" << d << "/log/slurmd-%n.log\n"
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
         << "SelectType=select/linear\nSchedulerType=sched/builtin\n"
         << "MpiDefault=none\nSwitchType=switch/none\nReturnToService=2\n"
         << "JobCompType=jobcomp/none\nJobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\n"
         // Virtual nodes claim 4 CPUs whatever the machine has, so --ntasks-per-node=4 fits.
         << "SlurmdParameters=config_overrides\n";
    for (const char* node : {"n1", "n2"}) {
      conf << "NodeName=" << node << " NodeHostname=" << short_host
           << " NodeAddr=127.0.0.1 Port=" << free_port() << " CPUs=4 State=UNKNOWN\n";
    }
    conf << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
  }

  TempDir dir_;
  std::string conf_;
  std::string munge_socket_;
  std::map<std::string, std::string> env_;
  int jobs_ = 0;
  std::unique_ptr<Subprocess> munged_;
  std::unique_ptr<Subprocess> slurmctld_;
  std::vector<std::unique_ptr<Subprocess>> slurmd_;
};

}  // namespace ddprun::testing
