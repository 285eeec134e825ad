#!/usr/bin/python3
"""Goodput under a failure campaign: ddprun against torchrun, the same faults at the same times.

Three nodes (agents on this machine, --nproc_per_node 1 each, Gloo on CPU) and one spare agent
train an unmodified Python DDP script for a fixed wall time. The script snapshots model,
optimizer and step every --snapshot-every seconds (rank 0, torch.save to a temporary file, then
rename) and every start resumes from the snapshot; rank 0 appends "STEP TIME" to a progress
file every 10 steps. Each launcher runs twice: once without faults, once under a seeded
schedule of faults, at least --gap seconds apart:

  worker_kill   SIGKILL of a worker (a crash)
  agent_kill    SIGKILL of every process of a node (the machine is lost); its agent is
                started again --return-after seconds later (the machine is back)
  hung_worker   SIGSTOP of a worker (a hang: ddprun's --watchdog_timeout kills it; the
                peers' collective times out after 60 s otherwise)
  partition     the node's network is cut for --partition-for seconds (its link to the
                others goes down, then up again; connections survive a short cut)
  bad_node      from then on, the workers of a node fail 1 s after every start (a broken
                GPU); kept last, as such a machine stays broken

Each fault hits a node whose worker trains at that moment, never node 0, which hosts the
rendezvous (both launchers' c10d, `is_host`); the seed picks which.

Run as root (with iproute2), the bench re-runs itself in private network, mount and UTS
namespaces and gives every node a network namespace of its own, joined by a bridge: node N is
host gnodeN at 10.77.0.(N+2) (an /etc/hosts seen only by the bench), so that a partition cuts
one node off, as a broken switch port would. Nothing of this outlives the bench; without root
the nodes share loopback and the partition is left out of the schedule. Goodput = the step the
job reached at the end of the faulty run / the step the same launcher reached in the same wall
time without faults (steps since the last snapshot are lost at a restart: the step counter
resumes from the snapshot). Recovery per fault: from the fault to the first progress line of
the resumed group (its step no higher than the line before) or, when training only stalled
(a partition), the first line after the stall.

    cmake --build build --target ddprun
    /usr/bin/python3 bench/goodput_bench.py --ddprun build/bin/ddprun --duration 600 --markdown

ddprun runs with its defaults (back-off, crash-loop stop, quarantine 30:600) plus
--watchdog_timeout 20; torchrun is Debian's 1.13 through bench/torchrun_shim.py with
--monitor_interval 0.1. Both get --max_restarts 10, and both have the fourth agent started
once the first round runs (torchrun 1.13 keeps it waiting; it joins a later round if it wins a
place). Python standard library only (the workers import torch).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "torchrun_shim.py")

TRAIN = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

work = os.environ["GOODPUT_DIR"]
node = os.environ["GOODPUT_NODE"]
with open(os.path.join(work, "pids", node), "w") as f:
    f.write(str(os.getpid()))
if os.path.exists(os.path.join(work, "bad", node)):
    time.sleep(1.0)  # a broken device: the worker fails soon after every start
    sys.exit(3)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
snap = os.path.join(work, "snapshot.pt")
step = 0
if os.path.exists(snap):
    state = torch.load(snap)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]
every = float(os.environ["GOODPUT_SNAPSHOT_EVERY"])
pause = float(os.environ["GOODPUT_STEP_SLEEP"])
last_save = time.monotonic()
progress = os.path.join(work, "progress")
while True:
    x = torch.randn(64, 32)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    time.sleep(pause)
    if step % 10 == 0:
        print("step", step, flush=True)  # a line of output: progress for the watchdog
        if rank == 0:
            with open(progress, "a") as f:
                f.write(f"{step} {time.monotonic()}\\n")
    if rank == 0 and time.monotonic() - last_save >= every:
        tmp = snap + ".tmp"
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, snap)
        last_save = time.monotonic()
"""

