#!/usr/bin/python3
"""Rendezvous latency of ddprun against torch's c10d rendezvous, and node-loss reaction.

For each N, runs ddprun-rdzv-bench (N light agents in one process against a ddprun-rdzvd
started here on a loopback port) and bench/torch_rdzv_bench.py (N torch c10d handlers against
a TCPStore process) several times, and prints the medians side by side with their ratio.
torch stops at the first N where a round fails or takes longer than --torch-limit seconds.
Then runs ddprun-rdzv-bench --mode loss (SIGKILL and SIGSTOP of one agent of three).

    /usr/bin/python3 bench/rdzv_bench.py --build /tmp/bench-build --markdown

Every daemon and child started here is ended by pid, also on failure or Ctrl-C.
"""

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import threading
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
started = []  # processes to end on the way out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Daemon:
    """ddprun-rdzvd on 127.0.0.1 and a free port, for one `with` block."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [self.path, "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            started.append(self.proc)
            line = self.proc.stderr.readline()
            if "listening" in line:
                # Keep reading the daemon's log so a full pipe can never block it.
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()
                return self
            stop(self.proc)
        raise RuntimeError(f"{self.path} did not start: {line.strip()}")

    def __exit__(self, *exc):
        stop(self.proc)


def run_json(cmd, timeout):
    """Runs cmd, returns the JSON objects it printed (one a line) and its exit status."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    started.append(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return [{"error": f"killed after {timeout} s"}], -9
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows, proc.returncode


def med(values):
    return statistics.median(values) if values else float("nan")


def span(values, digits=1):
    if not values:
        return "-"
    return (f"{med(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})")


