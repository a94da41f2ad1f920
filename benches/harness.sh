#!/usr/bin/env bash
# The side-by-side benchmark of redlock-proxy: one command, everything on 127.0.0.1, every
# configuration measured in the same run, a table of ratios at the end.
#
#   benches/harness.sh                 # full run (about 6-8 minutes after the build)
#   QUICK=1 benches/harness.sh         # short runs, to check the harness itself (about 2 minutes)
#
# What it runs (same workload, SET lock:<rand> v NX PX 10000, random keys out of 1,000,000):
#   1. redis-benchmark -c 1 and -c 50 against: one redis-server (direct), nutcracker (twemproxy)
#      over that redis-server, redlock-proxy over N = 1, 3, 5, 7 real masters; ROUNDS rounds
#      (default 5), configurations interleaved within each round, the median kept
#   2. full lock cycles (acquire, then the release script by EVALSHA) with the project's load
#      generator (benches/lockbench.rs), 1 and 50 workers: HdrHistogram p50/p99/p999
#   3. client-side Redlock: the npm `redlock` over the 5 masters vs ioredis through the proxy
#      (N=5), acquire + release loops with 50 concurrent workers (benches/node/lock_loop.js)
#   4. one of the 5 masters SIGSTOPped: acquire latency vs healthy, 1 and 50 workers
#   5. memory: VmRSS of the proxy (N=5) before and after 10,000 idle client connections
#      (and of redis-server and nutcracker for comparison)
#   6. perf (when `perf` works): where the proxy (N=5) spends its CPU under -c 50, and system
#      calls / context switches per request of redis-server, nutcracker and the proxy (N=1, 5)
#   (and during 1: CPU seconds per request of the client, the proxy or nutcracker, and the masters)
# Then benches/report.py prints the tables and the targets, and writes report.md and the
# plots (SVG) into OUT.
#
# Environment: OUT (default benches/results), ROUNDS (5), CONNS (10000 idle connections),
# PERF (auto|0|1), JOBS (cargo -j, default 1), PROXY_BIN (measure another build of the proxy),
# LAYOUT (shared: every process on every core, the default; split: the masters on CPU 1, and
# everything else, the proxy, nutcracker and the load generators, on CPU 0, as on a machine
# where the masters do not share the proxy's cores).
# Needs redis-server, redis-benchmark, redis-cli, python3, node + npm; installs nutcracker
# with apt-get when missing, and the pinned node packages with tests/compat/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/benches/results}
QUICK=${QUICK:-0}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-10000}
PERF=${PERF:-auto}
JOBS=${JOBS:-1}
started=$(date +%s)

if [ "$QUICK" = 1 ]; then
  ROUNDS=${QUICK_ROUNDS:-1}; N1=5000; N50=20000; CYCLE_S=1; NODE_S=2; PAUSE_S=2; PERF_S=3
else
  N1=20000; N50=100000; CYCLE_S=4; NODE_S=6; PAUSE_S=5; PERF_S=6
fi

LAYOUT=${LAYOUT:-shared}
masters_cpu=()
case "$LAYOUT" in
  shared) ;;
  # This shell and all it starts (proxy, nutcracker, load generators) on CPU 0.
  split) taskset -pc 0 $$ >/dev/null; masters_cpu=(taskset -c 1) ;;
  *) echo "harness: LAYOUT is shared or split" >&2; exit 1 ;;
esac

