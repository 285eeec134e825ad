"""The model and loop of examples/ddp_train.cpp in Python DDP, for bench/train_bench.py.

Same network (Linear(20, 64), ReLU, Linear(64, 1)), same optimizer (SGD, lr 0.02, momentum
0.9), same synthetic data size, DistributedSampler(shuffle=True, seed 0) and per-rank batch;
torch.nn.parallel.DistributedDataParallel over Gloo. Batches are taken by indexing the data
tensors with the sampler's indices, as the C++ program does, so neither side pays for a
DataLoader.

Usage: ddprun --standalone --nproc_per_node 2 bench/python_ddp_train.py EPOCHS [--batch_size 32]
"""
import argparse

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
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.dataset_size, 20, generator=g)
    w = torch.randn(20, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(args.dataset_size, 1, generator=g)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sampler = DistributedSampler(range(args.dataset_size))
    for epoch in range(args.total_epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.long)
        steps = 0
        loss = torch.tensor(0.0)
        for start in range(0, len(order), args.batch_size):
            batch = order[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = F.mse_loss(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            steps += 1
        print(f"[CPU{rank}] Epoch {epoch} | Batchsize: {args.batch_size} | Steps: {steps} | "
              f"Loss: {loss.item():.5f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
