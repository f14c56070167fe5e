#!/usr/bin/env bash
# Builds ladder-java (the Java example client) without root and without Maven Central: generates the
# classes from proto/ladder/v1/ladder.proto with protoc and grpc-java's plugin, compiles them and the
# example with javac against Debian's grpc-java jars, and writes a launcher script. Uses the system's
# packages when they are installed, otherwise downloads them with `apt-get download` and unpacks them
# with `dpkg -x` under a cache directory. (Users build with Maven instead: clients/java/pom.xml.)
#
#   clients/java/build.sh [BUILD_DIR]      # default clients/java/build; prints the launcher's path
#
# LADDER_JAVA_DEPS: where the packages are cached (default ~/.cache/ladder/java-deps).
# Exit 3 when the packages cannot be obtained (not Debian, no apt lists reachable, no network);
# any other failure is the build's own.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PROTO_ROOT="$(cd "$HERE/../../proto" && pwd)"
BUILD="$(mkdir -p "${1:-$HERE/build}" && cd "${1:-$HERE/build}" && pwd)"
DEPS="${LADDER_JAVA_DEPS:-$HOME/.cache/ladder/java-deps}"
# grpc-java 1.41 with its netty transport (libnetty-java) and perfmark, which libgrpc-java does not
# pull in; geronimo-annotation for javax.annotation.Generated (gone from JDK 11+), which the
# generated stub is annotated with; netty-tcnative (OpenSSL) for TLS: Debian's netty-handler has no
# JDK ALPN negotiator ("JDK provider does not support ALPN protocol"), and gRPC needs ALPN.
PACKAGES=(libgrpc-java protobuf-compiler-grpc-java-plugin libprotobuf-java libgoogle-common-protos-java
          libnetty-java libperfmark-java libguava-java libgeronimo-annotation-1.3-spec-java protobuf-compiler
          libnetty-tcnative-java libnetty-tcnative-jni)
# The jars of the classpath (from /usr/share/java, the prefix's first).
JARS=(grpc-api grpc-core grpc-context grpc-netty grpc-protobuf grpc-protobuf-lite grpc-stub protobuf
      proto-google-common-protos guava failureaccess perfmark-api geronimo-annotation-1.3-spec
      netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks netty-common
      netty-handler netty-handler-proxy netty-resolver netty-transport netty-transport-native-unix-common
      netty-tcnative)
APT_OPTS=()

unobtainable() {
  echo "build.sh: cannot obtain grpc-java: $*" >&2
  echo "build.sh: install ${PACKAGES[*]} openjdk-17-jdk-headless" >&2
  exit 3
}

have_system_packages() {
  command -v javac >/dev/null && command -v protoc >/dev/null && command -v grpc_java_plugin >/dev/null \
    && [ -f /usr/share/java/grpc-netty.jar ] && [ -f /usr/share/java/perfmark-api.jar ] \
    && [ -f /usr/share/java/geronimo-annotation-1.3-spec.jar ] && [ -f /usr/share/java/netty-tcnative.jar ] \
    && [ -f "/usr/lib/$(uname -m)-linux-gnu/jni/libnetty-tcnative.so" ]
}

# Apt's package lists may be absent (slim images clear them): then read our own copy, fetched without root.
use_private_lists_if_needed() {
  apt-cache show libgrpc-java >/dev/null 2>&1 && return 0
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
  command -v javac >/dev/null || wanted+=(openjdk-17-jdk-headless)
  local missing
  missing="$(missing_packages "${wanted[@]}")" || unobtainable "apt-cache cannot resolve ${wanted[*]}"
  rm -rf "$DEPS/debs" "$DEPS/root"
  mkdir -p "$DEPS/debs" "$DEPS/root"
  echo "build.sh: downloading $(echo "$missing" | wc -l) Debian packages into $DEPS/debs" >&2
  # shellcheck disable=SC2086  # one package name per word
  (cd "$DEPS/debs" && apt-get "${APT_OPTS[@]}" -qq download $missing >&2) \
    || unobtainable "apt-get download failed (no network?)"
  for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS/root"; done
  # Absolute links (the JDK's conf/ and security/ point into /etc/java-17-openjdk) to their copy in
  # the prefix: a system without the packages has nothing at the absolute path.
  local link target
  find "$DEPS/root" -type l | while read -r link; do
    target="$(readlink "$link")"
    case "$target" in /*) if [ -e "$DEPS/root$target" ]; then ln -sfn "$DEPS/root$target" "$link"; fi ;; esac
  done
  echo "${PACKAGES[*]}" > "$DEPS/root/.complete"  # what was fetched: another list fetches again
}

# A tool from the prefix, or the system's when dpkg had it installed already (so it was not fetched).
tool() {
  if [ -x "$DEPS/root/usr/bin/$1" ]; then echo "$DEPS/root/usr/bin/$1"; else command -v "$1"; fi
}

jdk_tool() {
  local jdk
  for jdk in "$DEPS"/root/usr/lib/jvm/java-*-openjdk-*; do
    if [ -x "$jdk/bin/$1" ]; then echo "$jdk/bin/$1"; return; fi
  done
  command -v "$1"
}

if ! have_system_packages; then
  [ "$(cat "$DEPS/root/.complete" 2>/dev/null)" = "${PACKAGES[*]}" ] || unpack_packages
  export LD_LIBRARY_PATH="$DEPS/root/usr/lib/$(uname -m)-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
classpath=""
for jar in "${JARS[@]}"; do
  for dir in "$DEPS/root/usr/share/java" /usr/share/java; do
    if [ -f "$dir/$jar.jar" ]; then classpath="$classpath${classpath:+:}$dir/$jar.jar"; break; fi
  done
done

rm -rf "$BUILD/gen" "$BUILD/classes" "$BUILD/jni"
mkdir -p "$BUILD/gen" "$BUILD/classes" "$BUILD/jni"
# netty loads libnetty_tcnative.so from java.library.path and the library checks its own file name:
# Debian's is libnetty-tcnative.so, so a copy under the name netty wants.
for dir in "$DEPS/root/usr/lib/$(uname -m)-linux-gnu/jni" "/usr/lib/$(uname -m)-linux-gnu/jni"; do
  if [ -f "$dir/libnetty-tcnative.so" ]; then cp "$dir/libnetty-tcnative.so" "$BUILD/jni/libnetty_tcnative.so"; break; fi
done
"$(tool protoc)" -I "$PROTO_ROOT" --plugin=protoc-gen-grpc-java="$(tool grpc_java_plugin)" \
  --java_out="$BUILD/gen" --grpc-java_out="$BUILD/gen" ladder/v1/ladder.proto
find "$BUILD/gen" "$HERE/src/main/java" -name '*.java' > "$BUILD/sources.txt"
"$(jdk_tool javac)" -nowarn -encoding UTF-8 --release 17 -cp "$classpath" -d "$BUILD/classes" @"$BUILD/sources.txt" >&2
cat > "$BUILD/ladder-java" <<LAUNCHER
#!/bin/sh
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
exec "$(jdk_tool java)" -Djava.library.path="$BUILD/jni" -cp "$BUILD/classes:$classpath" \\
  com.ladder.example.LadderExample "\$@"
LAUNCHER
chmod +x "$BUILD/ladder-java"
echo "$BUILD/ladder-java"
