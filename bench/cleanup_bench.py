#!/usr/bin/python3
"""What each --cleanup mode costs and what it leaves after a SIGKILL of ddprun.

1. Launch to exit of `ddprun --cleanup MODE --nproc_per_node 2 --no_python /bin/true`, runs
   alternating between the modes (median, min, max).
2. A job of 2 workers that each start 2 setsid'd sleepers (`setsid sleep MARK &`); once all 4
   run, ddprun gets SIGKILL. Reported: how many sleepers are still running 5 s later, and the
   time from the SIGKILL until none is (for the modes that get there).

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


def sigkill_leftovers(ddprun: str, mode: str) -> tuple[int, float | None]:
    mark = f"600.{random.randrange(10**6, 10**7)}"
    with tempfile.TemporaryDirectory() as tmp:
        ready = os.path.join(tmp, "ready")
        script = (f"setsid sleep {mark} & setsid sleep {mark} & echo x >> {ready}; "
                  f"exec sleep {mark}")
        job = subprocess.Popen([ddprun, "--cleanup", mode, "--nproc_per_node", "2", "--no_python",
                                "/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(ready) and sum(1 for _ in open(ready)) >= 2 and len(live(mark)) >= 6:
                break
            time.sleep(0.01)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--modes", default="subreaper,cgroup")
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
    for m in modes:
        results = [sigkill_leftovers(args.ddprun, m) for _ in range(3)]
        print(f"--cleanup {m}: after SIGKILL of ddprun, setsid'd sleepers left (of 4): "
              f"{[r[0] for r in results]}; all gone after (ms): "
              f"{[None if r[1] is None else round(r[1] * 1000, 1) for r in results]}")


if __name__ == "__main__":
    main()
