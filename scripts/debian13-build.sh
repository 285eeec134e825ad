#!/usr/bin/env bash
# Builds ddprun inside the Debian 13 root (scripts/debian13-root.sh): GCC 14, Boost 1.83,
# Catch2 3 and libtorch 2.6 with Gloo, so with the worker SDK, its examples and every test
# binary; warnings are errors. The build directory is build-debian13/ in this checkout
# (git-ignored), configured and built inside the root by scripts/debian13-run.sh, so its paths
# are the same inside and out. Then, for example:
#
#   scripts/debian13-run.sh ctest --test-dir build-debian13 -L 'sdk|python'
#
# Extra arguments go to cmake's configure step. Honours $DDPRUN_DEBIAN13_ROOT, $JOBS and
# $TARGETS (the targets to build, separated by spaces; all by default).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}

# Compiles go through the root's ccache, its cache kept in the root (/var/cache/ccache), so a
# later build on this machine recompiles only what changed, from any checkout (paths hashed
# relative to it). DDPRUN_CCACHE=0 turns it off.
launcher=()
cache_env=()
if [ "${DDPRUN_CCACHE:-1}" != 0 ]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cache_env=(env CCACHE_DIR=/var/cache/ccache CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
    CCACHE_MAXSIZE=4G)
else
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=)
fi
# SDK ON, not AUTO: a root whose libtorch cannot be found is an error here, not a build that
# quietly leaves the SDK out.
scripts/debian13-run.sh cmake -S . -B build-debian13 -G Ninja -DDDPRUN_BUILD_TESTS=ON \
  -DDDPRUN_BUILD_SDK=ON -DDDPRUN_WERROR=ON "${launcher[@]}" "$@"
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
if [ ${#cache_env[@]} -gt 0 ]; then scripts/debian13-run.sh "${cache_env[@]}" ccache -z >/dev/null; fi
scripts/debian13-run.sh "${cache_env[@]}" cmake --build build-debian13 -j"$jobs" "${targets[@]}"
if [ ${#cache_env[@]} -gt 0 ]; then
  scripts/debian13-run.sh "${cache_env[@]}" ccache -s | grep -E 'Hits|Misses' || true
fi
