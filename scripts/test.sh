#!/usr/bin/env bash
# Installs ddprun's dependencies, builds it twice (plain, and with AddressSanitizer and
# UBSan) and runs the whole test suite in both builds. This is what CI runs. The plain build
# includes the libtorch worker SDK and its tests (label sdk); the sanitizer build leaves the
# libtorch part out (docs/sdk.md) but runs the SDK's libtorch-free unit tests. Then the
# libFuzzer targets run for a bounded time (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install-deps.sh

echo "== build (RelWithDebInfo) =="
# Options forced on every configure: a build/ the demo configured (tests off) gets them back.
cmake -S . -B build -G Ninja -DDDPRUN_BUILD_TESTS=ON -DDDPRUN_BUILD_SDK=AUTO
cmake --build build -j"$jobs"
echo "== tests =="
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs")

echo "== build (AddressSanitizer + UBSan) =="
cmake -S . -B build-asan -G Ninja -DDDPRUN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DDDPRUN_BUILD_TESTS=ON
cmake --build build-asan -j"$jobs"
# The Python and SLURM tests run once, in the plain build: they drive the same ddprun code
# through torch or slurmd, which would only be slower under the sanitizers. So do the tests
# labelled plain-only (tests/CMakeLists.txt says why each); smaller cases of the same code run
# in both builds.
echo "== launcher, agent, rendezvous and SDK-core tests under ASan/UBSan =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --no-tests=error -j"$jobs" -LE 'python|slurm|plain-only')

echo "== fuzzers (clang, ASan/UBSan), about 40 s each =="
bash scripts/fuzz.sh
