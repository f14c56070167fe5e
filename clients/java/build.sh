#!/usr/bin/env bash
# Builds ladder-java (the Java example client) without root and without Maven Central: generates the
# classes from proto/ladder/v1/ladder.proto with protoc and grpc-java's plugin, compiles them and the
# example with javac against Debian's grpc-java jars, and writes a launcher script. Uses the system's
# packages when they are installed, otherwise downloads them with `apt-get download` and unpacks them
# with `dpkg -x` under a cache directory (scripts/debian-fetch.sh). (Users build with Maven instead:
# clients/java/pom.xml.)
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
# shellcheck source=../../scripts/debian-fetch.sh
source "$HERE/../../scripts/debian-fetch.sh"

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

unpack_packages() {
  local wanted=("${PACKAGES[@]}")
  command -v javac >/dev/null || wanted+=(openjdk-17-jdk-headless)
  debian_fetch "${wanted[@]}"
  debian_relink_absolute  # the JDK's conf/ and security/ point into /etc/java-17-openjdk
  debian_mark_fetched "${PACKAGES[@]}"
}

jdk_tool() {
  local jdk
  for jdk in "$DEPS"/root/usr/lib/jvm/java-*-openjdk-*; do
    if [ -x "$jdk/bin/$1" ]; then echo "$jdk/bin/$1"; return; fi
  done
  command -v "$1"
}

if ! have_system_packages; then
  debian_fetched "${PACKAGES[@]}" || unpack_packages
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
