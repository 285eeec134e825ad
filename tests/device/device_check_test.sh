#!/usr/bin/env bash
# The GPU machine's check (scripts/device_check.sh, docs/benchmarks.md) dry-run on this machine,
# so that it still works when a GPU is at hand: the bundle made from this build, then every part
# with the GPU parts skipped, the SDK taken from this build (its SDK-only CMake configured anew).
#
#   device_check_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d /tmp/ddprun-device-test.XXXXXX)
trap 'rm -rf --one-file-system "$tmp"' EXIT

fail() { echo "device_check_test: $*" >&2; exit 1; }

# A wrong part or budget is refused before anything runs.
if out=$(bash "$src/scripts/device_check.sh" --parts store,gpus 2>&1); then fail "--parts gpus was accepted"; fi
grep -qF "unknown part gpus" <<<"$out" || fail "--parts gpus: no clear error: $out"
if out=$(bash "$src/scripts/device_check.sh" --budget soon 2>&1); then fail "--budget soon was accepted"; fi
grep -qF -- "--budget soon is not a number" <<<"$out" || fail "--budget soon: no clear error: $out"
if out=$(bash "$src/scripts/device_check.sh" --recovery-runs 0 2>&1); then fail "--recovery-runs 0 was accepted"; fi
grep -qF -- "--recovery-runs 0 is not a number of runs" <<<"$out" || fail "--recovery-runs 0: no clear error: $out"

bash "$src/scripts/device_bundle.sh" "$build" "$tmp/bundle"
for f in bin/ddprun bin/ddprun-rdzvd share/ddprun/ddprun_standby.py \
         prefix/include/nlohmann/json.hpp prefix/include/CLI/CLI.hpp; do
  [ -f "$tmp/bundle/$f" ] || fail "the bundle has no $f"
done
# The bundled launcher finds its libraries beside it, not on the system's path. (ldd's output
# is read whole first: `ldd | grep -q` under pipefail fails whenever grep stops reading early.)
libraries=$(ldd "$tmp/bundle/bin/ddprun")
grep -qF "=> $tmp/bundle/bin/../lib/libspdlog" <<<"$libraries" ||
  fail "bundled ddprun does not load its own libspdlog: $libraries"

status=0
DDPRUN_DEVICE_BUNDLE=$tmp/bundle OUT=$tmp/out PYTHON=/usr/bin/python3 \
  bash "$src/scripts/device_check.sh" --dry-run --sdk-build "$build" >"$tmp/log" 2>&1 || status=$?
report=$tmp/out/report.md
[ -f "$report" ] || { cat "$tmp/log"; fail "no report"; }
[ $status -eq 0 ] || { cat "$tmp/log"; fail "the dry run failed ($status)"; }
expect() { grep -qF -- "$1" "$report" || { cat "$report"; fail "the report lacks: $1"; }; }
expect "No GPU used (--dry-run): the GPU parts are skipped."
for p in store sdk_build sdk_gpu recovery steps; do expect "- **$p**: ok"; done
expect '"rank": 1, "torch": "'
expect '"agent_store": "True", "store": "TCPStore"'
expect '"all_reduce": "ok"'
expect "cpu: killed in epoch 3 and resumed from the epoch-3 snapshot: True; final parameters identical to the uninterrupted run: True"
expect "| ddprun-python-standby |"
expect "| ddprun-python-standby-context |"
expect "Ratio ddprun-python-standby / ddprun-python-standby-context"
expect "| ddprun-cpp-standby |"
expect "| torchrun-python |"
expect "Ratio C++ / Python"
if grep -q "^    cuda:" "$report"; then fail "a GPU result in a dry run"; fi
echo "device_check_test: dry run ok"
