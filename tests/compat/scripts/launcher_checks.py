"""What PyTorch's own launcher tests check of a launched script, in one script of ddprun's:
it says whether it was launched by an elastic agent, meets the other ranks through the
init method given, all-reduces its rank, leaves a file named after its rank in --touch_dir,
and fails on purpose on --fail_rank (with torch's @record, so the traceback reaches the
launcher's failure report)."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--touch_dir", required=True)
    parser.add_argument("--init_method", default="env://")
    parser.add_argument("--fail_rank", type=int, default=-1)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    print(f"launched={dist.is_torchelastic_launched()}", flush=True)
    if args.init_method == "env://":
        dist.init_process_group("gloo")
    elif args.init_method == "tcp://":
        address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    else:  # file://, in the shared directory; a restart count keeps attempts apart
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        path = os.path.join(args.touch_dir, f"rendezvous.{attempt}")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                                world_size=world)
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    print(f"rank {rank} of {world}: sum={total.item()}", flush=True)
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    with open(os.path.join(args.touch_dir, str(rank)), "w", encoding="utf-8"):
        pass
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
