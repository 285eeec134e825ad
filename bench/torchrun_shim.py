#!/usr/bin/python3
"""torchrun with two fixes, so it can serve as the baseline on Debian 12 and 13.

Debian's python3-torch 1.13 crashes under Python 3.11 at start-up: the
launcher calls ``Std.from_str("0")`` for --redirects / --tee, and the
original looks the value up by iterating ``for s in Std``. Since Python 3.11,
iterating an ``IntFlag`` yields only its canonical single-bit members
(OUT, ERR), so the lookup misses NONE (0) and ALL (3) and returns None,
which later blows up in the multiprocessing API.

This wrapper replaces ``Std.from_str`` with a version that converts the value
through the enum constructor (which knows every value 0..3), then runs
``torch.distributed.run.main()`` with the command line unchanged.

Debian 13's python3-torch 2.6 was built without libuv, and TCPStore asks for
it by default (since 2.4): unpatched, torchrun fails in every mode ("use_libuv
was requested but PyTorch was build without libuv support"), USE_LIBUV=0 or
not, as torchrun's own stores are made without looking at it. Where a TCPStore
client refuses to start for want of libuv (on Debian 12's torch 1.13 nothing
below is done), the wrapper
- sets USE_LIBUV=0, which the workers read when init_process_group's env://
  (or tcp://) rendezvous makes their store without torchrun's agent store;
- makes the TCPStore of the static rendezvous (--master_addr/--master_port)
  and of the c10d rendezvous backend (--rdzv_backend c10d, and --standalone,
  which is c10d on localhost:0) with use_libuv=False;
- keeps the workers off torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE
  =False), as ddprun does on such a torch: a Python worker's client of that
  store asks for libuv whatever USE_LIBUV says, and under the c10d backend
  the agent would also host that store asking for libuv. The static
  rendezvous's use_agent_store is patched to False; the dynamic (c10d)
  rendezvous is given torch's own switch, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
  Worker rank 0 then hosts the workers' store, on a free port (the static
  rendezvous's own store keeps --master_port; the c10d one, --rdzv_endpoint).

Checked on Debian 12 and 13: static, --rdzv_backend c10d and --standalone, 2 workers doing
a Gloo all_reduce. The etcd and etcd-v2 rendezvous backends are not patched.

Usage (same arguments as torchrun):
    /usr/bin/python3 bench/torchrun_shim.py --standalone --nproc_per_node 2 \
        --no_python /bin/true
"""

import re
import sys
from typing import Dict, Union

from torch.distributed.elastic.multiprocessing import api as _mp_api

_ONE = re.compile(r"[0-3]")
_MANY = re.compile(r"[0-9]:[0-3](,[0-9]:[0-3])*")


def _std_from_str(cls, vm: str) -> Union["_mp_api.Std", Dict[int, "_mp_api.Std"]]:
    """"0".."3" -> a Std value; "0:1,1:2" -> {local_rank: Std}; else ValueError."""
    if _ONE.fullmatch(vm):
        return cls(int(vm))
    if _MANY.fullmatch(vm):
        out: Dict[int, _mp_api.Std] = {}
        for pair in vm.split(","):
            rank, value = pair.split(":")
            out[int(rank)] = cls(int(value))
        return out
    raise ValueError(f"{vm!r} is neither 0..3 nor a rank:value list such as 0:1,1:2")


_mp_api.Std.from_str = classmethod(_std_from_str)


def _libuv_missing() -> bool:
    """True when this torch's TCPStore has a use_libuv option, asks for libuv by default and
    was built without it: a client then refuses to start before it connects anywhere."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    if "use_libuv" not in (TCPStore.__init__.__doc__ or ""):
        return False  # torch 1.13: no libuv backend at all
    try:
        # Port 1 on loopback refuses at once; a torch with libuv gets that far and times out.
        TCPStore("127.0.0.1", 1, is_master=False, wait_for_workers=False,
                 timeout=timedelta(milliseconds=1))
    except RuntimeError as e:
        return "libuv" in str(e)
    return False


def _without_libuv() -> None:
    import os

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    os.environ["USE_LIBUV"] = "0"

    def tcp_store(*args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        return TCPStore(*args, **kwargs)

    static_tcp_rendezvous.TCPStore = tcp_store

    # --rdzv_backend c10d (and --standalone, which is c10d on localhost:0): the backend makes its
    # TCPStore, host or client, asking for libuv; it does not look at USE_LIBUV either.
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend
    c10d_rendezvous_backend.TCPStore = tcp_store
    # The dynamic rendezvous then shares a second TCPStore with the workers as their agent store:
    # its server asks for libuv, and so would every worker's client. torch's own switch turns the
    # sharing off: worker rank 0 then hosts the workers' store, on a free port, reading USE_LIBUV=0.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"

    static = static_tcp_rendezvous.StaticTCPRendezvous
    static.use_agent_store = property(lambda self: False)
    next_rendezvous = static.next_rendezvous

    def workers_on_a_free_port(self):
        from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo
        info = next_rendezvous(self)
        # Rank 0 of the workers hosts their store: not on the agent store's port.
        info._bootstrap_store_info = RendezvousStoreInfo.build(info.rank, info.store,
                                                               self.master_addr)
        return info
    static.next_rendezvous = workers_on_a_free_port

    # The static rendezvous's endpoint would name the workers' port too (the agent prefers it
    # to the rendezvous's answer above): it names none.
    from torch.distributed.launcher import api as launcher_api
    launcher_api._get_addr_and_port = lambda rdzv_parameters: (None, None)


def main() -> None:
    from torch.distributed.run import main as torchrun_main

    if _libuv_missing():
        _without_libuv()
    torchrun_main()


if __name__ == "__main__":
    # torch.distributed.run.main() parses sys.argv[1:] itself.
    sys.exit(main())