NODES = 3  # nodes of the job; agent NODES is the spare
STALL = 2.0  # seconds without a progress line that count as a stall (lines come every ~0.6 s)
SUBNET = "10.77.0"  # node N is SUBNET.(N + 2) when the nodes have network namespaces
INNER = "GOODPUT_BENCH_NAMESPACES"  # set in the re-run inside the bench's own namespaces


def node_addr(node: int, netns: bool) -> str:
    return f"{SUBNET}.{node + 2}" if netns else f"127.0.0.{node + 2}"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


def set_up_network() -> None:
    """In the bench's private namespaces: one network namespace per agent (the spare's
    included), each joined to a bridge by a veth pair, and an /etc/hosts naming them."""
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/netns"], check=True)
    ip("link", "set", "lo", "up")
    ip("link", "add", "gpbr", "type", "bridge")
    ip("addr", "add", f"{SUBNET}.1/24", "dev", "gpbr")
    ip("link", "set", "gpbr", "up")
    hosts = "127.0.0.1 localhost\n"
    for node in range(NODES + 1):
        ns = f"gp{node}"
        ip("netns", "add", ns)
        ip("link", "add", f"gph{node}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", f"gph{node}", "master", "gpbr", "up")
        ip("-n", ns, "addr", "add", f"{node_addr(node, True)}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        hosts += f"{node_addr(node, True)} gnode{node}\n"
    fd, path = tempfile.mkstemp(prefix="goodput-hosts-")
    with os.fdopen(fd, "w") as f:
        f.write(hosts)
    subprocess.run(["mount", "--bind", path, "/etc/hosts"], check=True)
    os.unlink(path)  # the mount keeps it while the bench runs


def in_namespaces() -> bool:
    """Re-runs the bench in namespaces of its own when it can (root and iproute2); returns
    whether the nodes have network namespaces."""
    if os.environ.get(INNER) == "1":
        set_up_network()
        return True
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        print("not root or no iproute2: the nodes share loopback; no partition", flush=True)
        return False
    env = dict(os.environ, **{INNER: "1"})
    inner = subprocess.Popen(["unshare", "--net", "--mount", "--uts", "--propagation", "private",
                              sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env)
    # Ctrl-C reaches both; SIGTERM is passed on: the inner bench stops its jobs, then ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: inner.send_signal(signal.SIGTERM))
    raise SystemExit(inner.wait())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_pids(sid: int) -> list[int]:
    """Processes of session `sid` (an agent started with start_new_session and its workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def signal_worker(pid: int | None, sig: int) -> bool:
    """Sends `sig` to the training worker `pid`, if it still is one."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"goodput_train.py" not in f.read():
                return False
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Job:
    """One launcher's job: NODES agents and a spare, in a work directory of its own."""

    def __init__(self, launcher: str, ddprun: str, work: str, script: str, args) -> None:
        self.launcher, self.ddprun, self.work, self.script, self.args = launcher, ddprun, work, script, args
        self.netns = args.netns
        self.port = free_port()
        self.agents: dict[int, subprocess.Popen] = {}
        for sub in ("pids", "bad", "logs"):
            os.makedirs(os.path.join(work, sub), exist_ok=True)
        open(os.path.join(work, "progress"), "w").close()

    def command(self, node: int) -> list[str]:
        host = "1" if node == 0 else "0"
        common = ["--nnodes", str(NODES), "--nproc_per_node", "1", "--max_restarts", "10",
                  "--rdzv_backend", "c10d", "--rdzv_endpoint",
                  f"{node_addr(0, self.netns)}:{self.port}", "--rdzv_id", "goodput"]
        if self.launcher == "ddprun":
            command = [self.ddprun, *common, "--rdzv_conf", f"is_host={host}",
                       "--local_addr", node_addr(node, self.netns), "--watchdog_timeout", "20",
                       "--event_log", os.path.join(self.work, f"events.{node}.jsonl"), self.script]
        else:
            command = [sys.executable, SHIM, *common, "--rdzv_conf", f"is_host={host}",
                       "--monitor_interval", "0.1", self.script]
        if not self.netns:
            return command
        # Its own network namespace and host name (the same pid: each step execs the next).
        return ["ip", "netns", "exec", f"gp{node}", "unshare", "--uts", "sh", "-c",
                f'hostname gnode{node} && exec "$@"', "sh", *command]

    def start(self, node: int) -> None:
        env = dict(os.environ, GOODPUT_DIR=self.work, GOODPUT_NODE=str(node),
                   GOODPUT_SNAPSHOT_EVERY=str(self.args.snapshot_every),
                   GOODPUT_STEP_SLEEP=str(self.args.step_sleep), PYTHON_EXEC=sys.executable)
        log = open(os.path.join(self.work, "logs", f"agent.{node}.{time.monotonic():.0f}.log"), "w")
        self.agents[node] = subprocess.Popen(self.command(node), env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        log.close()

    def worker_pid(self, node: int) -> int | None:
        try:
            with open(os.path.join(self.work, "pids", str(node))) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def progress(self) -> list[tuple[int, float]]:
        lines = []
        with open(os.path.join(self.work, "progress")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    lines.append((int(parts[0]), float(parts[1])))
        return lines

    def stop(self) -> None:
        for agent in self.agents.values():
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for agent in self.agents.values():
            try:
                agent.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for agent in self.agents.values():
            kill_session(agent.pid)  # whatever is left: a stopped worker, a lost node's orphans
            try:
                agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def schedule(seed: int, duration: float, gap: float, netns: bool) -> list[tuple[float, str, int]]:
    """The faults: (seconds after the first step, kind, which), bad_node last. `which` picks
    the target among the nodes training at the time (never node 0, the host)."""
    rng = random.Random(seed)
    kinds = ["worker_kill", "agent_kill", "hung_worker"] + (["partition"] if netns else [])
    rng.shuffle(kinds)
    kinds.append("bad_node")
    faults = []
    at = gap
    for kind in kinds:
        if at > duration - gap / 2:
            break
        faults.append((at + rng.uniform(0, gap / 4), kind, rng.randrange(1000)))
        at += gap
    return faults


def worker_alive(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"goodput_train.py" in f.read()
    except (OSError, TypeError):
        return False


def run(launcher: str, args, script: str, faults: list[tuple[float, str, int]]) -> dict:
    work = tempfile.mkdtemp(prefix=f"goodput-{launcher}-")
    job = Job(launcher, args.ddprun, work, script, args)
    try:
        return run_job(job, launcher, args, faults)
    except BaseException:
        job.stop()  # interrupted (Ctrl-C, SIGTERM): leave no agent or worker behind
        raise


def run_job(job: Job, launcher: str, args, faults: list[tuple[float, str, int]]) -> dict:
    work = job.work
    for node in range(NODES):
        job.start(node)
    began = time.monotonic()
    # Training starts when the first progress line comes; the spare joins then.
    while not job.progress() and time.monotonic() - began < 180:
        time.sleep(0.2)
    if not job.progress():
        job.stop()
        raise SystemExit(f"{launcher}: no training step within 180 s; see {work}/logs")
    t0 = job.progress()[0][1]
    job.start(NODES)
    injected = []
    pending = list(faults)
    returns: list[tuple[float, int]] = []
    heals: list[tuple[float, int]] = []
    end = t0 + args.duration
    while time.monotonic() < end:
        now = time.monotonic()
        for at, node in list(returns):
            if now >= at:
                job.start(node)  # the lost machine is back: a new agent
                returns.remove((at, node))
        for at, node in list(heals):
            if now >= at:
                ip("link", "set", f"gph{node}", "up")  # the partition is over
                heals.remove((at, node))
        if pending and now - t0 >= pending[0][0]:
            _, kind, which = pending.pop(0)
            training = [n for n in sorted(job.agents) if n != 0 and worker_alive(job.worker_pid(n))]
            if not training:
                injected.append((now, kind, -1))  # nothing to hit: the job is not training
                continue
            node = training[which % len(training)]
            pid = job.worker_pid(node)
            if kind == "worker_kill":
                signal_worker(pid, signal.SIGKILL)
            elif kind == "hung_worker":
                signal_worker(pid, signal.SIGSTOP)
            elif kind == "agent_kill" and node in job.agents:
                kill_session(job.agents[node].pid)
                returns.append((now + args.return_after, node))
            elif kind == "partition":
                ip("link", "set", f"gph{node}", "down")
                heals.append((now + args.partition_for, node))
            elif kind == "bad_node":
                open(os.path.join(work, "bad", str(node)), "w").close()
                signal_worker(pid, signal.SIGKILL)  # the device fails now, and at every start
            injected.append((now, kind, node))
        if all(a.poll() is not None for a in job.agents.values()):
            break  # the job ended
        time.sleep(0.05)
    steps = job.progress()
    final = max((s for s, t in steps if t <= end), default=0)
    codes = {node: a.poll() for node, a in job.agents.items()}
    job.stop()
    for at, node in heals:
        ip("link", "set", f"gph{node}", "up")
    recoveries = []
    for at, kind, node in injected:
        # The first progress line of a resumed group: its step is not above the line before it
        # (the counter went back to the snapshot's); or, when training only stalled, the first
        # line after a pause of over STALL seconds.
        before = [(s, t) for s, t in steps if t < at]
        last, last_t = before[-1] if before else (0, at)
        recovered = None
        for s, t in steps:
            if t < at:
                continue
            if s <= last or t - max(last_t, at) > STALL:
                recovered = t - at
                break
            last, last_t = s, t
        recoveries.append((kind, node, recovered))
    return {"launcher": launcher, "final_step": final, "codes": codes, "work": work,
            "recoveries": recoveries, "ended_early": all(c is not None for c in codes.values())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of training per run")
    ap.add_argument("--gap", type=float, default=100.0, help="seconds between faults")
    ap.add_argument("--partition-for", type=float, default=10.0,
                    help="seconds a partition lasts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--snapshot-every", type=float, default=5.0)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--return-after", type=float, default=20.0)
    ap.add_argument("--only", choices=["ddprun", "torchrun"])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the jobs, as Ctrl-C does
    args.netns = in_namespaces()
    faults = schedule(args.seed, args.duration, args.gap, args.netns)
    print("faults:", ", ".join(f"{k} at {t:.0f} s" for t, k, _ in faults), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "goodput_train.py")
        with open(script, "w") as f:
            f.write(TRAIN)
        launchers = [args.only] if args.only else ["ddprun", "torchrun"]
        results = {}
        for launcher in launchers:
            clean = run(launcher, args, script, [])
            print(f"{launcher} without faults: step {clean['final_step']}", flush=True)
            faulty = run(launcher, args, script, faults)
            print(f"{launcher} with faults: step {faulty['final_step']}, exit codes "
                  f"{faulty['codes']}, work dir {faulty['work']}", flush=True)
            results[launcher] = (clean, faulty)
    rows = []
    for launcher, (clean, faulty) in results.items():
        goodput = faulty["final_step"] / clean["final_step"] if clean["final_step"] else 0.0
        rec = "; ".join(f"{k} n{n}: {'-' if r is None else f'{r:.1f} s'}"
                        for k, n, r in faulty["recoveries"])
        rows.append((launcher, clean["final_step"], faulty["final_step"], goodput,
                     "yes" if faulty["ended_early"] else "no", rec))
    if args.markdown:
        print("| launcher | steps, no faults | steps, faults | goodput | job ended early | recovery per fault |")
        print("|---|---:|---:|---:|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1%} | {r[4]} | {r[5]} |")
    else:
        for r in rows:
            print(f"{r[0]}: goodput {r[3]:.1%} ({r[2]} of {r[1]} steps); ended early: {r[4]}; {r[5]}")


if __name__ == "__main__":
    main()
