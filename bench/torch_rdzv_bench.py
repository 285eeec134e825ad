#!/usr/bin/python3
"""The baseline of the rendezvous benchmark: torch's c10d rendezvous (torch 1.13).

N agents are N DynamicRendezvousHandler objects made through torch's rendezvous registry
(backend "c10d", --nnodes N:N), one thread each, in this process. The TCPStore that holds the
rendezvous state runs in a separate process (this script with --serve-store), the way
ddprun-rdzvd does for ddprun-rdzv-bench. As there: N-1 agents call next_rendezvous() at once;
once the shared state lists N-1 participants, the N-th agent calls next_rendezvous(), and the
figure is the time from that call until every agent's call has returned its rank.

With --backend etcd-v2 the handlers are torch's etcd-v2 backend instead (Debian's
python3-etcd, etcd's v2 API), against a three-member etcd that this script starts on 127.0.0.1
with --enable-v2 (50 ms heartbeats, 500 ms elections, as ddprun's etcd benchmark), every handler
talking to the first member.

Prints one JSON object per repetition on stdout. Run with Debian's /usr/bin/python3.

    /usr/bin/python3 bench/torch_rdzv_bench.py --nodes 64 --reps 3
    /usr/bin/python3 bench/torch_rdzv_bench.py --backend etcd-v2 --nodes 8 --reps 3
"""

import argparse
import json
import os
import pickle
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time


def serve_store(port):
    """Hosts the TCPStore on 127.0.0.1:port until stdin closes or SIGTERM arrives."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=300))
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stdin.read()
    del store


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_store():
    """The store process and its port; the caller ends it with stop_store."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-store", str(port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        stop_store(proc)
        raise RuntimeError("the TCPStore process did not start")
    return proc, port


def stop_store(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_etcd_v2(directory):
    """A three-member etcd with the v2 API on 127.0.0.1; its processes and the first client
    port. The caller ends them with stop_etcd."""
    client = [free_port() for _ in range(3)]
    peer = [free_port() for _ in range(3)]
    cluster = ",".join(f"m{i}=http://127.0.0.1:{peer[i]}" for i in range(3))
    procs = []
    for i in range(3):
        url = f"http://127.0.0.1:{client[i]}"
        procs.append(subprocess.Popen(
            ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(directory, f"m{i}"),
             "--enable-v2", "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer[i]}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer[i]}",
             "--initial-cluster", cluster, "--initial-cluster-state", "new",
             "--initial-cluster-token", f"torch-bench-{os.getpid()}",
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    import etcd as python_etcd

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            python_etcd.Client(host="127.0.0.1", port=client[0]).write("/torch-bench-ready", "1")
            return procs, client[0]
        except Exception:  # not up yet: a bounded wait
            time.sleep(0.1)
    stop_etcd(procs)
    raise RuntimeError("etcd (--enable-v2) did not start within 30 s")


def stop_etcd(procs):
    for proc in procs:
        stop_store(proc)


def one_round(n, port, run_id, timeout_s, backend="c10d"):
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import (RendezvousParameters,
                                                      rendezvous_handler_registry)
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import \
        C10dRendezvousBackend

    def params():
        return RendezvousParameters(
            backend=backend, endpoint=f"127.0.0.1:{port}", run_id=run_id, min_nodes=n,
            max_nodes=n, is_host=False, join_timeout=str(int(timeout_s)), read_timeout="300")

    def make_handler():
        return rendezvous_handler_registry.create_handler(params())

    # Handlers (and their store connections) are made before the clock starts, as a torchrun
    # agent makes its handler at start-up.
    setup_started = time.monotonic()
    handlers = [make_handler() for _ in range(n)]
    setup_s = time.monotonic() - setup_started
    results = [None] * n
    lock = threading.Lock()
    finished = threading.Event()
    count = [0]

    def agent(i):
        try:
            _store, rank, world_size = handlers[i].next_rendezvous()
            results[i] = (time.monotonic(), rank, world_size, None)
        except Exception as exc:  # reported as a failed check
            results[i] = (time.monotonic(), None, None, f"{type(exc).__name__}: {exc}")
        with lock:
            count[0] += 1
            if count[0] == n:
                finished.set()

    # Reads the shared state the way every handler does: the participants of the round.
    if backend == "etcd-v2":
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend

        observer, _ = create_backend(params())
    else:
        observer = C10dRendezvousBackend(
            TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300)), run_id)

    def participants():
        got = observer.get_state()
        return 0 if got is None else len(pickle.loads(got[0]).participants)

    out = {"n": n, "backend": backend, "run_id": run_id, "handler_setup_s": setup_s}
    first_join_at = time.monotonic()
    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(n)]
    for t in threads[:-1]:
        t.start()
    deadline = first_join_at + timeout_s
    while (joined := participants()) < n - 1:
        if time.monotonic() > deadline or count[0] > 0:
            out["error"] = (f"the first {n - 1} agents did not all join within {timeout_s} s: "
                            f"{joined} participants after "
                            f"{time.monotonic() - first_join_at:.1f} s")
            return out
        time.sleep(0.005)
    joined_at = time.monotonic()
    last_join_at = time.monotonic()
    threads[-1].start()
    if not finished.wait(timeout=max(1.0, deadline - time.monotonic())):
        out["error"] = f"timed out: {count[0]} of {n} agents got their rank within {timeout_s} s"
        return out
    errors = [r[3] for r in results if r[3]]
    ranks = sorted(r[1] for r in results if r[1] is not None)
    worlds = {r[2] for r in results if r[2] is not None}
    all_ranks_at = max(r[0] for r in results)
    out.update({
        "first_n_minus_1_joined_ms": (joined_at - first_join_at) * 1000,
        "first_join_to_all_ranks_ms": (all_ranks_at - first_join_at) * 1000,
        "last_join_to_first_rank_ms": (min(r[0] for r in results) - last_join_at) * 1000,
        "last_join_to_all_ranks_ms": (all_ranks_at - last_join_at) * 1000,
        "ranks_ok": not errors and ranks == list(range(n)) and worlds == {n},
    })
    if errors:
        out["problems"] = errors[:5]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120,
                    help="give up on a round after this many seconds (default 120)")
    ap.add_argument("--backend", choices=["c10d", "etcd-v2"], default="c10d",
                    help="torch's rendezvous backend (default c10d)")
    ap.add_argument("--serve-store", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_store:
        return serve_store(args.serve_store)

    import torch

    rc = 0
    etcd_dir = tempfile.mkdtemp(prefix="torch-rdzv-bench-") if args.backend == "etcd-v2" else None
    etcd_procs, etcd_port = start_etcd_v2(etcd_dir) if etcd_dir else ([], 0)
    for rep in range(args.reps):
        run_id = f"torch-bench-{os.getpid()}-{rep}"
        if args.backend == "etcd-v2":
            # One etcd for every repetition; each round has its own run id.
            out = one_round(args.nodes, etcd_port, run_id, args.timeout, "etcd-v2")
        else:
            # A fresh store per repetition: its state and connections do not carry over.
            proc, port = start_store()
            try:
                out = one_round(args.nodes, port, run_id, args.timeout)
            finally:
                stop_store(proc)
        out["torch"] = torch.__version__
        print(json.dumps(out), flush=True)
        if "error" in out or not out.get("ranks_ok"):
            rc = 1
            break
    stop_etcd(etcd_procs)
    if etcd_dir:
        shutil.rmtree(etcd_dir, ignore_errors=True)
    # Agent threads (and torch's keep-alive timers) may still run after a failed round.
    sys.stdout.flush()
    os._exit(rc)


if __name__ == "__main__":
    main()
