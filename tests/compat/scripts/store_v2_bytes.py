"""The torch 2.x store dialect as byte sequences (no 2.x torch installs here), against a store at
127.0.0.1:PORT, with a 1.13-dialect connection on the same port sharing its keys.

Usage: store_v2_bytes.py PORT. Prints one line per check; exits 0 when all pass.
"""
import socket
import struct
import sys
import time

port = int(sys.argv[1])
failures = 0


def expect(ok, what):
    global failures
    print(f"{what}: {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        failures += 1


def s(data):
    if isinstance(data, str):
        data = data.encode()
    return struct.pack("<Q", len(data)) + data


def i64(n):
    return struct.pack("<q", n)


def connect():
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def recv_exact(c, n):
    out = b""
    while len(out) < n:
        chunk = c.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def recv_bytes(c):
    (n,) = struct.unpack("<Q", recv_exact(c, 8))
    return recv_exact(c, n)


def closed_by_server(c):
    c.settimeout(10)
    try:
        return c.recv(1) == b""
    except ConnectionResetError:
        return True


VALIDATE = bytes.fromhex("00 CEF7853C")

a = connect()
# VALIDATE gets no reply; PING echoes its nonce (sent in two segments, as clients split writes).
a.sendall(VALIDATE + bytes.fromhex("0D"))
time.sleep(0.05)
a.sendall(bytes.fromhex("2A000000"))
expect(recv_exact(a, 4) == bytes.fromhex("2A000000"), "validate then ping")
a.sendall(b"\x04" + s("init/") + i64(1))
expect(struct.unpack("<q", recv_exact(a, 8))[0] == 1, "ADD init/")
a.sendall(b"\x01" + s("/shared") + s("from-v2"))
a.sendall(b"\x06" + struct.pack("<Q", 1) + s("/shared") + b"\x03" + s("/shared"))
expect(recv_exact(a, 1) == b"\x00" and recv_bytes(a) == b"from-v2", "SET, WAIT, GET")
a.sendall(b"\x05" + struct.pack("<Q", 2) + s("/shared") + s("/nope"))
expect(recv_exact(a, 1) == b"\x01", "CHECK with a missing key")
a.sendall(b"\x0b" + struct.pack("<Q", 2) + s("/m1") + s("1") + s("/m2") + s("22"))
a.sendall(b"\x0a" + struct.pack("<Q", 2) + s("/m1") + s("/m2"))
expect(recv_bytes(a) == b"1" and recv_bytes(a) == b"22", "MULTI_SET, MULTI_GET")
a.sendall(b"\x09" + s("/m1") + s("x") + b"\x03" + s("/m1"))
expect(recv_bytes(a) == b"1x", "APPEND")
a.sendall(b"\x07")
expect(struct.unpack("<q", recv_exact(a, 8))[0] == 4, "GETNUMKEYS counts init/ too")
a.sendall(b"\x08" + s("/m2"))
expect(struct.unpack("<q", recv_exact(a, 8))[0] == 1, "DELETE_KEY")
# A wait that the client gives up on: CANCEL_WAIT answers 1 and the wait never answers later.
a.sendall(b"\x06" + struct.pack("<Q", 1) + s("/later"))
time.sleep(0.2)
a.sendall(b"\x0c")
expect(recv_exact(a, 1) == b"\x01", "CANCEL_WAIT answers 1")
a.sendall(b"\x0e" + s("/q") + s("job1") + b"\x10" + s("/q"))
expect(struct.unpack("<q", recv_exact(a, 8))[0] == 1, "QUEUE_PUSH, QUEUE_LEN")
a.sendall(b"\x0f" + s("/q"))
expect(struct.unpack("<q", recv_exact(a, 8))[0] == 1 and recv_bytes(a) == b"job1", "QUEUE_POP")

# A torch 1.13 connection on the same port sees the 2.x client's keys; its SET wakes nobody
# on the cancelled wait.
legacy = connect()
legacy.sendall(b"\x05" + struct.pack("<Q", 1) + s("/shared") + b"\x02" + s("/shared"))
expect(recv_exact(legacy, 1) == b"\x00" and recv_bytes(legacy) == b"from-v2",
       "a 1.13 client reads a 2.x client's key")
legacy.sendall(b"\x00" + s("/later") + s("now"))
a.sendall(b"\x0d" + struct.pack("<I", 7))
expect(recv_exact(a, 4) == struct.pack("<I", 7), "no stray reply for the cancelled wait")

# An idle connection (a 1.13 callback socket) stays open.
idle = connect()
time.sleep(1.0)
idle.setblocking(False)
try:
    idle.recv(1)
    still_open = False
except BlockingIOError:
    still_open = True
expect(still_open, "an idle connection is left open")

# A malformed request closes its own connection only.
bad = connect()
bad.sendall(VALIDATE + b"\x7f")
expect(closed_by_server(bad), "an unknown opcode closes that connection")
huge = connect()
huge.sendall(VALIDATE + b"\x01" + struct.pack("<Q", 1 << 40))
expect(closed_by_server(huge), "a key length over the limit closes that connection")
wrong = connect()
wrong.sendall(VALIDATE + b"\x00" + struct.pack("<I", 1))
expect(closed_by_server(wrong), "a second VALIDATE with a wrong magic closes that connection")
a.sendall(b"\x0d" + struct.pack("<I", 9))
expect(recv_exact(a, 4) == struct.pack("<I", 9), "the other connections still work")
sys.exit(1 if failures else 0)
