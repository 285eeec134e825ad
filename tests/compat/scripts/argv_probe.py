"""Prints, for its rank, what the launcher gave the script: its local rank, __name__, __file__
and sys.argv. With PROBE_LOCAL_RANK_FLAG set (--local-rank or --local_rank) it first reads its
local rank from that argument, as scripts written for torch.distributed.launch do (PyTorch's
test_script_local_rank.py), and fails unless it equals LOCAL_RANK."""
import argparse
import os
import sys

import torch  # noqa: F401  a torch script: ddprun forks its workers from the zygote by default

flag = os.environ.get("PROBE_LOCAL_RANK_FLAG")
if flag:
    parser = argparse.ArgumentParser()
    parser.add_argument(flag, type=int, required=True, dest="local_rank")
    args, _ = parser.parse_known_args()
    if args.local_rank != int(os.environ["LOCAL_RANK"]):
        raise SystemExit(f"{flag}={args.local_rank} but LOCAL_RANK={os.environ['LOCAL_RANK']}")
# One write of the whole line: under torchrun both ranks share one stdout, and print() under
# python -u writes the line and its newline apart, so two ranks' lines could run together.
sys.stdout.write(f"probe local_rank={os.environ['LOCAL_RANK']} name={__name__} file={__file__} "
                 f"argv={sys.argv!r}\n")
sys.stdout.flush()
