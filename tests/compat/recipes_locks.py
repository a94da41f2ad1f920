"""Reentrant locks through redis-py's `execute_command`, against redlock-proxy.

usage: recipes_locks.py PORT

A holder takes its lock again with REENTRANT and gives each hold back with LOCK.RELEASE;
another client is refused until the last. Prints one line per check and exits 1 when any
check failed.
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


if __name__ == "__main__":
    main(int(sys.argv[1]))
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed")
    sys.exit(1 if failures else 0)
