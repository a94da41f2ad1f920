"""redis-py's `Lock` (redis.lock.Lock) against redlock-proxy.

usage: redis_py_lock.py PORT

Runs every check twice: once with redis-py's default protocol (RESP3 in 8.x: the
connection starts with `HELLO 3`) and once with `protocol=2`. Prints one line per
check and exits 1 when any check failed.
"""

import multiprocessing
import sys
import time
import traceback

import redis
from redis.exceptions import LockError, LockNotOwnedError

HOST = "127.0.0.1"
TIMEOUT_S = 10  # the lock's TTL in the main checks
DEFAULT_TTL_MS = 30_000  # the proxy's default_ttl_ms, for a lock taken without a TTL

from checks import check, failures


def client(port, protocol):
    kwargs = {"host": HOST, "port": port, "socket_timeout": 5, "socket_connect_timeout": 5}
    if protocol is not None:
        kwargs["protocol"] = protocol
    return redis.Redis(**kwargs)


def contender(port, protocol, name, held, go, results):
    """Runs in another process: a second Lock on `name` with its own token."""
    try:
        r = client(port, protocol)
        other = r.lock(name, timeout=TIMEOUT_S)
        results.put(("ready", r.ping()))
        # Told to go on once the first holder has the lock.
        if not held.wait(30):
            results.put(("error", "never told that the lock was taken"))
            return
        results.put(("seen", (time.time(), r.get(name), r.pttl(name))))
        results.put(("locked_seen", other.locked()))
        results.put(("owned_while_held", other.owned()))
        results.put(("acquired_while_held", other.acquire(blocking=False)))
        # Told to go on once the first holder released.
        if not go.wait(30):
            results.put(("error", "never told that the lock was released"))
            return
        results.put(("acquired_after_release", other.acquire(blocking=False)))
        results.put(("owned_after_acquire", other.owned()))
        token = other.local.token
        results.put(("holder_value", (r.get(name), token)))
        other.release()
        results.put(("released", True))
    except Exception:  # reported to the parent, which fails the check
        results.put(("error", traceback.format_exc()))


def expect_from(results, key):
    """The next value the contender sent; it must be labelled `key`."""
    try:
        got_key, value = results.get(timeout=30)
    except Exception:
        return ("<nothing>", None)
    if got_key == "error":
        return ("error", value)
    if got_key != key:
        return (got_key, value)
    return (key, value)


# The masters' clocks and the proxy's combining may differ from the expected TTL by a few ms.
SLACK_MS = 25


def check_pttl(label, r, name, expected_ms, since):
    """PTTL through the proxy is `expected_ms` less at most the time spent since `since`
    (time.monotonic() taken before the command that set the TTL)."""
    t = r.pttl(name)
    spent = (time.monotonic() - since) * 1000
    low = expected_ms - spent - SLACK_MS
    ok = isinstance(t, int) and low <= t <= expected_ms + 5
    check(label, ok, f"PTTL {t!r}, want {low:.0f}..{expected_ms} ({spent:.0f} ms spent since the command)")


