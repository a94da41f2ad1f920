#!/usr/bin/env bash
# Instructions per acquisition, counted by valgrind's callgrind: a count of instructions, not
# of seconds, so it is the same run after run whatever else the machine is doing (two shared
# cores cannot blur it). The proxy over N = 1 and N = 5 masters, against nutcracker's per
# forwarded SET, the same requests: SET lock:<rand> v NX PX 10000, one client (redis-benchmark
# -c 1 -P 1), random keys out of 1,000,000.
#
#   benches/callgrind.sh                  # about 3 minutes after the build
#   REQUESTS=20000 benches/callgrind.sh
#
# For each target: start it under callgrind, warm up, zero the counters, send REQUESTS
# acquisitions, dump; then zero, stay idle as long, dump: what the process does on its own in
# that time (health checks, timers) is taken off. Per request = (loaded - idle) / REQUESTS.
# Environment: OUT (default benches/results-callgrind), REQUESTS (10000), PROXY_BIN.
# Needs valgrind, redis-server, redis-benchmark, redis-cli, nutcracker (apt-get when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/benches/results-callgrind}
REQUESTS=${REQUESTS:-10000}
source "$ROOT/benches/common.sh"
die() { echo "callgrind: $*" >&2; exit 1; }
for pkg in valgrind nutcracker; do
  if ! command -v "$pkg" >/dev/null; then
    [ "$(id -u)" = 0 ] || die "$pkg is not installed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$pkg" >/dev/null
  fi
done
for tool in redis-server redis-benchmark redis-cli callgrind_control; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
if [ -z "${PROXY_BIN:-}" ]; then
  cargo build --release --bin redlock-proxy >&2
  PROXY_BIN=$ROOT/target/release/redlock-proxy
fi
mkdir -p "$OUT"
scratch

masters=(); master_pids=()
start_masters 5
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/config.toml"

# Instructions (Ir) in the newest dump of process $1.
dumped_ir() {
  local file; file=$(ls -t "$work"/cg.out."$1"* | head -1)
  awk '/^(summary|totals):/ {print $2; exit}' "$file"
}

bench() { # port requests
  redis-benchmark -p "$1" -c 1 -P 1 -n "$2" -r 1000000 SET 'lock:__rand_int__' v NX PX 10000 >/dev/null
}

measure() { # name port command... (the command listens on port)
  local name=$1 port=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out.%p" "$@" >"$work/$name.log" 2>&1 &
  local pid=$!; pids+=($pid)
  wait_ping "$port" 60  # valgrind starts slowly
  bench "$port" 2000
  callgrind_control -z "$pid" >/dev/null 2>&1
  local t0; t0=$(date +%s.%N)
  bench "$port" "$REQUESTS"
  local t1; t1=$(date +%s.%N)
  callgrind_control -d "$pid" >/dev/null 2>&1
  local loaded; loaded=$(dumped_ir "$pid")
  # Kept for callgrind_annotate: where the instructions went.
  cp "$(ls -t "$work"/cg.out."$pid"* | head -1)" "$OUT/$name.callgrind"
  callgrind_control -z "$pid" >/dev/null 2>&1
  sleep "$(python3 -c "print($t1 - $t0)")"
  callgrind_control -d "$pid" >/dev/null 2>&1
  local idle; idle=$(dumped_ir "$pid")
  kill "$pid" 2>/dev/null || true
  python3 -c "
import json
loaded, idle, n, secs = $loaded, $idle, $REQUESTS, $t1 - $t0
print(json.dumps({'target': '$name', 'requests': n, 'seconds_under_valgrind': round(secs, 1),
                  'ir_loaded': loaded, 'ir_idle': idle, 'ir_per_request': round((loaded - idle) / n)}))"
}

RESULTS=$OUT/callgrind.jsonl
: > "$RESULTS"
# nutcracker reads its port from its config file.
nc_port=$(free_port)
cat > "$work/nutcracker.yml" <<YML
bench:
  listen: 127.0.0.1:$nc_port
  hash: fnv1a_64
  distribution: ketama
  redis: true
  servers:
   - 127.0.0.1:${masters[0]}:1
YML
measure nutcracker "$nc_port" nutcracker -c "$work/nutcracker.yml" -s "$(free_port)" -a 127.0.0.1 \
  -o "$work/nutcracker.log" | tee -a "$RESULTS"
for n in 1 5; do
  args=(); for p in "${masters[@]:0:$n}"; do args+=(--backend "redis://127.0.0.1:$p"); done
  port=$(free_port)
  measure "proxy$n" "$port" "$PROXY_BIN" --config "$work/config.toml" --listen "127.0.0.1:$port" "${args[@]}" \
    | tee -a "$RESULTS"
done

python3 - "$RESULTS" "$(valgrind --version)" "$(nutcracker --version 2>&1 | head -1)" <<'PY' | tee "$OUT/report.md"
import json, sys
rows = {r["target"]: r for r in map(json.loads, open(sys.argv[1]))}
nc = rows["nutcracker"]["ir_per_request"]
print(f"{sys.argv[2]}, {sys.argv[3]}\n")
print("| target | instructions per acquisition | vs nutcracker's forwarded SET |")
print("|---|---:|---:|")
for name, label in (("nutcracker", "nutcracker (one forward)"), ("proxy1", "proxy N=1"), ("proxy5", "proxy N=5")):
    r = rows[name]["ir_per_request"]
    print(f"| {label} | {r:,} | {r / nc:.2f} |")
PY
