#!/usr/bin/python3
"""Launch-to-exit time and peak RSS of ddprun against torchrun.

Both launchers start two workers that are /bin/true on a standalone
(single-node c10d) rendezvous and exit when the workers have finished:

    ddprun   --standalone --nproc_per_node 2 --no_python /bin/true
    torchrun --standalone --nproc_per_node 2 --monitor_interval 0.1 --no_python /bin/true

torchrun is bench/torchrun_shim.py (Debian's torchrun with its Python 3.11
crash fixed). --monitor_interval 0.1 lowers torchrun's default 5 s polling
period so that the baseline is not handicapped by it; ddprun notices worker
exits at once and accepts the flag only for compatibility.

Time: each run is started with posix_spawn and reaped with wait4 from this
script; the clock runs from just before the spawn to the return of wait4.
stdin is /dev/null, stdout and stderr go to a scratch file. Runs alternate
between the two launchers (the torchrun runs are spread evenly among the
ddprun runs), after warm-up runs of each that are not counted.

Peak RSS: what wait4 reports as ru_maxrss for a launcher, taken in a separate
series of runs. Two facts of Linux decide how it has to be taken, and the
script demonstrates both at start-up:
  1. wait4 returns RUSAGE_BOTH for the reaped child: ru_maxrss is the larger
     of the child's own peak and the peaks of the descendants it reaped. The
     workers here are /bin/true, reaped by the launcher, so they count, but
     they are tiny (the /bin/true row shows how tiny).
  2. A process's peak includes the memory of the parent it was forked (or
     vforked) from, up to its exec. Spawned straight from this Python
     script, even /bin/true reports Python's ~10 MiB. So the launchers are
     started by GNU time (/usr/bin/time -f %M, a ~1 MiB process that forks,
     execs and wait4s its command) and its figure is reported.
As an independent check, one extra run of each launcher with /bin/sleep 0.5
workers samples VmHWM (the process's own peak RSS, not counting parents or
children) from /proc/<pid>/status for as long as the launcher lives.

Python standard library only (plus /usr/bin/time from Debian's `time`
package for the RSS series); run with /usr/bin/python3:

    /usr/bin/python3 bench/launch_bench.py --ddprun /tmp/b/bin/ddprun --markdown
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIM = os.path.join(REPO_ROOT, "bench", "torchrun_shim.py")
WORKER = ["--no_python", "/bin/true"]
SLEEPY_WORKER = ["--no_python", "/bin/sleep", "0.5"]
NPROC = "2"
MIB = 1024.0  # ru_maxrss and VmHWM are in KiB


@dataclass
class Series:
    name: str
    argv: list[str]
    times_ms: list[float] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    hwm_kib: int = 0


class Runner:
    """Runs commands with stdin from /dev/null and output into one scratch file."""

    def __init__(self) -> None:
        self._log = tempfile.TemporaryFile()
        self.fd = self._log.fileno()

    def _actions(self) -> list:
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        return [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, self.fd, 1),
            (os.POSIX_SPAWN_DUP2, self.fd, 2),
        ]

    def _fail(self, argv: list[str], code: int) -> None:
        os.lseek(self.fd, 0, os.SEEK_SET)
        log = os.read(self.fd, 1 << 16).decode(errors="replace")
        sys.exit(f"exit status {code}: {' '.join(argv)}\n{log}")

    def timed(self, argv: list[str]) -> tuple[float, int]:
        """Runs argv to completion; returns (wall ms, wait4 ru_maxrss KiB)."""
        actions = self._actions()
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions)
        _, status, ru = os.wait4(pid, 0)
        t1 = time.perf_counter_ns()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            self._fail(argv, code)
        return (t1 - t0) / 1e6, ru.ru_maxrss

    def gnu_time_rss(self, gnu_time: str, argv: list[str]) -> int:
        """ru_maxrss (KiB) of argv as forked and reaped by GNU time."""
        with tempfile.NamedTemporaryFile("r") as out:
            self.timed([gnu_time, "-f", "%M", "-o", out.name, *argv])
            return int(out.read().split()[-1])

    def sampled_vmhwm(self, argv: list[str]) -> int:
        """Starts argv and polls its own VmHWM until it exits; returns the last reading (KiB)."""
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=self._actions())
        last = 0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                if code != 0:
                    self._fail(argv, code)
                return last
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            last = int(line.split()[1])
            except OSError:
                pass
            time.sleep(0.005)


def wait4_semantics() -> tuple[int, int]:
    """wait4's ru_maxrss for a small forked child whose own child touches 128 MiB:
    once when the small child reaps it, once when it exits without reaping it."""

    def trial(reap: bool) -> int:
        pid = os.fork()
        if pid == 0:
            grandchild = os.fork()
            if grandchild == 0:
                buf = bytearray(128 << 20)  # zero-filled, so every page is touched
                del buf
                os._exit(0)
            if reap:
                os.waitpid(grandchild, 0)
            else:
                time.sleep(0.3)  # leaves it to init
            os._exit(0)
        _, _, ru = os.wait4(pid, 0)
        return ru.ru_maxrss

    return trial(True), trial(False)


def machine_info(python: str, ddprun: str) -> dict[str, str]:
    def first(path: str, prefix: str, default: str = "?") -> str:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(prefix):
                        return line[len(prefix):].strip().lstrip(":=").strip().strip('"')
        except OSError:
            pass
        return default

    def output(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    debian = first("/etc/debian_version", "", "")
    return {
        "date": datetime.date.today().isoformat(),
        "os": first("/etc/os-release", "PRETTY_NAME") + (f" ({debian})" if debian else ""),
        "kernel": platform.release(),
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": first("/proc/cpuinfo", "model name"),
        "python": platform.python_version(),
        "torch": output([python, "-c", "import torch; print(torch.__version__)"]),
        "ddprun": output([ddprun, "--version"]),
        "revision": output(["git", "-C", REPO_ROOT, "describe", "--always", "--dirty"]),
    }


def stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ddprun", default=os.path.join(REPO_ROOT, "build", "bin", "ddprun"),
                    help="ddprun binary (default: build/bin/ddprun under the repository root)")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="interpreter with torch, runs the torchrun shim (default /usr/bin/python3)")
    ap.add_argument("--runs", type=int, default=20, help="counted ddprun runs (default 20)")
    ap.add_argument("--baseline-runs", type=int, default=10,
                    help="counted torchrun runs (default 10; each takes about 2 s)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="uncounted runs of each launcher before measuring (default 2)")
    ap.add_argument("--rss-runs", type=int, default=5,
                    help="runs of each launcher under GNU time for peak RSS (default 5)")
    ap.add_argument("--gnu-time", default="/usr/bin/time", help="GNU time (default /usr/bin/time)")
    ap.add_argument("--markdown", action="store_true", help="print the results as markdown")
    ap.add_argument("--ddprun-before", metavar="PATH",
                    help="another ddprun binary (e.g. built from an earlier commit), timed "
                         "alternately with --ddprun: a before/after comparison of a change")
    args = ap.parse_args()
    if min(args.runs, args.baseline_runs, args.rss_runs) < 1 or args.warmup < 0:
        ap.error("--runs, --baseline-runs and --rss-runs must be >= 1, --warmup >= 0")

    ddprun = os.path.abspath(args.ddprun)
    for path, flag in ((ddprun, "--ddprun"), (args.python, "--python"),
                       (args.gnu_time, "--gnu-time")):
        if not os.access(path, os.X_OK):
            ap.error(f"nothing executable at {path}; pass {flag} PATH")

    dd = Series("ddprun", [ddprun, "--standalone", "--nproc_per_node", NPROC, *WORKER])
    before = None
    if args.ddprun_before:
        path = os.path.abspath(args.ddprun_before)
        if not os.access(path, os.X_OK):
            ap.error(f"nothing executable at {path}; pass --ddprun-before PATH")
        before = Series("ddprun (before)",
                        [path, "--standalone", "--nproc_per_node", NPROC, *WORKER])
    tr = Series("torchrun", [args.python, os.path.relpath(SHIM), "--standalone", "--nproc_per_node", NPROC,
                             "--monitor_interval", "0.1", *WORKER])

    reaped_kib, unreaped_kib = wait4_semantics()
    info = machine_info(args.python, ddprun)
    load_before = os.getloadavg()
    run = Runner()

    # Fact 2 above: /bin/true spawned from here, and under GNU time.
    true_direct_kib = max(run.timed(["/bin/true"])[1] for _ in range(3))
    true_gnu_kib = [run.gnu_time_rss(args.gnu_time, ["/bin/true"]) for _ in range(args.rss_runs)]

    for _ in range(args.warmup):
        run.timed(dd.argv)
        run.timed(tr.argv)
        if before:
            run.timed(before.argv)
    started = time.monotonic()
    for i in range(args.runs):
        dd.times_ms.append(run.timed(dd.argv)[0])
        if before:
            before.times_ms.append(run.timed(before.argv)[0])
        if (i + 1) * args.baseline_runs // args.runs > i * args.baseline_runs // args.runs:
            tr.times_ms.append(run.timed(tr.argv)[0])
    elapsed = time.monotonic() - started

    for _ in range(args.rss_runs):
        dd.rss_kib.append(run.gnu_time_rss(args.gnu_time, dd.argv))
        tr.rss_kib.append(run.gnu_time_rss(args.gnu_time, tr.argv))
        if before:
            before.rss_kib.append(run.gnu_time_rss(args.gnu_time, before.argv))
    dd.hwm_kib = run.sampled_vmhwm(dd.argv[: -len(WORKER)] + SLEEPY_WORKER)
    if before:
        before.hwm_kib = run.sampled_vmhwm(before.argv[: -len(WORKER)] + SLEEPY_WORKER)
    tr.hwm_kib = run.sampled_vmhwm(tr.argv[: -len(WORKER)] + SLEEPY_WORKER)
    load_after = os.getloadavg()

    assert len(dd.times_ms) == args.runs and len(tr.times_ms) == args.baseline_runs
    d_med, d_min, d_max = stats(dd.times_ms)
    t_med, t_min, t_max = stats(tr.times_ms)
    ratio = t_med / d_med

    def rss(values: list[int]) -> str:
        med, _, top = stats(values)
        return f"{med / MIB:.1f} (max {top / MIB:.1f})"

    bench_cmd = " ".join([sys.executable, os.path.relpath(os.path.abspath(sys.argv[0])),
                          *sys.argv[1:]])
    notes = [
        f"Runs interleaved (ddprun {args.runs}, torchrun {args.baseline_runs}, torchrun runs "
        f"spread evenly) after {args.warmup} discarded warm-up runs of each; the timed "
        f"series took {elapsed:.0f} s.",
        f"Peak RSS: median (max) of {args.rss_runs} runs of each launcher under "
        f"`{args.gnu_time} -f %M`; that is wait4's ru_maxrss of the launcher, the larger of "
        f"its own peak and those of the workers it reaped. /bin/true under GNU time: "
        f"{rss(true_gnu_kib)} MiB. Sampled VmHWM: the launcher's own peak, read from "
        f"/proc/<pid>/status every 5 ms during one run with `/bin/sleep 0.5` workers.",
        f"wait4 check on this kernel: a forked child that reaps a 128 MiB grandchild reports "
        f"{reaped_kib / MIB:.1f} MiB, one that does not reap it {unreaped_kib / MIB:.1f} MiB; "
        f"/bin/true spawned straight from this Python script reports "
        f"{true_direct_kib / MIB:.1f} MiB (the parent's pages count until exec), hence GNU time.",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['os']}, kernel {info['kernel']}; "
        f"Python {info['python']}, torch {info['torch']}, {info['ddprun']} (binary "
        f"{ddprun}; repository at {info['revision']}). Load average "
        f"(1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after.",
    ]

    if args.markdown:
        print(f"Measured {info['date']} with `{bench_cmd}`.\n")
        print("| launcher | timed runs | median (ms) | min (ms) | max (ms) "
              "| peak RSS, wait4 under GNU time (MiB) | peak RSS, sampled VmHWM (MiB) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        rows = [(dd, (d_med, d_min, d_max))]
        if before:
            rows.append((before, stats(before.times_ms)))
        rows.append((tr, (t_med, t_min, t_max)))
        for s, (med, lo, hi) in rows:
            print(f"| {s.name} | {len(s.times_ms)} | {med:.1f} | {lo:.1f} | {hi:.1f} "
                  f"| {rss(s.rss_kib)} | {s.hwm_kib / MIB:.1f} |")
        print(f"\nMedian ratio torchrun / ddprun: **{ratio:.1f}x**.\n")
        if before:
            print(f"Median ratio ddprun (before) / ddprun: "
                  f"**{stats(before.times_ms)[0] / d_med:.2f}x** (`{before.argv[0]}`, timed "
                  f"alternately with ddprun).\n")
        print("Commands timed:\n")
        print(f"- ddprun: `{' '.join(dd.argv)}`")
        print(f"- torchrun: `{' '.join(tr.argv)}`\n")
        print("Notes:\n")
        for note in notes:
            print(f"- {note}")
        return 0

    print(f"date            {info['date']}")
    print(f"ddprun cmd      {' '.join(dd.argv)}")
    print(f"torchrun cmd    {' '.join(tr.argv)}")
    print()
    print("launch to exit (ms)   median      min      max")
    print(f"  ddprun           {d_med:9.1f} {d_min:8.1f} {d_max:8.1f}")
    print(f"  torchrun         {t_med:9.1f} {t_min:8.1f} {t_max:8.1f}")
    print(f"  ratio torchrun/ddprun (medians): {ratio:.1f}x")
    print()
    print("peak RSS (MiB)     wait4 under GNU time, median (max)   sampled VmHWM")
    print(f"  ddprun           {rss(dd.rss_kib):>24}             {dd.hwm_kib / MIB:8.1f}")
    print(f"  torchrun         {rss(tr.rss_kib):>24}             {tr.hwm_kib / MIB:8.1f}")
    print(f"  /bin/true        {rss(true_gnu_kib):>24}")
    print()
    for note in notes:
        print(f"* {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
