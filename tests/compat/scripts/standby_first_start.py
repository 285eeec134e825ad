"""For tests/compat/python_standby_test.cpp: a script that imports torch when it can (so
--standby_workers=auto, the default, gives it standbys) and says how far it got."""
import os

try:
    import torch.distributed as dist
except ImportError:
    dist = None

if __name__ == "__main__":
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    if dist is None:
        print(f"rank {rank} of {world} without torch", flush=True)
    else:
        dist.init_process_group("gloo")
        dist.barrier()
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} joined", flush=True)
        dist.destroy_process_group()
