#!/usr/bin/env bash
# Installs the Debian 12 packages ddprun needs to build, test and run its demo, and debootstrap,
# which makes the Debian 13 root of the torch 2.6 tests (scripts/debian13-root.sh), and ccache,
# which scripts/test.sh compiles through, lintian, which checks the Debian packages, and
# patchelf, with which scripts/device_bundle.sh makes ddprun find its bundled libraries.
# Idempotent: packages already present are skipped by apt-get; safe to run again.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libboost-system-dev libboost-filesystem-dev
  libssl-dev openssl nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev catch2
  libtorch-dev libgloo-dev python3-torch python3-numpy
  procps iproute2 time clang-format groff-base man-db clang-14 libclang-rt-14-dev
  systemd dpkg-dev lintian
  prometheus-cpp-dev prometheus chromium
  elfutils gdb
  slurmctld slurmd slurm-client munge
  etcd-server etcd-client
  debootstrap ccache patchelf
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
