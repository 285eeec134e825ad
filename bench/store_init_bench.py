#!/usr/bin/python3
"""init_process_group time with ddprun's agent store against worker rank 0's store.

Each run starts `ddprun --standalone --nproc_per_node N --standby_workers=off` on this file in
worker mode: every worker imports torch, then times `init_process_group("gloo", "env://")`
alone (time.monotonic() just before and after) and writes the figure to a mark file. A run's
figure is the slowest rank's (the group is ready when the last rank is). Two series,
interleaved after one discarded warm-up run of each:
  agent-store   --agent_store on (the default): every rank is a client of the agent's store,
                bound before the workers start (TORCHELASTIC_USE_AGENT_STORE=True)
  rank0-store   --agent_store off: worker rank 0 hosts the TCPStore and the other ranks retry
                their connection (every 1 s in torch 1.13) until it is up

    cmake --build build --target ddprun
    /usr/bin/python3 bench/store_init_bench.py --build build --nproc 2,8 --runs 7
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SELF = os.path.abspath(__file__)


def worker():
    import torch.distributed as dist

    start = time.monotonic()
    dist.init_process_group("gloo", init_method="env://")
    took = time.monotonic() - start
    with open(os.path.join(os.environ["STORE_BENCH_MARKS"], os.environ["RANK"]), "w") as f:
        f.write(f"{took}\n")
    dist.barrier()
    dist.destroy_process_group()


def run_once(ddprun, nproc, agent_store):
    with tempfile.TemporaryDirectory() as marks:
        env = dict(os.environ, STORE_BENCH_MARKS=marks, PYTHON_EXEC=sys.executable,
                   STORE_BENCH_WORKER="1")
        cmd = [ddprun, "--standalone", "--nproc_per_node", str(nproc), "--standby_workers=off",
               "--agent_store", "on" if agent_store else "off", SELF]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
        times = []
        for name in os.listdir(marks):
            with open(os.path.join(marks, name)) as f:
                times.append(float(f.read()))
        if len(times) != nproc:
            raise RuntimeError(f"{len(times)} of {nproc} ranks reported")
        return max(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--nproc", default="2,8")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    ddprun = os.path.join(args.build, "bin", "ddprun")
    print(f"ddprun: {ddprun}; {os.cpu_count()} CPUs; {args.runs} runs per series")
    print("| ranks | series | median (ms) | min | max |")
    print("|---|---|---|---|---|")
    for nproc in [int(n) for n in args.nproc.split(",")]:
        series = {"agent-store": [], "rank0-store": []}
        run_once(ddprun, nproc, True)
        run_once(ddprun, nproc, False)
        for _ in range(args.runs):
            series["agent-store"].append(run_once(ddprun, nproc, True))
            series["rank0-store"].append(run_once(ddprun, nproc, False))
        for name, times in series.items():
            ms = [t * 1000 for t in times]
            print(f"| {nproc} | {name} | {statistics.median(ms):.0f} | {min(ms):.0f} | "
                  f"{max(ms):.0f} |", flush=True)


if __name__ == "__main__":
    if os.environ.get("STORE_BENCH_WORKER") == "1" and "RANK" in os.environ:
        worker()
    else:
        main()
