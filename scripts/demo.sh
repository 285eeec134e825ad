#!/usr/bin/env bash
# Installs ddprun's dependencies, builds ddprun and runs a real DDP training job under it:
# two CPU workers (Gloo, Debian's python3-torch), an embedded single-node rendezvous, and one
# injected failure on rank 1 at epoch 2 so that you see ddprun restart the group and the
# script resume from its snapshot.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DDDPRUN_BUILD_TESTS=OFF
cmake --build build --target ddprun -j"$(nproc)"

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
echo "+ build/bin/ddprun --standalone --nproc_per_node 2 --max_restarts 1 examples/ddp_train.py 4 1 --snapshot_path $workdir/snapshot.pt --fail_rank 1 --fail_epoch 2"
# Debian's interpreter holds python3-torch, whatever python3 comes first on PATH.
PYTHON_EXEC=/usr/bin/python3 build/bin/ddprun --standalone --nproc_per_node 2 --max_restarts 1 \
  examples/ddp_train.py 4 1 --snapshot_path "$workdir/snapshot.pt" --fail_rank 1 --fail_epoch 2
