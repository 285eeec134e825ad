#!/usr/bin/env bash
# The worker SDK and ddprun on a GPU machine, in one run that writes one report:
#
#   scripts/device_bundle.sh                      # here: binaries and header-only libraries
#   scripts/device_check.sh [--dry-run] [--sdk-build DIR]   # there: REPORT in $OUT or /tmp
#
# Parts (each under its own time limit; a failed part is reported and the next one runs):
#   machine      GPU, driver, torch, CUDA, NCCL, compilers
#   store        torch's own store client against ddprun's agent-hosted store: every store
#                operation the machine's torch has (bench/store_ops_check.py), Gloo, and NCCL
#   sdk_build    the worker SDK and its examples built against the machine's libtorch
#                (DDPRUN_SDK_ONLY, pip's torch.utils.cmake_prefix_path), NCCL from the nccl.h
#                of pip's nvidia-nccl package or the CUDA toolkit
#   sdk_gpu      examples/ddp_train under ddprun: CPU (Gloo) and GPU (NCCL) runs compared for loss
#                and parameters; a GPU run killed (SIGKILL) in epoch 3 and resumed from its
#                snapshot must end with parameters identical to an uninterrupted GPU run
#   recovery     bench/recovery_bench.py: SIGKILL of the worker to its first step after the
#                restart, ddprun (standbys forked from the zygote; fresh processes; C++ standbys)
#                against the machine's own torchrun, with the phases of the restarted rank
#   steps        bench/train_bench.py: the SDK's steps/s against PyTorch DDP, same model, batch
#                and GPU (the tutorial's model, and a wider one)
#
# Without a GPU (or with --dry-run) the GPU parts are skipped, saying so, and the CPU parts
# run small: tests/CMakeLists.txt runs it that way so that it keeps working. --sdk-build DIR
# takes ddp_train from DIR instead of building the SDK (the build is then only configured).
# --parts a,b runs only those parts (sdk_gpu and steps need sdk_build, or --sdk-build);
# --recovery-series a,b names bench/recovery_bench.py's series (default: Python standbys, Python
# standbys with --standby_cuda context (and warm, on a GPU), fresh Python workers and torchrun,
# and C++ standbys where the SDK was built); --recovery-runs N runs each N times (default on a
# GPU 3, or 2 for more than 4 series; 1 without; the part's limit is 30 s a run of each series).
# --budget SECONDS (default 480) bounds the whole run: each part's limit is cut to what is left,
# and a part with under 20 s left is skipped, so the report is written before a lease ends.
# Environment: DDPRUN_DEVICE_BUNDLE (default .device-bundle in the checkout), PYTHON (python3),
# DDPRUN_REVISION (the revision to report; the GPU machine's copy of the checkout may carry a
# stale .git).
set -uo pipefail

src=$(realpath "$(dirname "$0")/..")
bundle=$(realpath -m "${DDPRUN_DEVICE_BUNDLE:-$src/.device-bundle}")
python=${PYTHON:-python3}
dry_run=0
sdk_build=""
parts=store,sdk_build,sdk_gpu,recovery,steps
budget=480
recovery_series=""
recovery_runs=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --sdk-build) sdk_build=$(realpath "$2"); shift ;;
    --parts) parts=$2; shift ;;
    --budget) budget=$2; shift ;;
    --recovery-series) recovery_series=$2; shift ;;
    --recovery-runs) recovery_runs=$2; shift ;;
    *) echo "device_check: unknown argument $1 (use --dry-run, --sdk-build DIR, --parts LIST, --budget S)" >&2
       exit 2 ;;
  esac
  shift
done
for p in ${parts//,/ }; do
  case $p in store | sdk_build | sdk_gpu | recovery | steps) ;;
    *) echo "device_check: unknown part $p (store, sdk_build, sdk_gpu, recovery, steps)" >&2; exit 2 ;;
  esac
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "device_check: --budget $budget is not a number of seconds" >&2; exit 2; }
[[ -z $recovery_runs || $recovery_runs =~ ^[1-9][0-9]?$ ]] ||
  { echo "device_check: --recovery-runs $recovery_runs is not a number of runs from 1 to 99" >&2; exit 2; }
