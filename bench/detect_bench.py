#!/usr/bin/python3
"""Crash detection: from SIGKILL of a worker to ddprun's failure_detected event.

Runs `ddprun --standalone --nproc_per_node 2 --event_log E --no_python PROGRAM...`, waits
--settle seconds after workers_started, sends SIGKILL to the second worker at time.monotonic()
t0 and reads the failure_detected line's "t" (CLOCK_MONOTONIC, the same clock). With a small
program (/bin/sleep) the figure is ddprun's own reaction; with a libtorch program it also holds
the kernel's tear-down of the killed process (threads, large mappings), which ends before the
parent can learn of the exit.

    /usr/bin/python3 bench/detect_bench.py --build build --runs 10 -- /bin/sleep 100
    /usr/bin/python3 bench/detect_bench.py --build build --runs 10 -- build/bin/ddp_train 100000 100000
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def events(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def first(path, name, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for e in events(path):
            if e.get("event") == name:
                return e
        time.sleep(0.002)
    raise RuntimeError(f"no {name} in {limit} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--settle", type=float, default=2.5)
    ap.add_argument("program", nargs="+")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ddprun-detect-")
    log = os.path.join(work, "events.jsonl")
    ms = []
    try:
        for _ in range(args.runs):
            if os.path.exists(log):
                os.remove(log)
            p = subprocess.Popen([os.path.join(args.build, "bin", "ddprun"), "--standalone",
                                  "--nproc_per_node", "2", "--event_log", log, "--no_python"]
                                 + args.program, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            try:
                pids = first(log, "workers_started", 60)["pids"]
                time.sleep(args.settle)
                t0 = time.monotonic()
                os.kill(pids[1], signal.SIGKILL)
                ms.append((first(log, "failure_detected", 60)["t"] - t0) * 1000)
            finally:
                p.wait(60)
    finally:
        if os.path.exists(log):
            os.remove(log)
        os.rmdir(work)
    print(f"`{' '.join(args.program)}`: SIGKILL to failure_detected, {args.runs} runs: median "
          f"{statistics.median(ms):.2f} ms, min {min(ms):.2f}, max {max(ms):.2f} "
          f"(load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
