"""Reentrant locks and several locks at once through redis-py's `execute_command`,
against redlock-proxy.

usage: recipes_locks.py PORT

A holder takes its lock again with REENTRANT and gives each hold back with LOCK.RELEASE;
another client is refused until the last. A set of locks is taken with LOCK.ACQUIREALL (a
token per key), an overlapping set is refused whole, and LOCK.RELEASEALL frees them. Prints
one line per check and exits 1 when any check failed.
"""

import sys
import uuid

import redis

from checks import check, failures


def main(port):
    a = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    b = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    key, me, you = f"recipes:{uuid.uuid4()}", str(uuid.uuid4()), str(uuid.uuid4())
    token = a.execute_command("LOCK.ACQUIRE", key, me, 10000, "REENTRANT")
    check("a reentrant lock is taken with a fencing token", isinstance(token, int), repr(token))
    again = a.execute_command("LOCK.ACQUIRE", key, me, 10000, "REENTRANT")
    check("taken again, the same fencing token", again == token, f"{again!r} != {token!r}")
    info = a.execute_command("LOCK.INFO", key)
    holds = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
    holds = holds.get(b"holds", holds.get("holds"))
    check("LOCK.INFO shows two holds", holds == 2, repr(info))
    check("another token is refused", b.execute_command("LOCK.ACQUIRE", key, you, 10000) is None)
    check("one hold given back", a.execute_command("LOCK.RELEASE", key, me) == 1)
    check("still held after one", b.execute_command("LOCK.ACQUIRE", key, you, 10000) is None)
    check("the last hold given back", a.execute_command("LOCK.RELEASE", key, me) == 1)
    taken = b.execute_command("LOCK.ACQUIRE", key, you, 10000)
    check("free after the last hold", isinstance(taken, int) and taken > token, repr(taken))
    b.execute_command("LOCK.RELEASE", key, you)
    several(a, b)


def several(a, b):
    """Several locks at once: all or none."""
    base, me, you = f"recipes:{uuid.uuid4()}", str(uuid.uuid4()), str(uuid.uuid4())
    x, y, z = f"{base}:x", f"{base}:y", f"{base}:z"
    tokens = a.execute_command("LOCK.ACQUIREALL", me, 10000, 2, x, y)
    check(
        "a set is taken with a fencing token per key",
        isinstance(tokens, list) and len(tokens) == 2 and all(isinstance(t, int) for t in tokens),
        repr(tokens),
    )
    check("an overlapping set is refused whole", b.execute_command("LOCK.ACQUIREALL", you, 10000, 2, y, z) is None)
    check("nothing of it was taken", b.execute_command("LOCK.ACQUIRE", z, you, 10000) is not None)
    b.execute_command("LOCK.RELEASE", z, you)
    check("a key of the set is a lock of its own", b.execute_command("LOCK.ACQUIRE", x, you, 10000) is None)
    check("both released", a.execute_command("LOCK.RELEASEALL", me, 2, x, y) == 2)
    again = b.execute_command("LOCK.ACQUIREALL", you, 10000, 2, y, z)
    check("the overlapping set is free now", isinstance(again, list) and again[0] > tokens[1], repr(again))
    b.execute_command("LOCK.RELEASEALL", you, 2, y, z)


if __name__ == "__main__":
    main(int(sys.argv[1]))
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed")
    sys.exit(1 if failures else 0)