out=${OUT:-$(mktemp -d /tmp/ddprun-device-check.XXXXXX)}
mkdir -p "$out"
work=$(mktemp -d /tmp/ddprun-device-work.XXXXXX)
report=$out/report.md
ddprun=$bundle/bin/ddprun
[ -x "$ddprun" ] || { echo "device_check: $ddprun is missing: run scripts/device_bundle.sh first" >&2; exit 2; }
export PYTHON_EXEC=$python LOGLEVEL=WARNING PYTHONUNBUFFERED=1
started=$(date +%s)
failed=0

say() { printf '%s\n' "$*" | tee -a "$report"; }
wanted() { [[ ,$parts, == *,$1,* ]]; }
# part NAME SECONDS COMMAND...: runs COMMAND, its output in NAME.log, and reports the outcome.
part() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s) rc
  local left=$(( budget - (t0 - started) ))
  if ! wanted "$name"; then
    say "- **$name**: not asked for (--parts $parts)"
    return 1
  fi
  if [ $left -lt 20 ]; then
    failed=1
    say "- **$name**: skipped: ${left} s of the ${budget} s budget left"
    return 1
  fi
  [ $limit -gt $left ] && limit=$left
  echo "== $name (limit ${limit} s)" >&2
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    say "- **$name**: ok (${took} s)"
  else
    failed=1
    [ $rc -eq 124 ] && say "- **$name**: FAILED: over its ${limit} s limit (log: $name.log)" \
                    || say "- **$name**: FAILED with status $rc after ${took} s (log: $name.log)"
    tail -n 25 "$out/$name.log" | sed 's/^/    /' | tee -a "$report"
  fi
  return $rc
}
skip() { say "- **$1**: skipped: $2"; }

: >"$report"
say "# ddprun device check, $(date -u '+%Y-%m-%d %H:%M UTC')"
say ""
# The device machine's copy of the checkout may carry a stale .git: DDPRUN_REVISION wins.
say "Revision: ${DDPRUN_REVISION:-$(git -C "$src" describe --always --dirty 2>/dev/null || echo unknown)}; ddprun: $("$ddprun" --version 2>&1)"

# ---- machine
gpu=0
if [ $dry_run -eq 0 ] && command -v nvidia-smi >/dev/null &&
   "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  gpu=1
fi
{
  echo '```'
  uname -srm
  ldd --version 2>&1 | head -1
  echo "CPUs: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" - <<'EOF' 2>&1
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"GPU visible: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"device 0: {torch.cuda.get_device_name(0)}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
EOF
  # In a process of its own, without CUDA (whose threads would be counted): what the zygote pays.
  "$python" - <<'EOF' 2>&1
import os, time, torch
if int(torch.__version__.split(".")[0]) >= 2:
    t = time.monotonic()
    import torch._dynamo  # what a script's first optimizer imports (ddprun's zygote preloads it)
    print(f"import torch._dynamo after torch: {time.monotonic() - t:.2f} s, "
          f"threads after it: {len(os.listdir('/proc/self/task'))}")
EOF
  cmake --version 2>&1 | head -1
  c++ --version 2>&1 | head -1
  command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1
  echo '```'
} >>"$report" 2>&1
cat "$report"
[ $gpu -eq 1 ] || say "No GPU used ($([ $dry_run -eq 1 ] && echo '--dry-run' || echo 'none visible to torch')): the GPU parts are skipped."
say ""
say "## Parts"
say ""

# ---- store: torch's client against ddprun's store server
part store 120 bash -c '
  set -e
  cd "$1"
  "$2" --standalone --nproc_per_node 2 --agent_store on "$3/bench/store_ops_check.py"
  if [ "$4" = 1 ]; then
    "$2" --standalone --nproc_per_node 1 --agent_store on "$3/bench/store_ops_check.py" --device cuda
  fi' _ "$work" "$ddprun" "$src" "$gpu"
grep -so "{\"rank\".*" "$out/store.log" | sed 's/^/    /' >>"$report"

