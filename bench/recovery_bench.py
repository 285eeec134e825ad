#!/usr/bin/python3
"""Time to recovery after a worker is killed: from SIGKILL of rank 1 to the first training
step of the restarted group (every rank's first step done), ddprun against torchrun, side by
side.

Five series, run interleaved, 2 workers on this node (--standalone), Gloo on CPU, the same
model and data (examples/ddp_train.cpp and its Python twin bench/python_ddp_train.py), each
rank resuming from the snapshot rank 0 saved after the last epoch:
  ddprun-cpp-standby     ddprun --standby_workers ... build/bin/ddp_train  (C++, worker SDK)
  ddprun-cpp             ddprun ... build/bin/ddp_train
  ddprun-python-standby  ddprun --standby_workers ... bench/python_ddp_train.py (unmodified;
                         the standbys run ddprun's Python bootstrap, torch imported)
  ddprun-python          ddprun --standby_workers=off ... bench/python_ddp_train.py (standbys
                         are on by default for a script that imports torch)
  ddprun-python-standby-context, ddprun-python-standby-warm
                         ddprun-python-standby with --standby_cuda context or warm: each
                         standby makes its GPU ready while it waits (for --device cuda)
  torchrun-python        torchrun (bench/torchrun_shim.py) --monitor_interval 0.1 ... the same
                         Python script (torchrun's default interval is 5 s)

For each run the script waits until the group trains (and, with --standby_workers, until every
standby waits for its hand-over, read from /proc/<pid>/syscall), then --settle seconds, sends
SIGKILL to the worker with LOCAL_RANK=1 (RANK=1 here) at time.monotonic() t0, and
polls for the first steps of restart 1: the C++ program reports them through ddprun's event
log (--event_log, CLOCK_MONOTONIC like time.monotonic()), the Python script appends them to a
mark file. The launcher is then stopped with SIGTERM. ddprun's phases come from
`ddprun events summarize --json`. The memory of each Python standby while it waits (RSS, and
PSS, which counts pages shared between processes once) comes from /proc/<pid>/smaps_rollup,
and the GPU memory it holds from `nvidia-smi --query-compute-apps` where there is one (and
the whole device's use, --query-gpu=memory.used, for a container whose pids nvidia-smi cannot
name).

    cmake --build build --target ddprun ddp_train
    /usr/bin/python3 bench/recovery_bench.py --build build --runs 5 --markdown

On a GPU (scripts/device_check.sh): --device cuda trains both programs on the GPU with NCCL,
--nproc 1 (NCCL refuses two ranks on one GPU; the killed worker is then RANK=0), --torchrun
module runs the machine's own torchrun (`python -m torch.distributed.run`) instead of the shim
for Debian's 1.13, and --ddprun/--ddp_train name binaries outside a build folder. The Python
script's mark file also gives the phases of each restarted rank (process start, torch imported,
CUDA context, first collective, snapshot loaded, first step), reported as medians from the kill.
"""
import argparse
import json
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
sys.path.append(os.path.join(REPO_ROOT, "agent", "python"))
from ddprun_standby import waits_ready  # noqa: E402  (ddprun's Python standby bootstrap)
PY_TRAIN = os.path.join(REPO_ROOT, "bench", "python_ddp_train.py")
EPOCHS = "100000"  # far more than a run lasts: the bench stops the launcher


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def worker_with_rank(launcher_pid, rank):
    """The launcher's child (or grandchild) whose environment says RANK=<rank>."""
    todo = children(launcher_pid)
    seen = 0
    while todo and seen < 1000:
        pid = todo.pop()
        seen += 1
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"DDPRUN_STANDBY_FD" not in b" ".join(env):
            return pid
        todo += children(pid)
    return None


def waiting_standbys(launcher_pid, events):
    """Pids of the launcher's standbys that block reading their hand-over socket, their GPU
    ready with --standby_cuda (from the event log's standbys_started: a standby forked by the
    Python zygote has the zygote's /proc/<pid>/environ, so its environment cannot tell)."""
    started = set()
    for e in read_events(events):
        if e.get("event") == "standbys_started":
            started.update(e.get("pids", []))
    out = []
    for pid in children(launcher_pid):
        if pid not in started:
            continue
        if waits_ready(pid):
            out.append(pid)
    return out


def ddprun_worker(events, local_rank):
    """The pid of `local_rank` in ddprun's last started group, from its event log."""
    groups = [e for e in read_events(events) if e.get("event") == "workers_started"]
    return groups[-1]["pids"][local_rank] if groups else None


def zygote_pid(events):
    for e in read_events(events):
        if e.get("event") == "zygote_ready":
            return e["pid"]
    return None


