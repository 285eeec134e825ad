"""A PyTorch DDP training script written for torchrun, used unmodified under ddprun.

Usage: ddprun --standalone --nproc_per_node 2 examples/ddp_train.py 5 2 --batch_size 32

Trains a small linear model on synthetic data with the Gloo backend (CPU), shards the data
with DistributedSampler, saves a snapshot from rank 0 every `save_every` epochs and resumes
from it after a restart. At the end every rank checks that its parameters equal rank 0's.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ENV_NAMES = [
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
]


def make_dataset(size=2048, seed=1234):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 20, generator=g)
    w = torch.randn(20, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(size, 1, generator=g)
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, model, data, optimizer, save_every, snapshot_path):
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.data = data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        if snapshot_path and os.path.exists(snapshot_path):
            self._load_snapshot()
        self.model = DDP(self.model)

    def _load_snapshot(self):
        snapshot = torch.load(self.snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        tmp = self.snapshot_path + ".tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def _run_epoch(self, epoch):
        self.data.sampler.set_epoch(epoch)
        steps = 0
        loss = torch.tensor(0.0)
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
            steps += 1
        print(f"[CPU{self.rank}] Epoch {epoch} | Batchsize: {self.data.batch_size} | "
              f"Steps: {steps} | Loss: {loss.item():.5f}", flush=True)

    def train(self, max_epochs, fail_rank=-1, fail_epoch=0):
        for epoch in range(self.epochs_run, max_epochs):
            if (self.rank == fail_rank and epoch == fail_epoch
                    and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
                raise RuntimeError(f"injected failure on rank {self.rank} at epoch {epoch}")
            self._run_epoch(epoch)
            if self.rank == 0 and self.snapshot_path and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)

    def check_replicas_equal(self):
        """(whether this rank's parameters are rank 0's, the tensor broadcast to compare)."""
        flat = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        same = torch.equal(flat, reference)
        print(f"rank {self.rank}: parameters identical to rank 0: {same}", flush=True)
        return same, reference


@record
def main():
    parser = argparse.ArgumentParser(description="DDP training under ddprun or torchrun")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--snapshot_path", default="")
    parser.add_argument("--print_env", action="store_true")
    parser.add_argument("--fail_rank", type=int, default=-1,
                        help="this rank raises an error on the first attempt (restart demo)")
    parser.add_argument("--fail_epoch", type=int, default=0,
                        help="the epoch at which --fail_rank raises its error")
    args = parser.parse_args()

    if args.print_env:
        print(" ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in ENV_NAMES), flush=True)

    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = make_dataset()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False,
                        sampler=DistributedSampler(dataset))
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = Trainer(model, loader, optimizer, args.save_every, args.snapshot_path)
    trainer.train(args.total_epochs, args.fail_rank, args.fail_epoch)
    ok, broadcast = trainer.check_replicas_equal()
    # The DDP wrapper keeps the process group alive; destroyed after the other ranks have
    # gone, it can wait forever for them. Drop it while every rank is still here.
    del trainer
    # Rank 0 hosts the store: let every rank finish with it before anyone tears it down.
    dist.barrier()
    # Torch before 2.8 destroys the group holding the GIL (fixed by pytorch PR 154976); a Gloo
    # thread that only then lets go of the last tensor it sent would wait for the GIL forever (1
    # run in 25 with torch 2.6). Holding the tensor until the group is gone keeps it from being
    # the last.
    dist.destroy_process_group()
    del broadcast
    if not ok:
        raise SystemExit(3)


if __name__ == "__main__":
    main()
