#!/usr/bin/env bash
# Stock torchrun on ddprun's rendezvous (python/ddprun_rdzv): two torchrun agents on one
# ddprun-rdzvd with a shared secret and TLS form a round, restart after a worker failure, are
# listed by `ddprun status` while they train, and finish; a torchrun with the wrong secret is
# refused with a clear error. Needs torch 2.5 or later (the torchrun.handlers entry point): Debian 13's
# torch 2.6 runs it (CI's second platform); with an older torch it exits 77, which ctest counts
# as skipped, saying why.
#
#   tests/compat/torchrun_plugin_test.sh BUILD_DIR
set -euo pipefail

build=$(realpath "$1")
python=/usr/bin/python3
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! "$python" - <<'EOF'
import sys
import torch
from torch.distributed.elastic.rendezvous import registry
if not hasattr(registry, "_register_out_of_tree_handlers"):
    print(f"skipped: torch {torch.__version__} loads no torchrun.handlers plugins (torch 2.5 "
          "and later do; Debian 13's torch 2.6 runs this test)")
    sys.exit(77)
EOF
then exit 77; fi
torchrun=$(command -v torchrun) || fail "no torchrun next to $python's torch"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

(umask 077; "$python" -c 'import secrets; print(secrets.token_hex(32))' >"$work/secret")
(umask 077; "$python" -c 'import secrets; print(secrets.token_hex(32))' >"$work/other")
# A self-signed certificate for 127.0.0.1, its own CA.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null ||
  fail "openssl could not make a certificate"
chmod 600 "$work/key.pem"
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')

cat >"$work/train.py" <<'EOF'
import os
import sys
import time

import torch
import torch.distributed as dist

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
rank = int(os.environ["RANK"])
work = os.environ["PLUGIN_TEST_DIR"]
if rank == 1 and not os.path.exists(os.path.join(work, "failed_once")):
    open(os.path.join(work, "failed_once"), "w").close()
    sys.exit(3)  # the failure that makes both agents restart
dist.init_process_group("gloo")
# Both ranks are in: hold the round until the test has looked at `ddprun status`.
if rank == 0:
    open(os.path.join(work, "training"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(work, "go")) and time.monotonic() < deadline:
    time.sleep(0.1)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print(f"rank {rank} restart {restart} world {os.environ['WORLD_SIZE']} sum {total.item():g}",
      flush=True)
dist.barrier()
dist.destroy_process_group()
del total
EOF

"$build/bin/ddprun-rdzvd" --host 127.0.0.1 --port "$port" --secret_file "$work/secret" \
  --tls_cert "$work/cert.pem" --tls_key "$work/key.pem" >"$work/rdzvd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  "$python" -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null &&
    break
  sleep 0.1
done

# torch 2.6 as Debian builds it has no libuv, which its TCPStore asks for by default.
run_torchrun() {  # secret file, log; the rest: torchrun's own arguments before the script
  local secret=$1 log=$2
  shift 2
  PYTHONPATH="$build/python-site" USE_LIBUV=0 PLUGIN_TEST_DIR="$work" LOGLEVEL=INFO \
    timeout -s KILL 150 "$torchrun" --nnodes 2 --nproc_per_node 1 --rdzv_backend ddprun \
    --rdzv_endpoint "127.0.0.1:$port" --rdzv_id plugin_job --monitor_interval 0.2 \
    --rdzv_conf "secret_file=$secret,tls_ca=$work/cert.pem" "$@" "$work/train.py" >"$log" 2>&1
}
run_torchrun "$work/secret" "$work/a.log" --max_restarts 1 &
a=$!
pids+=($a)
run_torchrun "$work/secret" "$work/b.log" --max_restarts 1 &
b=$!
pids+=($b)

show() { for f in "$work"/*.log; do echo "---- $f"; tail -n 150 "$f"; done; }
for _ in $(seq 1200); do
  [ -f "$work/training" ] && break
  kill -0 "$a" 2>/dev/null || kill -0 "$b" 2>/dev/null || break
  sleep 0.1
done
[ -f "$work/training" ] || { show; fail "the restarted round never started training"; }
"$build/bin/ddprun" status --rdzv_endpoint "127.0.0.1:$port" --secret_file "$work/secret" \
  --tls_ca "$work/cert.pem" --rdzv_id plugin_job >"$work/status.txt" 2>&1 ||
  { cat "$work/status.txt"; fail "ddprun status failed"; }
touch "$work/go"
status_a=0; wait "$a" || status_a=$?
status_b=0; wait "$b" || status_b=$?
[ "$status_a" = 0 ] && [ "$status_b" = 0 ] ||
  { show; fail "torchrun exited $status_a and $status_b, not 0 and 0"; }

cat "$work/status.txt"
grep -q "plugin_job" "$work/status.txt" || fail "ddprun status does not list the job"
[ "$(grep -c "$(hostname)" "$work/status.txt")" -ge 2 ] ||
  fail "ddprun status lists fewer than two nodes of $(hostname)"
# Both ranks ran the restarted round (world 2, ranks 1 + 2 summed); torchrun counted the
# restart where the worker failed (the other node's is a membership change to torchrun), and
# the daemon formed that round.
grep -qh "rank 0 restart [01] world 2 sum 3" "$work/a.log" "$work/b.log" ||
  { show; fail "rank 0 did not finish"; }
grep -qh "rank 1 restart 1 world 2 sum 3" "$work/a.log" "$work/b.log" ||
  { show; fail "rank 1 did not finish after its restart"; }
grep -q "job 'plugin_job': round 1 complete with 2 node(s).*restart count 1" "$work/rdzvd.log" ||
  { show; fail "ddprun-rdzvd did not form the restarted round"; }

# The wrong secret: refused at once, saying so.
status=0
run_torchrun "$work/other" "$work/wrong.log" --max_restarts 0 || status=$?
[ "$status" != 0 ] || { show; fail "torchrun with the wrong secret exited 0"; }
grep -q "authentication failed: wrong secret" "$work/wrong.log" ||
  { show; fail "torchrun with the wrong secret did not say so"; }
echo "ok: two stock torchrun agents formed, restarted and finished on ddprun-rdzvd"
