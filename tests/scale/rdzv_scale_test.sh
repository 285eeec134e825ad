#!/usr/bin/env bash
# One round of 2,048 light agents on one ddprun-rdzvd (the largest CI affords beside its other
# tests): every agent gets its own group rank (exactly 0..2047, world size 2048, one round) and
# the round costs at most 2 frames per agent besides the hello (docs/design.md#rendezvous-at-scale).
# Asserts counts, never times.
#
#   tests/scale/rdzv_scale_test.sh BUILD_DIR [AGENTS]
set -euo pipefail

build=$(realpath "$1")
agents=${2:-2048}
fail() { echo "FAIL: $*" >&2; exit 1; }

work=$(mktemp -d)
daemon=""
cleanup() {
  if [[ -n $daemon ]]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The daemon on a port that was free a moment ago; it says when it listens.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$build/bin/ddprun-rdzvd" --port "$port" --host 127.0.0.1 >"$work/daemon.log" 2>&1 &
daemon=$!
listening=""
for _ in $(seq 1 100); do
  if grep -q "listening" "$work/daemon.log"; then listening=yes; break; fi
  kill -0 "$daemon" 2>/dev/null || { cat "$work/daemon.log" >&2; fail "ddprun-rdzvd exited"; }
  sleep 0.1
done
[[ -n $listening ]] || { cat "$work/daemon.log" >&2; fail "ddprun-rdzvd did not listen within 10 s"; }

set +e
"$build/bin/ddprun-rdzv-bench" --mode latency --nodes "$agents" --port "$port" --timeout 120 \
  >"$work/result.json" 2>"$work/bench.err"
rc=$?
set -e
cat "$work/result.json"
[[ $rc -eq 0 ]] || { tail -20 "$work/bench.err" >&2; fail "ddprun-rdzv-bench exited $rc"; }

/usr/bin/python3 - "$work/result.json" "$agents" <<'PY'
import json
import sys

result = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
agents = int(sys.argv[2])
problems = []
if result.get("n") != agents:
    problems.append(f"the bench ran {result.get('n')} agents, not {agents}")
if result.get("ranks_ok") is not True:
    problems.append(f"ranks are not exactly 0..{agents - 1} in one round: {result.get('problems')}")
# A Waiting answering each of the first N-1 joins, a RoundReady to each of N.
frames = result.get("frames_received", -1)
if not 0 < frames <= 2 * agents:
    problems.append(f"{frames} frames for {agents} agents: more than 2 per agent")
for p in problems:
    print("FAIL:", p, file=sys.stderr)
print(f"{agents} agents: ranks right, {frames / agents:.2f} frames per agent")
sys.exit(1 if problems else 0)
PY
