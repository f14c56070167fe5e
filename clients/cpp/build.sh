#!/usr/bin/env bash
# Builds ladder-cpp (the C++ client) without root: uses the system's gRPC C++ packages when they are
# installed, otherwise downloads the Debian packages with `apt-get download`, unpacks them with
# `dpkg -x` under a cache directory and builds against that prefix (the binary gets an rpath to it).
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
APT_OPTS=()

unobtainable() {
  echo "build.sh: cannot obtain gRPC C++: $*" >&2
  echo "build.sh: install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler pkg-config" >&2
  exit 3
}

have_system_packages() {
  command -v protoc >/dev/null && command -v grpc_cpp_plugin >/dev/null && command -v pkg-config >/dev/null \
    && pkg-config --exists grpc++ protobuf
}

# Apt's package lists may be absent (slim images clear them): then read our own copy, fetched without root.
use_private_lists_if_needed() {
  apt-cache show libgrpc++-dev >/dev/null 2>&1 && return 0
  mkdir -p "$DEPS/apt/lists/partial" "$DEPS/apt/cache/archives/partial"
  APT_OPTS=(-o "Dir::State::Lists=$DEPS/apt/lists" -o "Dir::Cache=$DEPS/apt/cache" -o Debug::NoLocking=1)
  echo "build.sh: no apt package lists here; fetching a private copy into $DEPS/apt" >&2
  apt-get "${APT_OPTS[@]}" -qq update >&2 || unobtainable "apt-get update failed (no network?)"
}

# The packages and everything they depend on that dpkg does not already have installed.
missing_packages() {
  local name
  apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "$@" | grep -v -e '^ ' -e '^<' -e ':' | sort -u |
    while read -r name; do
      dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q 'ok installed' || echo "$name"
    done
}

unpack_packages() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || unobtainable "no apt-get/dpkg (not Debian)"
  use_private_lists_if_needed
  local wanted=("${PACKAGES[@]}")
  command -v pkg-config >/dev/null || wanted+=(pkgconf)
  local missing
  missing="$(missing_packages "${wanted[@]}")" || unobtainable "apt-cache cannot resolve ${wanted[*]}"
  rm -rf "$DEPS/debs" "$DEPS/root"
  mkdir -p "$DEPS/debs" "$DEPS/root"
  echo "build.sh: downloading $(echo "$missing" | wc -l) Debian packages into $DEPS/debs" >&2
  # shellcheck disable=SC2086  # one package name per word
  (cd "$DEPS/debs" && apt-get "${APT_OPTS[@]}" -qq download $missing >&2) \
    || unobtainable "apt-get download failed (no network?)"
  for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS/root"; done
  touch "$DEPS/root/.complete"
}

# A tool from the prefix, or the system's when dpkg had it installed already (so it was not fetched).
tool() {
  if [ -x "$DEPS/root/usr/bin/$1" ]; then echo "$DEPS/root/usr/bin/$1"; else command -v "$1"; fi
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
  [ -f "$DEPS/root/.complete" ] || unpack_packages
  make_against_prefix
fi
echo "$BUILD/ladder-cpp"
