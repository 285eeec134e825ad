#!/usr/bin/python3
"""Rendezvous under load and attack: one ddprun-rdzvd serving --jobs jobs of --nodes light
agents each (ddprun-rdzv-bench --mode jobs), alone and with bench/rdzv_attacker.py at a fixed
rate, interleaved for --repeats repeats; round latency, rounds per second and the daemon's RSS
side by side (bench/README.md, docs/benchmarks.md#rendezvous-under-attack).

Each run starts a fresh daemon, pinned with taskset to --daemon-cpu, with the limits stated
by --daemon-flags. The benchmark client (and, in an attack run, the attacker) runs pinned to
--client-cpu. The attacker starts once every job's round 0 has formed, so the legitimate jobs
exist before it fills the job cap; the benchmark's warm-up (longer than the daemon's stalled
frame timeout with the short timeouts of a trial) lets the attack settle before the measurement window. The
daemon's VmRSS is sampled from /proc every 100 ms; VmHWM is read at the end.

With --refused-hellos N it measures a flood instead: a daemon with a shared secret (and, with
--hosting-agent, an agent hosting the rendezvous for a one-node job) gets N connections that
each send a hello without the secret, read the refusal and close, from --flood-threads threads;
the process's VmRSS before, the peak during (100 ms samples) and 5 s after, side by side for
each process flooded (docs/benchmarks.md#a-flood-of-refused-connections).

Standard library only. Every process is started by this script and ended by its pid.
"""
import argparse
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DAEMON_FLAGS = ("--hello_timeout 10 --stalled_frame_timeout 30 "
                        "--max_buffered_bytes 33554432 --max_jobs 2000")
started = []  # every Popen this script made, ended by pid in cleanup()


def cleanup():
    for p in started:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def proc_status(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0])  # kB
    except OSError:
        pass
    return out