log() { printf '[%4ss] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }
die() { echo "harness: $*" >&2; exit 1; }

# --- tools ------------------------------------------------------------------------------
for tool in redis-server redis-benchmark redis-cli python3 node npm cargo; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (redis: apt-get install -y redis-server redis-tools)"
done
if ! command -v nutcracker >/dev/null 2>&1; then
  log "installing nutcracker (twemproxy)"
  { apt-get install -y -qq nutcracker || { apt-get update -qq && apt-get install -y -qq nutcracker; }; } >/dev/null \
    || die "could not install nutcracker"
fi
log "node packages (tests/compat/setup.sh)"
bash tests/compat/setup.sh >/dev/null || die "tests/compat/setup.sh failed"
export NODE_PATH=$ROOT/tests/compat/node_modules

# 10,000 idle client connections: the load generator and the proxy each need that many fds.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((CONNS + 500)) ]; then
  log "fd limit $(ulimit -n): idle connections lowered from $CONNS"
  CONNS=$(( $(ulimit -n) - 500 ))
fi

# --- build ------------------------------------------------------------------------------
log "building (cargo build --release -j $JOBS; cargo bench --no-run -j $JOBS --bench lockbench)"
executable() { python3 -c '
import json, sys
want = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == want:
        print(m["executable"])' "$1"; }
if [ -z "${PROXY_BIN:-}" ]; then
  PROXY_BIN=$(cargo build --release -j "$JOBS" --bin redlock-proxy --message-format=json | executable redlock-proxy | tail -1)
fi
LOADGEN=$(cargo bench -j "$JOBS" --bench lockbench --no-run --message-format=json | executable lockbench | tail -1)
[ -x "$PROXY_BIN" ] || die "no proxy binary"
[ -x "$LOADGEN" ] || die "no lockbench binary"

rm -rf "$OUT/raw"
mkdir -p "$OUT/raw"/{rb,cycle,node,paused,mem,perf}
RAW=$OUT/raw
work=$(mktemp -d)

# --- processes --------------------------------------------------------------------------
pids=()
stopped=()
cleanup() {
  for p in "${stopped[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

source "$ROOT/benches/common.sh"
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
TIMEFORMAT='%3R %3U %3S'   # bash's `time`: wall, and the client's user and system seconds
# CPU ticks the whole machine spent in user, system, irq and softirq mode, all cores. Process
# times include the softirq work (loopback TCP) done in the process's context, so the machine
# total must too, or "other load" comes out negative.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }

masters=()
master_pids=()
for _ in 1 2 3 4 5 6 7; do
  port=$(free_port)
  "${masters_cpu[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pids+=($!); master_pids+=($!); wait_ping "$port"; masters+=("$port")
done

# The masters are fresh: no lock predates them, so the startup quarantine is not needed.
# maxclients: room for the idle connections of step 5 (builds without the option get none).
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/config.toml"
printf 'maxclients = %d\n' $((CONNS + 1000)) >> "$work/config.toml"
if ! "$PROXY_BIN" --config "$work/config.toml" --backend redis://127.0.0.1:1 --check-config >/dev/null 2>&1; then
  printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/config.toml"
  "$PROXY_BIN" --config "$work/config.toml" --backend redis://127.0.0.1:1 --check-config >/dev/null 2>&1 \
    || die "the proxy refuses its benchmark config: $("$PROXY_BIN" --config "$work/config.toml" --check-config 2>&1 | tail -1)"
fi
declare -A proxy_port proxy_pid
start_proxy() { # name n
  local port; port=$(free_port)
  local args=()
  for p in "${masters[@]:0:$2}"; do args+=(--backend "redis://127.0.0.1:$p"); done
  "$PROXY_BIN" --config "$work/config.toml" --listen "127.0.0.1:$port" "${args[@]}" >"$work/$1.log" 2>&1 &
  pids+=($!); proxy_pid[$1]=$!; proxy_port[$1]=$port
  wait_ping "$port"
}
for n in 1 3 5 7; do start_proxy "proxy$n" "$n"; done

nc_port=$(free_port)
start_nutcracker "$nc_port" "${masters[0]}" "$work"
pids+=("$NUTCRACKER_PID"); nc_pid=$NUTCRACKER_PID

declare -A target_port=([direct]=${masters[0]} [nutcracker]=$nc_port
  [proxy1]=${proxy_port[proxy1]} [proxy3]=${proxy_port[proxy3]} [proxy5]=${proxy_port[proxy5]} [proxy7]=${proxy_port[proxy7]})
configs=(direct nutcracker proxy1 proxy3 proxy5 proxy7)

flush() { for p in "${masters[@]}"; do redis-cli -p "$p" FLUSHALL ASYNC >/dev/null; done; }

# --- metadata ---------------------------------------------------------------------------
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain -- src 2>/dev/null | head -1 || true)
python3 - "$RAW/meta.json" <<EOF
import json, sys
json.dump({
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "command": "${HARNESS_COMMAND:-benches/harness.sh}",
  "quick": $QUICK, "layout": "$LAYOUT", "rounds": $ROUNDS, "conns": $CONNS,
  "commit": "$commit", "src_dirty": bool("$dirty"),
  "proxy_bin": "${PROXY_BIN#"$ROOT"/}",
  "redis": "$(redis-server --version | cut -d' ' -f3)",
  "nutcracker": "$(nutcracker --version 2>&1 | head -1)",
  "node": "$(node --version)",
  "redlock": "$(node -p 'JSON.parse(require("fs").readFileSync(process.env.NODE_PATH + "/redlock/package.json")).version')",
  "ioredis": "$(node -p 'JSON.parse(require("fs").readFileSync(process.env.NODE_PATH + "/ioredis/package.json")).version')",
  "loadavg_start": "$(cut -d' ' -f1-3 /proc/loadavg)",
  "kernel": "$(uname -r)", "cpus": $(nproc),
  "cpu_model": "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)",
  "requests_c1": $N1, "requests_c50": $N50,
}, open(sys.argv[1], "w"), indent=1)
EOF

# --- 1. redis-benchmark -----------------------------------------------------------------
log "1. redis-benchmark: ${configs[*]}; -c 1 ($N1 requests) and -c 50 ($N50); $ROUNDS round(s)"
for r in $(seq "$ROUNDS"); do
  for c in 1 50; do
    n=$N1; [ "$c" = 50 ] && n=$N50
    for cfg in "${configs[@]}"; do
      flush
      # CPU time (user + system, all threads) of the client, the proxy in the middle and the
      # masters it uses, over this run: where the 2 cores go per request.
      mids=(); used=(${master_pids[0]})
      case $cfg in
        nutcracker) mids=($nc_pid) ;;
        proxy*) mids=(${proxy_pid[$cfg]}); used=("${master_pids[@]:0:${cfg#proxy}}") ;;
      esac
      mid0=$(cpu_ticks "${mids[@]}"); m0=$(cpu_ticks "${used[@]}"); busy0=$(machine_ticks)
      cmd=(SET "lock:__rand_int__" v NX PX 10000)
      { time redis-benchmark -p "${target_port[$cfg]}" -c "$c" -n "$n" -r 1000000 --csv \
          "${cmd[@]}" >"$RAW/rb/${cfg}__c${c}__r${r}.csv" 2>/dev/null; } 2>"$work/time" \
        || die "redis-benchmark against $cfg failed"
      printf '{"requests":%s,"wall_s":%s,"machine_s":%s,"client_s":%s,"middle_s":%s,"masters_s":%s}\n' "$n" \
        "$(awk '{print $1}' "$work/time")" \
        "$(awk -v a="$busy0" -v b="$(machine_ticks)" -v hz="$HZ" 'BEGIN {print (b - a) / hz}')" \
        "$(awk '{print $2 + $3}' "$work/time")" \
        "$(awk -v a="$mid0" -v b="$(cpu_ticks "${mids[@]}")" -v hz="$HZ" 'BEGIN {print (b - a) / hz}')" \
        "$(awk -v a="$m0" -v b="$(cpu_ticks "${used[@]}")" -v hz="$HZ" 'BEGIN {print (b - a) / hz}')" \
        >"$RAW/rb/${cfg}__c${c}__r${r}.cpu"
      log "   round $r -c $c $cfg: $(tail -1 "$RAW/rb/${cfg}__c${c}__r${r}.csv" | awk -F'","' '{print $2}') req/s"
    done
  done
