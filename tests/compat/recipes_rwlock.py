"""A read-write lock through redlock-proxy from redis-py, with `execute_command`.

usage: recipes_rwlock.py PORT

Readers share (RWLOCK.READ), a writer is refused while they hold and granted once they
release (RWLOCK.WRITE), fencing tokens rise across read and write grants, a reader asking to
write gets an error (no upgrade), EXTEND, INFO, a writer waiting (WAIT) is handed the lock by
a release, a KEEPALIVE hold outlives its TTL; once with redis-py's default protocol (RESP3 in
8.x) and once with `protocol=2`. Prints one line per check and exits 1 when any failed.
"""

import sys
import threading
import time
import traceback

import redis

from checks import check, failures

HOST = "127.0.0.1"


def info(r, key):
    """RWLOCK.INFO as a dict (a map in RESP3, a flat list in RESP2)."""
    shown = r.execute_command("RWLOCK.INFO", key)
    if isinstance(shown, list):
        shown = dict(zip(shown[::2], shown[1::2]))
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in shown.items()}


def run(port, protocol):
    p = f"[protocol={protocol or 'default'}]"
    kwargs = {"host": HOST, "port": port, "socket_timeout": 10, "socket_connect_timeout": 5}
    if protocol is not None:
        kwargs["protocol"] = protocol
    r = redis.Redis(**kwargs)
    other = redis.Redis(**kwargs)
    key = f"doc:{protocol or 'default'}"

    tokens = []
    for reader in ("r1", "r2"):
        token = r.execute_command("RWLOCK.READ", key, reader, 10000)
        check(f"{p} RWLOCK.READ {reader} -> a fencing token", isinstance(token, int), repr(token))
        tokens.append(token)
    check(f"{p} readers' tokens rise", tokens[1] > tokens[0], repr(tokens))
    readers = sorted(t.decode() for t in info(r, key)["readers"])
    check(f"{p} RWLOCK.INFO readers", readers == ["r1", "r2"], repr(readers))
    check(f"{p} RWLOCK.WRITE while readers hold -> None", other.execute_command("RWLOCK.WRITE", key, "w1", 10000) is None)
    try:
        r.execute_command("RWLOCK.WRITE", key, "r1", 10000)
        check(f"{p} a reader asking to write is refused", False, "no error")
    except redis.ResponseError as e:
        check(f"{p} a reader asking to write is refused", "not upgraded" in str(e), str(e))
    extended = r.execute_command("RWLOCK.EXTEND", key, "r1", 10000)
    check(f"{p} RWLOCK.EXTEND -> validity in ms", isinstance(extended, int) and 9000 < extended <= 10000, repr(extended))

    # A writer waiting is handed the lock by the last reader's release.
    got = {}

    def wait_write():
        got["token"] = other.execute_command("RWLOCK.WRITE", key, "w1", 10000, "WAIT", 5000)

    waiter = threading.Thread(target=wait_write)
    waiter.start()
    deadline = time.monotonic() + 5
    while info(r, key)["writer_waiting"] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    check(f"{p} RWLOCK.INFO writer_waiting 1", info(r, key)["writer_waiting"] == 1)
    check(f"{p} a new reader waits behind the writer -> None", r.execute_command("RWLOCK.READ", key, "r3", 10000) is None)
    for reader in ("r1", "r2"):
        check(f"{p} RWLOCK.RELEASE {reader} -> 1", r.execute_command("RWLOCK.RELEASE", key, reader) == 1)
    waiter.join(10)
    check(f"{p} the waiting writer got the lock, above the readers' tokens", isinstance(got.get("token"), int) and got["token"] > tokens[1], repr(got))
    shown = info(r, key)
    writer = shown["writer"].decode() if isinstance(shown["writer"], bytes) else shown["writer"]
    check(f"{p} RWLOCK.INFO writer w1", writer == "w1", repr(shown))
    check(f"{p} RWLOCK.READ while the writer holds -> None", r.execute_command("RWLOCK.READ", key, "r4", 10000) is None)
    check(f"{p} RWLOCK.RELEASE w1 -> 1", other.execute_command("RWLOCK.RELEASE", key, "w1") == 1)
    check(f"{p} RWLOCK.RELEASE w1 again -> 0", other.execute_command("RWLOCK.RELEASE", key, "w1") == 0)

    # KEEPALIVE: the hold outlives its TTL while the connection is open.
    kept = r.execute_command("RWLOCK.READ", key, "k", 600, "KEEPALIVE")
    check(f"{p} RWLOCK.READ KEEPALIVE -> a token", isinstance(kept, int), repr(kept))
    time.sleep(1.0)
    readers = [t.decode() for t in info(other, key)["readers"]]
    check(f"{p} the KEEPALIVE reader still holds after its TTL", readers == ["k"], repr(readers))
    check(f"{p} RWLOCK.RELEASE k -> 1", r.execute_command("RWLOCK.RELEASE", key, "k") == 1)
    r.close()
    other.close()


def main():
    if len(sys.argv) != 2:
        print("usage: recipes_rwlock.py PORT", file=sys.stderr)
        return 2
    port = int(sys.argv[1])
    print(f"redis-py {redis.__version__} against {HOST}:{port}")
    for protocol in (None, 2):
        try:
            run(port, protocol)
        except Exception:
            check(f"[protocol={protocol or 'default'}] ran without an exception", False, traceback.format_exc())
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
