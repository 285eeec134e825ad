#!/usr/bin/env bash
# Makes the bundle that scripts/device_check.sh takes to a GPU machine which has pip's torch,
# CMake and a compiler but none of Debian's packages:
#
#   scripts/device_bundle.sh [BUILD_DIR] [BUNDLE_DIR]      (defaults: build, .device-bundle)
#
#   BUNDLE_DIR/bin/ddprun, ddprun-rdzvd     from BUILD_DIR, stripped, finding their libraries in
#   BUNDLE_DIR/lib/                          the shared libraries they need beyond glibc and
#                                            GCC's runtime (spdlog, fmt, prometheus-cpp), each
#                                            finding the others beside it ($ORIGIN)
#   BUNDLE_DIR/share/ddprun/ddprun_standby.py  the Python standby bootstrap ddprun looks for there
#   BUNDLE_DIR/prefix/                       Debian's nlohmann_json and CLI11 (headers and CMake
#                                            files), which the worker SDK and its examples need
#
# The SDK itself is built on the GPU machine from the checkout, against that machine's libtorch.
# Debian 12's binaries run on a newer glibc and libstdc++ (the GPU machine's image is newer).
# Needs patchelf. Replaces BUNDLE_DIR.
set -euo pipefail

src=$(realpath "$(dirname "$0")/..")
build=$(realpath "${1:-$src/build}")
bundle=$(realpath -m "${2:-$src/.device-bundle}")
command -v patchelf >/dev/null || { echo "device_bundle: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
for f in bin/ddprun bin/ddprun-rdzvd share/ddprun/ddprun_standby.py; do
  [ -f "$build/$f" ] || { echo "device_bundle: $build/$f is missing: build ddprun first" >&2; exit 1; }
done

rm -rf --one-file-system "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/share/ddprun" "$bundle/prefix"

# Libraries every glibc system with a C++ compiler has; everything else ldd names travels.
system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.'
for exe in ddprun ddprun-rdzvd; do
  cp "$build/bin/$exe" "$bundle/bin/$exe"
  chmod u+w "$bundle/bin/$exe"
  strip --strip-unneeded "$bundle/bin/$exe"
  ldd "$build/bin/$exe" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $system_lib ]] && [ ! -e "$bundle/lib/$name" ]; then
      cp -L "$path" "$bundle/lib/$name"
    fi
  done
  patchelf --set-rpath '$ORIGIN/../lib' "$bundle/bin/$exe"
done
for lib in "$bundle"/lib/*; do
  chmod u+w "$lib"
  strip --strip-unneeded "$lib"
  patchelf --set-rpath '$ORIGIN' "$lib"
done
cp "$build/share/ddprun/ddprun_standby.py" "$bundle/share/ddprun/"

# Header-only libraries, from their Debian packages' files: their CMake files find the headers
# relative to themselves, so the prefix can live anywhere.
for pkg in nlohmann-json3-dev libcli11-dev; do
  dpkg-query -L "$pkg" | while read -r f; do
    case $f in
      /usr/include/* | /usr/share/cmake/* | /usr/lib/cmake/* | /usr/share/pkgconfig/*)
        if [ -f "$f" ]; then
          mkdir -p "$bundle/prefix/$(dirname "${f#/usr/}")"
          cp "$f" "$bundle/prefix/${f#/usr/}"
        fi ;;
    esac
  done
done

# Gloo's headers (libgloo-dev), for a libtorch that ships none: device_check.sh searches them
# after libtorch's own (-idirafter), since c10d's Gloo group includes them.
dpkg-query -L libgloo-dev | grep '^/usr/include/gloo/.*\.h$' | while read -r f; do
  mkdir -p "$bundle/gloo/$(dirname "${f#/usr/}")"
  cp "$f" "$bundle/gloo/${f#/usr/}"
done

echo "device_bundle: $bundle ($(du -sh "$bundle" | cut -f1)): $(ls "$bundle/lib" | tr '\n' ' ')"