# ---- sdk_build
sdk_bin=""
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
# nccl.h must be the version libtorch was built with (c10d's NCCL options embed its structs):
# pip's nvidia-nccl package first, then the CUDA toolkit's, the first whose version is torch's.
nccl_include=$("$python" - <<'EOF' 2>"$out/nccl_headers.log"
import glob, os, re, sys
import torch
want = tuple(torch.cuda.nccl.version()) if torch.cuda.is_available() else None
found = []
try:
    import nvidia
    for root in nvidia.__path__:
        found += glob.glob(os.path.join(root, "**", "include", "nccl.h"), recursive=True)
except ImportError:
    pass
found += glob.glob("/usr/local/cuda/include/nccl.h") + glob.glob("/usr/include/nccl.h")
for header in found:
    text = open(header).read()
    version = tuple(int(re.search(rf"#define NCCL_{part}\s+(\d+)", text).group(1))
                    for part in ("MAJOR", "MINOR", "PATCH"))
    print(f"{header}: NCCL {'.'.join(map(str, version))}", file=sys.stderr)
    if want is None or version == want:
        print(os.path.dirname(header))
        break
EOF
)
torch_include=$(dirname "$(dirname "$torch_prefix")")/include
gloo_from="libtorch's own"
[ -f "$torch_include/gloo/algorithm.h" ] || gloo_from="Debian's libgloo-dev (libtorch ships none)"
cmake_args=(-G Ninja -DDDPRUN_SDK_ONLY=ON -DCMAKE_BUILD_TYPE=Release -DDDPRUN_WERROR=OFF
  "-DCMAKE_PREFIX_PATH=$torch_prefix;$bundle/prefix" -DCMAKE_POLICY_VERSION_MINIMUM=3.5
  "-DCMAKE_CXX_FLAGS=-idirafter $bundle/gloo/include")
[ -n "$nccl_include" ] && cmake_args+=("-DDDPRUN_NCCL_INCLUDE_DIR=$nccl_include")
if command -v nvcc >/dev/null; then
  cmake_args+=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")"
               "-DCMAKE_CUDA_COMPILER=$(command -v nvcc)")
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
fi
say "- sdk_build: libtorch from \`$torch_prefix\`; nccl.h from \`${nccl_include:-nowhere with the NCCL version of torch}\`; gloo headers: $gloo_from"
sed 's/^/    /' "$out/nccl_headers.log" >>"$report"
if [ -n "$sdk_build" ]; then
  # Configure only (the CMake path of an SDK-only build), and take the programs from DIR.
  if part sdk_build 300 bash -c 'cmake -S "$1" -B "$2" "${@:3}" && cmake --build "$2" --target ddprun_sdk_core' \
       _ "$src" "$work/sdk" "${cmake_args[@]}"; then
    sdk_bin=$sdk_build/bin
  fi
else
  if part sdk_build 420 bash -c 'cmake -S "$1" -B "$2" "${@:3}" &&
       cmake --build "$2" --target ddp_train send_recv ddprun-snapshot -- -j "$(nproc)"' \
       _ "$src" "$work/sdk" "${cmake_args[@]}"; then
    sdk_bin=$work/sdk/bin
  fi
  grep -sE "^-- ddprun worker SDK" "$out/sdk_build.log" | sed 's/^-- /    /' >>"$report"
  if [ -f "$out/sdk_build.log" ]; then
    say "    compiler warnings: $(grep -c "warning:" "$out/sdk_build.log") (listed in sdk_build.log)"
  fi
fi

# ---- sdk_gpu: CPU against GPU, and a GPU kill-and-resume
if [ -z "$sdk_bin" ] && wanted sdk_gpu; then
  skip sdk_gpu "no SDK build"
else
  devices=cpu
  [ $gpu -eq 1 ] && devices="cpu cuda"
  part sdk_gpu 240 bash -c '
    set -e
    ddprun=$1 bin=$2 work=$3 devices=$4 python=$5
    cd "$work"
    for d in $devices; do
      "$ddprun" --standalone --nproc_per_node 1 --no_python "$bin/ddp_train" 6 1 --device $d \
        --dump_params "$work/whole.$d" > "$work/whole.$d.out" 2>&1
      "$ddprun" --standalone --nproc_per_node 1 --max_restarts 1 --no_python "$bin/ddp_train" 6 1 \
        --device $d --snapshot_path "$work/snap.$d" --fail_rank 0 --fail_epoch 3 --fail_kill \
        --dump_params "$work/resumed.$d" > "$work/resumed.$d.out" 2>&1
      cat "$work/whole.$d.out" "$work/resumed.$d.out"
    done
    "$python" - "$work" $devices <<"EOF"
import array, re, sys
work, devices = sys.argv[1], sys.argv[2:]
def params(name):
    a = array.array("f")
    with open(f"{work}/{name}.rank0", "rb") as f:
        a.frombytes(f.read())
    return a