def load():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build directory holding bin/ddprun-rdzvd and bin/ddprun-rdzv-bench")
    ap.add_argument("--nodes", default="8,64,512,1024", help="comma-separated N")
    ap.add_argument("--reps", type=int, default=7, help="ddprun rounds per N (default 7)")
    ap.add_argument("--torch-reps", type=int, default=3, help="torch rounds per N (default 3)")
    ap.add_argument("--torch-limit", type=float, default=60,
                    help="stop torch at the first N whose round takes longer (default 60 s)")
    ap.add_argument("--loss-reps", type=int, default=5, help="node-loss runs per signal")
    ap.add_argument("--keep-alive-interval", type=float, default=0.5)
    ap.add_argument("--keep-alive-max-attempt", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print tables for the docs")
    args = ap.parse_args()

    rdzvd = os.path.join(args.build, "bin", "ddprun-rdzvd")
    bench = os.path.join(args.build, "bin", "ddprun-rdzv-bench")
    torch_bench = os.path.join(REPO, "bench", "torch_rdzv_bench.py")
    nodes = [int(n) for n in args.nodes.split(",")]
    load_before = load()
    t0 = time.monotonic()
    results = {}  # n -> {"ddprun": [rows], "torch": [rows] or None, "torch_note": str}
    torch_stopped = "not run (--no-torch)" if args.no_torch else None

    for n in nodes:
        entry = results.setdefault(n, {"ddprun": [], "torch": [], "torch_note": ""})
        with Daemon(rdzvd) as d:
            for rep in range(args.reps):
                rows, rc = run_json([bench, "--port", str(d.port), "--nodes", str(n),
                                     "--run-id", f"bench-{n}-{rep}", "--timeout", "120"], 200)
                row = rows[0] if rows else {"error": f"exit {rc}, no output"}
                if rc != 0 or "error" in row or not row.get("ranks_ok"):
                    raise SystemExit(f"ddprun-rdzv-bench failed at N={n}: {json.dumps(row)}")
                entry["ddprun"].append(row)
                print(f"# ddprun N={n} rep {rep}: {row['last_join_to_all_ranks_ms']:.1f} ms",
                      file=sys.stderr)
        if torch_stopped:
            entry["torch_note"] = torch_stopped
            continue
        rows, rc = run_json(["/usr/bin/python3", torch_bench, "--nodes", str(n), "--reps",
                             str(args.torch_reps), "--timeout", str(2 * args.torch_limit)],
                            args.torch_reps * (2 * args.torch_limit + 30))
        good = [r for r in rows if "error" not in r and r.get("ranks_ok")]
        entry["torch"] = good
        for r in rows:
            print(f"# torch N={n}: {json.dumps(r)}", file=sys.stderr)
        bad = [r for r in rows if r not in good]
        if bad or rc != 0 or len(good) < args.torch_reps:
            why = bad[0].get("error", bad[0].get("problems")) if bad else f"exit {rc}"
            entry["torch_note"] = f"failed: {why}"
            torch_stopped = f"not run (failed at N={n})"
        elif max(r["last_join_to_all_ranks_ms"] for r in good) > args.torch_limit * 1000:
            torch_stopped = f"not run (N={n} took over {args.torch_limit:.0f} s)"

    loss = {}
    for victim in ("kill", "stop"):
        loss[victim] = []
        with Daemon(rdzvd) as d:
            for rep in range(args.loss_reps):
                rows, rc = run_json([bench, "--mode", "loss", "--port", str(d.port),
                                     "--nodes", "3", "--min", "2", "--victim", victim,
                                     "--run-id", f"loss-{victim}-{rep}",
                                     "--keep-alive-interval", str(args.keep_alive_interval),
                                     "--keep-alive-max-attempt",
                                     str(args.keep_alive_max_attempt), "--timeout", "30"], 60)
                row = rows[0] if rows else {"error": f"exit {rc}, no output"}
                if rc != 0 or "error" in row:
                    raise SystemExit(f"ddprun-rdzv-bench --mode loss failed: {json.dumps(row)}")
                loss[victim].append(row)
    elapsed = time.monotonic() - t0
    report(args, nodes, results, loss, load_before, load(), elapsed)


def report(args, nodes, results, loss, load_before, load_after, elapsed):
    cmd = "/usr/bin/python3 bench/rdzv_bench.py " + " ".join(sys.argv[1:])
    commit = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Measured {datetime.date.today().isoformat()} with `{cmd}`.")
    print()
    print("Rendezvous latency: from the last agent's join to every agent holding its group "
          "rank, ms, median (min-max).")
    print()
    print("| N | ddprun runs | ddprun last join -> all ranks | torch runs | torch last join -> "
          "all ranks | ratio torch / ddprun | ddprun frames received per round (per agent) |"
          " ddprun first join -> all ranks | torch first join -> all ranks |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in nodes:
        e = results[n]
        d = [r["last_join_to_all_ranks_ms"] for r in e["ddprun"]]
        df = [r["first_join_to_all_ranks_ms"] for r in e["ddprun"]]
        frames = [r["frames_received"] for r in e["ddprun"]]
        t = [r["last_join_to_all_ranks_ms"] for r in e["torch"]]
        tf = [r["first_join_to_all_ranks_ms"] for r in e["torch"]]
        ratio = f"**{med(t) / med(d):.0f}x**" if t else "-"
        tcell = span(t) if t else e["torch_note"] or "-"
        print(f"| {n} | {len(d)} | {span(d)} | {len(t)} | {tcell} | {ratio} | "
              f"{med(frames):.0f} ({med(frames) / n:.2f}) | {span(df)} | "
              f"{span(tf) if tf else '-'} |")
    print()
    window = args.keep_alive_interval * args.keep_alive_max_attempt * 1000
    print(f"Node loss: 3 agents, --nnodes 2:3, keep_alive_interval {args.keep_alive_interval} s x "
          f"keep_alive_max_attempt {args.keep_alive_max_attempt} = {window:.0f} ms. Time from "
          "the signal to the one agent's process to both survivors holding the Restart, ms.")
    print()
    print("| signal to the agent | runs | signal -> all survivors told, median (min-max) | "
          "keep-alive window | reason the survivors were given |")
    print("|---|---:|---:|---:|---|")
    for victim, label in (("kill", "SIGKILL (kernel closes its socket)"),
                          ("stop", "SIGSTOP (socket stays open, heartbeats stop)")):
        rows = loss[victim]
        v = [r["signal_to_all_restarts_ms"] for r in rows]
        print(f"| {label} | {len(v)} | {span(v)} | {window:.0f} ms | {rows[0]['reason']} |")
    print()
    print("Notes:")
    print()
    print(f"- ddprun: {args.reps} rounds per N, each with its own run id, against one "
          f"ddprun-rdzvd per N; torch: {args.torch_reps} rounds per N, a fresh TCPStore process "
          f"each; torch stops at the first N whose round fails or takes over "
          f"{args.torch_limit:.0f} s. The whole run took {elapsed:.0f} s.")
    print(f"- Machine: {os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}, Python "
          f"{platform.python_version()}; repository at {commit}. Load average (1 min) "
          f"{load_before:.2f} before, {load_after:.2f} after.")


def on_signal(sig, _frame):
    raise SystemExit(128 + sig)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    try:
        main()
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
