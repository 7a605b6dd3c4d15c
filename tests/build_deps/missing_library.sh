#!/usr/bin/env bash
# A required library that CMake cannot find stops the configure with its name, where
# CMake looked and the variable to set.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=(-S "$RD_SOURCE_DIR" -DRESNET_DDP_CUDA=OFF -DRESNET_DDP_TESTS=OFF)

# configure_fails NAME EXPECTED... [-- CMAKE ARGS]: the configure fails and prints each EXPECTED.
configure_fails() {
  local name=$1 rc=0
  shift
  local expected=()
  while [ "$1" != -- ]; do expected+=("$1"); shift; done
  shift
  "$RD_CMAKE" "${base[@]}" -B "$work/$name" "$@" >"$work/$name.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || { cat "$work/$name.log"; fail "$name: configure succeeded"; }
  # CMake wraps its messages: compare with the line breaks and indentation removed.
  local text
  text=$(tr -s ' \n' ' ' <"$work/$name.log")
  for e in "${expected[@]}"; do
    grep -q -F -- "$e" <<<"$text" || { cat "$work/$name.log"; fail "$name: no '$e'"; }
  done
  echo "ok: $name"
}

configure_fails hdf5 "resnet_ddp: HDF5 (C library) not found (needed for checkpoints" "Looked in: CMAKE_PREFIX_PATH=" \
  "set HDF5_ROOT=<prefix>" "spack load" -- -DCMAKE_DISABLE_FIND_PACKAGE_HDF5=ON
# No pkg-config module anywhere: libjpeg-turbo is the first one asked for.
PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH='' configure_fails libjpeg \
  "resnet_ddp: libjpeg-turbo (pkg-config module libjpeg) not found (needed for JPEG decoding)" "PKG_CONFIG_PATH=''" \
  "add <prefix>/lib/pkgconfig to PKG_CONFIG_PATH" --
# An optional library asked for with ON is required.
RD_PKG_HIDE=libtiff-4 configure_fails tiff_on \
  "resnet_ddp: libtiff >= 4.5 (pkg-config module libtiff-4) not found (needed for RESNET_DDP_TIFF=ON" -- \
  -DRESNET_DDP_TIFF=ON "-DPKG_CONFIG_EXECUTABLE=$RD_SOURCE_DIR/tests/build_deps/pkg_config_without.sh"
