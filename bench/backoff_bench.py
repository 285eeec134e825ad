#!/usr/bin/python3
"""Does the pause between failures in a row follow --restart_backoff?

Runs `ddprun --max_restarts N --crash_loop_stop 0 --restart_backoff BASE:MAX --event_log LOG
--no_python /bin/sh -c 'exit 1'` (a group that fails at once, every time), then reads the event
log: for each `restart_delayed` the pause it announced (`delay_ms`), the time until the
`rendezvous_start` that followed it (the pause kept), and the whole gap from the failure
(`failure_detected`) to the next `workers_started`. Prints one row per restart and the largest
difference between the pause kept and the schedule.

    /usr/bin/python3 bench/backoff_bench.py --ddprun build/bin/ddprun --restarts 6 --backoff 0.5:4

Python standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--restarts", type=int, default=6)
    ap.add_argument("--backoff", default="0.5:4")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "events.jsonl")
        cmd = [args.ddprun, "--standalone", "--max_restarts", str(args.restarts),
               "--crash_loop_stop", "0", "--restart_backoff", args.backoff, "--event_log", log,
               "--no_python", "/bin/sh", "-c", "exit 1"]
        code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=600).returncode
        with open(log) as f:
            events = [json.loads(line) for line in f if line.strip()]
    print(f"exit {code}; load average {os.getloadavg()}, {os.cpu_count()} CPUs")
    print(f"`{' '.join(cmd[:10])} ...`")
    print("| failures in a row | pause announced | pause kept | kept - announced | failure to next start |")
    print("|---:|---:|---:|---:|---:|")
    worst = 0.0
    for i, e in enumerate(events):
        if e["event"] != "restart_delayed":
            continue
        join = next((n for n in events[i + 1:] if n["event"] == "rendezvous_start"), None)
        failure = next((p for p in reversed(events[:i]) if p["event"] == "failure_detected"), None)
        started = next((n for n in events[i + 1:] if n["event"] == "workers_started"), None)
        if join is None or failure is None or started is None:
            continue
        announced = e["delay_ms"]
        kept = (join["t"] - e["t"]) * 1000.0
        gap = (started["t"] - failure["t"]) * 1000.0
        worst = max(worst, abs(kept - announced))
        print(f"| {e['failures_in_a_row']} | {announced} ms | {kept:.1f} ms | "
              f"{kept - announced:+.1f} ms | {gap:.1f} ms |")
    print(f"largest difference between the pause kept and the schedule: {worst:.1f} ms")


if __name__ == "__main__":
    main()