def rss_pss_kib(pid):
    """(Rss, Pss) in KiB from /proc/<pid>/smaps_rollup."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] in ("Rss:", "Pss:"):
                values[parts[0][:-1]] = int(parts[1])
    return values["Rss"], values["Pss"]


def job_processes(launcher_pid):
    """The launcher and every process below it (bounded)."""
    seen, todo = set(), [launcher_pid]
    while todo and len(seen) < 10000:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children(pid)
    return seen


def nvidia_smi(query):
    """nvidia-smi's CSV rows for `query` (--query-...=fields), each a list of ints, or None
    without one or when it fails."""
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.splitlines():
        try:
            rows.append([int(x.strip()) for x in line.split(",")])
        except ValueError:
            continue
    return rows


def gpu_memory_mib(job):
    """({pid: MiB of GPU memory it holds} or None, MiB in use on all GPUs together or None).
    Per process from nvidia-smi --query-compute-apps, None when it lists no process at all or
    none of `job`'s (the job's ranks train on the GPU whenever this is asked: nvidia-smi sees
    other pid numbers, a container's host's); a process without a CUDA context is not listed:
    it holds none. The whole device's use (--query-gpu=memory.used) needs no pid."""
    apps = nvidia_smi("--query-compute-apps=pid,used_memory") or []
    held = {}
    for row in apps:
        if len(row) == 2:
            held[row[0]] = held.get(row[0], 0) + row[1]
    if not held.keys() & job:
        held = None
    used = nvidia_smi("--query-gpu=memory.used")
    return held, (sum(row[0] for row in used if row) if used else None)


def read_events(path):
    events = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return events


def first_steps_from_events(path, restart):
    return [e["t"] for e in read_events(path)
            if e.get("event") == "first_step" and e.get("restart_count") == restart]


def marks_of(path, restart, phase):
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[0] == phase and int(parts[1]) == restart:
                    out.append(float(parts[2]))
    except OSError:
        pass
    return out


def first_steps_from_marks(path, restart):
    return marks_of(path, restart, "first_step")


PHASES = ("start", "imported", "cuda_ready", "pg_ready", "snapshot_loaded", "first_step")


