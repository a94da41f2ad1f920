#!/usr/bin/env bash
# What each lock recipe's acquisition costs, against a mutex's (`LOCK.ACQUIRE`), in one run:
# per acquisition, the commands the masters ran (every command `INFO commandstats` counts, those
# scripts run inside included, health checks aside), the scripts sent (round trips times N),
# the masters' CPU (`INFO cpu`) and the proxy's CPU (/proc), each as a ratio to `LOCK.ACQUIRE`'s.
# Uncontended: redis-benchmark with random keys (`-r 1000000`), so that nearly every request is
# a grant of a fresh lock, semaphore, read-write lock or set of keys.
#
#   cargo build --release && benches/recipes.sh
#
# Environment: PROXY (binary, default target/release/redlock-proxy), N (masters, 5), CLIENTS
# (50), ROUNDS (5, interleaved, medians), REQUESTS (20000 per kind and round), KINDS (names of
# the kinds below to run, default all that the proxy serves). `reentrant` is a first acquisition
# with `REENTRANT` (fresh keys: no count-up). A campaign (`ELECT.CAMPAIGN`) is a fenced session lock,
# a `LOCK.ACQUIRE ... KEEPALIVE`, and is left out: redis-benchmark would keep each as a session of
# its connection, and their releases at its end would land in the next kind's figures.
set -euo pipefail
PROXY=${PROXY:-target/release/redlock-proxy}
N=${N:-5}
CLIENTS=${CLIENTS:-50}
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-20000}

source "$(dirname "$0")/common.sh"
scratch

# name | the command redis-benchmark sends (each __rand_int__ is its own random number).
declare -A COMMAND=(
  [lock]='LOCK.ACQUIRE lock:__rand_int__ t__rand_int__ 10000'
  [semaphore]='SEM.ACQUIRE sem:__rand_int__ t__rand_int__ 3 10000'
  [read]='RWLOCK.READ rw:__rand_int__ t__rand_int__ 10000'
  [write]='RWLOCK.WRITE rw:__rand_int__ t__rand_int__ 10000'
  [reentrant]='LOCK.ACQUIRE lock:__rand_int__ t__rand_int__ 10000 REENTRANT'
  [three-keys]='LOCK.ACQUIREALL t__rand_int__ 10000 3 {m__rand_int__}a {m__rand_int__}b {m__rand_int__}c'
)
ORDER=(lock semaphore read write reentrant three-keys)

masters=()
args=()
for _ in $(seq "$N"); do
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pids+=($!); wait_ping "$port"; args+=(--backend "redis://127.0.0.1:$port"); masters+=("$port")
done
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/proxy.toml"
proxy=$(free_port)
"$PROXY" --config "$work/proxy.toml" --listen "127.0.0.1:$proxy" "${args[@]}" >"$work/proxy.log" 2>&1 &
proxy_pid=$!
pids+=("$proxy_pid")
wait_ping "$proxy"
# The database's fencing epochs are made by its first fenced acquisition (once per database).
for _ in $(seq 50); do
  [ -n "$(redis-cli -p "$proxy" LOCK.ACQUIRE warm-up w 1000)" ] && break
  sleep 0.1
done

# The kinds this proxy serves (a kind whose command it does not know is left out).
kinds=()
for kind in ${KINDS:-${ORDER[*]}}; do
  read -r -a words <<< "${COMMAND[$kind]//__rand_int__/0}"
  if redis-cli -p "$proxy" COMMAND INFO "${words[0]}" | grep -qi "${words[0]}"; then
    kinds+=("$kind")
  else
    echo "($kind: ${words[0]} is not served by this proxy; left out)"
  fi
done

# Commands the masters ran so far (health checks aside), their scripts, their CPU in ms.
master_stats() {
  local calls=0 scripts=0 cpu=0 port
  for port in "${masters[@]}"; do
    read -r c s u <<< "$(redis-cli -p "$port" INFO all | tr -d '\r' | awk -F'[:=,]' '
      /^cmdstat_/ { name = substr($1, 9); if (name !~ /^(ping|info|client|hello|select|psubscribe|subscribe|command|config)$/) c += $3;
                    if (name ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall)$/) s += $3 }
      /^used_cpu_(sys|user):/ { u += $2 * 1000 }
      END { printf "%d %d %d\n", c, s, u }')"
    calls=$((calls + c)); scripts=$((scripts + s)); cpu=$((cpu + u))
  done
  echo "$calls $scripts $cpu"
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "N=$N masters, $ROUNDS rounds of $REQUESTS requests at -c $CLIENTS, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for r in $(seq "$ROUNDS"); do
  # Rotate the order each round, so that no kind always runs first.
  n=${#kinds[@]}
  for i in $(seq 0 $((n - 1))); do
    kind=${kinds[$(((i + r) % n))]}
    read -r c0 s0 m0 <<< "$(master_stats)"
    p0=$(cpu_ticks "$proxy_pid")
    read -r -a words <<< "${COMMAND[$kind]}"
    out=$(redis-benchmark -p "$proxy" -c "$CLIENTS" -n "$REQUESTS" -r 1000000 -q "${words[@]}" 2>&1 | tr '\r' '\n' | grep -i 'requests per second' | tail -1)
    p1=$(cpu_ticks "$proxy_pid")
    read -r c1 s1 m1 <<< "$(master_stats)"
    rps=$(awk '{for (i = 1; i <= NF; i++) if ($(i + 1) == "requests") print $i}' <<< "$out")
    awk -v n="$REQUESTS" -v c=$((c1 - c0)) -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v p=$(((p1 - p0) * 1000 / HZ)) -v rps="$rps" \
      'BEGIN { printf "%.3f %.3f %.2f %.2f %s\n", c / n, s / n, m * 1000 / n, p * 1000 / n, rps }' >> "$work/$kind"
  done
done

# Per kind: medians of commands, scripts, master CPU (us), proxy CPU (us), req/s; ratios to lock.
col() { awk -v k="$2" '{print $k}' "$work/$1" | median; }
printf '%-11s %9s %9s %9s %9s %9s %8s %8s %8s %8s\n' kind commands scripts master_us proxy_us req/s cmd/lock scr/lock mcpu/lk pcpu/lk
for kind in "${kinds[@]}"; do
  printf '%-11s %9s %9s %9s %9s %9s' "$kind" "$(col "$kind" 1)" "$(col "$kind" 2)" "$(col "$kind" 3)" "$(col "$kind" 4)" "$(col "$kind" 5)"
  for k in 1 2 3 4; do
    awk -v a="$(col "$kind" $k)" -v b="$(col lock $k)" 'BEGIN { printf " %8.2f", (b > 0) ? a / b : 0 }'
  done
  echo
done
