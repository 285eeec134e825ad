#!/usr/bin/python3
"""First launch of a Python job: from the launcher's start until every rank has joined the
process group, with and without ddprun's pre-warmed interpreters, against torchrun.

Each run starts one launcher with N workers (--standalone) on bench/python_first_step.py,
which imports torch and torch.distributed, joins a Gloo process group, passes a barrier and
writes "<rank> <time.monotonic()>" to a mark file. The clock runs from just before the
launcher is spawned (time.monotonic()) to the last rank's mark. Three series, interleaved:
  ddprun-zygote   ddprun --standby_workers ...: one interpreter (the zygote) imports torch
                  and the script's imports while the rendezvous forms, and the workers are
                  forked from it (docs/design.md, "Standby workers")
  ddprun-fresh    ddprun --standby_workers=off ...: a new interpreter per worker, each
                  importing torch (standbys are on by default for a script that imports torch)
  torchrun        torchrun (bench/torchrun_shim.py) --monitor_interval 0.1 ...; --torchrun
                  shim-static on Debian 13's torch 2.6 (bench/torchrun_cmd.py)

    cmake --build build --target ddprun
    /usr/bin/python3 bench/python_launch_bench.py --build build --nproc 2,8 --runs 5 --markdown
"""
import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from torchrun_cmd import MODES, torchrun_argv

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "bench", "python_first_step.py")


def marks(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    out.append(float(parts[1]))
    except OSError:
        pass
    return out


def one_run(series, nproc, args, work):
    mark = os.path.join(work, f"{series}-{nproc}.marks")
    if os.path.exists(mark):
        os.remove(mark)
    common = ["--standalone", "--nproc_per_node", str(nproc)]
    ddprun = os.path.join(args.build, "bin", "ddprun")
    if series == "ddprun-zygote":
        argv = [ddprun] + common + ["--standby_workers", SCRIPT, mark]
    elif series == "ddprun-fresh":
        argv = [ddprun] + common + ["--standby_workers=off", SCRIPT, mark]
    else:
        argv = torchrun_argv(args.python, args.torchrun, nproc) + [SCRIPT, mark]
    env = dict(os.environ, PYTHON_EXEC=args.python, LOGLEVEL="WARNING")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        deadline = t0 + 300
        while len(marks(mark)) < nproc and time.monotonic() < deadline:
            time.sleep(0.005)
        got = marks(mark)
        if len(got) < nproc:
            raise RuntimeError(f"{series} x{nproc}: {len(got)} of {nproc} ranks in 300 s")
        elapsed = max(got) - t0
        code = proc.wait(120)
        if code != 0:
            raise RuntimeError(f"{series} x{nproc}: exit code {code}")
        return elapsed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--nproc", default="2,8")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--series", default="ddprun-zygote,ddprun-fresh,torchrun")
    ap.add_argument("--torchrun", choices=MODES, default="shim",
                    help="the baseline's mode (bench/torchrun_cmd.py): shim (Debian 12), "
                         "shim-static (Debian 13), module (a torch with libuv)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    series = args.series.split(",")
    counts = [int(n) for n in args.nproc.split(",")]
    results = {(s, n): [] for s in series for n in counts}
    work = tempfile.mkdtemp(prefix="ddprun-pylaunch-")
    try:
        for run in range(args.runs):
            for n in counts:
                for s in series:
                    t = one_run(s, n, args, work)
                    results[(s, n)].append(t)
                    print(f"run {run} {s} x{n}: {t * 1000:.0f} ms", file=sys.stderr)
    finally:
        for f in os.listdir(work):
            os.remove(os.path.join(work, f))
        os.rmdir(work)

    ms = lambda v: f"{v * 1000:.0f}"
    print(f"Measured {time.strftime('%Y-%m-%d')} with `{' '.join(sys.argv)}`: {args.runs} runs "
          f"per series, interleaved; --standalone; from the launcher's start to the last "
          f"rank past its first barrier.\n")
    print("| workers | series | median ms | min | max |")
    print("|---:|---|---:|---:|---:|")
    for n in counts:
        for s in series:
            v = results[(s, n)]
            print(f"| {n} | {s} | {ms(statistics.median(v))} | {ms(min(v))} | {ms(max(v))} |")
    for n in counts:
        med = {s: statistics.median(results[(s, n)]) for s in series}
        if "ddprun-zygote" in med:
            for base in ("ddprun-fresh", "torchrun"):
                if base in med:
                    print(f"\n{n} workers: {base} / ddprun-zygote (medians): "
                          f"**{med[base] / med['ddprun-zygote']:.2f}x**.")
    print(f"\nMachine: {os.cpu_count()} CPUs, {platform.platform()}; load average (1 min) at "
          f"the end {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
