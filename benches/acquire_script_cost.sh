#!/usr/bin/env bash
# What the acquisition script costs a master, against a plain `SET NX PX` in the same run:
# the script as it was before rule 15's clock reading, and as it is (with `TIME` read after the
# write). One master on a free port, redis-benchmark with random keys (nearly every call
# grants, so the clock reading runs), pipelined so the master, not the loopback, is the limit.
# Reports requests a second and each script's ratio to the plain SET.
#
#   bash benches/acquire_script_cost.sh [requests] [rounds]
set -euo pipefail
requests=${1:-500000}
rounds=${2:-3}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
  --logfile "$dir/redis.log" >/dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done

before="if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[2]) return 1 end return {redis.call('pttl', KEYS[1])}"
# The script as the proxy sent it from issue #27 until the acquisition became a transaction
# (src/backend/acquire.rs; benches/acquire_forms.py measures that against these).
now="if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[2]) local t = redis.call('time') return {1, t[1], t[2]} end return {redis.call('pttl', KEYS[1])}"

rate() {
  redis-cli -p "$port" flushall >/dev/null
  redis-benchmark -p "$port" -n "$requests" -c 50 -P 16 -r 100000000 -q "$@" 2>/dev/null |
    tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1
}

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $requests requests a run, $rounds rounds"
for round in $(seq "$rounds"); do
  set_nx=$(rate SET "k:__rand_int__" v NX PX 10000)
  old=$(rate EVAL "$before" 2 "k:__rand_int__" "m:__rand_int__" v 10000 n)
  new=$(rate EVAL "$now" 2 "k:__rand_int__" "m:__rand_int__" v 10000 n)
  python3 - "$round" "$set_nx" "$old" "$new" <<'EOF'
import sys
r, s, o, n = sys.argv[1], *map(float, sys.argv[2:])
print(f"round {r}: SET NX PX {s:,.0f}/s; script before {o:,.0f}/s ({o/s:.2f} of SET); "
      f"script with TIME {n:,.0f}/s ({n/s:.2f} of SET, {n/o:.3f} of before)")
EOF
done
