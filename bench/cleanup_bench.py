#!/usr/bin/python3
"""What each --cleanup mode costs and what it leaves after a SIGKILL of ddprun.

1. Launch to exit of `ddprun --cleanup MODE --nproc_per_node 2 --no_python /bin/true`, runs
   alternating between the modes (median, min, max).
2. A job of 2 workers that each start 2 sleepers that leave the worker's process group: setsid'd
   ones (`setsid sleep MARK &`), and with `--kinds` also ones in process groups of their own
   (setpgid(0, 0), then exec sleep). Once all 4 run, and then `--settle` seconds more, ddprun
   gets SIGKILL. Reported: how many sleepers are still running 5 s later, and the time from the
   SIGKILL until none is (for the modes that get there). Without a cgroup the watcher notes the
   sleepers' sessions and groups each second, so one killed sooner can miss them.
3. The watcher's CPU time while a job of `--workers` sleeping workers runs for `--seconds`
   (from /proc/<watcher>/schedstat), per mode, also with `--background` more idle processes on
   the machine: without a cgroup it reads /proc each second.

    /usr/bin/python3 bench/cleanup_bench.py --ddprun build/bin/ddprun --runs 20

Python standard library only; cgroup needs a delegated cgroup v2 tree (root here).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time

from proc_scan import live_pids


def live(mark: str) -> list[int]:
    return live_pids(mark, skip=("ddprun", "/bin/sh"))


def launch_to_exit(ddprun: str, mode: str) -> float:
    start = time.monotonic()
    subprocess.run([ddprun, "--cleanup", mode, "--nproc_per_node", "2", "--no_python", "/bin/true"],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.monotonic() - start


# How a sleeper leaves its worker's process group, as a shell command prefix.
LEAVE = {
    "setsid": "setsid",
    "setpgrp": ("/usr/bin/python3 -c 'import os, sys; os.setpgid(0, 0); "
                "os.execvp(sys.argv[1], sys.argv[1:])'"),
}


def sigkill_leftovers(ddprun: str, mode: str, settle: float,
                      kind: str) -> tuple[int, float | None]:
    mark = f"600.{random.randrange(10**6, 10**7)}"
    with tempfile.TemporaryDirectory() as tmp:
        ready = os.path.join(tmp, "ready")
        leave = LEAVE[kind]
        script = (f"{leave} sleep {mark} & {leave} sleep {mark} & echo x >> {ready}; "
                  f"exec sleep {mark}")
        job = subprocess.Popen([ddprun, "--cleanup", mode, "--nproc_per_node", "2", "--no_python",
                                "/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(ready) and sum(1 for _ in open(ready)) >= 2 and len(live(mark)) >= 6:
                break
            time.sleep(0.01)
        time.sleep(settle)
        killed = time.monotonic()
        job.send_signal(signal.SIGKILL)
        job.wait()
        gone_after = None
        while time.monotonic() - killed < 5:
            if not live(mark):
                gone_after = time.monotonic() - killed
                break
            time.sleep(0.002)
        left = live(mark)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return len(left), gone_after


def cpu_ns(pid: int) -> int:
    """The CPU time `pid` has had, in ns (/proc/<pid>/schedstat's first field: finer than the
    clock ticks of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def watcher_cpu(ddprun: str, mode: str, workers: int, seconds: float) -> tuple[float, int]:
    """The watcher's CPU time per second of a job, in ms, and how many processes ran."""
    mark = f"600.{random.randrange(10**6, 10**7)}"
    job = subprocess.Popen([ddprun, "--cleanup", mode, "--nproc_per_node", str(workers),
                            "--no_python", "/bin/sleep", mark], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while len(live(mark)) < workers and time.monotonic() < deadline:
            time.sleep(0.01)
        # The watcher: the child of ddprun named ddprun-watcher (every worker leads a session
        # of its own too).
        watcher = None
        for task in os.listdir(f"/proc/{job.pid}/task"):
            with open(f"/proc/{job.pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    with open(f"/proc/{child}/comm") as comm:
                        if comm.read().strip() == "ddprun-watcher":
                            watcher = child
        if watcher is None:
            raise SystemExit(f"--cleanup {mode}: no watcher found below ddprun")
        before = cpu_ns(watcher)
        time.sleep(seconds)
        used = cpu_ns(watcher) - before
        processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait()
    return used / 1e6 / seconds, processes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--modes", default="subreaper,cgroup")
    ap.add_argument("--settle", default="0,1.5",
                    help="seconds between the sleepers running and the SIGKILL, comma-separated")
    ap.add_argument("--kinds", default="setsid",
                    help="how the sleepers leave their process group: setsid, setpgrp, or both "
                         "comma-separated")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--background", type=int, default=1000,
                    help="idle processes started for the second watcher measurement")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for mode in modes:  # warm-up
        launch_to_exit(args.ddprun, mode)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for m in modes:
            times[m].append(launch_to_exit(args.ddprun, m))
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs, {args.runs} runs per mode")
    for m in modes:
        t = times[m]
        print(f"--cleanup {m}: launch to exit median {statistics.median(t) * 1000:.1f} ms "
              f"(min {min(t) * 1000:.1f}, max {max(t) * 1000:.1f})")
    for kind in args.kinds.split(","):
        for settle in [float(s) for s in args.settle.split(",")]:
            for m in modes:
                results = [sigkill_leftovers(args.ddprun, m, settle, kind) for _ in range(3)]
                print(f"--cleanup {m}: SIGKILL of ddprun {settle:g} s after the sleepers "
                      f"started: {kind} sleepers left (of 4): {[r[0] for r in results]}; all "
                      f"gone after (ms): "
                      f"{[None if r[1] is None else round(r[1] * 1000, 1) for r in results]}")
    for background in (0, args.background):
        idle = [subprocess.Popen(["sleep", "3600"]) for _ in range(background)]
        try:
            for m in modes:
                ms, processes = watcher_cpu(args.ddprun, m, args.workers, args.seconds)
                print(f"--cleanup {m}: the watcher's CPU time with {args.workers} workers, "
                      f"{processes} processes on the machine: {ms:.2f} ms per second "
                      f"({args.seconds:g} s)")
        finally:
            for p in idle:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
