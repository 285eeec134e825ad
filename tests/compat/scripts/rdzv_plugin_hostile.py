"""The torchrun plugin (python/ddprun_rdzv) against servers that are not what they claim: each
case ends in torch's RendezvousError naming the problem, within the connect timeout, never a
hang or a raw exception. Run by tests/CMakeLists.txt with PYTHONPATH=<build>/python-site; it
needs torch (the rendezvous API), not torch 2.5's plugin loading, so it runs with 1.13 too.
"""
import os
import socket
import struct
import sys
import tempfile
import threading
import time

import ddprun_rdzv
from torch.distributed.elastic.rendezvous import api


def serve_once(behaviour):
    """A listener on 127.0.0.1 whose first connection gets `behaviour(conn)`; its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def run():
        conn, _ = listener.accept()
        try:
            behaviour(conn)
        except OSError:
            pass
        time.sleep(3)  # hold the connection open past the client's limit
        conn.close()
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1]


def frame(body):
    return struct.pack(">I", len(body)) + body


def handler(port, **conf):
    params = api.RendezvousParameters(backend="ddprun", endpoint=f"127.0.0.1:{port}",
                                      run_id="hostile", min_nodes=1, max_nodes=1,
                                      connect_timeout=1, **conf)
    return ddprun_rdzv.create_handler(params)


def expect_error(name, port, needle, **conf):
    started = time.monotonic()
    try:
        handler(port, **conf).next_rendezvous()
    except api.RendezvousError as e:
        took = time.monotonic() - started
        if needle not in str(e) or took > 2.5:
            sys.exit(f"FAIL {name}: after {took:.1f} s: {e!r} (expected {needle!r})")
        print(f"ok {name}: {e} ({took:.2f} s)")
        return
    sys.exit(f"FAIL {name}: no error")


# A frame announced larger than 1 MiB is refused from its header.
expect_error("oversized frame", serve_once(lambda c: c.sendall(struct.pack(">I", 2 << 20))),
             "more than 1048576")
# A frame nested deeper than the parser goes.
expect_error("deep nesting", serve_once(lambda c: c.sendall(frame(b"[" * 200000 + b"]" * 200000))),
             "nested too deeply")
# Silence after the hello: bounded by connect_timeout.
expect_error("silent server", serve_once(lambda c: c.recv(4096)), "timed out")
# Half a frame, then nothing.
expect_error("stalled frame", serve_once(lambda c: c.sendall(struct.pack(">I", 100) + b"{")),
             "timed out")
# Not a ddprun server: an HTTP answer.
expect_error("not ddprun", serve_once(lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")),
             "cannot greet ddprun's rendezvous")
# With a secret, a server that challenges twice instead of proving it holds the secret.
with tempfile.NamedTemporaryFile("w", delete=False) as f:
    f.write("0123456789abcdef0123456789abcdef\n")
os.chmod(f.name, 0o600)
challenge = frame(b'{"type": "challenge", "nonce": "00112233445566778899aabbccddeeff"}')
expect_error("second challenge", serve_once(lambda c: c.sendall(challenge * 2)), "malformed",
             secret_file=f.name)
os.unlink(f.name)
print("ok: every hostile server was refused in time")
