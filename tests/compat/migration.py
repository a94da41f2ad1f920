"""A rolling deploy, in one process: old instances lock on the legacy Redis directly, upgraded
ones lock through the proxies, on the same keys, each holder inside a guarded resource that
counts every overlap (two holders of one key inside at once).

Two kinds of lock code, each run by old and new instances alike (the same code, only the
address differs, as in a rollout):
  - the SETNX/GET/GETSET/DEL pattern of docs/migrating-from-setnx.md, on key lock:setnx;
  - redis-py's Lock (SET NX PX with a token, scripts to release), on key lock:pylock.

Usage: migration.py LEGACY_PORT PROXY_PORT[,PROXY_PORT...]
Prints a `progress {json}` line every 0.2 s with the acquisitions per group, and runs until a
line `stop` (or the end) arrives on stdin; then prints `result {json}`.
Exits 0 whatever it counted: the test judges the figures.
"""

import json
import sys
import threading
import time

import redis

LEGACY = int(sys.argv[1])
PROXIES = [int(p) for p in sys.argv[2].split(",")]
TIMEOUT = 2.0  # seconds a SETNX-pattern lock may be held (written into its value)
LOCK_TTL = 2.0  # redis-py Lock's timeout, seconds
HOLD = 0.002  # seconds inside the resource

stop = threading.Event()
guard = threading.Lock()
inside = {}  # key -> set of holder names inside the resource now
overlaps = []
counts = {}
errors = {}


def enter(key, who):
    with guard:
        holders = inside.setdefault(key, set())
        if holders:
            overlaps.append({"key": key, "entering": who, "inside": sorted(holders), "at": time.time()})
        holders.add(who)
        counts[who] = counts.get(who, 0) + 1


def leave(key, who):
    with guard:
        inside[key].discard(who)


def error(who, e):
    with guard:
        errors.setdefault(who, []).append(type(e).__name__ + ": " + str(e)[:160])
        del errors[who][:-5]


def client(port):
    return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)


def expiry_of(value):
    try:
        return float(value.decode().split(":")[0])
    except (ValueError, AttributeError):
        return None


def setnx_pattern(who, port):
    """The guide's SETNX + GET + GETSET + DEL lock, values tagged with the writer."""
    r = client(port)
    key = "lock:setnx"
    n = 0
    while not stop.is_set():
        n += 1
        try:
            expires = time.time() + TIMEOUT
            value = f"{expires}:{who}:{n}"
            won = r.setnx(key, value) == 1
            if not won:
                held = r.get(key)
                stale = expiry_of(held) if held is not None else None
                if stale is not None and stale < time.time():
                    old = r.getset(key, value)
                    won = old is not None and old == held
            if not won:
                time.sleep(0.003)
                continue
            enter(key, who)
            time.sleep(HOLD)
            leave(key, who)
            if time.time() < expires:
                r.delete(key)
        except redis.RedisError as e:
            error(who, e)
            time.sleep(0.01)


def redis_py_lock(who, port):
    """redis-py's Lock: SET NX PX with a token, released and extended by its scripts."""
    r = client(port)
    key = "lock:pylock"
    while not stop.is_set():
        lock = r.lock(key, timeout=LOCK_TTL, blocking=False)
        try:
            if not lock.acquire(blocking=False):
                time.sleep(0.003)
                continue
            enter(key, who)
            time.sleep(HOLD)
            leave(key, who)
            lock.release()
        except redis.RedisError as e:
            error(who, e)
            time.sleep(0.01)


def main():
    workers = [
        ("old-setnx-1", setnx_pattern, LEGACY),
        ("old-setnx-2", setnx_pattern, LEGACY),
        ("old-pylock-1", redis_py_lock, LEGACY),
        ("old-pylock-2", redis_py_lock, LEGACY),
    ]
    for i, port in enumerate(PROXIES):
        workers.append((f"new-setnx-{i}", setnx_pattern, port))
        workers.append((f"new-pylock-{i}", redis_py_lock, port))
    threads = [threading.Thread(target=f, args=(who, port), daemon=True) for who, f, port in workers]
    for t in threads:
        t.start()

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.2):
        with guard:
            print("progress " + json.dumps({"counts": counts, "overlaps": len(overlaps)}), flush=True)
    for t in threads:
        t.join(timeout=10)
    with guard:
        print(
            "result " + json.dumps({"counts": counts, "overlaps": overlaps[:20], "overlap_count": len(overlaps), "errors": errors}),
            flush=True,
        )


main()
