#!/usr/bin/python3
"""The agent store under two careless or hostile clients, against the store of one or more
builds side by side (tests/helpers/store_server, the agent's StoreServer alone):

- decode: one MULTI_SET of --multiset-mib MiB (2,048 keys, equal values), sent in 64 KiB
  writes; the store's CPU time (user + system, from /proc) until it has applied it (a GET of
  the last key answers);
- watch: --watchers connections register a torch 1.13 watch on one key and never read; then
  two SETs of --value-mib MiB each; the store's VmRSS before and 3 s after.

Usage: store_limits_bench.py BUILD_DIR [BUILD_DIR...]   (each with bin/store_server)
Standard library only; every process is started here and ended by its pid.
"""
import argparse
import os
import socket
import struct
import subprocess
import sys
import time


def u64(n):
    return struct.pack("<Q", n)


def blob(b):
    return u64(len(b)) + b


def start_store(build):
    p = subprocess.Popen([os.path.join(build, "bin", "store_server")], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    line = p.stdout.readline().decode()
    if not line.startswith("port "):
        p.kill()
        raise SystemExit("store_server did not start")
    return p, int(line.split()[1])


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0


def read_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(min(1 << 20, n - len(out)))
        if not chunk:
            raise SystemExit("the store closed the connection")
        out += chunk
    return out


def decode_case(build, mib):
    p, port = start_store(build)
    try:
        keys = 2048
        value = b"v" * (mib * 1024 * 1024 // keys)
        request = bytes([11]) + u64(keys) + b"".join(
            blob(b"/k%d" % i) + blob(value) for i in range(keys))
        s = socket.create_connection(("127.0.0.1", port))
        before = cpu_seconds(p.pid)
        start = time.monotonic()
        for i in range(0, len(request), 65536):
            s.sendall(request[i:i + 65536])
        s.sendall(bytes([2]) + blob(b"/k%d" % (keys - 1)))  # GET: answered once applied
        length = struct.unpack("<Q", read_exact(s, 8))[0]
        read_exact(s, length)
        took = time.monotonic() - start
        cpu = cpu_seconds(p.pid) - before
        s.close()
        return cpu, took
    finally:
        p.kill()
        p.wait()


def watch_case(build, watchers, mib):
    p, port = start_store(build)
    try:
        conns = []
        for _ in range(watchers):
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(bytes([7]) + blob(b"/watched"))
            read_exact(c, 1)
            conns.append(c)
        time.sleep(0.5)
        before = rss_mib(p.pid)
        setter = socket.create_connection(("127.0.0.1", port))
        for _ in range(2):
            setter.sendall(bytes([0]) + blob(b"/watched") + blob(b"x" * (mib << 20)))
        setter.sendall(bytes([6]))  # GETNUMKEYS: answered once both sets are applied
        read_exact(setter, 8)
        time.sleep(3)
        after = rss_mib(p.pid)
        closed = 0
        for c in conns:
            c.setblocking(False)
            try:
                while True:
                    chunk = c.recv(1 << 20)
                    if not chunk:
                        closed += 1
                        break
            except BlockingIOError:
                pass
            c.close()
        setter.close()
        return before, after, closed
    finally:
        p.kill()
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--multiset-mib", type=int, default=128)
    ap.add_argument("--watchers", type=int, default=40)
    ap.add_argument("--value-mib", type=int, default=8)
    a = ap.parse_args()
    print("| build | MULTI_SET of %d MiB: store CPU (s) | wall (s) | %d watchers, 2 SETs of %d MiB: "
          "RSS before (MiB) | 3 s after (MiB) | watchers closed |" % (a.multiset_mib, a.watchers,
                                                                      a.value_mib))
    print("|---|---:|---:|---:|---:|---:|")
    for build in a.builds:
        cpu, took = decode_case(build, a.multiset_mib)
        before, after, closed = watch_case(build, a.watchers, a.value_mib)
        print("| %s | %.2f | %.2f | %.1f | %.1f | %d |" % (build, cpu, took, before, after, closed),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
