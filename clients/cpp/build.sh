#!/usr/bin/env bash
# Builds ladder-cpp (the C++ client) without root: uses the system's gRPC C++ packages when they are
# installed, otherwise downloads the Debian packages with `apt-get download`, unpacks them with
# `dpkg -x` under a cache directory (scripts/debian-fetch.sh) and builds against that prefix (the
# binary gets an rpath to it).
#
#   clients/cpp/build.sh [BUILD_DIR]      # default clients/cpp/build; prints the binary's path
#
# LADDER_CPP_DEPS: where the packages are cached (default ~/.cache/ladder/cpp-deps).
# Exit 3 when the packages cannot be obtained (not Debian, no apt lists reachable, no network, no g++);
# any other failure is the build's own.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(mkdir -p "${1:-$HERE/build}" && cd "${1:-$HERE/build}" && pwd)"
DEPS="${LADDER_CPP_DEPS:-$HOME/.cache/ladder/cpp-deps}"
PACKAGES=(libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler)
# shellcheck source=../../scripts/debian-fetch.sh
source "$HERE/../../scripts/debian-fetch.sh"

unobtainable() {
  echo "build.sh: cannot obtain gRPC C++: $*" >&2
  echo "build.sh: install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler pkg-config" >&2
  exit 3
}

have_system_packages() {
  command -v protoc >/dev/null && command -v grpc_cpp_plugin >/dev/null && command -v pkg-config >/dev/null \
    && pkg-config --exists grpc++ protobuf
}

unpack_packages() {
  local wanted=("${PACKAGES[@]}")
  command -v pkg-config >/dev/null || wanted+=(pkgconf)
  debian_fetch "${wanted[@]}"
  debian_mark_fetched "${PACKAGES[@]}"
}

make_against_prefix() {
  local root="$DEPS/root" triplet
  triplet="$(gcc -dumpmachine)"
  local lib="$root/usr/lib/$triplet"
  local pkg_config
  pkg_config="$(command -v pkg-config || tool pkgconf)"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$lib/pkgconfig:$root/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$root"
  # DT_RPATH, not RUNPATH: libgrpc must find its own dependencies (libupb, libre2, ...) in the prefix too.
  make -s -C "$HERE" BUILD="$BUILD" PROTOC="$(tool protoc)" GRPC_CPP_PLUGIN="$(tool grpc_cpp_plugin)" \
    PKG_CONFIG="$pkg_config" EXTRA_LDFLAGS="-Wl,--disable-new-dtags,-rpath,$lib" >&2
}

command -v g++ >/dev/null && command -v make >/dev/null || unobtainable "no g++/make (install build-essential)"
if have_system_packages; then
  make -s -C "$HERE" BUILD="$BUILD" >&2
else
  debian_fetched "${PACKAGES[@]}" || unpack_packages
  make_against_prefix
fi
echo "$BUILD/ladder-cpp"
