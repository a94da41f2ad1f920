#!/usr/bin/env bash
# Side by side with etcd: the same lock workload against etcd's lock API (three members) and
# against redlock-proxy over three Redis masters, same machine, same load generator
# (benches/compare, a crate of its own: `lockcompare`), one run each.
#
#   benches/compare.sh              # about 3 minutes after the builds
#   SECONDS_EACH=3 benches/compare.sh
#
# Measures:
#   1. lock-and-release cycles per second at 1 and 50 concurrent clients, with the
#      acquisition's p50/p99/p999 (HdrHistogram, µs): etcd Lock(name, lease) + Unlock(key),
#      against SET lock:<r> <token> NX PX 10000 + the release script (EVALSHA) through the proxy
#   2. the time from a holder's death (kill -9) to the next waiter's grant, TTL 5 s on both:
#      an etcd lease kept alive by the holder, against a proxy session lock (KEEPALIVE); the
#      waiter blocks in etcd's Lock, and in the proxy's LOCK.ACQUIRE ... WAIT
#   3. the longest time any of 10 clients went without completing a cycle when the etcd leader
#      is killed (kill -9), against when one of the three masters is
# etcd's data is on tmpfs, as the masters keep none (no fsync is paid by either side).
#
# Environment: OUT (default benches/results-compare), SECONDS_EACH (10), HANDOVERS (5),
# PROXY_BIN (measure another build of the proxy), LAYOUT (shared, the default, or split: etcd
# and the masters on CPU 1, the proxy and the load generator on CPU 0).
# Needs etcd (Debian's etcd-server) and protoc (protobuf-compiler), installed with apt-get when missing, redis-server,
# redis-cli, python3, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/benches/results-compare}
SECONDS_EACH=${SECONDS_EACH:-10}
HANDOVERS=${HANDOVERS:-5}
LAYOUT=${LAYOUT:-shared}
source "$ROOT/benches/common.sh"
started=$(date +%s)
log() { printf '[%4ss] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }
die() { echo "compare: $*" >&2; exit 1; }

servers_cpu=()
case "$LAYOUT" in
  shared) ;;
  split) taskset -pc 0 $$ >/dev/null; servers_cpu=(taskset -c 1) ;;
  *) die "LAYOUT is shared or split" ;;
esac

if ! command -v etcd >/dev/null; then
  [ "$(id -u)" = 0 ] || die "etcd is not installed (apt-get install -y etcd-server etcd-client)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server etcd-client >/dev/null
fi
if ! command -v protoc >/dev/null; then  # etcd-client's build compiles etcd's .proto files
  [ "$(id -u)" = 0 ] || die "protoc is not installed (apt-get install -y protobuf-compiler)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler >/dev/null
fi
for tool in etcd etcdctl protoc redis-server redis-cli python3 cargo; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

log "building the proxy and lockcompare"
if [ -z "${PROXY_BIN:-}" ]; then
  cargo build --release --bin redlock-proxy >&2
  PROXY_BIN=$ROOT/target/release/redlock-proxy
fi
COMPARE_TARGET=${COMPARE_TARGET:-$ROOT/target/compare}
CARGO_TARGET_DIR=$COMPARE_TARGET cargo build --release --manifest-path benches/compare/Cargo.toml >&2
LC=$COMPARE_TARGET/release/lockcompare

mkdir -p "$OUT"
RESULTS=$OUT/compare.jsonl
: > "$RESULTS"
scratch
# etcd's data on tmpfs, like the masters' (which keep none).
data=$(mktemp -d -p /dev/shm)
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work" "$data"' EXIT

# --- etcd: three members -------------------------------------------------------------------
declare -a etcd_client etcd_pid
cluster=""
declare -a peer
for i in 1 2 3; do peer[$i]=$(free_port); cluster+="${cluster:+,}e$i=http://127.0.0.1:${peer[$i]}"; done
for i in 1 2 3; do
  etcd_client[$i]=$(free_port)
  "${servers_cpu[@]}" etcd --name "e$i" --data-dir "$data/e$i" \
    --listen-client-urls "http://127.0.0.1:${etcd_client[$i]}" --advertise-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${peer[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$i]}" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token lockcompare \
    --log-level error >"$work/etcd$i.log" 2>&1 &
  etcd_pid[$i]=$!; pids+=($!)
done
ETCD=$(for i in 1 2 3; do printf 'http://127.0.0.1:%s,' "${etcd_client[$i]}"; done); ETCD=${ETCD%,}
for _ in $(seq 100); do
  etcdctl --endpoints "$ETCD" endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
etcdctl --endpoints "$ETCD" endpoint health >/dev/null 2>&1 || die "etcd never became healthy: $(tail -3 "$work/etcd1.log")"

