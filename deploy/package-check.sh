#!/usr/bin/env bash
# Builds the Debian package (`cargo deb`, [package.metadata.deb] in Cargo.toml) and checks it
# without installing it on this system:
#   1. the package: the binary at /usr/bin/redlock-proxy, stripped and under MAX_BINARY_MB, its
#      debug info in the -dbgsym package; the systemd unit, naming that binary and the config;
#      deploy/config.production.toml as the conffile /etc/redlock-proxy/config.toml; a postinst
#      that creates the redlock-proxy user and neither enables nor starts the service;
#   2. the installed files, unpacked into a scratch root (dpkg -x): the binary checks the
#      packaged config as the unit's ExecStartPre does, then serves with it over three
#      redis-servers started here (the flags replace the placeholder masters and the
#      addresses): one lock is granted, a second refused, and the first released.
# Exits non-zero, naming the failed check, on any problem. Everything it starts is stopped, and
# its scratch directory removed, on exit. Run from anywhere: bash deploy/package-check.sh
# Needs cargo-deb (cargo install cargo-deb --locked), dpkg-deb, readelf, redis-server,
# redis-cli and python3. Environment: MAX_BINARY_MB (default 20; the
# stripped binary is about 9 MiB, with its debug info about 72).
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_BINARY_MB=${MAX_BINARY_MB:-20}
BIN=usr/bin/redlock-proxy
CONF=etc/redlock-proxy/config.toml
UNIT=usr/lib/systemd/system/redlock-proxy.service

started=$(date +%s)
work=$(mktemp -d)
pids=()
cleanup() {
  local status=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then echo "package-check: FAILED (exit $status)" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "package-check: FAIL: $*" >&2
  exit 1
}
step() { echo "package-check: $*"; }

for tool in cargo dpkg-deb readelf redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not on the PATH"
done
cargo deb --version >/dev/null 2>&1 || fail "cargo-deb is missing: cargo install cargo-deb --locked"

