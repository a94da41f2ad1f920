#!/usr/bin/env bash
# A/B of two proxy builds (or one build under two configurations) in the same run: the way a
# change to the request path is judged before it lands. Same workload as the harness
# (SET lock:<rand> v NX PX 10000), interleaved rounds, medians and the B/A ratio per line.
#
#   A=old/redlock-proxy B=target/release/redlock-proxy benches/ab.sh
#   A=target/release/redlock-proxy B_CONF='threads = 2' benches/ab.sh
#
# Environment: A, B (binaries; B defaults to A), A_CONF, B_CONF (extra config.toml lines for
# each, e.g. 'threads = 2'), NS (masters per proxy, default "1 5"), CLIENTS ("1 50"), ROUNDS (5),
# REQUESTS (50000 at -c 50; a fifth of it at -c 1). nutcracker and direct Redis are measured
# in the same rounds as reference lines. Besides requests per second, the median CPU time the
# proxy (or nutcracker) spent per request: the steadier figure on a shared machine. Rounds
# alternate the order of the lines (the line run first in a round tends to run faster).
# LAYOUT=split pins the masters to CPU 1 and everything else to CPU 0, as harness.sh does.
set -euo pipefail
A=${A:?A=path to the first proxy binary}
B=${B:-$A}
NS=${NS:-1 5}
CLIENTS=${CLIENTS:-1 50}
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-50000}
masters_cpu=()
case "${LAYOUT:-shared}" in
  shared) ;;
  split) taskset -pc 0 $$ >/dev/null; masters_cpu=(taskset -c 1) ;;
  *) echo "ab: LAYOUT is shared or split" >&2; exit 1 ;;
esac

source "$(dirname "$0")/common.sh"
scratch

max_n=0
for n in $NS; do [ "$n" -gt "$max_n" ] && max_n=$n; done
masters=()
for _ in $(seq "$max_n"); do
  port=$(free_port)
  "${masters_cpu[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pids+=($!); wait_ping "$port"; masters+=("$port")
done
printf 'quarantine = "restarts"\nlog_level = "warn"\n%s\n' "${A_CONF:-}" > "$work/A.toml"
printf 'quarantine = "restarts"\nlog_level = "warn"\n%s\n' "${B_CONF:-}" > "$work/B.toml"

declare -A port_of pid_of
start_proxy() { # name binary n (config: the name's first letter)
  local port args=()
  port=$(free_port)
  for p in "${masters[@]:0:$3}"; do args+=(--backend "redis://127.0.0.1:$p"); done
  "$2" --config "$work/${1:0:1}.toml" --listen "127.0.0.1:$port" "${args[@]}" >"$work/$1.log" 2>&1 &
  pids+=($!); port_of[$1]=$port; pid_of[$1]=$!
  wait_ping "$port"
}
lines=(direct nutcracker)
port_of[direct]=${masters[0]}
for n in $NS; do
  start_proxy "A.N$n" "$A" "$n"
  start_proxy "B.N$n" "$B" "$n"
  lines+=("A.N$n" "B.N$n")
done
port_of[nutcracker]=$(free_port)
start_nutcracker "${port_of[nutcracker]}" "${masters[0]}" "$work"
pids+=("$NUTCRACKER_PID"); pid_of[nutcracker]=$NUTCRACKER_PID

# One redis-benchmark run: requests per second.
run() { # port clients requests
  redis-benchmark -p "$1" -c "$2" -n "$3" -r 1000000 -q SET 'lock:__rand_int__' v NX PX 10000 2>/dev/null \
    | tr '\r' '\n' | awk '/requests per second/ {for (i = 1; i <= NF; i++) if ($i == "requests") print $(i-1)}' | tail -1
}
for r in $(seq "$ROUNDS"); do
  for c in $CLIENTS; do
    n=$REQUESTS; [ "$c" -lt 50 ] && n=$((REQUESTS / 5))
    # Every other round the other way round: the line run first tends to run faster.
    order=("${lines[@]}")
    if [ $((r % 2)) = 0 ]; then
      order=(); for ((i = ${#lines[@]} - 1; i >= 0; i--)); do order+=("${lines[i]}"); done
    fi
    for line in "${order[@]}"; do
      # ASYNC: a synchronous flush of a run's keys stalls the master past the proxy's probe
      # timeout, and the next line would start against a master marked down.
      for p in "${masters[@]}"; do redis-cli -p "$p" FLUSHALL ASYNC >/dev/null; done
      pid=${pid_of[$line]:-}
      before=0; [ -n "$pid" ] && before=$(cpu_ticks "$pid")
      rps=$(run "${port_of[$line]}" "$c" "$n")
      us=nan; [ -n "$pid" ] && us=$(( ($(cpu_ticks "$pid") - before) * 1000000 / HZ / n ))
      echo "$c $line $rps $us" >> "$work/results"
    done
  done
  echo "round $r of $ROUNDS done" >&2
done

python3 - "$work/results" "$CLIENTS" "${lines[*]}" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 4]
clients, lines = sys.argv[2].split(), sys.argv[3].split()
med, cpu = {}, {}
for c in clients:
    for line in lines:
        v = [float(r[2]) for r in rows if r[0] == c and r[1] == line]
        med[c, line] = statistics.median(v) if v else float("nan")
        u = [float(r[3]) for r in rows if r[0] == c and r[1] == line]
        cpu[c, line] = statistics.median(u) if u else float("nan")
print(f"{'clients':>7}  {'line':<12} {'req/s (median)':>14}  {'vs direct':>9}  {'vs nutcracker':>13}  {'B/A':>6}  {'CPU us/req':>10}")
for c in clients:
    for line in lines:
        m = med[c, line]
        ba = ""
        if line.startswith("B."):
            ba = f"{m / med[c, 'A.' + line[2:]]:.2f}"
        print(f"{c:>7}  {line:<12} {m:>14.0f}  {m / med[c, 'direct']:>9.2f}  {m / med[c, 'nutcracker']:>13.2f}  {ba:>6}  {cpu[c, line]:>10.1f}")
EOF
