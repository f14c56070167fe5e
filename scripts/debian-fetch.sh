# Fetches Debian packages without root, for clients/{cpp,go,java}/build.sh (sourced, not run): each
# package and every dependency dpkg does not already have installed is downloaded with
# `apt-get download` and unpacked with `dpkg -x` under "$DEPS/root"; when apt's package lists are
# absent (slim images clear them), a private copy is fetched into "$DEPS/apt" first.
#
# The caller sets DEPS (its cache directory) and defines `unobtainable MESSAGE`, which says what to
# install and exits 3. After sourcing, it may set DEBIAN_EXCLUDE: package names never fetched (an
# alternative apt lists beside the one wanted). APT_OPTS holds the options every apt call here takes.
APT_OPTS=()
DEBIAN_EXCLUDE=()

# Whether the prefix holds what `debian_fetch` last fetched for exactly these packages.
debian_fetched() {
  [ "$(cat "$DEPS/root/.complete" 2>/dev/null)" = "$*" ]
}

# Fetch and unpack the packages and their missing dependencies into "$DEPS/root" (replacing what it
# held); the first package also probes whether apt's lists are here.
debian_fetch() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || unobtainable "no apt-get/dpkg (not Debian)"
  _debian_lists_for "$1"
  local missing
  missing="$(_debian_missing "$@")" || unobtainable "apt-cache cannot resolve $*"
  rm -rf "$DEPS/debs" "$DEPS/root"
  mkdir -p "$DEPS/debs" "$DEPS/root"
  echo "build.sh: downloading $(echo "$missing" | wc -l) Debian packages into $DEPS/debs" >&2
  # shellcheck disable=SC2086  # one package name per word
  (cd "$DEPS/debs" && apt-get "${APT_OPTS[@]}" -qq download $missing >&2) \
    || unobtainable "apt-get download failed (no network?)"
  local deb
  for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS/root"; done
}

# Record what the prefix holds (debian_fetched compares against it): another list fetches again.
debian_mark_fetched() {
  echo "$*" > "$DEPS/root/.complete"
}

# Absolute links (a JDK's conf/ and security/ point into /etc) to their copy in the prefix: a system
# without the packages has nothing at the absolute path.
debian_relink_absolute() {
  local link target
  find "$DEPS/root" -type l | while read -r link; do
    target="$(readlink "$link")"
    case "$target" in /*) if [ -e "$DEPS/root$target" ]; then ln -sfn "$DEPS/root$target" "$link"; fi ;; esac
  done
}

# A tool from the prefix, or the system's when dpkg had it installed already (so it was not fetched).
tool() {
  if [ -x "$DEPS/root/usr/bin/$1" ]; then echo "$DEPS/root/usr/bin/$1"; else command -v "$1"; fi
}

# Apt's package lists may be absent: then read our own copy, fetched without root.
_debian_lists_for() {
  apt-cache show "$1" >/dev/null 2>&1 && return 0
  mkdir -p "$DEPS/apt/lists/partial" "$DEPS/apt/cache/archives/partial"
  APT_OPTS=(-o "Dir::State::Lists=$DEPS/apt/lists" -o "Dir::Cache=$DEPS/apt/cache" -o Debug::NoLocking=1)
  echo "build.sh: no apt package lists here; fetching a private copy into $DEPS/apt" >&2
  apt-get "${APT_OPTS[@]}" -qq update >&2 || unobtainable "apt-get update failed (no network?)"
}

# The packages and everything they depend on that dpkg does not already have installed, less
# DEBIAN_EXCLUDE. Of a dependency's alternatives apt-cache lists them all.
_debian_missing() {
  local name
  apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "$@" | grep -v -e '^ ' -e '^<' -e ':' | sort -u |
    while read -r name; do
      dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q 'ok installed' || echo "$name"
    done | _debian_without_excluded
}

_debian_without_excluded() {
  if [ "${#DEBIAN_EXCLUDE[@]}" -eq 0 ]; then cat; else grep -v -x -F "${DEBIAN_EXCLUDE[@]/#/-e}" || true; fi
}
