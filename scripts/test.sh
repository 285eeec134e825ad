#!/usr/bin/env bash
# Installs ddprun's dependencies, builds it twice (plain, and with AddressSanitizer and
# UBSan) and runs the whole test suite in both builds. This is what CI runs. The plain build
# includes the libtorch worker SDK and its tests (label sdk); the sanitizer build leaves the
# libtorch part out (docs/sdk.md) but runs the SDK's libtorch-free unit tests. Then a Release
# build with clang (no SDK, no tests: it must compile warning-free), the libFuzzer targets for
# a bounded time (scripts/fuzz.sh), and the second platform: ddprun built in a Debian 13 root
# (scripts/debian13-root.sh) with torch 2.6, and its sdk and python tests run there. Warnings
# are errors in every build here (DDPRUN_WERROR=ON). The plain build's tests include the Debian
# packages (label package: packed, unpacked and checked, about two minutes with the SDK's
# out-of-tree build; not a stage of their own). Each stage's time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

timings=()
stage_started=$SECONDS
stage_name=""
# Starts a stage: closes the previous one's timing and prints a header.
stage() {
  if [ -n "$stage_name" ]; then timings+=("$(printf '%5d s  %s' $((SECONDS - stage_started)) "$stage_name")"); fi
  stage_name="$1"
  stage_started=$SECONDS
  [ -z "$1" ] || echo "== $1 =="
}
print_timings() {
  stage ""
  echo "== stage times =="
  printf '%s\n' "${timings[@]}"
  echo "$(printf '%5d s' "$SECONDS")  in all"
}
trap print_timings EXIT

stage "install dependencies"
bash scripts/install-deps.sh

# Every Debian 12 build below (plain, sanitizers, clang, fuzzers) compiles through ccache, with
# its cache kept outside the checkout like the Debian 13 root: a later run on the same machine
# recompiles only what changed (CMake reads the launcher from the environment at configure
# time). Paths are hashed relative to the checkout, so two clones share the cache. A cold cache
# costs a few per cent; `ccache -s` at the end says how it went. DDPRUN_CCACHE=0 turns it off.
if [ "${DDPRUN_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_DIR=${CCACHE_DIR:-/var/cache/ddprun/ccache}
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  mkdir -p "$CCACHE_DIR"
  ccache -z >/dev/null
fi

stage "build (RelWithDebInfo)"
# Options forced on every configure: a build/ the demo configured (tests off) gets them back.
cmake -S . -B build -G Ninja -DDDPRUN_BUILD_TESTS=ON -DDDPRUN_BUILD_SDK=AUTO -DDDPRUN_WERROR=ON
cmake --build build -j"$jobs"
stage "tests (plain build)"
# One run for every label, in parallel; ctest's "Label Time Summary" gives each label's time.
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs")

stage "build (AddressSanitizer + UBSan)"
cmake -S . -B build-asan -G Ninja -DDDPRUN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DDDPRUN_BUILD_TESTS=ON -DDDPRUN_WERROR=ON
cmake --build build-asan -j"$jobs"
# The Python and SLURM tests run once, in the plain build: they drive the same ddprun code
# through torch or slurmd, which would only be slower under the sanitizers. So do the tests
# labelled plain-only (tests/CMakeLists.txt says why each); smaller cases of the same code run
# in both builds.
stage "launcher, agent, rendezvous and SDK-core tests under ASan/UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --no-tests=error -j"$jobs" -LE 'python|slurm|plain-only')

stage "build (Release, clang 14, no SDK)"
cmake -S . -B build-clang -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Release \
  -DDDPRUN_BUILD_SDK=OFF -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_WERROR=ON
cmake --build build-clang -j"$jobs"

stage "fuzzers (clang, ASan/UBSan), about 40 s each, $jobs at a time"
bash scripts/fuzz.sh
if [ -n "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then ccache -s | grep -E 'Hits|Misses' || true; fi

# The second platform: Debian 13's torch 2.6, Python 3.13, GCC 14 and Catch2 3, in a root kept
# in /var/cache/ddprun (made once per machine, in about two minutes; then reused). Its build has
# the worker SDK on libtorch 2.6; the tests that involve torch run there: the sdk label and the
# python label (the launcher's compatibility, standbys and the zygote, the agent store, DDP
# resume; docs-python matches it too). The rest of the suite is the same C++ on both platforms.
stage "Debian 13, torch 2.6: the root"
bash scripts/debian13-root.sh
stage "Debian 13, torch 2.6: build"
# Inside the root, through the root's own ccache (scripts/debian13-build.sh).
unset CMAKE_CXX_COMPILER_LAUNCHER
# What the two labels run (and what those need, by add_dependencies): ddprun's libraries are
# all compiled with GCC 14 that way; the other test programs are not built here.
JOBS=$jobs TARGETS="compat_tests sdk_tests sdk_training_tests docs_tests" \
  bash scripts/debian13-build.sh
stage "Debian 13, torch 2.6: tests labelled sdk and python"
bash scripts/debian13-run.sh ctest --test-dir build-debian13 --output-on-failure \
  --no-tests=error -j"$jobs" -L 'sdk|python'
stage ""
