"""The torchrun baseline's command line, for the benches that run it beside ddprun.

Modes: "shim" runs bench/torchrun_shim.py --standalone (Debian 12's torch 1.13); "shim-static"
runs the shim on the static rendezvous at a free port (Debian 13's torch 2.6, which hosts no
c10d or --standalone rendezvous without libuv; the shim turns its agent store off); "module"
runs `python -m torch.distributed.run --standalone` (a torch with libuv, such as pip's 2.11).
Each with --monitor_interval 0.1 (torchrun's default is 5 s) and one node.
"""
import os
import socket

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_shim.py")
MODES = ("shim", "shim-static", "module")


def torchrun_argv(python, mode, nproc, flags=()):
    """[python, ...torchrun..., --nproc_per_node nproc, *flags, --monitor_interval 0.1]; the
    caller appends the script and its arguments."""
    if mode == "shim-static":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = [SHIM, "--rdzv_backend", "static", "--master_addr", "127.0.0.1",
                    "--master_port", str(port), "--nnodes", "1", "--node_rank", "0"]
    elif mode == "module":
        launcher = ["-m", "torch.distributed.run", "--standalone"]
    elif mode == "shim":
        launcher = [SHIM, "--standalone"]
    else:
        raise ValueError(f"torchrun mode {mode!r} is not one of {', '.join(MODES)}")
    return ([python] + launcher + ["--nproc_per_node", str(nproc)] + list(flags) +
            ["--monitor_interval", "0.1"])