done

# --- 2. lock cycles with the load generator ---------------------------------------------
log "2. lock cycles (SET NX PX + EVALSHA release), ${CYCLE_S}s each"
for c in 1 50; do
  for cfg in direct proxy1 proxy3 proxy5 proxy7; do
    flush
    "$LOADGEN" --bench cycle --port "${target_port[$cfg]}" --workers "$c" --seconds "$CYCLE_S" \
      --label "$cfg" --hist "$RAW/cycle/${cfg}__c${c}.hist" >"$RAW/cycle/${cfg}__c${c}.json"
    log "   -c $c $cfg: $(python3 benches/report.py --line cycle "$RAW/cycle/${cfg}__c${c}.json")"
  done
done

# --- 3. client-side Redlock (node) vs ioredis through the proxy --------------------------
log "3. node: redlock over 5 masters vs ioredis through the proxy (N=5), 50 workers, ${NODE_S}s each"
for mode in redlock-masters ioredis-proxy redlock-proxy; do
  flush
  if [ "$mode" = redlock-masters ]; then ports=("${masters[@]:0:5}"); else ports=("${proxy_port[proxy5]}"); fi
  # lock_loop.js reads the CPU time of the proxy (none for client-side Redlock) and of the 5
  # masters at the edges of its measured window, and its own: what one lock cycle costs each
  # part, and the rate a proxy that cost nothing could reach on these cores (P4's bound).
  middle=""; [ "$mode" = redlock-masters ] || middle=${proxy_pid[proxy5]}
  MIDDLE_PIDS=$middle MASTER_PIDS="${master_pids[*]:0:5}" CLK_TCK=$HZ \
    timeout $((NODE_S + 60)) node benches/node/lock_loop.js "$mode" "$NODE_S" 50 "${ports[@]}" >"$RAW/node/$mode.json" \
    || die "node $mode failed"
  log "   $mode: $(python3 benches/report.py --line node "$RAW/node/$mode.json")"
