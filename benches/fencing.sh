#!/usr/bin/env bash
# The cost of fencing tokens: `LOCK.ACQUIRE lock:<rand> t 10000` against `SET lock:<rand> t NX PX
# 10000` through the same proxy over N masters, interleaved rounds, medians of requests/s and the
# fenced/plain ratio at each client count.
#
#   cargo build --release && benches/fencing.sh
#
# Environment: PROXY (binary, default target/release/redlock-proxy), N (masters, 5), CLIENTS
# ("1 50"), ROUNDS (5), REQUESTS (40000 at -c 50; a fifth of it at -c 1). Rounds alternate which
# command goes first.
set -euo pipefail
PROXY=${PROXY:-target/release/redlock-proxy}
N=${N:-5}
CLIENTS=${CLIENTS:-1 50}
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-40000}

source "$(dirname "$0")/common.sh"
scratch

args=()
for _ in $(seq "$N"); do
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pids+=($!); wait_ping "$port"; args+=(--backend "redis://127.0.0.1:$port")
done
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/proxy.toml"
proxy=$(free_port)
"$PROXY" --config "$work/proxy.toml" --listen "127.0.0.1:$proxy" "${args[@]}" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_ping "$proxy"
# The database's fencing epochs are made by its first fenced acquisition (once per database).
for _ in $(seq 50); do
  [ -n "$(redis-cli -p "$proxy" LOCK.ACQUIRE warm-up w 1000)" ] && break
  sleep 0.1
done

# One redis-benchmark run of command $2... at -c $1: requests per second.
rps() {
  local c=$1 n=$REQUESTS
  shift
  [ "$c" -eq 1 ] && n=$((REQUESTS / 5))
  redis-benchmark -p "$proxy" -c "$c" -n "$n" -r 1000000 -q "$@" 2>/dev/null \
    | tr '\r' '\n' | awk '/requests per second/ {for (i = 1; i <= NF; i++) if ($(i + 1) == "requests") print $i}' | tail -1
}
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "N=$N masters, $ROUNDS rounds, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for c in $CLIENTS; do
  : > "$work/plain" ; : > "$work/fenced"
  for r in $(seq "$ROUNDS"); do
    order=(plain fenced)
    [ $((r % 2)) -eq 0 ] && order=(fenced plain)
    for kind in "${order[@]}"; do
      if [ "$kind" = plain ]; then
        rps "$c" SET 'lock:__rand_int__' t NX PX 10000 >> "$work/plain"
      else
        rps "$c" LOCK.ACQUIRE 'lock:__rand_int__' t 10000 >> "$work/fenced"
      fi
    done
  done
  plain=$(median < "$work/plain")
  fenced=$(median < "$work/fenced")
  echo "-c $c: SET NX PX $(paste -sd/ "$work/plain") (median $plain); LOCK.ACQUIRE $(paste -sd/ "$work/fenced") (median $fenced); fenced/plain $(awk -v f="$fenced" -v p="$plain" 'BEGIN {printf "%.2f", f / p}')"
done
