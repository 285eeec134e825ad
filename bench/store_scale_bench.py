#!/usr/bin/python3
"""The agent store at scale: light workers' init_process_group against ddprun's store and torch's.

For each size N, each run starts a fresh server and runs `ddprun-store-bench` (bench/store_bench.cpp)
against it: N light workers, each sending what one rank of `init_process_group(backend,
"env://")` sends to the agent store, 8 ranks per source address (127.1.x.y). Servers, interleaved
run by run:
  ddprun        `ddprun-store-bench --serve --ranks N`: the agent's StoreServer with the agent's
                limits, sized for N workers as the agent sizes it when the round forms
  torch-1.13    torch 1.13's own TCPStore server (`TCPStore(..., is_master=True)` in
                /usr/bin/python3), which speaks only the 1.13 dialect
  before        optional (--before BIN): an earlier ddprun-store-bench's --serve
Clients speak the 1.13 dialect (--dialect legacy: ADD init/, the callback connection, the
exchange, the store-based barrier polled every 10 ms) unless --dialect v2. Where N workers'
connections (two each with the callback connection) would not fit the descriptor limit of one
server process, the callback connection is left out for every server, and the table says so.

Per run: first connect to last rank done, requests per rank, the server's CPU time and peak RSS
(VmHWM) and its RSS before the clients came (idle).

    cmake --build build --target ddprun-store-bench
    /usr/bin/python3 bench/store_scale_bench.py --bench build/bin/ddprun-store-bench \\
        --ranks 1024,4096,16384 --runs 3
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TORCH_SERVER = """
import sys, datetime, torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=900), wait_for_workers=False)
print("port", s.port, flush=True)
sys.stdin.read()
"""

CONNECTIONS_PER_PROCESS = 9000  # light clients per bench process: under the descriptor limit


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB to MiB
    return 0.0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def start_server(kind, bench, before, ranks):
    if kind == "torch-1.13":
        proc = subprocess.Popen(["/usr/bin/python3", "-c", TORCH_SERVER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    else:
        binary = before if kind == "before" else bench
        args = [binary, "--serve"] + ([] if kind == "before" else ["--ranks", str(ranks)])
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    for _ in range(20):  # the port, after any warning the server logs first
        line = proc.stdout.readline().split()
        if len(line) == 2 and line[0] == "port":
            return proc, int(line[1])
        if not line:
            break
    proc.kill()
    raise RuntimeError(f"{kind}: the server printed no port")


def stop_server(proc):
    proc.terminate()
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def run_once(kind, args, ranks, callback):
    proc, port = start_server(kind, args.bench, args.before, ranks)
    try:
        time.sleep(0.5)
        idle = proc_status(proc.pid, "VmRSS")
        cpu_before = cpu_seconds(proc.pid)
        connections = ranks * (2 if callback else 1)
        procs = max(args.procs, -(-connections // CONNECTIONS_PER_PROCESS))
        cmd = [args.bench, "--port", str(port), "--ranks", str(ranks), "--procs", str(procs),
               "--dialect", args.dialect, "--callback", "on" if callback else "off",
               "--exchange", args.exchange, "--timeout", str(args.timeout)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout + 60)
        report = json.loads(out.stdout) if out.stdout.strip() else {}
        report["rc"] = out.returncode
        report["server_cpu_s"] = cpu_seconds(proc.pid) - cpu_before
        report["server_peak_mib"] = proc_status(proc.pid, "VmHWM")
        report["server_idle_mib"] = idle
        report["client_procs"] = procs
        return report
    finally:
        stop_server(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/bin/ddprun-store-bench")
    parser.add_argument("--before", help="an earlier ddprun-store-bench whose --serve to compare")
    parser.add_argument("--servers", default="ddprun,torch-1.13")
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dialect", default="legacy", choices=["legacy", "v2"])
    parser.add_argument("--exchange", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--procs", type=int, default=2, help="client processes, at least")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", help="also write every run's report here")
    args = parser.parse_args()
    servers = args.servers.split(",")
    if args.before:
        servers.append("before")
    if args.dialect == "v2" and "torch-1.13" in servers:
        sys.exit("torch 1.13's server speaks only the 1.13 dialect: drop it from --servers")
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    print(f"bench: {args.bench}; {os.cpu_count()} CPUs; open-file limit {files}; "
          f"{args.runs} runs; dialect {args.dialect}; exchange {args.exchange}")
    print()
    print("| ranks | server | callback conn. | first connect to last rank done, ms: median (min-max)"
          " | requests/rank | server CPU s | server peak RSS MiB | idle MiB | KiB/rank beyond idle"
          " | ranks done | failed runs |")
    print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    everything = []
    for ranks in [int(n) for n in args.ranks.split(",")]:
        # Two connections a worker with the 1.13 callback connection, plus the server's own.
        callback = args.dialect == "legacy" and 2 * ranks + 100 < files
        reports = {kind: [] for kind in servers}
        for _ in range(args.runs):
            for kind in servers:
                report = run_once(kind, args, ranks, callback)
                report.update(server=kind, n=ranks)
                reports[kind].append(report)
                everything.append(report)
                print(f"  {kind} {ranks}: rc {report['rc']}, "
                      f"{report.get('first_connect_to_last_done_ms', 'no')} ms, "
                      f"done {report.get('done', 0)}, errors {report.get('errors', [])[:2]}",
                      file=sys.stderr)
        for kind in servers:
            runs = reports[kind]
            ok = [r for r in runs if r["rc"] == 0]
            wall = [r["first_connect_to_last_done_ms"] for r in ok]
            shown = (f"{statistics.median(wall):.0f} ({min(wall):.0f}-{max(wall):.0f})"
                     if wall else "none finished")
            pick = ok or runs

            def med(key):
                return statistics.median(r.get(key, 0) for r in pick)
            beyond = (med("server_peak_mib") - med("server_idle_mib")) * 1024 / ranks
            print(f"| {ranks} | {kind} | {'yes' if callback else 'no'} | {shown} "
                  f"| {med('requests_per_rank'):.1f} | {med('server_cpu_s'):.2f} "
                  f"| {med('server_peak_mib'):.1f} | {med('server_idle_mib'):.1f} | {beyond:.2f} "
                  f"| {min(r.get('done', 0) for r in runs)} | {len(runs) - len(ok)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
