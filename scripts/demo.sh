#!/usr/bin/env bash
# Installs ddprun's dependencies, builds ddprun and the C++ worker SDK, and runs a real DDP
# training job under ddprun: two CPU workers of examples/ddp_train.cpp (Gloo through libtorch),
# an embedded single-node rendezvous, and one injected failure on rank 1 halfway through epoch 2,
# so that you see ddprun restart the group and the workers resume from the last snapshot.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# A fresh build/ skips the tests (the demo builds three targets); one the test command set up
# keeps them, so running the demo never turns a developer's test build off.
tests=OFF
if [[ -f build/CMakeCache.txt ]]; then
  tests=$(sed -n 's/^DDPRUN_BUILD_TESTS:BOOL=//p' build/CMakeCache.txt)
fi
cmake -S . -B build -G Ninja -DDDPRUN_BUILD_TESTS="${tests:-OFF}" -DDDPRUN_BUILD_SDK=ON
cmake --build build --target ddprun ddp_train ddprun-snapshot -j"$(nproc)"

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
cmd=(build/bin/ddprun --standalone --nproc_per_node 2 --max_restarts 1 --no_python
  build/bin/ddp_train 4 1 --snapshot_path "$workdir/snapshot.pt" --fail_rank 1 --fail_epoch 2)
echo "+ ${cmd[*]}"
"${cmd[@]}"
echo "+ build/bin/ddprun-snapshot $workdir/snapshot.pt.000004"
build/bin/ddprun-snapshot "$workdir/snapshot.pt.000004"
