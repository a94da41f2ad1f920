#!/usr/bin/env bash
# A/B of two proxy builds (or one build under two configurations) in the same run: the way a
# change to the request path is judged before it lands. Same workload as the harness
# (SET lock:<rand> v NX PX 10000), interleaved rounds, medians and the B/A ratio per line.
#
#   A=old/redlock-proxy B=target/release/redlock-proxy benches/ab.sh
#   A=target/release/redlock-proxy B_CONF='threads = 2' benches/ab.sh
#
# Environment: A, B (binaries; B defaults to A), A_CONF, B_CONF (extra config.toml lines for
# each, e.g. 'threads = 2'), OP (acquire: the SET NX above, the default; release: the usual
# compare-and-delete script by EVAL, of a random key that is not held, so that every run takes
# the script path to every master), NS (masters per proxy, default "1 5"), CLIENTS ("1 50"), ROUNDS (5),
# REQUESTS (50000 at -c 50; a fifth of it at -c 1). nutcracker and direct Redis are measured
# in the same rounds as reference lines. Besides requests per second, the median CPU time the
# proxy (or nutcracker) spent per request: the steadier figure on a shared machine; the p50
# latency; the CPU time the masters spent per request (`INFO cpu`), against the line
# `direct-P16` (plain `SET NX PX` sent straight to the master pipelined 16 deep, the fair floor
# for a proxy that batches its requests); and the keys each master holds per lock taken. Rounds
# alternate the order of the lines (the line run first tends to run faster).
# LAYOUT=split pins the masters to CPU 1 and everything else to CPU 0, as harness.sh does.
set -euo pipefail
A=${A:?A=path to the first proxy binary}
B=${B:-$A}
NS=${NS:-1 5}
CLIENTS=${CLIENTS:-1 50}
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-50000}
case "${OP:-acquire}" in
  acquire) op=(SET 'lock:__rand_int__' v NX PX 10000) ;;
  release) op=(EVAL 'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end' 1 'lock:__rand_int__' v) ;;
  *) echo "ab: OP is acquire or release" >&2; exit 1 ;;
esac
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
lines=(direct direct-P16 nutcracker)
port_of[direct]=${masters[0]}
port_of[direct-P16]=${masters[0]}
for n in $NS; do
  start_proxy "A.N$n" "$A" "$n"
  start_proxy "B.N$n" "$B" "$n"
  lines+=("A.N$n" "B.N$n")
done
port_of[nutcracker]=$(free_port)
start_nutcracker "${port_of[nutcracker]}" "${masters[0]}" "$work"
pids+=("$NUTCRACKER_PID"); pid_of[nutcracker]=$NUTCRACKER_PID

# One redis-benchmark run: requests per second and p50 latency (ms), counted from the end of the
# CSV line (a script's text holds commas and unescaped quotes).
run() { # port clients requests [pipeline depth]
  redis-benchmark -p "$1" -c "$2" -n "$3" -P "${4:-1}" -r 1000000 --csv "${op[@]}" 2>/dev/null \
    | tr '\r' '\n' | awk -F, '/^"(SET|EVAL)/ {gsub(/"/, ""); print $(NF-6), $(NF-3)}' | tail -1
}
# CPU seconds (user + system) the masters on the first $1 ports have spent so far, in their main
# threads (Redis 7's `used_cpu_*_main_thread`): the commands' work, without the background
# thread that frees the keys of the previous line's `FLUSHALL ASYNC`.
masters_cpu() {
  for p in "${masters[@]:0:$1}"; do redis-cli -p "$p" INFO cpu; done | tr -d '\r' \
    | awk -F: '/^used_cpu_(user|sys)_main_thread:/ {s += $2} END {printf "%.6f", s}'
}
# How many masters line $1 uses.
masters_of() { case $1 in direct*|nutcracker) echo 1 ;; *) echo "${1##*N}" ;; esac; }
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
      m=$(masters_of "$line")
      before=0; [ -n "$pid" ] && before=$(cpu_ticks "$pid")
      master_before=$(masters_cpu "$m")
      depth=1; [ "$line" = direct-P16 ] && depth=16
      read -r rps p50 < <(run "${port_of[$line]}" "$c" "$n" "$depth")
      us=nan; [ -n "$pid" ] && us=$(( ($(cpu_ticks "$pid") - before) * 1000000 / HZ / n ))
      master_us=$(python3 -c "print(($(masters_cpu "$m") - $master_before) * 1e6 / $n / $m)")
      # Keys per lock on the first master: every key the run left, over the lock keys.
      keys=$(redis-cli -p "${masters[0]}" DBSIZE)
      locks=$(redis-cli -p "${masters[0]}" --scan --pattern 'lock:*' | wc -l)
      echo "$c $line $rps $us $p50 $master_us $keys $locks" >> "$work/results"
    done
  done
  echo "round $r of $ROUNDS done" >&2
done

python3 - "$work/results" "$CLIENTS" "${lines[*]}" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 8]
clients, lines = sys.argv[2].split(), sys.argv[3].split()
def median(c, line, col):
    v = [float(r[col]) for r in rows if r[0] == c and r[1] == line]
    return statistics.median(v) if v else float("nan")
print(f"{'clients':>7}  {'line':<12} {'req/s':>9} {'vs direct':>9} {'vs nutcr.':>9} {'B/A':>5} "
      f"{'p50 ms':>7} {'p50/direct':>10} {'proxy CPU us':>12} {'master CPU us/acq':>17} {'vs direct-P16':>13} {'keys/lock':>9}")
for c in clients:
    for line in lines:
        m = median(c, line, 2)
        ba = f"{m / median(c, 'A.' + line[2:], 2):.2f}" if line.startswith("B.") else ""
        p50, mcpu = median(c, line, 4), median(c, line, 5)
        keys, locks = median(c, line, 6), median(c, line, 7)
        print(f"{c:>7}  {line:<12} {m:>9.0f} {m / median(c, 'direct', 2):>9.2f} {m / median(c, 'nutcracker', 2):>9.2f} {ba:>5} "
              f"{p50:>7.3f} {p50 / median(c, 'direct', 4):>10.2f} {median(c, line, 3):>12.1f} {mcpu:>17.2f} "
              f"{mcpu / median(c, 'direct-P16', 5):>13.2f} {keys / locks if locks else float('nan'):>9.2f}")
EOF
