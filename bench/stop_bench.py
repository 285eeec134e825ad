#!/usr/bin/python3
"""How fast ddprun stops when SIGTERM comes while a large group starts.

Starts `ddprun --nproc_per_node N --no_python /bin/sh -c 'echo $$$$ >> PIDS; exec sleep MARK'`
(ddprun, as torchrun, turns `$$` in a worker's arguments into `$`: the shell sees `$$`),
sends SIGTERM as soon as the first worker has written its pid, and measures the time from the
signal to ddprun's exit, how many workers had started by then, and how many processes running
`sleep MARK` are left after the exit (MARK is a number of seconds unique to the run, so only
this run's workers match). Runs alternate between the binaries given, e.g. the branch and main.

    /usr/bin/python3 bench/stop_bench.py --ddprun build/bin/ddprun --baseline /work/main/build/bin/ddprun

Python standard library only.
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


def one_run(ddprun: str, workers: int, extra: list[str]) -> tuple[float, int, int, int]:
    mark = f"600.{random.randrange(10**6, 10**7)}"
    with tempfile.TemporaryDirectory() as tmp:
        pids = os.path.join(tmp, "pids")
        cmd = [ddprun, "--nproc_per_node", str(workers), *extra, "--no_python", "/bin/sh", "-c",
               f"echo $$$$ >> {pids}; exec sleep {mark}"]  # the shell gets `$$`
        job = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (os.path.exists(pids) and os.path.getsize(pids)):
            time.sleep(0.005)
        sent = time.monotonic()
        job.send_signal(signal.SIGTERM)
        try:
            code = job.wait(timeout=600)
        except subprocess.TimeoutExpired:
            job.kill()
            code = job.wait()
        elapsed = time.monotonic() - sent
        with open(pids) as f:
            started = sum(1 for _ in f)
        time.sleep(0.5)  # let SIGKILLed leftovers die
        leftovers = live_pids(mark)
        left = len(leftovers)
        for pid in leftovers:  # this run's only: they run `sleep MARK`
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return elapsed, started, left, code


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--baseline", help="another ddprun to compare with (e.g. main's)")
    ap.add_argument("--workers", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--extra", default="", help="more ddprun flags, space separated")
    args = ap.parse_args()
    binaries = [args.ddprun] + ([args.baseline] if args.baseline else [])
    results: dict[str, list[tuple[float, int, int, int]]] = {b: [] for b in binaries}
    extra = args.extra.split()
    for _ in range(args.runs):
        for b in binaries:
            results[b].append(one_run(b, args.workers, extra))
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs, {args.workers} workers")
    for b, rs in results.items():
        times = [r[0] for r in rs]
        print(f"{b}: SIGTERM to exit median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}); workers started "
              f"{[r[1] for r in rs]}; left running {[r[2] for r in rs]}; exit {[r[3] for r in rs]}")


if __name__ == "__main__":
    main()