def losses(name):
    return [float(m) for m in re.findall(r"Epoch \d+ .*Loss: ([0-9.]+)", open(f"{work}/{name}.out").read())]
ok = True
for d in devices:
    same = params(f"whole.{d}") == params(f"resumed.{d}")
    resumed = "Resuming training from snapshot at Epoch 3" in open(f"{work}/resumed.{d}.out").read()
    whole = losses("whole." + d)
    print(f"{d}: losses by epoch {whole}")
    print(f"{d}: killed in epoch 3 and resumed from the epoch-3 snapshot: {resumed}; final "
          f"parameters identical to the uninterrupted run: {same}")
    ok = ok and same and resumed
if "cuda" in devices:
    c, g = params("whole.cpu"), params("whole.cuda")
    diff = max(abs(a - b) for a, b in zip(c, g))
    lc, lg = losses("whole.cpu"), losses("whole.cuda")
    rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(lc, lg))
    print(f"GPU against CPU after 6 epochs: largest parameter difference {diff:.3g}, "
          f"largest relative loss difference {rel:.3g} (float32 sums in another order)")
    ok = ok and len(lc) == len(lg) == 6 and rel < 1e-2
sys.exit(0 if ok else 1)
EOF' _ "$ddprun" "$sdk_bin" "$work" "$devices" "$python"
  grep -sE "^(cpu|cuda|GPU against)" "$out/sdk_gpu.log" | sed 's/^/    /' >>"$report"
fi

# ---- recovery: ddprun against the machine's torchrun
rec_args=(--ddprun "$ddprun" --python "$python" --nproc 1 --settle 1.0 --markdown)
if "$python" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
  rec_args+=(--torchrun module)
else
  rec_args+=(--torchrun shim)  # Debian 12's torchrun 1.13 needs the shim on Python 3.11
fi
# --standby_cuda (docs/usage.md): standbys that made their GPU ready while they waited.
series=ddprun-python-standby,ddprun-python-standby-context
[ $gpu -eq 1 ] && series+=,ddprun-python-standby-warm
series+=,ddprun-python,torchrun-python
[ -n "$sdk_bin" ] && { rec_args+=(--ddp_train "$sdk_bin/ddp_train"); series+=,ddprun-cpp-standby; }
[ -n "$recovery_series" ] && series=$recovery_series
series_count=$(tr ',' '\n' <<<"$series" | grep -c .)
# On a GPU a run takes 10 to 15 s: 3 runs of up to 4 series, else 2, keep the whole default
# check (the steps part comes after this one) within its 480 s.
runs=${recovery_runs:-$([ $gpu -eq 1 ] && { [ "$series_count" -le 4 ] && echo 3 || echo 2; } || echo 1)}
if [ $gpu -eq 1 ]; then
  part recovery $(( 30 * runs * series_count )) "$python" "$src/bench/recovery_bench.py" "${rec_args[@]}" --device cuda --runs "$runs" --series "$series"
else
  part recovery $(( 30 * runs * series_count )) "$python" "$src/bench/recovery_bench.py" "${rec_args[@]}" --device cpu --runs "$runs" --series "$series"
fi
sed -n '/^Measured/,/^Memory of a waiting Python zygote/p' "$out/recovery.log" >>"$report" 2>/dev/null

# ---- steps: the SDK against PyTorch DDP
if [ -z "$sdk_bin" ] && wanted steps; then
  skip steps "no SDK build"
else
  steps_args=(--ddprun "$ddprun" --ddp_train "$sdk_bin/ddp_train" --python "$python" --nproc 1)
  if [ $gpu -eq 1 ]; then
    part steps 200 bash -c '"$1" "$2" "${@:3}" --device cuda --epochs 8 --repeats 3 &&
      "$1" "$2" "${@:3}" --device cuda --epochs 8 --repeats 2 --hidden 1024 --batch_size 512 --dataset_size 65536' \
      _ "$python" "$src/bench/train_bench.py" "${steps_args[@]}"
  else
    part steps 200 "$python" "$src/bench/train_bench.py" "${steps_args[@]}" --device cpu --epochs 3 --repeats 1
  fi
  sed -n '/^Measured/,/^Ratio/p' "$out/steps.log" >>"$report" 2>/dev/null
fi

say ""
say "Took $(( $(date +%s) - started )) s; logs beside this report in $out."
rm -rf --one-file-system "$work"
echo "device_check: report in $report" >&2
cat "$report"
exit $failed
