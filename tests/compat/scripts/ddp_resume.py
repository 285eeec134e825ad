"""A DDP training script in the shape of PyTorch's DDP tutorial (tests/compat/python_standby_test.cpp):
DistributedSampler, DDP, a snapshot saved by rank 0 with torch.save after every epoch and loaded
by every rank at start. On the first attempt the worker with LOCAL_RANK=1 kills itself with
SIGKILL at the start of --kill_epoch, once rank 0's snapshot of the epoch before is on disk (and,
with WAIT_STANDBYS=1, once the agent's standbys wait for their hand-over). At the end rank 0
writes its parameters, bit for bit, to --params.

Usage: ddp_resume.py EPOCHS SNAPSHOT PARAMS [--kill_epoch N]
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from standby_probe_wait import standbys_waiting


def main():
    epochs, snapshot_path, params_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    args = sys.argv[4:]
    kill_epoch = int(args[args.index("--kill_epoch") + 1]) if "--kill_epoch" in args else -1
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g)
    dataset = TensorDataset(x, y)
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first = 0
    if os.path.exists(snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        model.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        first = snapshot["epochs_run"]
        print(f"rank {rank}: resuming from the snapshot at epoch {first}", flush=True)
    ddp = DDP(model)
    for epoch in range(first, epochs):
        if (epoch == kill_epoch and os.environ["LOCAL_RANK"] == "1"
                and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
            deadline = time.monotonic() + 120
            while os.environ.get("WAIT_STANDBYS") == "1" and not standbys_waiting():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        loader.sampler.set_epoch(epoch)
        for source, target in loader:
            optimizer.zero_grad()
            F.mse_loss(ddp(source), target).backward()
            optimizer.step()
        if rank == 0:
            tmp = snapshot_path + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epochs_run": epoch + 1}, tmp)
            os.replace(tmp, snapshot_path)
        # Every rank goes on only once the snapshot of this epoch is on disk.
        dist.barrier()
        print(f"rank {rank}: epoch {epoch} done", flush=True)
    if rank == 0:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        with open(params_path, "w") as f:
            f.write(flat.numpy().tobytes().hex())
    dist.barrier()
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