# --- the proxy over three masters ------------------------------------------------------------
masters=(); master_pids=()
start_masters 3 "${servers_cpu[@]}"
printf 'quarantine = "restarts"\nlog_level = "warn"\n' > "$work/config.toml"
proxy_port=$(free_port)
args=(); for p in "${masters[@]}"; do args+=(--backend "redis://127.0.0.1:$p"); done
"$PROXY_BIN" --config "$work/config.toml" --listen "127.0.0.1:$proxy_port" "${args[@]}" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_ping "$proxy_port"
PROXY=127.0.0.1:$proxy_port
at() { if [ "$1" = etcd ]; then echo "$ETCD"; else echo "$PROXY"; fi; }

# --- 1. cycles ---------------------------------------------------------------------------------
for clients in 1 50; do
  for target in etcd proxy; do
    log "cycles: $target, $clients client(s), ${SECONDS_EACH} s"
    "$LC" cycles --target "$target" --at "$(at "$target")" --clients "$clients" --seconds "$SECONDS_EACH" | tee -a "$RESULTS" >&2
  done
done

# --- 2. handover after the holder's death -------------------------------------------------------
for target in etcd proxy; do
  for i in $(seq "$HANDOVERS"); do
    name="lock:handover:$target:$i"
    "$LC" hold --target "$target" --at "$(at "$target")" --name "$name" --ttl-s 5 >"$work/holder.out" 2>&1 &
    holder=$!; pids+=($holder)
    for _ in $(seq 100); do grep -q '^held' "$work/holder.out" && break; sleep 0.05; done
    grep -q '^held' "$work/holder.out" || die "the $target holder never held: $(cat "$work/holder.out")"
    log "handover: $target, run $i"
    "$LC" handover --target "$target" --at "$(at "$target")" --name "$name" --ttl-s 5 --holder "$holder" | tee -a "$RESULTS" >&2
    wait "$holder" 2>/dev/null || true
  done
done

# --- 3. the longest pause when a member dies ----------------------------------------------------
leader_port=$(etcdctl --endpoints "$ETCD" endpoint status -w json | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    if s["Status"]["leader"] == s["Status"]["header"]["member_id"]:
        print(s["Endpoint"].rsplit(":", 1)[1])')
leader_pid=""
for i in 1 2 3; do [ "${etcd_client[$i]}" = "$leader_port" ] && leader_pid=${etcd_pid[$i]}; done
[ -n "$leader_pid" ] || die "no etcd leader found"
log "pause: etcd, 10 clients, the leader (port $leader_port) killed at 3 s"
"$LC" pause --target etcd --at "$ETCD" --clients 10 --seconds 8 --kill "$leader_pid" --kill-at-ms 3000 | tee -a "$RESULTS" >&2
log "pause: proxy, 10 clients, one master of three killed at 3 s"
"$LC" pause --target proxy --at "$PROXY" --clients 10 --seconds 8 --kill "${master_pids[0]}" --kill-at-ms 3000 | tee -a "$RESULTS" >&2

# --- the tables ---------------------------------------------------------------------------------
python3 - "$RESULTS" "$(etcd --version | head -1)" "$(redis-server --version | cut -d' ' -f3)" "$LAYOUT" <<'PY' | tee "$OUT/report.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{sys.argv[2]}, Redis {sys.argv[3]}, layout {sys.argv[4]}\n")
print("| clients | system | cycles/s | acquire p50 µs | p99 µs | p999 µs | errors | proxy/etcd |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
cyc = [r for r in rows if "cycles_per_s" in r][:4]
for c in (1, 50):
    e = next(r for r in cyc if r["clients"] == c and r["target"] == "Etcd")
    p = next(r for r in cyc if r["clients"] == c and r["target"] == "Proxy")
    for r in (e, p):
        ratio = f"{p['cycles_per_s'] / e['cycles_per_s']:.2f}" if r is p else ""
        name = "etcd (Lock/Unlock)" if r is e else "proxy N=3 (SET NX PX + EVALSHA)"
        print(f"| {c} | {name} | {r['cycles_per_s']:,.0f} | {r['acquire_p50_us']} | {r['acquire_p99_us']} | {r['acquire_p999_us']} | {r['errors']} | {ratio} |")
print()
print("| holder killed (-9), TTL 5 s | runs | median ms | max ms |")
print("|---|---:|---:|---:|")
for t, name in (("Etcd", "etcd lease"), ("Proxy", "proxy session lock")):
    h = [r["handover_ms"] for r in rows if r.get("target") == t and "handover_ms" in r]
    print(f"| {name}: next waiter granted after | {len(h)} | {statistics.median(h):,.1f} | {max(h):,.1f} |")
print()
print("| member killed (-9), 10 clients cycling | longest pause ms | cycles | errors |")
print("|---|---:|---:|---:|")
pauses = [r for r in rows if "cycles_per_s" in r][4:]
for r in pauses:
    name = "etcd leader" if r["target"] == "Etcd" else "one master of three (proxy)"
    print(f"| {name} | {r['longest_gap_ms']:,} | {r['cycles']:,} | {r['errors']} |")
PY
log "done: $OUT/report.md"
