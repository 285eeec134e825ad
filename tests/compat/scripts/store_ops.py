"""torch's TCPStore clients against a store at 127.0.0.1:PORT that they do not host.

Usage: store_ops.py PORT. Prints one line per check and exits 0 when torch got the answers it
gets from its own server. With USE_LIBUV=0 the clients are made with use_libuv=False, as torch's
own env:// rendezvous makes them then (torch 2.x without libuv, Debian 13's 2.6).
"""
import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

port = int(sys.argv[1])
failures = 0


def expect(ok, what):
    global failures
    print(f"{what}: {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        failures += 1


# torch 1.13's TCPStore has no use_libuv argument: given only when asked for.
LIBUV = {"use_libuv": False} if os.environ.get("USE_LIBUV") == "0" else {}


def client(timeout=20):
    # As workers connect with TORCHELASTIC_USE_AGENT_STORE=True: is_master=False.
    return dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout),
                         wait_for_workers=False, **LIBUV)


store = client()
store.set("k1", "v1")
expect(store.get("k1") == b"v1", "set then get")
store.set("empty", b"")
expect(store.get("empty") == b"", "an empty value")
expect(store.add("cnt", 5) == 5 and store.add("cnt", -2) == 3, "add")
expect(store.get("cnt") == b"3", "add stores decimal text")
expect(store.compare_set("cs", "x", "y") == b"x", "compare_set on a missing key, expecting x")
expect(store.compare_set("cs", "", "y") == b"y", "compare_set creates with an empty expectation")
expect(store.compare_set("cs", "y", "z") == b"z", "compare_set swaps on a match")
expect(store.compare_set("cs", "y", "w") == b"z", "compare_set keeps on a mismatch")
expect(store.num_keys() == 4, f"num_keys counts every key ({store.num_keys()})")
expect(store.delete_key("k1") is True, "delete of a present key")
expect(store.delete_key("k1") is False, "delete of an absent key")

# wait: a second client (its own two connections) sets the key while the first waits.
other = client()
setter = threading.Timer(0.3, lambda: other.set("late", "here"))
setter.start()
store.wait(["late"], timedelta(seconds=20))
setter.join()
expect(store.get("late") == b"here", "wait until another client sets the key")

# A wait that times out raises, and the client's next calls on a fresh store still work.
timed_out = False
short = client(timeout=2)
try:
    short.wait(["never"], timedelta(milliseconds=300))
except RuntimeError:
    timed_out = True
expect(timed_out, "a wait for an absent key times out")

# get blocks until the key exists (torch sends WAIT, then GET).
threading.Timer(0.3, lambda: other.set("slow", "v")).start()
start = time.monotonic()
expect(store.get("slow") == b"v", "get waits for a key set later")

# Keys under the prefix workers use are plain keys to the store.
prefixed = dist.PrefixStore("/worker/attempt_0", store)
prefixed.set("a", "1")
expect(store.get("/worker/attempt_0/a") == b"1", "PrefixStore keys")
sys.exit(1 if failures else 0)
