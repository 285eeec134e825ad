#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cpp) with clang, ASan and UBSan in build-fuzz/
# and runs each for FUZZ_SECONDS (default 40), one per CPU at a time, from its seed corpus in
# tests/fuzz/corpus/<name>.
# New inputs go to a temporary directory, never into the repository. A crash, leak, sanitizer
# report or time-out makes the script fail and leaves the input in build-fuzz/findings/.
# CI runs it from scripts/test.sh; the last lines give each target's executions per second.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-40}"
jobs=$(nproc)

cmake -S . -B build-fuzz -G Ninja -DDDPRUN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DDDPRUN_WERROR=ON >/dev/null
targets=()
for source in tests/fuzz/*_fuzz.cpp; do targets+=("$(basename "$source" .cpp)"); done
cmake --build build-fuzz -j"$jobs" --target "${targets[@]}"

mkdir -p build-fuzz/findings
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One target for $seconds: its log in build-fuzz/findings/<target>.log, its one-line summary in
# $scratch/<target>.summary; returns non-zero (and prints the log's tail) on a finding.
fuzz_one() {
  local target=$1 name=${1%_fuzz}
  local seeds="tests/fuzz/corpus/$name" log="build-fuzz/findings/$1.log"
  mkdir -p "$scratch/$name"
  echo "== fuzz: $target for ${seconds} s =="
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build-fuzz/bin/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=1100000 -print_final_stats=1 -artifact_prefix=build-fuzz/findings/"$target"- \
    "$scratch/$name" "$seeds" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $target found a problem; the input is in build-fuzz/findings/" >&2
    return 1
  fi
  local runs speed
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "$target: $runs runs, $speed exec/s, no finding" >"$scratch/$target.summary"
}

# One target per CPU at a time (each fuzzer is one process on one core).
running=()
failed=0
for target in "${targets[@]}"; do
  fuzz_one "$target" &
  running+=($!)
  if [ ${#running[@]} -ge "$jobs" ]; then
    wait "${running[0]}" || failed=1
    running=("${running[@]:1}")
  fi
done
for pid in "${running[@]}"; do wait "$pid" || failed=1; done
[ "$failed" -eq 0 ] || exit 1
for target in "${targets[@]}"; do echo "fuzz: $(cat "$scratch/$target.summary")"; done