def run(port, protocol):
    tag = "resp3(default)" if protocol is None else f"protocol={protocol}"
    p = f"[{tag}]"
    name = f"lock:py:{'default' if protocol is None else protocol}"
    r = client(port, protocol)

    # The connection handshake: redis-py 8.x sends HELLO 3 by default and needs proto 3 back.
    conn = r.connection_pool.get_connection()
    try:
        meta = conn.handshake_metadata
        if protocol is None:
            proto = None
            if isinstance(meta, dict):
                proto = meta.get(b"proto", meta.get("proto"))
            check(f"{p} default connection negotiated RESP3 (HELLO 3 -> proto 3)", proto == 3, f"HELLO reply {meta!r}")
        else:
            check(f"{p} RESP2 connection, no HELLO sent", meta is None, f"handshake {meta!r}")
    finally:
        r.connection_pool.release(conn)
    check(f"{p} PING", r.ping() is True)

    r.delete(name)

    # Another process, with its own client, Lock object and token, started (which takes a
    # while) before the lock is taken, so that the lock's TTL does not run during its start.
    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()
    go = ctx.Event()
    results = ctx.Queue()
    proc = ctx.Process(target=contender, args=(port, protocol, name, held, go, results))
    proc.start()
    try:
        k, v = expect_from(results, "ready")
        check(f"{p} other process connected (PING)", (k, v) == ("ready", True), f"{k}={v!r}")

        # acquire
        lock = r.lock(name, timeout=TIMEOUT_S)
        acquired_at = time.time()
        since = time.monotonic()
        got = lock.acquire(blocking=False)
        check(f"{p} acquire(blocking=False) -> True", got is True, f"got {got!r}")
        check(f"{p} owned() -> True", lock.owned() is True)
        check(f"{p} locked() -> True", lock.locked() is True)
        value = r.get(name)
        check(f"{p} GET returns this lock's token", value == lock.local.token, f"GET {value!r}, token {lock.local.token!r}")
        check_pttl(f"{p} PTTL after acquire is 10000 less the time spent", r, name, 10_000, since)

        # contention from the other process
        held.set()
        k, v = expect_from(results, "seen")
        if k == "seen":
            print(f"info {p} other process looked {(v[0] - acquired_at) * 1000:.0f} ms after the acquire: GET {v[1]!r}, PTTL {v[2]!r}", flush=True)
        k, v = expect_from(results, "locked_seen")
        check(f"{p} other process: locked() -> True while held", (k, v) == ("locked_seen", True), f"{k}={v!r}")
        k, v = expect_from(results, "owned_while_held")
        check(f"{p} other process: owned() -> False while held", (k, v) == ("owned_while_held", False), f"{k}={v!r}")
        k, v = expect_from(results, "acquired_while_held")
        check(f"{p} other process: acquire(blocking=False) refused while held", (k, v) == ("acquired_while_held", False), f"{k}={v!r}")
        check(f"{p} first holder still owns it after the refused attempt", lock.owned() is True)

        # extend (additive), extend(replace_ttl=True), reacquire: each read back with PTTL
        since = time.monotonic()
        before = r.pttl(name)
        ok = lock.extend(5)
        check(f"{p} extend(5) -> True", ok is True, f"got {ok!r}")
        check_pttl(f"{p} PTTL after extend(5) is the PTTL before it + 5000", r, name, before + 5000, since)
        since = time.monotonic()
        ok = lock.extend(3, replace_ttl=True)
        check(f"{p} extend(3, replace_ttl=True) -> True", ok is True, f"got {ok!r}")
        check_pttl(f"{p} PTTL after extend(3, replace_ttl=True) is 3000", r, name, 3000, since)
        since = time.monotonic()
        ok = lock.reacquire()
        check(f"{p} reacquire() -> True", ok is True, f"got {ok!r}")
        check_pttl(f"{p} PTTL after reacquire() is 10000 again", r, name, 10_000, since)

        # release; the other process then gets it
        try:
            lock.release()
            check(f"{p} release()", True)
        except Exception as e:
            check(f"{p} release()", False, repr(e))
        check(f"{p} locked() -> False after release", lock.locked() is False)
        check(f"{p} owned() -> False after release", lock.owned() is False)
        t = r.pttl(name)
        check(f"{p} PTTL -2 after release", t == -2, f"PTTL {t!r}")
        go.set()
        k, v = expect_from(results, "acquired_after_release")
        check(f"{p} other process: acquire(blocking=False) -> True after release", (k, v) == ("acquired_after_release", True), f"{k}={v!r}")
        k, v = expect_from(results, "owned_after_acquire")
        check(f"{p} other process: owned() -> True", (k, v) == ("owned_after_acquire", True), f"{k}={v!r}")
        k, v = expect_from(results, "holder_value")
        check(f"{p} GET returns the other process's token", k == "holder_value" and v[0] == v[1], f"{k}={v!r}")
        k, v = expect_from(results, "released")
        check(f"{p} other process: release()", (k, v) == ("released", True), f"{k}={v!r}")
    finally:
        held.set()
        go.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    check(f"{p} other process exited 0", proc.exitcode == 0, f"exit code {proc.exitcode!r}")
    check(f"{p} lock free after the other process released", r.exists(name) == 0)

    # Releasing a lock that is no longer owned: it expired and someone else holds it.
    short = r.lock(name, timeout=0.5)
    check(f"{p} acquire short lock (timeout=0.5)", short.acquire(blocking=False) is True)
    time.sleep(0.8)
    check(f"{p} short lock expired: locked() -> False", short.locked() is False)
    taker = r.lock(name, timeout=TIMEOUT_S)
    check(f"{p} another Lock takes the expired lock", taker.acquire(blocking=False) is True)
    try:
        short.extend(1)
        check(f"{p} extend() of a lock no longer owned raises LockNotOwnedError", False, "no exception")
    except LockNotOwnedError:
        check(f"{p} extend() of a lock no longer owned raises LockNotOwnedError", True)
    try:
        short.release()
        check(f"{p} release() of a lock no longer owned raises LockNotOwnedError", False, "no exception")
    except LockNotOwnedError:
        check(f"{p} release() of a lock no longer owned raises LockNotOwnedError", True)
    check(f"{p} the new holder still owns it after the failed release", taker.owned() is True)
    taker.release()

    # Released behind its back (DEL through the proxy): release() raises LockNotOwnedError.
    gone = r.lock(name, timeout=TIMEOUT_S)
    check(f"{p} acquire, then DEL through the proxy", gone.acquire(blocking=False) is True and r.delete(name) == 1)
    try:
        gone.release()
        check(f"{p} release() after the key was deleted raises LockNotOwnedError", False, "no exception")
    except LockNotOwnedError:
        check(f"{p} release() after the key was deleted raises LockNotOwnedError", True)

    # The context manager form, blocking with a timeout.
    try:
        with r.lock(name, timeout=5, blocking_timeout=2) as held:
            check(f"{p} `with r.lock(...)` holds the lock inside", held.owned() is True)
        check(f"{p} `with r.lock(...)` released it on exit", r.exists(name) == 0)
    except LockError as e:
        check(f"{p} `with r.lock(...)`", False, repr(e))

    # After SCRIPT FLUSH the proxy answers EVALSHA with NOSCRIPT; redis-py then sends
    # SCRIPT LOAD and EVALSHA again.
    check(f"{p} SCRIPT FLUSH -> True", r.script_flush() is True)
    sha = redis.lock.Lock.lua_release.sha
    exists = r.script_exists(sha)
    check(f"{p} SCRIPT EXISTS release script -> [False] after the flush", exists == [False], f"got {exists!r}")
    reloaded = r.lock(name, timeout=TIMEOUT_S)
    check(f"{p} acquire after SCRIPT FLUSH", reloaded.acquire(blocking=False) is True)
    try:
        reloaded.release()
        check(f"{p} release() after SCRIPT FLUSH (NOSCRIPT -> SCRIPT LOAD -> EVALSHA)", True)
    except Exception as e:
        check(f"{p} release() after SCRIPT FLUSH (NOSCRIPT -> SCRIPT LOAD -> EVALSHA)", False, repr(e))
    exists = r.script_exists(sha)
    check(f"{p} SCRIPT EXISTS release script -> [True] after the reload", exists == [True], f"got {exists!r}")
    check(f"{p} free after that release", r.exists(name) == 0)

    # timeout=None: redis-py sends `SET name token NX` with no TTL; the proxy gives it default_ttl_ms.
    forever = r.lock(name, timeout=None)
    since = time.monotonic()
    check(f"{p} timeout=None: acquire -> True", forever.acquire(blocking=False) is True)
    check_pttl(f"{p} timeout=None: PTTL is the proxy's default TTL ({DEFAULT_TTL_MS})", r, name, DEFAULT_TTL_MS, since)
    rival = r.lock(name, timeout=None)
    check(f"{p} timeout=None: a second Lock is refused", rival.acquire(blocking=False) is False)
    try:
        forever.release()
        check(f"{p} timeout=None: release()", True)
    except Exception as e:
        check(f"{p} timeout=None: release()", False, repr(e))
    check(f"{p} timeout=None: free after release", r.exists(name) == 0)

    # The proxy's own waiting and session locks, through redis-py's generic command call.
    held = r.execute_command("LOCK.ACQUIRE", name, "w-holder", 10000, "KEEPALIVE")
    check(f"{p} LOCK.ACQUIRE ... KEEPALIVE -> a fencing token", isinstance(held, int), repr(held))
    waited = r.execute_command("LOCK.ACQUIRE", name, "w-waiter", 10000, "WAIT", 200)
    check(f"{p} LOCK.ACQUIRE ... WAIT 200 while held -> None", waited is None, repr(waited))
    released = r.execute_command("LOCK.RELEASE", name, "w-holder")
    check(f"{p} LOCK.RELEASE of the session lock -> 1", released == 1, repr(released))
    got = r.execute_command("LOCK.ACQUIRE", name, "w-waiter", 10000, "WAIT", 1000)
    check(f"{p} LOCK.ACQUIRE ... WAIT 1000 once free -> a higher token", isinstance(got, int) and got > held, repr(got))
    r.execute_command("LOCK.RELEASE", name, "w-waiter")
    r.close()


def main():
    if len(sys.argv) < 2:
        print("usage: redis_py_lock.py PORT", file=sys.stderr)
        return 2
    port = int(sys.argv[1])
    print(f"redis-py {redis.__version__} against 127.0.0.1:{port}", flush=True)
    for protocol in (None, 2):
        try:
            run(port, protocol)
        except Exception:
            check(f"[protocol={protocol}] run completed without an exception", False, traceback.format_exc())
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