def wait_for(predicate, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    return predicate()


def one_run(series, args, work):
    snap = os.path.join(work, f"{series}.snap")
    events = os.path.join(work, f"{series}.events.jsonl")
    marks = os.path.join(work, f"{series}.marks")
    for p in (events, marks):
        if os.path.exists(p):
            os.remove(p)
    for f in os.listdir(work):
        if f.startswith(f"{series}.snap"):
            os.remove(os.path.join(work, f))
    ddprun = args.ddprun
    nproc = args.nproc
    common = ["--standalone", "--nproc_per_node", str(nproc), "--max_restarts", "1"]
    py_args = [PY_TRAIN, EPOCHS, "--dataset_size", "256", "--snapshot_path", snap,
               "--mark_file", marks, "--device", args.device]
    cpp_args = ["--no_python", args.ddp_train, EPOCHS, "1", "--dataset_size", "256",
                "--snapshot_path", snap, "--keep_snapshots", "2", "--device", args.device]
    if series == "ddprun-cpp-standby":
        argv = [ddprun] + common + ["--standby_workers", "--event_log", events] + cpp_args
    elif series == "ddprun-cpp":
        argv = [ddprun] + common + ["--event_log", events] + cpp_args
    elif series == "ddprun-python-standby":
        argv = [ddprun] + common + ["--standby_workers", "--event_log", events] + py_args
    elif series.startswith("ddprun-python-standby-"):
        mode = series[len("ddprun-python-standby-"):]
        argv = [ddprun] + common + ["--standby_workers", "--standby_cuda", mode,
                                    "--event_log", events] + py_args
    elif series == "ddprun-python":
        argv = [ddprun] + common + ["--standby_workers=off", "--event_log", events] + py_args
    else:
        argv = torchrun_argv(args.python, args.torchrun, nproc, ["--max_restarts", "1"]) + py_args
    env = dict(os.environ, PYTHON_EXEC=args.python, LOGLEVEL="WARNING")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    cpp = series.startswith("ddprun-cpp")
    firsts = ((lambda r: first_steps_from_events(events, r)) if cpp
              else (lambda r: first_steps_from_marks(marks, r)))
    try:
        if not wait_for(lambda: len(firsts(0)) == nproc, 120):
            raise RuntimeError(f"{series}: no first step in 120 s")
        memory = []
        if series.endswith("-standby") or series.startswith("ddprun-python-standby-"):
            if not wait_for(lambda: len(waiting_standbys(proc.pid, events)) == nproc, 120):
                raise RuntimeError(f"{series}: no {nproc} standbys waiting in 120 s")
            if series.startswith("ddprun-python-standby"):
                gpu, device_used = (gpu_memory_mib(job_processes(proc.pid))
                                    if args.device == "cuda" else (None, None))
                for pid in waiting_standbys(proc.pid, events):
                    rss, pss = rss_pss_kib(pid)
                    memory.append((series, "standby", rss, pss,
                                   None if gpu is None else gpu.get(pid, 0)))
                if device_used is not None:
                    memory.append((series, "device", None, None, device_used))
                if zygote_pid(events) is not None:
                    memory.append((series, "zygote") + rss_pss_kib(zygote_pid(events)) + (None,))
        time.sleep(args.settle)  # training under way
        # --standalone: RANK=n is local rank n; the last rank is killed (1 of 2, 0 of 1).
        victim_rank = min(1, nproc - 1)
        victim = (ddprun_worker(events, victim_rank) if series.startswith("ddprun")
                  else worker_with_rank(proc.pid, victim_rank))
        if victim is None:
            raise RuntimeError(f"{series}: no worker with RANK={victim_rank}")
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        if series.startswith("ddprun"):
            # For `ddprun events summarize`: its detect phase starts here.
            with open(events, "a") as f:
                f.write(json.dumps({"t": t0, "event": "fault_injected", "node": "bench"}) + "\n")
        if not wait_for(lambda: len(firsts(1)) == nproc, 120):
            raise RuntimeError(f"{series}: no first step after the restart in 120 s")
        recovery = max(firsts(1)) - t0
        phases = {}
        if not cpp:
            for phase in PHASES:
                reached = marks_of(marks, 1, phase)
                if len(reached) == nproc:
                    phases[phase] = max(reached) - t0
        if series.startswith("ddprun"):
            detected = [e["t"] for e in read_events(events) if e.get("event") == "failure_detected"]
            if detected:
                phases["detect"] = detected[0] - t0
        return recovery, phases, events, memory
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def summarize(ddprun, events):
    out = subprocess.run([ddprun, "events", "summarize", events, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--ddprun", help="the launcher (default BUILD/bin/ddprun)")
    ap.add_argument("--ddp_train", help="the C++ trainer (default BUILD/bin/ddp_train)")
    ap.add_argument("--nproc", type=int, default=2, help="workers (default 2)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--torchrun", choices=MODES, default="shim",
                    help="shim: bench/torchrun_shim.py (Debian's 1.13); shim-static: the shim "
                         "on the static rendezvous at a free port (Debian 13's 2.6, which hosts "
                         "no c10d rendezvous without libuv); module: python -m "
                         "torch.distributed.run of --python")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=1.5,
                    help="seconds of training before the kill (default 1.5)")
    ap.add_argument("--series", default="ddprun-cpp-standby,ddprun-cpp,ddprun-python-standby,"
                                        "ddprun-python,torchrun-python")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    args.ddprun = args.ddprun or os.path.join(args.build, "bin", "ddprun")
    args.ddp_train = args.ddp_train or os.path.join(args.build, "bin", "ddp_train")
    series = args.series.split(",")
    results = {s: [] for s in series}
    detect = {s: [] for s in series}
    phase_times = {s: {} for s in series}
    last_events = {}
    memory = []  # (series, kind, rss KiB, pss KiB, GPU MiB or None) of each standby and zygote
    work = tempfile.mkdtemp(prefix="ddprun-recovery-")
    try:
        for run in range(args.runs):
            for s in series:
                recovery, phases, events, standby_memory = one_run(s, args, work)
                results[s].append(recovery)
                memory += standby_memory
                if "detect" in phases:
                    detect[s].append(phases["detect"])
                for phase in PHASES:
                    if phase in phases:
                        phase_times[s].setdefault(phase, []).append(phases[phase])
                if s.startswith("ddprun"):
                    last_events[s] = summarize(args.ddprun, events)
                print(f"run {run} {s}: {recovery * 1000:.0f} ms", file=sys.stderr)
    finally:
        for f in os.listdir(work):
            os.remove(os.path.join(work, f))
        os.rmdir(work)

    ms = lambda v: f"{v * 1000:.0f}"
    print(f"Measured {time.strftime('%Y-%m-%d')} with `{' '.join(sys.argv)}`: {args.runs} runs "
          f"per series, interleaved; {args.nproc} workers on {args.device}, --standalone, "
          f"SIGKILL of RANK={min(1, args.nproc - 1)} after {args.settle} s of training.\n")
    print("| series | recovery, median ms | min | max | detect, median ms |")
    print("|---|---:|---:|---:|---:|")
    for s in series:
        v = results[s]
        d = f"{statistics.median(detect[s]) * 1000:.1f}" if detect[s] else "n/a"
        print(f"| {s} | {ms(statistics.median(v))} | {ms(min(v))} | {ms(max(v))} | {d} |")
    if "torchrun-python" in results:
        base = statistics.median(results["torchrun-python"])
        for s in series:
            if s != "torchrun-python":
                print(f"\nRatio torchrun-python / {s} (medians): "
                      f"**{base / statistics.median(results[s]):.1f}x**.")
    if "ddprun-python-standby" in results:
        base = statistics.median(results["ddprun-python-standby"])
        for s in series:
            if s.startswith("ddprun-python-standby-"):
                print(f"\nRatio ddprun-python-standby / {s} (medians): "
                      f"**{base / statistics.median(results[s]):.2f}x**.")
    with_phases = [s for s in series if phase_times[s]]
    if with_phases:
        print("\nPhases of the restarted Python ranks, median ms from the kill to the moment the "
              "last rank reached each (the script's mark file):\n")
        print("| series | " + " | ".join(PHASES) + " |")
        print("|---|" + "---:|" * len(PHASES))
        for s in with_phases:
            cells = [f"{statistics.median(phase_times[s][p]) * 1000:.0f}"
                     if p in phase_times[s] else "n/a" for p in PHASES]
            print(f"| {s} | " + " | ".join(cells) + " |")
    mib = lambda kib: f"{kib / 1024:.0f}"
    standbys = [s for s in series if any(m[0] == s and m[1] == "standby" for m in memory)]
    if standbys:
        print("\nMemory of a waiting Python standby, medians (/proc/<pid>/smaps_rollup; GPU: "
              "nvidia-smi --query-compute-apps, n/a without it):\n")
        print("| series | standbys measured | RSS MiB (min-max) | PSS MiB (min-max) | GPU MiB "
              "(min-max) |")
        print("|---|---:|---:|---:|---:|")
        for s in standbys:
            mine = [m for m in memory if m[0] == s and m[1] == "standby"]
            rss, pss = [m[2] for m in mine], [m[3] for m in mine]
            gpu = [m[4] for m in mine if m[4] is not None]
            cells = [f"{mib(statistics.median(v))} ({mib(min(v))}-{mib(max(v))})"
                     for v in (rss, pss)]
            cells.append(f"{statistics.median(gpu):.0f} ({min(gpu)}-{max(gpu)})" if gpu
                         else "n/a")
            print(f"| {s} | {len(mine)} | " + " | ".join(cells) + " |")
    in_use = {s: [m[4] for m in memory if m[0] == s and m[1] == "device"] for s in series}
    if any(in_use.values()):
        print("\nGPU memory in use on the machine's GPUs, all processes, while the standbys "
              "waited (nvidia-smi --query-gpu=memory.used), median MiB; the difference from "
              "ddprun-python-standby, divided by the standbys waiting, is what a standby's "
              "--standby_cuda holds even where nvidia-smi cannot name processes:\n")
        print("| series | MiB in use (min-max) | more than ddprun-python-standby, per standby |")
        print("|---|---:|---:|")
        base = in_use.get("ddprun-python-standby")
        for s in series:
            if in_use[s]:
                v = in_use[s]
                extra = (f"{(statistics.median(v) - statistics.median(base)) / args.nproc:.0f}"
                         if base and s != "ddprun-python-standby" else "n/a")
                print(f"| {s} | {statistics.median(v):.0f} ({min(v)}-{max(v)}) | {extra} |")
    rss = [m[2] for m in memory if m[1] == "zygote"]
    pss = [m[3] for m in memory if m[1] == "zygote"]
    if rss:
        print(f"\nMemory of a waiting Python zygote ({len(rss)} measured, "
              f"/proc/<pid>/smaps_rollup): RSS median {mib(statistics.median(rss))} MiB "
              f"(min {mib(min(rss))}, max {mib(max(rss))}), PSS median "
              f"{mib(statistics.median(pss))} MiB (min {mib(min(pss))}, max {mib(max(pss))}).")
    for s, summary in last_events.items():
        if summary:
            print(f"\nPhases of the last {s} run (`ddprun events summarize --json`):\n")
            print("```json\n" + json.dumps(summary, indent=1) + "\n```")
    print(f"\nMachine: {os.cpu_count()} CPUs, {platform.platform()}; load average (1 min) at "
          f"the end {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
