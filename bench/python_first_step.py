"""For bench/python_launch_bench.py: an unmodified torchrun script that imports torch, joins a
Gloo process group, passes a barrier and appends "<rank> <time.monotonic()>" to the mark file
given as its argument."""
import sys
import time

import torch  # noqa: F401 - imported as a training script would
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    dist.barrier()
    with open(sys.argv[1], "a") as f:
        f.write(f"{dist.get_rank()} {time.monotonic()}\n")
    dist.barrier()
    dist.destroy_process_group()
