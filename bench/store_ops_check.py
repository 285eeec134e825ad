"""Every store operation the workers' torch has, against the store ddprun gives them.

Run as a worker under ddprun (the agent-hosted store is on by default, so torch's own TCPStore
client talks to ddprun's store server):

    ddprun --standalone --nproc_per_node 2 bench/store_ops_check.py [--device cuda]

Each rank joins the process group (Gloo, or NCCL with --device cuda, whose communicator is
bootstrapped through the same store), all-reduces once, then runs each store operation its
torch offers on the store underneath the group's prefix (its own keys, so ranks do not meet):
set, get, add, compare_set, check, wait, delete_key, num_keys, append, multi_set, multi_get,
queue_push, queue_pop, queue_len, list_keys. Each rank prints one JSON line: the torch version,
the store's class and backend, and per operation "ok", "absent" (this torch has no such method)
or the error. The exit status is 1 if any present operation failed or returned a wrong value.
"""
import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d


def underlying(store):
    """The TCPStore under the group's PrefixStore(s)."""
    seen = 0
    while hasattr(store, "underlying_store") and seen < 8:
        store = store.underlying_store
        seen += 1
    return store


def run_ops(store, rank):
    k = f"ddprun_store_ops/{rank}/"
    checks = {
        "set": lambda: store.set(k + "a", b"1") is None,
        "get": lambda: store.get(k + "a") == b"1",
        "add": lambda: store.add(k + "n", 5) == 5 and store.add(k + "n", 2) == 7,
        "compare_set": lambda: store.compare_set(k + "a", b"1", b"2") == b"2",
        "check": lambda: store.check([k + "a"]) and not store.check([k + "missing"]),
        "wait": lambda: store.wait([k + "a"], timedelta(seconds=5)) is None,
        "delete_key": lambda: store.delete_key(k + "a") and not store.delete_key(k + "a"),
        "num_keys": lambda: store.num_keys() >= 1,
        "append": lambda: (store.append(k + "s", b"x"), store.append(k + "s", b"y"),
                           store.get(k + "s"))[-1] == b"xy",
        "multi_set": lambda: store.multi_set([k + "m1", k + "m2"], [b"p", b"q"]) is None,
        "multi_get": lambda: store.multi_get([k + "m1", k + "m2"]) == [b"p", b"q"],
        "queue_push": lambda: (store.queue_push(k + "q", b"first"),
                               store.queue_push(k + "q", b"second"))[0] is None,
        "queue_len": lambda: store.queue_len(k + "q") == 2,
        "queue_pop": lambda: store.queue_pop(k + "q") == b"first",
        "list_keys": lambda: k + "n" in store.list_keys(),
    }
    results = {}
    for name, check in checks.items():
        if not hasattr(store, name):
            results[name] = "absent"
            continue
        try:
            results[name] = "ok" if check() else "wrong value"
        except Exception as e:  # noqa: BLE001 (reported, not hidden)
            results[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.ones(1, device=device)
    dist.all_reduce(total)
    store = underlying(distributed_c10d._get_default_store())
    results = run_ops(store, rank)
    dist.barrier()
    report = {
        "rank": rank,
        "torch": torch.__version__,
        "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        "store": type(store).__name__,
        "libuv": getattr(store, "libuvBackend", None),
        "all_reduce": "ok" if int(total.item()) == dist.get_world_size() else "wrong value",
        "ops": results,
    }
    print(json.dumps(report), flush=True)
    dist.destroy_process_group()
    bad = [n for n, r in results.items() if r not in ("ok", "absent")]
    raise SystemExit(1 if bad or report["all_reduce"] != "ok" else 0)


if __name__ == "__main__":
    main()
