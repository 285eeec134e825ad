#!/usr/bin/env bash
# Makes a Debian 13 (trixie) root with torch 2.6 and what ddprun needs to build and run its
# sdk and python tests there (scripts/debian13-build.sh): debootstrap minbase, then the packages
# below with apt-get inside the root. Nothing but Debian packages is downloaded.
#
#   scripts/debian13-root.sh [DIR]     (default $DDPRUN_DEBIAN13_ROOT or
#                                       /var/cache/ddprun/debian13-root)
#
# The root lives outside any checkout, so CI on the same machine makes it once (about 1.7 GB).
# Idempotent: a complete root whose package list is the one below is left as it is, in well
# under a second. A half-made root is finished or remade:
#   - debootstrap works in DIR.partial and renames it to DIR only when it succeeded, so any
#     DIR.partial is a debootstrap that did not finish: it is removed and made again;
#   - DIR without DIR/.ddprun-complete (or with another package list in it) had its packages
#     interrupted or the list changed: dpkg --configure -a, then apt-get install the list.
# Needs root (debootstrap, chroot) and debootstrap (scripts/install-deps.sh).
set -euo pipefail

root=${1:-${DDPRUN_DEBIAN13_ROOT:-/var/cache/ddprun/debian13-root}}
mirror=${DDPRUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(realpath -m "$root")
partial="$root.partial"
stamp="$root/.ddprun-complete"

# Only what the build (CMakeLists.txt's find_package calls, with the SDK) and the sdk, python
# and docs-python tests use; no etcd, SLURM, Chromium or clang (those stages run on Debian 12).
packages=(
  g++ cmake ninja-build pkgconf
  libboost-dev libboost-system-dev libboost-filesystem-dev
  libssl-dev openssl nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libcatch2-dev
  prometheus-cpp-dev
  libtorch-dev libgloo-dev python3-torch python3-numpy
  procps iproute2 file ccache
)
wanted="${packages[*]}"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "debian13-root: $root is complete"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || { echo "debian13-root: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || {
  echo "debian13-root: debootstrap is missing: run scripts/install-deps.sh" >&2; exit 1; }
mkdir -p "$(dirname "$root")"

# One maker at a time: a second CI run waits here, then finds the root complete.
exec 9>"$root.lock"
flock 9
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "debian13-root: $root is complete"
  exit 0
fi

# Removes a root nothing is mounted below: mounts live only in the private namespaces of
# in_root (below), which end with their command, so one here means something else is wrong.
remove_root() {
  local below
  below=$(findmnt -rn -o TARGET | awk -v r="$1" '$0 == r || index($0, r "/") == 1')
  if [ -n "$below" ]; then
    echo "debian13-root: not removing $1: something is mounted below it: $below" >&2
    exit 1
  fi
  rm -rf --one-file-system "$1"
}

# Runs a command in the root, with /proc and the host's resolv.conf (apt fetches from
# Debian's archive), in a mount namespace of its own: the mounts end with the command.
in_root() {
  unshare --mount --propagation private bash -c '
    set -e
    root=$1; shift
    mount -t proc proc "$root/proc"
    touch "$root/etc/resolv.conf"
    mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
    exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive "$@"' bash "$root" "$@"
}

if [ -e "$partial" ]; then
  echo "debian13-root: removing $partial, a debootstrap that did not finish"
  remove_root "$partial"
fi
if [ -e "$root" ] && [ ! -x "$root/usr/bin/apt-get" ]; then
  echo "debian13-root: $root has no apt-get: making it again"
  remove_root "$root"
fi

if [ ! -e "$root" ]; then
  echo "debian13-root: debootstrap --variant=minbase trixie $partial ($mirror)"
  started=$SECONDS
  debootstrap --variant=minbase trixie "$partial" "$mirror"
  mv "$partial" "$root"
  echo "debian13-root: base system in $((SECONDS - started)) s"
fi

started=$SECONDS
rm -f "$stamp"
# A previous run stopped inside dpkg: finish what it unpacked before installing more.
in_root dpkg --configure -a
in_root apt-get update -qq
in_root apt-get install -y -qq --no-install-recommends "${packages[@]}"
in_root apt-get clean
echo "$wanted" >"$stamp"
echo "debian13-root: packages in $((SECONDS - started)) s; $root is complete ($(du -sh --one-file-system "$root" | cut -f1))"
