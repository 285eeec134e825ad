#!/usr/bin/python3
"""A script that can never start, under a generous restart budget: ddprun against torchrun.

The script imports torch and then raises at import time, as a typo in a config key or a
missing dataset does. Both launchers run it with `--standalone --nproc_per_node 2
--max_restarts 50`; the bench counts how often the workers were started (each start appends
a line to a file), the wall time until the launcher exits, and the exit status. ddprun runs
with its defaults (the crash-loop stop and the restart back-off); the baseline is Debian's
torchrun through bench/torchrun_shim.py. Runs alternate between the two launchers.

    /usr/bin/python3 bench/crash_loop_bench.py --ddprun build/bin/ddprun --runs 3

Python standard library only (the workers import torch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """\
import os
import torch  # noqa: F401  (what a training script imports first)
with open(os.environ["CRASH_LOOP_STARTS"], "a") as f:
    f.write(os.environ.get("RANK", "?") + "\\n")
raise KeyError("learning_rate")  # a config key that is not there
"""


def one_run(cmd: list[str], starts: str, limit: float) -> tuple[float, int, int]:
    open(starts, "w").close()
    # Both launchers' workers run this interpreter (torchrun's run sys.executable; ddprun's
    # would take the first python3 on PATH, which may lack torch).
    env = dict(os.environ, CRASH_LOOP_STARTS=starts, PYTHON_EXEC=sys.executable)
    began = time.monotonic()
    try:
        done = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=limit)
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = -1
    elapsed = time.monotonic() - began
    with open(starts) as f:
        worker_starts = sum(1 for _ in f)
    return elapsed, worker_starts, code


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-restarts", type=int, default=50)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds before a run is killed")
    ap.add_argument("--only", choices=["ddprun", "torchrun"],
                    help="run one launcher (the baseline's 51 starts take minutes)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "broken_train.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        starts = os.path.join(tmp, "starts")
        common = ["--standalone", "--nproc_per_node", str(args.nproc), "--max_restarts",
                  str(args.max_restarts)]
        launchers = {
            "ddprun": [args.ddprun, *common, script],
            "torchrun (shim)": [sys.executable, os.path.join(HERE, "torchrun_shim.py"), *common,
                                script],
        }
        if args.only:
            launchers = {k: v for k, v in launchers.items() if k.startswith(args.only)}
        results: dict[str, list[tuple[float, int, int]]] = {name: [] for name in launchers}
        for _ in range(args.runs):
            for name, cmd in launchers.items():
                results[name].append(one_run(cmd, starts, args.limit))
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs; --max_restarts "
          f"{args.max_restarts}, --nproc_per_node {args.nproc}, {args.runs} runs each")
    print("| launcher | worker starts | groups started | wall time to exit, median (min-max) | exit |")
    print("|---|---:|---:|---:|---|")
    for name, rs in results.items():
        times = [r[0] for r in rs]
        starts_seen = sorted({r[1] for r in rs})
        groups = sorted({r[1] // args.nproc for r in rs})
        print(f"| {name} | {', '.join(map(str, starts_seen))} | {', '.join(map(str, groups))} | "
              f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f}) | "
              f"{', '.join(sorted({str(r[2]) for r in rs}))} |")


if __name__ == "__main__":
    main()
