#!/usr/bin/python3
"""torchrun with one fix, so it can serve as the baseline on Debian 12.

Debian's python3-torch 1.13 crashes under Python 3.11 at start-up: the
launcher calls ``Std.from_str("0")`` for --redirects / --tee, and the
original looks the value up by iterating ``for s in Std``. Since Python 3.11,
iterating an ``IntFlag`` yields only its canonical single-bit members
(OUT, ERR), so the lookup misses NONE (0) and ALL (3) and returns None,
which later blows up in the multiprocessing API.

This wrapper replaces ``Std.from_str`` with a version that converts the value
through the enum constructor (which knows every value 0..3), then runs
``torch.distributed.run.main()`` with the command line unchanged.

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


def main() -> None:
    from torch.distributed.run import main as torchrun_main

    torchrun_main()


if __name__ == "__main__":
    # torch.distributed.run.main() parses sys.argv[1:] itself.
    sys.exit(main())
