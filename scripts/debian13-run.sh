#!/usr/bin/env bash
# Runs a command inside the Debian 13 root (scripts/debian13-root.sh), in this checkout:
#
#   scripts/debian13-run.sh python3 -c 'import torch; print(torch.__version__)'
#   DDPRUN_DEBIAN13_ROOT=/other/root scripts/debian13-run.sh ctest --test-dir build-debian13
#
# The checkout is bound at its own path inside the root (so a build directory under it has the
# same paths inside and out), and /proc, /dev, /tmp and /etc/hosts are the machine's (Gloo
# resolves the host's name through /etc/hosts; without it, it would ask a DNS resolver). All
# mounts are made in a private mount namespace that ends with the command: nothing stays
# mounted in the root, and the command keeps its pid, so its exit status and signals are the
# command's. Needs root.
set -euo pipefail

root=$(realpath -m "${DDPRUN_DEBIAN13_ROOT:-/var/cache/ddprun/debian13-root}")
src=$(realpath "$(dirname "$0")/..")
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
[ -f "$root/.ddprun-complete" ] || {
  echo "debian13-run: $root is not a complete root: run scripts/debian13-root.sh first" >&2
  exit 1
}

exec unshare --mount --propagation private bash -c '
  set -e
  root=$1 src=$2; shift 2
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --bind /tmp "$root/tmp"
  touch "$root/etc/hosts"
  mount --bind /etc/hosts "$root/etc/hosts"
  mkdir -p "$root$src"
  mount --bind "$src" "$root$src"
  exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    TERM="${TERM:-dumb}" sh -c "cd \"\$0\" && exec \"\$@\"" "$src" "$@"' bash "$root" "$src" "$@"