# --- 1. The package -------------------------------------------------------------------------
step "building the package (cargo deb)"
cargo deb --locked --output "$work/out" >"$work/cargo-deb.log" 2>&1 || {
  tail -30 "$work/cargo-deb.log" >&2
  fail "cargo deb failed"
}
shopt -s nullglob
debs=("$work"/out/redlock-proxy_*.deb)
ddebs=("$work"/out/redlock-proxy-dbgsym_*.ddeb)
shopt -u nullglob
[ ${#debs[@]} -eq 1 ] || fail "expected one redlock-proxy_*.deb, found: $(ls "$work/out")"
[ ${#ddebs[@]} -eq 1 ] || fail "expected one redlock-proxy-dbgsym_*.ddeb, found: $(ls "$work/out")"
deb=${debs[0]}
ddeb=${ddebs[0]}
step "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB) and $(basename "$ddeb") ($(du -k "$ddeb" | cut -f1) KiB)"

dpkg-deb -I "$deb" >"$work/info.txt" || fail "dpkg-deb -I cannot read $deb"
dpkg-deb -c "$deb" >"$work/contents.txt" || fail "dpkg-deb -c cannot read $deb"
# The contents' lines: "<mode> <owner>/<group> <size> <date> <time> ./<path>".
has() { awk -v p="./$1" '$6 == p' "$work/contents.txt"; }
[ -n "$(has "$BIN")" ] || fail "the package has no /$BIN"
[ -n "$(has "$UNIT")" ] || fail "the package has no /$UNIT"
[ -n "$(has "$CONF")" ] || fail "the package has no /$CONF"
[ "$(has "$CONF" | awk '{print $1}')" = "-rw-r-----" ] ||
  fail "/$CONF is not packaged 0640: $(has "$CONF")"
if awk '$6 ~ /^\.\/usr\/lib\/debug\//' "$work/contents.txt" | grep -q .; then
  fail "the package itself carries debug info (it belongs in the -dbgsym package)"
fi

mkdir "$work/control"
dpkg-deb -e "$deb" "$work/control" || fail "dpkg-deb -e cannot extract the control files"
grep -qx "/$CONF" "$work/control/conffiles" 2>/dev/null ||
  fail "/$CONF is not a conffile: $(cat "$work/control/conffiles" 2>/dev/null || echo 'no conffiles')"
postinst=$work/control/postinst
[ -x "$postinst" ] || fail "the package has no executable postinst"
sh -n "$postinst" || fail "the postinst is not valid sh"
# Its commands, continuation lines joined.
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$postinst" >"$work/postinst.joined"
grep -Eq '^[[:space:]]*(adduser|useradd) .*--system.* redlock-proxy$' "$work/postinst.joined" ||
  fail "the postinst does not create the redlock-proxy system user"
grep -q 'chown root:redlock-proxy /etc/redlock-proxy/config.toml' "$postinst" ||
  fail "the postinst does not give the config to root:redlock-proxy"
grep -q 'chmod 0640 /etc/redlock-proxy/config.toml' "$postinst" || fail "the postinst does not make the config 0640"
# cargo-deb's systemd snippets were merged in (in place of #DEBHELPER#), without an enable or a
# start: the packaged config's masters are placeholders.
grep -q 'deb-systemd-helper update-state redlock-proxy.service' "$postinst" ||
  fail "the postinst lacks the systemd unit's snippets"
if grep -q '#DEBHELPER#' "$postinst"; then fail "the postinst still has the #DEBHELPER# token"; fi
if grep -Eq 'deb-systemd-invoke (start|restart)|systemctl .*(enable|start)' "$postinst"; then
  fail "the postinst enables or starts the service"
fi
dpkg-deb -f "$deb" Depends | grep -qw adduser || fail "the package does not depend on adduser"

# --- 2. The installed files, in a scratch root ------------------------------------------------
root=$work/root
dpkg-deb -x "$deb" "$root" || fail "dpkg-deb -x failed"
dpkg-deb -x "$ddeb" "$work/dbg" || fail "dpkg-deb -x of the dbgsym package failed"
bin=$root/$BIN
conf=$root/$CONF
unit=$root/$UNIT

# The binary: stripped (no debug sections, no symbol table), small, its debug info apart.
# (.debug_gdb_scripts is not debug info: a loaded section naming gdb's pretty-printers.)
readelf -S --wide "$bin" >"$work/sections.txt" || fail "/$BIN is not an ELF file"
unstripped=$(grep -Eo '\.debug_[a-z_]+|\.symtab' "$work/sections.txt" | grep -vx '\.debug_gdb_scripts' || true)
[ -z "$unstripped" ] || fail "/$BIN is not stripped: $(echo $unstripped)"
size=$(stat -c %s "$bin")
[ "$size" -le $((MAX_BINARY_MB * 1024 * 1024)) ] || fail "/$BIN is $size bytes, over $MAX_BINARY_MB MiB"
step "/$BIN: stripped, $size bytes"
mapfile -t debug_files < <(find "$work/dbg/usr/lib/debug" -type f -name '*.debug' 2>/dev/null)
[ ${#debug_files[@]} -eq 1 ] || fail "expected one .debug file in the dbgsym package, found ${#debug_files[@]}"
readelf -S --wide "${debug_files[0]}" 2>/dev/null | grep -q '\.debug_line' ||
  fail "the dbgsym package's ${debug_files[0]#"$work/dbg"} has no line tables"
build_id=$(readelf -n "$bin" | awk '/Build ID:/ {print $3}')
if [ -n "$build_id" ]; then
  want=/usr/lib/debug/.build-id/${build_id:0:2}/${build_id:2}.debug
  [ "${debug_files[0]#"$work/dbg"}" = "$want" ] ||
    fail "the debug info is at ${debug_files[0]#"$work/dbg"}, not at the binary's build id $want"
fi

# The unit runs the packaged binary with the packaged config.
for key in ExecStartPre ExecStart; do
  line=$(grep "^$key=" "$unit") || fail "the unit has no $key"
  read -r -a words <<<"${line#*=}"
  [ "${words[0]}" = "/$BIN" ] || fail "the unit's $key runs ${words[0]}, the package installs /$BIN"
  [ "${words[1]:-}" = --config ] && [ "${words[2]:-}" = "/$CONF" ] ||
    fail "the unit's $key does not read /$CONF: $line"
done
grep -q '^User=redlock-proxy$' "$unit" || fail "the unit does not run as the redlock-proxy user"
cmp -s "$conf" deploy/config.production.toml || fail "/$CONF is not deploy/config.production.toml"

# Three masters on free loopback ports; the proxy and its metrics on two more.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ping() {
  for _ in $(seq 200); do
    [ "$(redis-cli -p "$1" PING 2>/dev/null)" = PONG ] && return 0
    sleep 0.05
  done
  fail "the redis-server on port $1 never answered PING"
}
backends=()
for i in 1 2 3; do
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" --dbfilename "dump-$i.rdb" >"$work/redis-$i.log" 2>&1 &
  pids+=($!)
  wait_ping "$port"
  backends+=(--backend "redis://127.0.0.1:$port")
done
port=$(free_port)
metrics_port=$(free_port)
# The packaged config, as installed. The flags: the masters started here (repeated --backend
# replaces the file's list), free loopback addresses, and "restarts" because these masters
# were started a moment ago (under "always" they would not vote for max_ttl_ms). The client
# password placeholder is filled from the environment, as the proxy does at start.
flags=(--config "$conf" "${backends[@]}" --listen "127.0.0.1:$port"
  --metrics-listen "127.0.0.1:$metrics_port" --quarantine restarts)
export REDLOCK_CLIENT_PASSWORD=package-check-secret

step "checking the packaged config with the installed binary (the unit's ExecStartPre)"
"$bin" "${flags[@]}" --check-config >"$work/check-config.log" 2>&1 || {
  cat "$work/check-config.log" >&2
  fail "--check-config refused the packaged config"
}

step "starting the installed binary with the packaged config on 127.0.0.1:$port"
"$bin" "${flags[@]}" >"$work/proxy.log" 2>&1 &
proxy_pid=$!
pids+=("$proxy_pid")
proxy_log() {
  echo "--- proxy log (last 30 lines)" >&2
  tail -30 "$work/proxy.log" >&2
}
cli() { REDISCLI_AUTH=$REDLOCK_CLIENT_PASSWORD redis-cli --no-auth-warning -p "$port" "$@" 2>&1; }
up=0
for _ in $(seq 200); do
  kill -0 "$proxy_pid" 2>/dev/null || {
    proxy_log
    fail "the proxy exited during start-up"
  }
  up=$(cli PROXY BACKENDS | grep -c 'state=up' || true)
  [ "$up" -eq 3 ] && break
  sleep 0.05
done
[ "$up" -eq 3 ] || {
  cli PROXY BACKENDS >&2
  proxy_log
  fail "only $up of 3 masters are up after 10 s"
}

# The packaged config's requirepass is in force.
got=$(redis-cli -p "$port" PING 2>&1)
case "$got" in NOAUTH*) ;; *)
  proxy_log
  fail "PING without AUTH answered '$got', not NOAUTH"
  ;;
esac

expect() {
  local want=$1
  shift
  local got
  got=$(cli "$@")
  [ "$got" = "$want" ] || {
    proxy_log
    fail "redis-cli $* answered '$got', expected '$want'"
  }
  local shown=$*
  step "redis-cli ${shown/"$release"/<release script>}: ${want:-(nil)}"
}
release='if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end'
expect OK SET lock:pkg t1 NX PX 10000
expect "" SET lock:pkg t2 NX PX 10000
expect 1 EVAL "$release" 1 lock:pkg t1
expect OK SET lock:pkg t2 NX PX 10000
expect 1 EVAL "$release" 1 lock:pkg t2

# A graceful stop: SIGTERM, exit 0 (what the unit's KillSignal expects).
kill -TERM "$proxy_pid"
status=0
wait "$proxy_pid" || status=$?
[ "$status" -eq 0 ] || {
  proxy_log
  fail "the proxy exited $status on SIGTERM"
}

step "OK in $(($(date +%s) - started)) s"
