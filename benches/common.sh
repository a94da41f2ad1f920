# Helpers shared by benches/harness.sh and benches/ab.sh (sourced, not run).

# A scratch folder ($work) and the processes started ($pids): removed and stopped when the script
# exits.
scratch() {
  work=$(mktemp -d)
  pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
  trap 'exit 130' INT TERM
}

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until the server on port $1 answers PING ($2 seconds at most, default 10), else stops
# the script.
wait_ping() {
  for _ in $(seq $(( ${2:-10} * 20 ))); do
    [ "$(redis-cli -p "$1" PING 2>/dev/null)" = PONG ] && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): port $1 never answered PING" >&2
  exit 1
}

# Starts $1 redis-servers on free ports, without persistence, each prefixed by the command in
# the rest of the arguments (e.g. `taskset -c 1`); appends their ports to `masters`, their pids
# to `master_pids` and `pids`.
start_masters() {
  local n=$1 port; shift
  for _ in $(seq "$n"); do
    port=$(free_port)
    "$@" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    pids+=($!); master_pids+=($!); wait_ping "$port"; masters+=("$port")
  done
}

# CPU time (user + system, all threads) of processes so far, in clock ticks; 0 for none.
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}'))); done; echo "$t"; }
HZ=$(getconf CLK_TCK)

# Starts nutcracker (twemproxy) on port $1 in front of the redis-server on port $2, its files in
# folder $3; sets NUTCRACKER_PID. The caller kills it.
start_nutcracker() {
  cat > "$3/nutcracker.yml" <<YML
bench:
  listen: 127.0.0.1:$1
  hash: fnv1a_64
  distribution: ketama
  redis: true
  servers:
   - 127.0.0.1:$2:1
YML
  nutcracker -c "$3/nutcracker.yml" -s "$(free_port)" -a 127.0.0.1 -o "$3/nutcracker.log" &
  NUTCRACKER_PID=$!
  wait_ping "$1"
}
