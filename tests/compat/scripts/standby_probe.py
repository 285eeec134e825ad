"""A torchrun script for ddprun's standby tests (tests/compat/python_standby_test.cpp).

Attempt 0: rank 1 fails (with WAIT_STANDBYS=1, once the agent's standbys wait for their
hand-over), so the restart hands attempt 1 to the standbys (with --standby_workers) or starts it afresh.
Attempt 1: every rank prints, as "PROBE <name> <json>" lines, what a script can observe about
how it was started, then exits as its arguments say.

Usage: standby_probe.py [--exit N] [--raise] [--interrupt]   (WAIT_STANDBYS=1: see above)
"""
import atexit
import ctypes
import faulthandler
import json
import os
import random
import signal
import sys
import time

import numpy
import torch
import torch.distributed
from standby_helper import VALUE
from standby_probe_wait import agent_children, command_line, standbys_waiting

ARGS = sys.argv[1:]


def probe(name, value):
    print(f"PROBE {name} {json.dumps(value, sort_keys=True)}", flush=True)


if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["RANK"] == "1":
        if os.environ.get("WAIT_STANDBYS") == "1":
            deadline = time.monotonic() + 120
            while not standbys_waiting() and time.monotonic() < deadline:
                time.sleep(0.05)
            # What ps shows of the agent's children: workers, the zygote, waiting standbys.
            probe("waiting", sorted(command_line(pid) for pid in agent_children()))
        sys.exit(9)
    time.sleep(120)  # stopped by the agent when rank 1 fails
    sys.exit(0)

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
probe("env", dict(os.environ))
probe("c_env_agrees", all(libc.getenv(k.encode()) == v.encode() for k, v in os.environ.items())
      and libc.getenv(b"DDPRUN_STANDBY_FD") is None)
probe("name", __name__)
probe("file", __file__)
probe("argv", sys.argv)
# What ps, pgrep -f and /proc show of this process, as tools outside it see it.
with open("/proc/self/cmdline", "rb") as f:
    probe("cmdline", [a.decode() for a in f.read().split(b"\0")[:-1]])
with open("/proc/self/environ", "rb") as f:
    probe("proc_environ", dict(v.decode().split("=", 1) for v in f.read().split(b"\0")[:-1]))
probe("orig_argv", getattr(sys, "orig_argv", None))
probe("path", sys.path)
# torch's RemoteModule template directory, if torch.distributed.nn.jit.instantiator is loaded
# (with torch 2.x the zygote preloads torch._dynamo, which imports it): this rank's own?
template_dir = getattr(sys.modules.get("torch.distributed.nn.jit.instantiator"),
                       "INSTANTIATED_TEMPLATE_DIR_PATH", None)
probe("template_dir", template_dir)
probe("template_dir_exists", template_dir is not None and os.path.isdir(template_dir))
probe("cwd", os.getcwd())
probe("main_globals", sorted(k for k in globals() if k.startswith("__")))
probe("main_module_is_us", sys.modules["__main__"].__dict__ is globals())
probe("helper", VALUE)
probe("threads", torch.get_num_threads())
probe("faulthandler", faulthandler.is_enabled())
probe("signals", {s.name: (h.name if isinstance(h := signal.getsignal(s), signal.Handlers)
                           else repr(h)) for s in
                  (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT,
                   signal.SIGPIPE, signal.SIGCHLD)})
# Its own session and process group, as torchrun 2.6 starts a worker (start_new_session).
probe("leads", [os.getsid(0) == os.getpid(), os.getpgrp() == os.getpid()])
probe("blocked", sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
probe("flags", [sys.flags.optimize, sys.flags.dont_write_bytecode, sys.flags.no_user_site,
                sys.flags.hash_randomization, sys.flags.isolated])
probe("stdout_write_through", sys.stdout.write_through)
probe("cuda_initialized", torch.cuda.is_initialized())
probe("debug_level", str(torch.distributed.get_debug_level()))
# Each rank draws its own numbers, as separate interpreters do (the test compares the ranks).
probe("random", [random.random(), float(numpy.random.random()), torch.initial_seed(),
                 torch.rand(1).item()])
atexit.register(lambda: print(f"atexit ran on rank {os.environ['RANK']}", flush=True))
if "--raise" in ARGS and os.environ["RANK"] == "1":
    raise RuntimeError("raised by the probe on rank 1")
if "--interrupt" in ARGS and os.environ["RANK"] == "1":
    raise KeyboardInterrupt
if "--exit" in ARGS and os.environ["RANK"] == "1":
    sys.exit(int(ARGS[ARGS.index("--exit") + 1]))