def cpu_seconds(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        return float("nan")


def popen(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    started.append(p)
    return p


def one_run(a, attack, log_dir, index):
    port = free_port()
    daemon_log = open(os.path.join(log_dir, "daemon-%02d-%s.log" % (index, "attack" if attack else "base")), "w")
    daemon = popen(["taskset", "-c", a.daemon_cpu, a.rdzvd, "--host", "127.0.0.1", "--port",
                    str(port)] + shlex.split(a.daemon_flags),
                   stdout=daemon_log, stderr=subprocess.STDOUT)
    wait_listening(port, daemon, "the daemon (see %s)" % daemon_log.name)
    rss = {"base_kb": proc_status(daemon.pid).get("VmRSS", 0), "peak_kb": 0}
    stop_sampling = threading.Event()

    def sample():
        while not stop_sampling.is_set():
            rss["peak_kb"] = max(rss["peak_kb"], proc_status(daemon.pid).get("VmRSS", 0))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = os.getloadavg()
    bench_argv = ["taskset", "-c", a.client_cpu, a.bench, "--mode", "jobs", "--port", str(port),
                  "--jobs", str(a.jobs), "--nodes", str(a.nodes), "--duration", str(a.duration),
                  "--warmup", str(a.warmup), "--round-gap-ms", str(a.round_gap_ms),
                  "--run-id", "bench-%d-%d" % (os.getpid(), index)]
    # Output to files: the clients log a warning line for every connection the server closes,
    # and a pipe nobody reads would block them (and stop their heartbeats).
    tag = "%02d-%s" % (index, "attack" if attack else "base")
    bench_out_path = os.path.join(log_dir, "bench-%s.out" % tag)
    bench_err_path = os.path.join(log_dir, "bench-%s.err" % tag)
    with open(bench_out_path, "w") as bo, open(bench_err_path, "w") as be:
        bench = popen(bench_argv, stdout=bo, stderr=be)
    attacker = None
    cpu0 = None
    # Round 0 formed: start the attacker (attack runs) and the daemon's CPU clock.
    while bench.poll() is None:
        with open(bench_err_path) as f:
            if "round 0 formed" in f.read():
                cpu0 = cpu_seconds(daemon.pid)
                if attack:
                    attacker = popen(["taskset", "-c", a.client_cpu, sys.executable,
                                      os.path.join(ROOT, "bench", "rdzv_attacker.py"), "--port",
                                      str(port), "--duration", str(a.warmup + a.duration + 2),
                                      "--rate", a.rate, "--hold", str(a.hold)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                break
        time.sleep(0.02)
    bench.wait()
    with open(bench_out_path) as f:
        out = f.read()
    with open(bench_err_path) as f:
        rest_err = f.read()
    cpu1 = cpu_seconds(daemon.pid)
    attack_out = None
    if attacker:
        attacker_stdout, attacker_err = attacker.communicate(timeout=a.hold + a.duration + 60)
        if attacker.returncode != 0:
            sys.stderr.write("attacker failed: %s\n" % attacker_err[-2000:])
        attack_out = json.loads(attacker_stdout) if attacker_stdout.strip() else None
    time.sleep(0.5)
    stop_sampling.set()
    sampler.join()
    status = proc_status(daemon.pid)
    alive = daemon.poll() is None
    if alive:
        os.kill(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.wait()
    daemon_log.close()
    with open(daemon_log.name) as f:
        log = f.read()
    stalls = [int(x) for x in re.findall(r"did not run for (\d+) ms", log)]
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit("rdzv_attack_bench.py: no JSON from the benchmark (exit %s): %s %s"
                         % (bench.returncode, out[-2000:], rest_err[-2000:]))
    result.update({"attack": attack, "exit": bench.returncode, "load_before": load,
                   "daemon_alive_at_end": alive, "daemon_rss_start_kb": rss["base_kb"],
                   "daemon_rss_peak_kb": max(rss["peak_kb"], status.get("VmRSS", 0)),
                   "daemon_rss_end_kb": status.get("VmRSS", 0),
                   "daemon_hwm_kb": status.get("VmHWM", 0),
                   "daemon_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None else None,
                   "daemon_stall_warnings": len(stalls), "daemon_longest_stall_ms": max(stalls, default=0),
                   "daemon_log_lines": log.count("\n"),
                   "client_connections_lost": out.count("lost the rendezvous server"),
                   "attacker": attack_out, "argv": bench_argv})
    return result


def med(runs, key):
    vals = [key(r) for r in runs]
    return statistics.median(vals), min(vals), max(vals)


def wait_listening(port, proc, what):
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("rdzv_attack_bench.py: %s did not start" % what)
            time.sleep(0.05)


def refused_hellos(port, count):
    """`count` connections: a framed hello without the secret, the reply read (a refusal, or
    the server's hello when it has no secret), close (reset, so no TIME_WAIT is left on the
    client's side). Returns how many were answered as expected."""
    hello = json.dumps({"type": "hello", "protocol": 1, "role": "agent"}).encode()
    frame = len(hello).to_bytes(4, "big") + hello
    refused = 0
    for _ in range(count):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                s.sendall(frame)
                reply = b""
                while b'"refused"' not in reply and b'"server"' not in reply:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
                refused += b'"refused"' in reply or b'"server"' in reply
        except OSError:
            pass
    return refused


def flood_run(a, target):
    """One flood against a fresh daemon or hosting agent: RSS before, peak and after (kB)."""
    log_dir = os.path.join("/tmp", "rdzv_attack_bench-%d" % os.getpid())
    os.makedirs(log_dir, exist_ok=True)
    secret = os.path.join(log_dir, "secret")
    with open(secret, "w") as f:
        f.write("flood-bench-secret-0123456789\n")
    os.chmod(secret, 0o600)
    port = free_port()
    log = open(os.path.join(log_dir, "%s.log" % target), "w")
    secret_flags = [] if a.no_secret else ["--secret_file", secret]
    if target == "daemon":
        proc = popen(["taskset", "-c", a.daemon_cpu, a.rdzvd, "--host", "127.0.0.1", "--port",
                      str(port)] + secret_flags, stdout=log, stderr=subprocess.STDOUT)
    else:
        env = dict(os.environ)
        if not a.no_secret:
            env["DDPRUN_RDZV_SECRET_FILE"] = secret
        proc = popen(["taskset", "-c", a.daemon_cpu, os.path.join(a.build, "bin", "ddprun"),
                      "--nnodes", "1", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                      "--rdzv_endpoint", "127.0.0.1:%d" % port, "--rdzv_id", "flood",
                      "--no_python", "sleep", "3600"], stdout=log, stderr=subprocess.STDOUT,
                     env=env)
    wait_listening(port, proc, target)
    time.sleep(1)
    before = proc_status(proc.pid).get("VmRSS", 0)
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc_status(proc.pid).get("VmRSS", 0))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    per_thread = a.refused_hellos // a.flood_threads
    counts = [0] * a.flood_threads
    started_at = time.monotonic()

    def flood(i):
        counts[i] = refused_hellos(port, per_thread)

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(a.flood_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started_at
    time.sleep(5)
    stop.set()
    sampler.join()
    after = proc_status(proc.pid).get("VmRSS", 0)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    return {"target": target, "hellos": per_thread * a.flood_threads, "refused": sum(counts),
            "seconds": took, "rss_before_kb": before, "rss_peak_kb": peak[0],
            "rss_after_kb": after, "alive": alive}


def flood_main(a):
    results = []
    try:
        for target in ["daemon"] + (["hosting agent"] if a.hosting_agent else []):
            results.append(flood_run(a, target.replace(" ", "-")))
    finally:
        cleanup()
    print("%d hellos %s (%d threads), one connection each; VmRSS in MiB" %
          (a.refused_hellos, "answered (no secret)" if a.no_secret else "refused (no secret sent)",
           a.flood_threads))
    print("| process | refused | flood (s) | RSS before | peak during | 5 s after |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print("| %s | %d of %d | %.1f | %.1f | %.1f | %.1f |" % (
            r["target"], r["refused"], r["hellos"], r["seconds"], r["rss_before_kb"] / 1024,
            r["rss_peak_kb"] / 1024, r["rss_after_kb"] / 1024))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["alive"] and r["refused"] == r["hellos"] for r in results) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--duration", type=float, default=20, help="measurement window, s")
    ap.add_argument("--warmup", type=float, default=6, help="unmeasured rounds first, s")
    ap.add_argument("--round-gap-ms", type=float, default=0,
                    help="pause of each job between rounds (0: back to back)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", default=None, help="the attacker's --rate (default: its own)")
    ap.add_argument("--hold", type=float, default=15, help="the attacker's --hold")
    ap.add_argument("--daemon-flags", default=DEFAULT_DAEMON_FLAGS)
    ap.add_argument("--daemon-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--json-out", help="write every run's JSON here")
    ap.add_argument("--refused-hellos", type=int, default=0,
                    help="measure a flood of this many refused hellos instead (see above)")
    ap.add_argument("--flood-threads", type=int, default=4)
    ap.add_argument("--hosting-agent", action="store_true",
                    help="with --refused-hellos: flood an agent hosting the rendezvous too")
    ap.add_argument("--no-secret", action="store_true",
                    help="with --refused-hellos: no secret anywhere, so each hello is answered")
    a = ap.parse_args()
    a.bench = os.path.join(a.build, "bin", "ddprun-rdzv-bench")
    a.rdzvd = os.path.join(a.build, "bin", "ddprun-rdzvd")
    if a.refused_hellos:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        return flood_main(a)
    if a.rate is None:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import rdzv_attacker
        a.rate = rdzv_attacker.DEFAULT_RATE
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = os.path.join("/tmp", "rdzv_attack_bench-%d" % os.getpid())
    os.makedirs(log_dir, exist_ok=True)
    runs = []
    try:
        for r in range(a.repeats):
            # Interleaved, the order alternating per repeat.
            for attack in ([False, True] if r % 2 == 0 else [True, False]):
                res = one_run(a, attack, log_dir, len(runs))
                runs.append(res)
                if "error" in res:
                    print("repeat %d %s: FAILED: %s %s" % (r, "attack" if attack else "no attack",
                                                          res["error"], res.get("problems", "")[:3]),
                          file=sys.stderr, flush=True)
                    continue
                lj = res["last_join_to_all_ranks_ms"]
                print("repeat %d %-9s median %.1f ms p99 %.1f ms rounds/s %.0f rss peak %.1f MiB "
                      "errors %s load %.2f" % (r, "attack" if attack else "no attack", lj["median"],
                                               lj["p99"], res["rounds_per_s"],
                                               res["daemon_rss_peak_kb"] / 1024, res["errors"],
                                               res["load_before"][0]), file=sys.stderr, flush=True)
    finally:
        cleanup()
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(runs, f, indent=1)
    failed = [r for r in runs if "error" in r]
    base = [r for r in runs if not r["attack"] and "error" not in r]
    att = [r for r in runs if r["attack"] and "error" not in r]
    rows = [
        ("round latency, last join to all ranks, median (ms)",
         lambda r: r["last_join_to_all_ranks_ms"]["median"]),
        ("round latency, last join to all ranks, p99 (ms)",
         lambda r: r["last_join_to_all_ranks_ms"]["p99"]),
        ("failure report to all ranks, median (ms)", lambda r: r["failure_to_all_ranks_ms"]["median"]),
        ("failure report to all ranks, p99 (ms)", lambda r: r["failure_to_all_ranks_ms"]["p99"]),
        ("rounds per second", lambda r: r["rounds_per_s"]),
        ("daemon RSS at start (MiB)", lambda r: r["daemon_rss_start_kb"] / 1024),
        ("daemon RSS, peak of 100 ms samples (MiB)", lambda r: r["daemon_rss_peak_kb"] / 1024),
        ("daemon VmHWM at end (MiB)", lambda r: r["daemon_hwm_kb"] / 1024),
        ("daemon RSS at end (MiB)", lambda r: r["daemon_rss_end_kb"] / 1024),
        ("daemon CPU from round 0 to the end (s)", lambda r: r["daemon_cpu_s"]),
        ("client errors", lambda r: r["errors"]),
        ("daemon \"did not run for N ms\" warnings", lambda r: r["daemon_stall_warnings"]),
        ("client connections the server closed (clients' \"lost the rendezvous server\")",
         lambda r: r["client_connections_lost"]),
    ]
    print("%d jobs x %d nodes, window %g s after %g s warm-up, round gap %g ms, %d repeats "
          "interleaved; daemon on CPU %s, client and attacker on CPU %s" %
          (a.jobs, a.nodes, a.duration, a.warmup, a.round_gap_ms, a.repeats, a.daemon_cpu,
           a.client_cpu))
    print("daemon flags: %s; attack rate per s: %s; hold %g s" % (a.daemon_flags, a.rate, a.hold))
    print("load average before each run: %s" % ", ".join("%.2f" % r["load_before"][0] for r in runs))
    print()
    print("| metric | no attack: median (min-max) | under attack: median (min-max) | ratio of medians |")
    print("|---|---|---|---|")
    for name, key in rows:
        b, bl, bh = med(base, key)
        t, tl, th = med(att, key)
        ratio = "%.2f" % (t / b) if b else "-"
        print("| %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %s |" % (name, b, bl, bh, t, tl, th, ratio))
    print()
    print("daemon alive at the end of every run: %s" % all(r["daemon_alive_at_end"] for r in runs))
    print("runs that failed before the window (not in the table): %d%s" % (
        len(failed), "".join("\n- %s: %s" % ("attack" if r["attack"] else "no attack", r["error"])
                             for r in failed)))
    for r in att:
        s = r["attacker"]
        if not s:
            continue
        print("attacker: max open %d, cpu %.1f s, %s" % (
            s["max_open"], s["cpu_s"], "; ".join(
                "%s %d started/%d closed by server/%d replies/%d refused" % (
                    k, v["started"], v["closed_by_server"], v["replies"], v["refused"])
                for k, v in s["stats"].items())))
    print("logs: %s" % log_dir)


if __name__ == "__main__":
    sys.exit(main())
