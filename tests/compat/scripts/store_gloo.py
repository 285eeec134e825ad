"""A worker that joins a Gloo process group through env:// and all-reduces its rank.

Usage: store_gloo.py [--fail_rank R]: rank R exits 1 after the collective in attempt 0 only.
Prints "rank R attempt N store S sum X".
"""
import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fail_rank", type=int, default=-1)
args = parser.parse_args()

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
rank = dist.get_rank()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
dist.barrier()
print(f"rank {rank} attempt {attempt} store {os.environ['TORCHELASTIC_USE_AGENT_STORE']} "
      f"sum {int(t.item())}", flush=True)
# Every rank has printed before any leaves this barrier: the failure cannot cut a line short.
dist.barrier()
if rank == args.fail_rank and attempt == 0:
    sys.exit(1)
dist.destroy_process_group()
