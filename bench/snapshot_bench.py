#!/usr/bin/python3
"""Snapshot save MiB/s (worker SDK) against `dd ... conv=fsync` writing the same amount to the
same directory. Runs alternate; medians are reported.

    cmake --build build --target snapshot_bench
    /usr/bin/python3 bench/snapshot_bench.py --build build --dir /var/tmp --mib 256 --repeats 5
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tool = os.path.join(args.build, "bin", "snapshot_bench")
    work = tempfile.mkdtemp(prefix="ddprun-snapbench-", dir=args.dir)
    sdk_rates, dd_rates = [], []
    try:
        for _ in range(args.repeats):
            out = subprocess.run([tool, work, str(args.mib), "1"], check=True,
                                 stdout=subprocess.PIPE, text=True, timeout=600).stdout
            sdk_rates.append(float(re.search(r"= ([0-9.]+) MiB/s", out).group(1)))
            target = os.path.join(work, "dd.bin")
            start = time.perf_counter()
            subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M",
                            f"count={args.mib // 4}", "conv=fsync"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
            dd_rates.append(args.mib / (time.perf_counter() - start))
            os.remove(target)
    finally:
        for f in os.listdir(work):
            os.remove(os.path.join(work, f))
        os.rmdir(work)
    fs = subprocess.run(["df", "-T", args.dir], stdout=subprocess.PIPE, text=True).stdout
    fs_line = fs.strip().splitlines()[-1].split()
    print(f"Measured {time.strftime('%Y-%m-%d')} with `{' '.join(sys.argv)}`: {args.mib} MiB "
          f"of float32 parameters, {args.repeats} alternating runs, directory {args.dir} "
          f"({fs_line[1]} on {fs_line[0]}).\n")
    print("| writer | MiB/s (median) | min | max |")
    print("|---|---:|---:|---:|")
    print(f"| SnapshotStore::save | {statistics.median(sdk_rates):.1f} | {min(sdk_rates):.1f} | "
          f"{max(sdk_rates):.1f} |")
    print(f"| dd bs=4M conv=fsync | {statistics.median(dd_rates):.1f} | {min(dd_rates):.1f} | "
          f"{max(dd_rates):.1f} |")
    print(f"\nRatio save / dd: **{statistics.median(sdk_rates) / statistics.median(dd_rates):.0%}**."
          f"\n\nMachine: {os.cpu_count()} CPUs, {platform.platform()}; load average (1 min) at "
          f"the end {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