done

# --- 4. one master paused ---------------------------------------------------------------
victim=${master_pids[4]}
log "4. one of 5 masters paused (SIGSTOP pid $victim, port ${masters[4]}), ${PAUSE_S}s per run"
for phase in healthy paused; do
  if [ "$phase" = paused ]; then
    kill -STOP "$victim"; stopped+=("$victim")
  fi
  for c in 1 50; do
    flush_ports=("${masters[@]:0:4}"); [ "$phase" = healthy ] && flush_ports=("${masters[@]:0:5}")
    for p in "${flush_ports[@]}"; do redis-cli -p "$p" FLUSHALL ASYNC >/dev/null; done
    # No warm-up when paused: the run starts right after SIGSTOP (or after the previous run),
    # so it includes the moments before the probe marks the master down.
    warm=0.5; [ "$phase" = paused ] && warm=0
    "$LOADGEN" --bench cycle --port "${proxy_port[proxy5]}" --workers "$c" --seconds "$PAUSE_S" --warmup "$warm" \
      --label "$phase" --hist "$RAW/paused/${phase}__c${c}.hist" >"$RAW/paused/${phase}__c${c}.json"
    log "   $phase -c $c: $(python3 benches/report.py --line paused "$RAW/paused/${phase}__c${c}.json")"
  done
done
kill -CONT "$victim"; stopped=()
redis-cli -p "${proxy_port[proxy5]}" INFO backends >"$RAW/paused/info_backends.txt" 2>&1 || true

# --- 5. memory per idle connection ------------------------------------------------------
log "5. memory: $CONNS idle client connections"
start_proxy memproxy 5
# redis-server refuses clients past maxclients (10000 by default).
redis-cli -p "${masters[5]}" CONFIG SET maxclients $((CONNS + 1000)) >/dev/null
redis-benchmark -p "${proxy_port[memproxy]}" -c 50 -n 20000 -r 1000000 SET "lock:__rand_int__" v NX PX 10000 >/dev/null 2>&1
declare -A mem_pid=([proxy5]=${proxy_pid[memproxy]} [redis]=${master_pids[5]} [nutcracker]=$nc_pid)
declare -A mem_port=([proxy5]=${proxy_port[memproxy]} [redis]=${masters[5]} [nutcracker]=$nc_port)
for t in proxy5 redis nutcracker; do
  pid=${mem_pid[$t]}; port=${mem_port[$t]}
  sleep 1
  before=$(rss_kb "$pid")
  rm -f "$work/ready" "$work/release"
  "$LOADGEN" --bench idle --port "$port" --conns "$CONNS" --ready-file "$work/ready" \
    --release-file "$work/release" --max-hold 120 >"$RAW/mem/$t.loadgen.json" &
  lg=$!; pids+=($lg)
  for _ in $(seq 1200); do [ -f "$work/ready" ] && break; kill -0 "$lg" 2>/dev/null || break; sleep 0.1; done
  [ -f "$work/ready" ] || die "idle connections to $t never opened"
  sleep 2
  after=$(rss_kb "$pid")
  touch "$work/release"
  wait "$lg" || die "idle connection check against $t failed"
  sleep 1
  closed=$(rss_kb "$pid")
  printf '{"target":"%s","conns":%s,"before_kb":%s,"after_kb":%s,"after_close_kb":%s}\n' \
    "$t" "$CONNS" "$before" "$after" "$closed" >"$RAW/mem/$t.json"
  log "   $t: VmRSS $before KiB -> $after KiB with $CONNS idle connections ($(( (after - before) * 1024 / CONNS )) bytes/conn), $closed KiB after close"
