#!/usr/bin/env bash
# Lock throughput with Redis Cluster members: three members, each a cluster of 1, 2 and 3 shards,
# against one redis-server taking the same commands directly, in the same run. Reports locks/s
# (`SET lock:<rand> t NX PX 10000` at -c 50, median of ROUNDS), and CPU time per lock of the
# proxy, of all the shard masters together, and of the load generator, so that the curve can be
# read for a machine with more cores than this one.
#
#   cargo build --release && benches/cluster.sh
#
# Environment: PROXY (binary, default target/release/redlock-proxy), SHARDS ("1 2 3"), ROUNDS (5),
# REQUESTS (100000), CLIENTS (50), THREADS (the proxy's `threads`, default one per core).
set -euo pipefail
PROXY=${PROXY:-target/release/redlock-proxy}
SHARDS=${SHARDS:-1 2 3}
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-100000}
CLIENTS=${CLIENTS:-50}
THREADS=${THREADS:-$(nproc)}

source "$(dirname "$0")/common.sh"
scratch

# Starts a cluster of $1 shards (masters only, slots split evenly); its ports in `ports`, its
# processes added to `pids`.
start_cluster() {
  local n=$1 i
  ports=()
  for i in $(seq "$n"); do
    local port bus
    port=$(free_port); bus=$((port + 10000 > 65535 ? port - 10000 : port + 10000))
    mkdir -p "$work/$port"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work/$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" >"$work/$port/log" 2>&1 &
    pids+=($!); wait_ping "$port"; ports+=("$port")
  done
  for i in "${!ports[@]}"; do
    local from=$(( i * 16384 / n )) to=$(( (i + 1) * 16384 / n - 1 ))
    redis-cli -p "${ports[$i]}" CLUSTER ADDSLOTSRANGE "$from" "$to" >/dev/null
    [ "$i" -gt 0 ] && redis-cli -p "${ports[$i]}" CLUSTER MEET 127.0.0.1 "${ports[0]}" >/dev/null
  done
  for _ in $(seq 200); do
    local ok=1 p
    for p in "${ports[@]}"; do
      redis-cli -p "$p" CLUSTER INFO | grep -q 'cluster_state:ok' || ok=0
      [ "$(redis-cli -p "$p" CLUSTER NODES | wc -l)" -eq "$n" ] || ok=0
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
}

# redis-benchmark at -c CLIENTS against port $1: requests per second.
rps() {
  redis-benchmark -p "$1" -c "$CLIENTS" -n "$REQUESTS" -r 1000000 -q SET 'lock:__rand_int__' t NX PX 10000 2>/dev/null \
    | tr '\r' '\n' | awk '/requests per second/ {for (i = 1; i <= NF; i++) if ($(i + 1) == "requests") print $i}' | tail -1
}
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

direct=$(free_port)
redis-server --port "$direct" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
pids+=($!); wait_ping "$direct"

echo "3 cluster members, -c $CLIENTS, $REQUESTS requests x $ROUNDS rounds, $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "| shards per member | direct redis-server locks/s | proxy locks/s | proxy/direct | proxy CPU µs/lock | all shard masters CPU µs/lock | redis-benchmark CPU µs/lock |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for s in $SHARDS; do
  args=(); master_pids=()
  for _ in 1 2 3; do
    before=${#pids[@]}
    start_cluster "$s"
    master_pids+=("${pids[@]:$before}")
    args+=(--backend "redis+cluster://127.0.0.1:${ports[0]}")
  done
  printf 'quarantine = "restarts"\nlog_level = "warn"\nthreads = %s\n' "$THREADS" > "$work/proxy.toml"
  proxy=$(free_port)
  "$PROXY" --config "$work/proxy.toml" --listen "127.0.0.1:$proxy" "${args[@]}" >"$work/proxy-$s.log" 2>&1 &
  proxy_pid=$!; pids+=("$proxy_pid")
  wait_ping "$proxy"
  : > "$work/direct"; : > "$work/proxy"
  proxy_ticks=0; masters_ticks=0; bench_ticks=0; locks=0
  for r in $(seq "$ROUNDS"); do
    rps "$direct" >> "$work/direct"
    p0=$(cpu_ticks "$proxy_pid"); m0=$(cpu_ticks "${master_pids[@]}"); b0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
    rps "$proxy" >> "$work/proxy"
    proxy_ticks=$((proxy_ticks + $(cpu_ticks "$proxy_pid") - p0))
    masters_ticks=$((masters_ticks + $(cpu_ticks "${master_pids[@]}") - m0))
    bench_ticks=$((bench_ticks + $(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat) - b0))
    locks=$((locks + REQUESTS))
  done
  d=$(median < "$work/direct"); p=$(median < "$work/proxy")
  awk -v s="$s" -v d="$d" -v p="$p" -v pt="$proxy_ticks" -v mt="$masters_ticks" -v bt="$bench_ticks" -v n="$locks" -v hz="$HZ" \
    'BEGIN {printf "| %d | %.0f | %.0f | %.2f | %.1f | %.1f | %.1f |\n", s, d, p, p / d, pt / hz / n * 1e6, mt / hz / n * 1e6, bt / hz / n * 1e6}'
  kill "$proxy_pid" "${master_pids[@]}" 2>/dev/null || true
  wait "$proxy_pid" "${master_pids[@]}" 2>/dev/null || true
done
