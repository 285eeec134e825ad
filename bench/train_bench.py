#!/usr/bin/python3
"""Training steps per second: examples/ddp_train.cpp (worker SDK) against the same model in
Python DDP (bench/python_ddp_train.py), both under ddprun, same process count, batch and data.

Each program runs --epochs epochs. The script stamps rank 0's epoch lines as they arrive
through ddprun ("[default0]:[CPU0] Epoch k | ... | Steps: n"); steps per second are the steps
of epochs 2..E divided by the time from the end of epoch 1 to the end of epoch E, so start-up
(process launch, importing torch, process-group bootstrap), the first epoch's warm-up and
shutdown are left out. Runs of the two programs alternate; the script reports the median over
--repeats.

    /usr/bin/python3 bench/train_bench.py --build build --nproc 2 --batch_size 32

On a GPU (scripts/device_check.sh): --device cuda --nproc 1 trains both on the GPU with NCCL;
--hidden widens the hidden layer of both; --ddprun, --ddp_train and --python name the programs
outside a build folder and Debian's Python.
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, env):
    """Runs cmd; returns (seconds, steps) from the end of rank 0's first epoch to its last."""
    pattern = re.compile(r"^\[default0\]:\[[CG]PU0\] Epoch \d+ .*Steps: (\d+)")
    stamps = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          text=True, bufsize=1) as p:
        lines = []
        for line in p.stdout:
            m = pattern.match(line)
            if m:
                stamps.append((time.perf_counter(), int(m.group(1))))
            lines.append(line)
        rc = p.wait(timeout=600)
    if rc != 0 or len(stamps) < 2:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}\n{''.join(lines)}")
    return stamps[-1][0] - stamps[0][0], sum(n for _, n in stamps[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--dataset_size", type=int, default=2048)
    ap.add_argument("--ddprun", help="the launcher (default BUILD/bin/ddprun)")
    ap.add_argument("--ddp_train", help="the C++ trainer (default BUILD/bin/ddp_train)")
    ap.add_argument("--python", default="/usr/bin/python3")
    args = ap.parse_args()

    ddprun = args.ddprun or os.path.join(args.build, "bin", "ddprun")
    ddp_train = args.ddp_train or os.path.join(args.build, "bin", "ddp_train")
    launch = [ddprun, "--standalone", "--nproc_per_node", str(args.nproc)]
    common = ["--batch_size", str(args.batch_size), "--device", args.device,
              "--hidden", str(args.hidden), "--dataset_size", str(args.dataset_size)]
    programs = {
        "C++ ddp_train (worker SDK)":
            lambda e: launch + ["--no_python", ddp_train, str(e), "1"] + common,
        "Python DDP (python_ddp_train.py)":
            lambda e: launch + [os.path.join(REPO_ROOT, "bench", "python_ddp_train.py"), str(e)]
            + common,
    }
    env = dict(os.environ, PYTHON_EXEC=args.python)
    per_step = {name: [] for name in programs}
    for _ in range(args.repeats):
        for name, cmd in programs.items():
            seconds, steps = timed(cmd(args.epochs), env)
            per_step[name].append(seconds / steps)

    print(f"Measured {time.strftime('%Y-%m-%d')} with `{' '.join(sys.argv)}`: "
          f"{args.nproc} processes on {args.device}, hidden width {args.hidden}, "
          f"per-rank batch {args.batch_size}, {args.dataset_size} samples, "
          f"{args.epochs} epochs per run (epochs 2..{args.epochs} timed), "
          f"{args.repeats} alternating runs of each.\n")
    print("| program | steps/s per rank (median) | min | max |")
    print("|---|---:|---:|---:|")
    rates = {}
    for name, values in per_step.items():
        r = [1.0 / v for v in values]
        rates[name] = statistics.median(r)
        print(f"| {name} | {rates[name]:.1f} | {min(r):.1f} | {max(r):.1f} |")
    names = list(programs)
    print(f"\nRatio C++ / Python: **{rates[names[0]] / rates[names[1]]:.2f}x**.\n")
    print("Commands (E = epochs):\n")
    for name, cmd in programs.items():
        print(f"- {name}: `{' '.join(cmd('E'))}`")
    load = os.getloadavg()[0]
    print(f"\nMachine: {os.cpu_count()} CPUs, {platform.platform()}, Python "
          f"{platform.python_version()}; load average (1 min) at the end {load:.2f}.")


if __name__ == "__main__":
    main()
