#!/usr/bin/python3
"""A hostile peer for bench/rdzv_attack_bench.py: the attack mix of issue 10 at a fixed rate.

Against a ddprun-rdzvd on HOST:PORT (no shared secret), for --duration seconds, one thread
starts, every second, the number of each attack that --rate gives (spread evenly over the
second):

  crash_number   a hello whose protocol is 1e400 (ended the daemon with exit 70 before the fix)
  crash_nested   a hello whose protocol is 100,000 nested arrays, about 200 KB (SIGSEGV before)
  stall2         a connection that sends 2 bytes of a frame header and then nothing
  partial1m      a connection that announces a 1 MiB body, sends all of it but 16 bytes, and
                 holds it
  new_job        hello and a join for a new rdzv_id (join timeout 24 h), then close: each one
                 is a job the daemon keeps until its job cap refuses more
  garbage        random bytes, or an HTTP request
  status         hello and a status query for every job; the reply (a page of about 256 KiB)
                 is read, then the connection closes
  status_unread  hello and 20 status queries in one write, and no reply is read: the daemon
                 must queue the replies (20 pages of about 256 KiB) until --hold ends

Connections the server should close (stall2, partial1m, crash frames) are held open until the
server closes them or --hold seconds pass, whichever is first; at most --max-open at once (an
attack that would go over is counted as skipped). At --duration every connection still open is
closed ("closed_here", as is a status or new_job connection once its reply is read) and the
script exits.
Prints one JSON object with the counts: started, closed by the server, replies, refusals.
Standard library only.
"""
import argparse
import errno
import json
import os
import random
import resource
import selectors
import socket
import struct
import sys
import time

KINDS = ["crash_number", "crash_nested", "stall2", "partial1m", "new_job", "garbage", "status",
         "status_unread"]
DEFAULT_RATE = ("crash_number=10,crash_nested=2,stall2=20,partial1m=10,new_job=50,garbage=10,"
                "status=5,status_unread=0.2")
UNREAD_QUERIES = 20
MIB = 1 << 20


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def hello() -> bytes:
    return frame(json.dumps({"type": "hello", "protocol": 1, "role": "agent",
                             "nonce": os.urandom(32).hex()}).encode())


def join(run_id: str) -> bytes:
    settings = {"min_nodes": 2, "max_nodes": 2, "nproc_per_node": 1, "max_restarts": 0,
                "join_timeout_ms": 24 * 3600 * 1000, "last_call_timeout_ms": 30000,
                "close_timeout_ms": 24 * 3600 * 1000, "keep_alive_interval_ms": 5000,
                "keep_alive_max_attempt": 3}
    return frame(json.dumps({"type": "join", "run_id": run_id, "node_id": run_id + ":1:x",
                             "name": "squatter", "addr": "127.0.0.1", "master_port": 1,
                             "node_rank": None, "settings": settings,
                             "restart_count": 0}).encode())


NESTED = b'{"type":"hello","protocol":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
PAYLOADS = {
    "crash_number": frame(b'{"type":"hello","protocol":1e400}'),
    "crash_nested": frame(NESTED),
    "stall2": b"\x00\x00",
    # The header announces MIB - 8 bytes; all but the last 16 arrive.
    "partial1m": struct.pack(">I", MIB - 8) + b"x" * (MIB - 8 - 16),
    "status": hello() + frame(b'{"type":"status","run_id":null}'),
    "status_unread": hello() + frame(b'{"type":"status","run_id":null}') * UNREAD_QUERIES,
}
HTTP = b"GET / HTTP/1.1\r\nHost: rdzv\r\nUser-Agent: curl/7.88\r\nAccept: */*\r\n\r\n"


