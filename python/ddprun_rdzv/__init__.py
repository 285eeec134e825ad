"""ddprun's rendezvous for stock torchrun.

    torchrun --rdzv_backend ddprun --rdzv_endpoint head:29400 --rdzv_id job1 \
             --nnodes 2 --nproc_per_node 8 --rdzv_conf secret_file=/etc/ddprun/secret train.py

joins the job at `ddprun-rdzvd` (or at a ddprun agent that hosts the rendezvous), with its
shared secret and TLS, and shows up in `ddprun status`, the daemon's status page and metrics.
torch 2.5 and later find this module through its `torchrun.handlers` entry point
(docs/usage.md, "Stock torchrun on ddprun's rendezvous").

The protocol is ddprun's own (docs/design.md#rendezvous): frames of a 4-byte big-endian length
and a JSON object; hello (and, with a secret, a challenge answered with an HMAC); join before
every round; heartbeats; workers_failed when torchrun restarts its workers; leave at the end.
torchrun keeps its own restart budget: the server's is set high (--rdzv_conf max_restarts), and
its crash-loop stop and quarantine are off, so that torchrun decides as it always does.
"""

import hashlib
import hmac
import json
import os
import secrets
import socket
import ssl
import stat
import struct
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import api

PROTOCOL = 1  # rendezvous/framing.h kProtocolVersion
MAX_FRAME_BYTES = 1 << 20  # rendezvous/limits.h kMaxFrameBytes
SECRET_FILE_VARIABLE = "DDPRUN_RDZV_SECRET_FILE"
MIN_SECRET_BYTES = 16
DEFAULT_PORT = 29400
# The store key under which group rank 0's agent says which port its rank 0 worker listens on.
WORKER_PORT_KEY = "ddprun/worker_master_port"


