"""The model and loop of examples/ddp_train.cpp in Python DDP, for bench/train_bench.py.

Same network (Linear(20, 64), ReLU, Linear(64, 1)), same optimizer (SGD, lr 0.02, momentum
0.9), same synthetic data size, DistributedSampler(shuffle=True, seed 0) and per-rank batch;
torch.nn.parallel.DistributedDataParallel over Gloo. Batches are taken by indexing the data
tensors with the sampler's indices, as the C++ program does, so neither side pays for a
DataLoader.

Usage: ddprun --standalone --nproc_per_node 2 bench/python_ddp_train.py EPOCHS [--batch_size 32]

For bench/recovery_bench.py: --snapshot_path saves model, optimizer and epoch from rank 0
after every epoch (torch.save to a temporary file, then rename) and every rank resumes from it,
as the C++ program does with its snapshots; --mark_file appends "<phase> <restart count>
<time.monotonic()>" lines when an attempt's first training step is done, one per phase reached
on the way: start (the script runs), imported (torch), cuda_ready (with --device cuda: the
rank's GPU has a CUDA context), pg_ready (the process group has done its first collective,
which creates NCCL's communicator), snapshot_loaded, first_step.

--device cuda trains on GPU LOCAL_RANK with NCCL, as examples/ddp_train.cpp --device cuda does;
--hidden sets the hidden layer's width (64).
"""
import os
import time

STARTED = time.monotonic()

import argparse  # noqa: E402

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--dataset_size", type=int, default=2048)
    parser.add_argument("--snapshot_path")
    parser.add_argument("--mark_file")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    marks = [("start", STARTED), ("imported", time.monotonic())]

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # creates the CUDA context
        marks.append(("cuda_ready", time.monotonic()))
        dist.init_process_group(backend="nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    dist.all_reduce(torch.zeros(1, device=device))
    marks.append(("pg_ready", time.monotonic()))
    rank = dist.get_rank()
    tag = "GPU" if args.device == "cuda" else "CPU"
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.dataset_size, 20, generator=g)
    w = torch.randn(20, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(args.dataset_size, 1, generator=g)
    x, y = x.to(device), y.to(device)
    model = torch.nn.Sequential(torch.nn.Linear(20, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1)).to(device)
    model = DDP(model, device_ids=[device.index] if args.device == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    first_epoch = 0
    if args.snapshot_path and os.path.exists(args.snapshot_path):
        snapshot = torch.load(args.snapshot_path, map_location=device)
        model.module.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        first_epoch = snapshot["epoch"]
        marks.append(("snapshot_loaded", time.monotonic()))
    sampler = DistributedSampler(range(args.dataset_size))
    marked = False
    for epoch in range(first_epoch, args.total_epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.long, device=device)
        steps = 0
        loss = torch.tensor(0.0)
        for start in range(0, len(order), args.batch_size):
            batch = order[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = F.mse_loss(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            steps += 1
            if args.mark_file and not marked:
                marked = True
                loss.item()  # the step is done on the GPU too
                marks.append(("first_step", time.monotonic()))
                restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                with open(args.mark_file, "a") as f:
                    f.write("".join(f"{name} {restart} {t}\n" for name, t in marks))
        print(f"[{tag}{rank}] Epoch {epoch} | Batchsize: {args.batch_size} | Steps: {steps} | "
              f"Loss: {loss.item():.5f}", flush=True)
        if args.snapshot_path and rank == 0:
            tmp = args.snapshot_path + ".tmp"
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch + 1}, tmp)
            os.replace(tmp, args.snapshot_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
