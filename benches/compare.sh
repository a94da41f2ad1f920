#!/usr/bin/env bash
# Side-by-side throughput: one redis-server directly vs redlock-proxy over N real masters,
# same workload (SET lock:<rand> v NX PX 10000), same run. Prints requests/s and the ratio
# to direct. Usage: benches/compare.sh [requests] (default 50000). Needs redis-server,
# redis-benchmark, and a release build (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-50000}
cargo build --release -q
bin=target/release/redlock-proxy
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ping() { for _ in $(seq 200); do redis-cli -p "$1" PING >/dev/null 2>&1 && return 0; sleep 0.05; done; echo "port $1 never answered" >&2; exit 1; }

masters=()
for _ in 1 2 3 4 5 6 7; do
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pids+=($!); wait_ping "$port"; masters+=("$port")
done

# The masters are fresh: no lock predates them, so the startup quarantine is not needed.
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/config.toml"

start_proxy() { # n
  local port; port=$(free_port)
  local args=()
  for p in "${masters[@]:0:$1}"; do args+=(--backend "redis://127.0.0.1:$p"); done
  "$bin" --config "$work/config.toml" --listen "127.0.0.1:$port" "${args[@]}" >/dev/null 2>&1 &
  pids+=($!); wait_ping "$port"; echo "$port"
}

rps() { # port clients
  redis-benchmark -p "$1" -c "$2" -n "$requests" -r 1000000 --csv \
    SET "lock:__rand_int__" v NX PX 10000 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'
}

printf '%-16s %8s %14s %10s\n' config clients 'requests/s' 'vs direct'
for c in 1 50; do
  direct=$(rps "${masters[0]}" "$c")
  printf '%-16s %8s %14.0f %10s\n' direct "$c" "$direct" 1.00
  for n in 1 3 5 7; do
    port=$(start_proxy "$n")
    r=$(rps "$port" "$c")
    printf '%-16s %8s %14.0f %10.2f\n' "proxy N=$n" "$c" "$r" "$(python3 -c "print($r/$direct)")"
  done
done
