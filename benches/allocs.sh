#!/usr/bin/env bash
# Heap allocations and instructions per request on the proxy's request path, counted by
# valgrind's DHAT (counts, not seconds: they do not depend on what else the machine does).
# Instructions are the proxy's own, in user space (system calls not included); under valgrind
# the proxy runs slower, so more requests share each read and write than on a real run.
#
#   cargo build --release && benches/allocs.sh
#
# The proxy runs under DHAT over N masters; redis-benchmark sends `SET lock:<rand> v NX PX 10000`
# (or COMMAND, e.g. COMMAND='LOCK.ACQUIRE lock:__rand_int__ t 10000') twice: SMALL requests, then
# SMALL + DELTA more. Start-up and warm-up are the same in both runs, so the difference of the
# two totals over DELTA is what one request costs. Environment: PROXY (binary, default
# target/release/redlock-proxy), NS (masters, "1 5"), C (clients, 50), SMALL (2000), DELTA (8000).
set -euo pipefail
PROXY=${PROXY:-target/release/redlock-proxy}
NS=${NS:-1 5}
C=${C:-50}
SMALL=${SMALL:-2000}
DELTA=${DELTA:-8000}
read -r -a COMMAND <<< "${COMMAND:-SET lock:__rand_int__ v NX PX 10000}"

source "$(dirname "$0")/common.sh"
scratch

command -v valgrind >/dev/null || { echo "allocs.sh needs valgrind (apt-get install -y valgrind)" >&2; exit 1; }
masters=()
max_n=0
for n in $NS; do [ "$n" -gt "$max_n" ] && max_n=$n; done
master_pids=()
start_masters "$max_n"
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/proxy.toml"

# Total blocks allocated and instructions run by a proxy over the first $1 masters that
# served $2 requests.
blocks() {
  local port args=() pid
  port=$(free_port)
  for p in "${masters[@]:0:$1}"; do args+=(--backend "redis://127.0.0.1:$p"); done
  valgrind --tool=dhat --dhat-out-file="$work/dhat.json" "$PROXY" --config "$work/proxy.toml" \
    --listen "127.0.0.1:$port" "${args[@]}" >"$work/dhat.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done
  # The same warm-up in every run (scripts cached, fencing epochs made).
  redis-benchmark -p "$port" -c "$C" -n 500 -r 1000000 -q "${COMMAND[@]}" >/dev/null 2>&1
  redis-benchmark -p "$port" -c "$C" -n "$2" -r 1000000 -q "${COMMAND[@]}" >/dev/null 2>&1
  kill -TERM "$pid"
  wait "$pid" || true
  local blocks instructions
  blocks=$(awk '/Total:/ {for (i = 1; i <= NF; i++) if ($(i + 1) == "blocks") {gsub(",", "", $i); print $i}}' "$work/dhat.log" | head -1)
  instructions=$(grep -o '"te":[0-9]*' "$work/dhat.json" 2>/dev/null | cut -d: -f2 || true)
  if [ -z "$blocks" ] || [ -z "$instructions" ]; then
    # Said, not swallowed: a count missing would otherwise end the script without a word.
    echo "allocs: no count from the run over $1 masters ($2 requests); the proxy's log:" >&2
    tail -20 "$work/dhat.log" >&2
    return 1
  fi
  echo "$blocks $instructions"
}

echo "${COMMAND[*]} at -c $C, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for n in $NS; do
  counts=$(blocks "$n" "$SMALL") || exit 1
  read -r small small_ins <<< "$counts"
  counts=$(blocks "$n" "$((SMALL + DELTA))") || exit 1
  read -r large large_ins <<< "$counts"
  echo "N=$n: $small blocks after $SMALL requests, $large after $((SMALL + DELTA)): $(awk -v a="$small" -v b="$large" -v d="$DELTA" 'BEGIN {printf "%.1f", (b - a) / d}') allocations and $(awk -v a="$small_ins" -v b="$large_ins" -v d="$DELTA" 'BEGIN {printf "%.0f", (b - a) / d}') instructions per request"
done
