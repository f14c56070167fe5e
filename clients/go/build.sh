#!/usr/bin/env bash
# Builds ladder-go (the Go example client) without root and without the Go module proxy: uses the
# system's Go and Debian's packaged Go sources (/usr/share/gocode) when they are installed, otherwise
# downloads Debian's packages with `apt-get download`, unpacks them with `dpkg -x` under a cache
# directory (scripts/debian-fetch.sh) and builds in GOPATH mode against that prefix (GO111MODULE=off:
# Debian packages Go libraries as GOPATH sources, not as modules).
#
#   clients/go/build.sh [BUILD_DIR]          # default clients/go/build; prints the binary's path
#   clients/go/build.sh --generate [OUT]     # regenerates ladder/v1/*.pb.go into OUT (default clients/go)
#
# LADDER_GO_DEPS: where the packages are cached (default ~/.cache/ladder/go-deps).
# Exit 3 when the packages cannot be obtained (not Debian, no apt lists reachable, no network);
# any other failure is the build's own.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PROTO_ROOT="$(cd "$HERE/../../proto" && pwd)"
MODULE=github.com/ladder-serve/ladder/clients/go
DEPS="${LADDER_GO_DEPS:-$HOME/.cache/ladder/go-deps}"
# golang-go is Go 1.19 on Debian 12; protoc-gen-go is google.golang.org/protobuf's (>= 1.20 reads
# proto3 `optional`; golang-goprotobuf-dev's 1.3 refuses the file); protoc-gen-go-grpc is grpc-go's.
PACKAGES=(golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-google-genproto-dev
          protobuf-compiler protoc-gen-go protoc-gen-go-grpc)
# shellcheck source=../../scripts/debian-fetch.sh
source "$HERE/../../scripts/debian-fetch.sh"
# Of a dependency's alternatives apt-cache lists them all: github.com/golang/protobuf 1.3 and 1.5
# share a directory (dpkg would refuse the pair), and grpc-go 1.33 wants 1.5 (APIv2-backed), so 1.3 goes.
DEBIAN_EXCLUDE=(golang-github-golang-protobuf-1-3-dev golang-goprotobuf-dev)
GENERATE=""
if [ "${1:-}" = "--generate" ]; then
  GENERATE="$(mkdir -p "${2:-$HERE}" && cd "${2:-$HERE}" && pwd)"
else
  BUILD="$(mkdir -p "${1:-$HERE/build}" && cd "${1:-$HERE/build}" && pwd)"
fi

unobtainable() {
  echo "build.sh: cannot obtain Go and grpc-go: $*" >&2
  echo "build.sh: install ${PACKAGES[*]}" >&2
  exit 3
}

have_system_packages() {
  command -v go >/dev/null && command -v protoc >/dev/null && command -v protoc-gen-go >/dev/null \
    && command -v protoc-gen-go-grpc >/dev/null \
    && [ -d /usr/share/gocode/src/google.golang.org/grpc ] \
    && [ -d /usr/share/gocode/src/google.golang.org/genproto/googleapis/rpc/errdetails ] \
    && [ -d /usr/share/gocode/src/google.golang.org/protobuf ]
}

unpack_packages() {
  debian_fetch "${PACKAGES[@]}"
  debian_mark_fetched "${PACKAGES[@]}"
}

if ! have_system_packages; then
  debian_fetched "${PACKAGES[@]}" || unpack_packages
  export LD_LIBRARY_PATH="$DEPS/root/usr/lib/$(uname -m)-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [ -n "$GENERATE" ]; then
  # The command docs/clients.md gives, with Debian's plugins: paths=source_relative puts the files
  # at ladder/v1/ (the .proto's path), which is the package go_package names.
  "$(tool protoc)" -I "$PROTO_ROOT" \
    --plugin=protoc-gen-go="$(tool protoc-gen-go)" --plugin=protoc-gen-go-grpc="$(tool protoc-gen-go-grpc)" \
    --go_out="$GENERATE" --go_opt=paths=source_relative \
    --go-grpc_out="$GENERATE" --go-grpc_opt=paths=source_relative \
    ladder/v1/ladder.proto
  echo "$GENERATE/ladder/v1"
  exit 0
fi

# GOPATH mode: the module's directory appears at its import path in a GOPATH of its own, beside
# Debian's sources; no network (GOPROXY=off), no cgo (no C compiler needed).
mkdir -p "$BUILD/gopath/src/$(dirname "$MODULE")"
ln -sfn "$HERE" "$BUILD/gopath/src/$MODULE"
GO="$(tool go)"
GOPATH="$BUILD/gopath:$DEPS/root/usr/share/gocode:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS= \
  CGO_ENABLED=0 GOCACHE="$BUILD/cache" "$GO" build -o "$BUILD/ladder-go" "$MODULE/cmd/ladder-go" >&2
echo "$BUILD/ladder-go"