class Conn:
    def __init__(self, kind, sock, payload, deadline):
        self.kind, self.sock, self.out, self.deadline = kind, sock, payload, deadline
        self.inbuf = b""
        self.frames = []
        self.registered = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of attack")
    ap.add_argument("--rate", default=DEFAULT_RATE,
                    help="attacks per second by kind, e.g. " + DEFAULT_RATE)
    ap.add_argument("--hold", type=float, default=15.0,
                    help="seconds a connection is held at most (default 15)")
    ap.add_argument("--max-open", type=int, default=2000, help="connections open at once, at most")
    ap.add_argument("--run-prefix", default="squat-%d" % os.getpid())
    a = ap.parse_args()
    rates = {k: 0.0 for k in KINDS}
    for item in a.rate.split(","):
        if item:
            k, v = item.split("=")
            if k not in rates:
                sys.exit("rdzv_attacker.py: unknown attack %r (known: %s)" % (k, ", ".join(KINDS)))
            rates[k] = float(v)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    stats = {k: {"started": 0, "closed_by_server": 0, "closed_here": 0, "connect_failed": 0,
                 "skipped": 0, "replies": 0, "refused": 0} for k in KINDS}
    refusal_samples = {}
    sel = selectors.DefaultSelector()
    conns = {}
    max_open = 0
    jobs_made = 0
    rng = random.Random(1)
    start = time.monotonic()
    end_attack = start + a.duration
    # Each kind fires at start + (i + 0.5) / rate: evenly spread, a fixed count per second.
    fired = {k: 0 for k in KINDS}

    def close(c, by_server):
        del conns[id(c.sock)]
        if c.registered:
            sel.unregister(c.sock)
        c.sock.close()
        s = stats[c.kind]
        if by_server:
            s["closed_by_server"] += 1
        else:
            s["closed_here"] += 1

    def launch(kind, now):
        nonlocal max_open, jobs_made
        if len(conns) >= a.max_open:
            stats[kind]["skipped"] += 1
            return
        if kind == "new_job":
            jobs_made += 1
            payload = hello() + join("%s-%d" % (a.run_prefix, jobs_made))
        elif kind == "garbage":
            payload = HTTP if rng.random() < 0.5 else bytes(rng.getrandbits(8) for _ in range(64))
        else:
            payload = PAYLOADS[kind]
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect((a.host, a.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            stats[kind]["connect_failed"] += 1
            return
        c = Conn(kind, s, payload, now + a.hold)
        conns[id(s)] = c
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
        stats[kind]["started"] += 1
        max_open = max(max_open, len(conns))

    def on_frames(c):
        while len(c.inbuf) >= 4:
            n = struct.unpack(">I", c.inbuf[:4])[0]
            if len(c.inbuf) < 4 + n:
                return
            body = c.inbuf[4:4 + n]
            c.inbuf = c.inbuf[4 + n:]
            try:
                msg = json.loads(body)
            except ValueError:
                msg = {}
            t = msg.get("type")
            if t == "refused":
                stats[c.kind]["refused"] += 1
                refusal_samples.setdefault(c.kind, msg.get("message", "")[:160])
            elif t == "status_reply" or t == "waiting":
                stats[c.kind]["replies"] += 1
            c.frames.append(t)

    while True:
        now = time.monotonic()
        if now < end_attack:
            elapsed = now - start
            for k in KINDS:
                while rates[k] > 0 and (fired[k] + 0.5) / rates[k] <= elapsed:
                    fired[k] += 1
                    launch(k, now)
        else:
            break  # the attack is over: what is still open is closed below
        for key, events in sel.select(timeout=0.005):
            c = key.data
            if id(c.sock) not in conns:
                continue
            if events & selectors.EVENT_WRITE and c.out:
                try:
                    sent = c.sock.send(c.out)
                    c.out = c.out[sent:]
                except BlockingIOError:
                    pass
                except OSError:
                    close(c, True)
                    continue
                if not c.out:
                    if c.kind == "status_unread":
                        # Never read the replies: they pile up at the server until --hold.
                        sel.unregister(c.sock)
                        c.registered = False
                        continue
                    sel.modify(c.sock, selectors.EVENT_READ, c)
            if events & selectors.EVENT_READ:
                try:
                    data = c.sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    close(c, True)
                    continue
                if not data:
                    close(c, True)
                    continue
                c.inbuf += data
                on_frames(c)
                # A status reply or a job's Waiting: done, close from this side.
                if c.kind == "status" and "status_reply" in c.frames:
                    close(c, False)
                elif c.kind == "new_job" and ("waiting" in c.frames or "refused" in c.frames):
                    close(c, False)
        now = time.monotonic()
        for c in [c for c in conns.values() if now >= c.deadline]:
            close(c, False)
    for c in list(conns.values()):
        close(c, False)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"duration_s": a.duration, "rates_per_s": rates, "hold_s": a.hold,
                      "max_open": max_open, "jobs_attempted": jobs_made,
                      "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                      "stats": stats, "refusal_samples": refusal_samples}))


if __name__ == "__main__":
    main()