class _Connection:
    """One framed connection to the rendezvous server: whole frames in, whole frames out.
    Connecting, TLS and every read until greeted() are bounded by `timeout` seconds; after
    that, a server that vanishes is noticed when unacknowledged data (the heartbeats) is older
    than `window_ms`, the keep-alive window, as ddprun's agent notices it."""

    def __init__(self, host, port, tls, timeout, window_ms):
        raw = socket.create_connection((host, port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(window_ms))
        self.local_addr = raw.getsockname()[0]
        self.sock = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
        self._send_lock = threading.Lock()

    def greeted(self):
        """The greeting is over: from now on a read waits as long as the server is silent."""
        self.sock.settimeout(None)

    def send(self, message):
        body = json.dumps(message).encode()
        with self._send_lock:
            self.sock.sendall(struct.pack(">I", len(body)) + body)

    def _read_exactly(self, size):
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(min(size - len(data), 65536))
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def receive(self):
        """The next message, or None when the server closed the connection."""
        header = self._read_exactly(4)
        if header is None:
            return None
        (size,) = struct.unpack(">I", header)
        if size > MAX_FRAME_BYTES:
            raise ValueError(f"a frame of {size} bytes, more than {MAX_FRAME_BYTES}")
        body = self._read_exactly(size)
        if body is None:
            return None
        try:
            message = json.loads(body)
        except RecursionError:
            raise ValueError("a frame nested too deeply") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ValueError("a frame that is not a message")
        return message

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def read_secret_file(path):
    """The shared secret, checked as ddprun checks it (rendezvous/auth.cpp)."""
    how = "create one with: (umask 077; openssl rand -hex 32 > FILE)"
    try:
        info = os.stat(path)
    except OSError as e:
        raise ValueError(f"secret file {path}: {e.strerror}; {how}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"secret file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise ValueError(f"secret file {path} is readable by group or others (mode "
                         f"{info.st_mode & 0o777:03o}): run chmod 600 {path}")
    with open(path, "rb") as f:
        secret = f.read().rstrip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret file {path} holds {len(secret)} bytes; at least "
                         f"{MIN_SECRET_BYTES} are needed: {how}")
    return secret


def handshake_mac(secret, side, role, client_nonce, server_nonce):
    """HMAC-SHA256 over length-prefixed fields, as rendezvous/auth.cpp's handshake_mac."""
    text = "ddprun-rdzv-auth-v1"
    for field in (side, role, client_nonce, server_nonce):
        text += f"|{len(field.encode())}:{field}"
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def parse_endpoint(endpoint):
    """(host, port) of `host:port`, `[ipv6]:port` or `host`."""
    endpoint = (endpoint or "").strip()
    if not endpoint:
        raise ValueError("--rdzv_backend ddprun needs --rdzv_endpoint host:port (ddprun-rdzvd)")
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif endpoint.count(":") == 1:
        host, port = endpoint.split(":")
    else:
        host, port = endpoint, ""
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--rdzv_endpoint {endpoint}: the port must be 1..65535")
    return host, int(port)


def _free_port(addr):
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class DdprunRendezvousHandler(api.RendezvousHandler):
    """A torchrun RendezvousHandler on ddprun's rendezvous server."""

    def __init__(self, params):
        self._run_id = params.run_id
        conf = params.config
        self._host, self._port = parse_endpoint(params.endpoint)
        secret_file = conf.get("secret_file") or os.environ.get(SECRET_FILE_VARIABLE)
        self._secret = read_secret_file(secret_file) if secret_file else None
        self._tls = None
        if conf.get("tls_ca"):
            self._tls = ssl.create_default_context(cafile=conf["tls_ca"])
            if conf.get("tls_cert"):
                self._tls.load_cert_chain(conf["tls_cert"], conf.get("tls_key"))
        seconds = lambda key, default: float(conf.get(key, default))  # noqa: E731
        self._settings = {
            "min_nodes": params.min_nodes, "max_nodes": params.max_nodes,
            "nproc_per_node": int(conf.get("nproc_per_node", 1)),
            # torchrun counts its own restarts: the server's budget only has to be larger.
            "max_restarts": int(conf.get("max_restarts", 1000)),
            "join_timeout_ms": int(seconds("join_timeout", 600) * 1000),
            "last_call_timeout_ms": int(seconds("last_call_timeout", 30) * 1000),
            "close_timeout_ms": int(seconds("close_timeout", 30) * 1000),
            "keep_alive_interval_ms": int(seconds("keep_alive_interval", 5) * 1000),
            "keep_alive_max_attempt": int(conf.get("keep_alive_max_attempt", 3)),
            "restart_window_ms": 0, "crash_loop_limit": 0, "fatal_exit_codes": [],
            "quarantine_after": 0, "quarantine_cooldown_ms": 30000,
            "quarantine_cooldown_max_ms": 600000}
        self._local_addr = getattr(params, "local_addr", None)  # torch 2.0 and later
        self._node_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(16)}"
        self._name = socket.gethostname()
        self._timeout = seconds("connect_timeout", 60)
        self._connection = None
        self._changed = threading.Condition()
        self._round = None       # the round this node's workers run (the server's message)
        self._rounds = []        # round messages not yet taken by next_rendezvous
        self._restart = None     # a restart the server announced since that round
        self._closed = None      # the server's closed message
        self._error = None       # why the connection is unusable
        self._restart_count = 0
        self._store = None       # this round's agents' store (group rank 0 hosts it)

    # ---- the connection ---------------------------------------------------------------------

    def _connect(self):
        # A node may start before the server: tried every second for --rdzv_conf
        # connect_timeout (60 s), as a ddprun agent does.
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                connection = _Connection(self._host, self._port, self._tls, self._timeout,
                                         self._settings["keep_alive_interval_ms"] *
                                         self._settings["keep_alive_max_attempt"])
                break
            except ssl.SSLError as e:
                raise api.RendezvousConnectionError(
                    f"TLS to ddprun's rendezvous at {self._host}:{self._port} failed: {e}"
                ) from None
            except OSError as e:
                if time.monotonic() + 1 > deadline:
                    raise api.RendezvousConnectionError(
                        f"cannot reach ddprun's rendezvous at {self._host}:{self._port} in "
                        f"{self._timeout:g} s (--rdzv_conf connect_timeout): {e}") from None
                time.sleep(1)
        try:
            self._greet(connection)
        except (OSError, ValueError) as e:  # a timeout, a reset, a frame that is not one
            connection.close()
            raise api.RendezvousConnectionError(
                f"cannot greet ddprun's rendezvous at {self._host}:{self._port}: {e} (the "
                f"greeting may take --rdzv_conf connect_timeout, {self._timeout:g} s)") from None
        except api.RendezvousError:
            connection.close()
            raise
        connection.greeted()
        self._connection = connection
        threading.Thread(target=self._read, args=(connection,), daemon=True,
                         name="ddprun-rdzv-reader").start()
        threading.Thread(target=self._heartbeat, args=(connection,), daemon=True,
                         name="ddprun-rdzv-heartbeat").start()

    def _greet(self, connection):
        """The hello and, with a secret, the challenge both ways (rendezvous/auth.cpp), all
        within connect_timeout: a server that stalls or chatters cannot hold this node."""
        nonce = secrets.token_hex(32)
        connection.send({"type": "hello", "protocol": PROTOCOL, "role": "agent",
                         "nonce": nonce})
        deadline = time.monotonic() + self._timeout
        server_nonce = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            connection.sock.settimeout(left)
            message = connection.receive()
            if message is None:
                raise ConnectionError("the server closed the connection (TLS on one side only?)")
            kind = message["type"]
            if kind == "refused":
                raise api.RendezvousError(str(message.get("message", "refused"))[:4096])
            if kind == "challenge":
                if self._secret is None:
                    raise api.RendezvousError(
                        "authentication failed: the rendezvous server requires a shared "
                        "secret; give its secret file with --rdzv_conf secret_file=PATH or "
                        f"{SECRET_FILE_VARIABLE}=PATH")
                if server_nonce is not None or not isinstance(message.get("nonce"), str):
                    raise api.RendezvousError(
                        "authentication failed: the server's challenge is malformed")
                server_nonce = message["nonce"]
                connection.send({"type": "auth", "mac": handshake_mac(
                    self._secret, "client", "agent", nonce, server_nonce)})
                continue
            if kind != "hello" or message.get("protocol") != PROTOCOL:
                raise api.RendezvousError(
                    f"not a ddprun rendezvous server speaking protocol {PROTOCOL}: it sent a "
                    f"{kind[:64]!r} message with protocol {str(message.get('protocol'))[:16]}")
            if self._secret is not None and not hmac.compare_digest(
                    str(message.get("mac", "")),
                    handshake_mac(self._secret, "server", "agent", nonce, server_nonce or "")):
                raise api.RendezvousError(
                    "authentication failed: the rendezvous server did not prove that it holds "
                    "the secret (is it started without --secret_file, or with another?)")
            return

    def _read(self, connection):
        """The reader thread: every message the server sends, noted for the handler."""
        try:
            while True:
                message = connection.receive()
                if message is None:
                    raise ConnectionError("the server closed the connection")
                with self._changed:
                    kind = message["type"]
                    if kind == "round":
                        self._rounds.append(message)
                    elif kind == "restart":
                        self._restart = message
                    elif kind == "closed":
                        self._closed = message
                    elif kind == "refused":
                        self._error = str(message.get("message", "refused"))[:4096]
                    self._changed.notify_all()
        except (OSError, ValueError, ConnectionError) as e:
            with self._changed:
                if self._error is None and self._closed is None and self._connection is not None:
                    self._error = f"lost the connection to ddprun's rendezvous: {e}"
                self._changed.notify_all()

    def _heartbeat(self, connection):
        interval = self._settings["keep_alive_interval_ms"] / 1000
        while self._connection is connection:
            time.sleep(interval)
            try:
                connection.send({"type": "heartbeat"})
            except OSError:
                return

    def _wait(self, ready, timeout, what):
        """Waits until `ready()` (under the lock) or the job closed or failed; raises then."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self._error is not None:
                    raise api.RendezvousError(self._error)
                if ready():
                    return
                if self._closed is not None:
                    raise api.RendezvousClosedError(
                        "the job is closed: " + self._closed.get("message", ""))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise api.RendezvousTimeoutError(f"no {what} in {timeout:.0f} s")
                self._changed.wait(left)

    # ---- RendezvousHandler ------------------------------------------------------------------

    def get_backend(self):
        return "ddprun"

    @property
    def use_agent_store(self):
        # The workers' rank 0 hosts their store (a torch built without libuv, as Debian 13's,
        # cannot make the client torchrun would give them for the agent's).
        return False

    def next_rendezvous(self):
        if self._connection is None:
            self._connect()
        window = self._settings["keep_alive_interval_ms"] * self._settings[
            "keep_alive_max_attempt"] / 1000
        if self._round is not None:
            with self._changed:
                announced = self._restart is not None
            if not announced:
                # torchrun restarts its workers after a failure here; the server restarts the
                # other nodes' workers.
                self._connection.send({
                    "type": "workers_failed", "round": self._round["round"],
                    "description": f"torchrun on {self._name} restarts its workers",
                    "exit_code": 1, "signal": 0, "rank": -1, "exception": "",
                    "progress": True, "culprit": True})
            self._wait(lambda: self._restart is not None, window + 30, "restart notice")
        with self._changed:
            if self._restart is not None:
                self._restart_count = int(self._restart.get("restart_count", 0))
            self._restart = None
            self._round = None
        addr = self._local_addr or self._connection.local_addr
        self._connection.send({
            "type": "join", "run_id": self._run_id, "node_id": self._node_id,
            "name": self._name, "addr": addr, "master_port": _free_port(addr),
            "node_rank": None, "settings": self._settings,
            "restart_count": self._restart_count, "resume": None})
        self._wait(lambda: bool(self._rounds), self._settings["join_timeout_ms"] / 1000 + 30,
                   "complete round")
        with self._changed:
            self._round = self._rounds.pop(0)
            self._rounds.clear()
        return self._round_info(self._round)

    def _round_info(self, round_message):
        rank = int(round_message["group_rank"])
        world_size = int(round_message["group_world_size"])
        master_addr = round_message["master_addr"]
        kwargs = {"is_master": rank == 0, "wait_for_workers": False,
                  "timeout": timedelta(milliseconds=self._settings["join_timeout_ms"])}
        try:
            store = TCPStore(master_addr, int(round_message["master_port"]), world_size,
                             use_libuv=False, **kwargs)
        except TypeError:  # a torch without libuv's option
            store = TCPStore(master_addr, int(round_message["master_port"]), world_size,
                             **kwargs)
        if rank == 0:
            store.set(WORKER_PORT_KEY, str(_free_port(master_addr)))
        worker_port = int(store.get(WORKER_PORT_KEY))
        self._store = store
        return api.RendezvousInfo(
            store, rank, world_size, api.RendezvousStoreInfo(master_addr, worker_port))

    def is_closed(self):
        with self._changed:
            return self._closed is not None

    def set_closed(self):
        self._leave("torchrun closed the rendezvous")
        with self._changed:
            if self._closed is None:
                self._closed = {"message": "closed by this node"}

    def num_nodes_waiting(self):
        # A restart the server announced (another node's failure, or nodes waiting to join):
        # torchrun then restarts this node's workers, counted as a membership change.
        with self._changed:
            if self._error is not None:
                raise api.RendezvousError(self._error)
            return 1 if self._restart is not None else 0

    def get_run_id(self):
        return self._run_id

    def shutdown(self):
        self._leave("torchrun's agent ended")
        return True

    def _leave(self, reason):
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.send({"type": "leave", "reason": reason})
        except OSError:
            pass
        connection.close()


def create_handler(params):
    """torchrun's handler creator for --rdzv_backend ddprun."""
    try:
        return DdprunRendezvousHandler(params)
    except ValueError as e:
        raise api.RendezvousError(str(e)) from None


def handler_creator():
    """The `torchrun.handlers` entry point: torchrun calls it and registers what it returns."""
    return create_handler