done

# --- 6. perf ----------------------------------------------------------------------------
if [ "$PERF" != 0 ] && command -v perf >/dev/null 2>&1; then
  log "6. perf: proxy N=5 under redis-benchmark -c 50 for ${PERF_S}s"
  flush
  pp=${proxy_pid[proxy5]}
  perf record -e cpu-clock -F 999 -g -p "$pp" -o "$work/perf.data" -- sleep "$PERF_S" >/dev/null 2>"$RAW/perf/record.log" &
  perf_job=$!
  sleep 0.3
  timeout $((PERF_S + 30)) redis-benchmark -p "${proxy_port[proxy5]}" -c 50 -n 10000000 -r 1000000 \
    SET "lock:__rand_int__" v NX PX 10000 >/dev/null 2>&1 &
  rbj=$!
  wait "$perf_job" || true
  kill "$rbj" 2>/dev/null || true; wait "$rbj" 2>/dev/null || true
  if [ -s "$work/perf.data" ]; then
    # Self time by symbol, inclusive time (children) by symbol, and time by thread.
    tidy() { grep -E '^ +[0-9]' | sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/[[:space:]]+$//' | head -"$1"; }
    perf report -i "$work/perf.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null | tidy 60 >"$RAW/perf/self.txt" || true
    perf report -i "$work/perf.data" --children --sort symbol --stdio -g none 2>/dev/null | tidy 80 >"$RAW/perf/children.txt" || true
    perf report -i "$work/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | tidy 20 >"$RAW/perf/dso.txt" || true
  elif [ "$PERF" = 1 ]; then
    die "perf record failed: $(cat "$RAW/perf/record.log")"
  fi
  # System calls and context switches per request (tracepoints; skipped where unavailable).
  ev=syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_read
  ev=$ev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,context-switches,task-clock
  for c in 1 50; do
    n=$N1; [ "$c" = 50 ] && n=$((N50 / 2))
    for cfg in direct nutcracker proxy1 proxy5; do
      pid=${master_pids[0]}; [ "$cfg" = nutcracker ] && pid=$nc_pid
      case $cfg in proxy*) pid=${proxy_pid[$cfg]} ;; esac
      flush
      perf stat -x, -e "$ev" -p "$pid" -o "$RAW/perf/stat_${cfg}__c${c}.csv" >/dev/null 2>&1 &
      ps_job=$!
      sleep 0.3
      redis-benchmark -p "${target_port[$cfg]}" -c "$c" -n "$n" -r 1000000 -q SET "lock:__rand_int__" v NX PX 10000 >/dev/null 2>&1
      kill -INT "$ps_job" 2>/dev/null || true; wait "$ps_job" 2>/dev/null || true
      echo "$n" >"$RAW/perf/stat_${cfg}__c${c}.requests"
    done
  done
else
  log "6. perf: skipped"
fi

# --- report -----------------------------------------------------------------------------
log "report"
python3 - "$RAW/meta.json" <<EOF
import json, sys
m = json.load(open(sys.argv[1])); m["loadavg_end"] = "$(cut -d' ' -f1-3 /proc/loadavg)"; m["seconds"] = $(( $(date +%s) - started ))
json.dump(m, open(sys.argv[1], "w"), indent=1)
EOF
python3 benches/report.py "$OUT"
log "done in $(( $(date +%s) - started ))s; report: $OUT/report.md, plots: $OUT/throughput_p99_vs_n.svg, $OUT/cycle_latency.svg"
