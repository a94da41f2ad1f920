"""A semaphore through redlock-proxy from redis-py, with `execute_command`.

usage: recipes_semaphore.py PORT

Takes the permits of a 2-permit semaphore from three clients, shows the third refused and
then handed a permit by a release while it waits (`WAIT`), reads `SEM.INFO`, extends and
releases; once over RESP3 (redis-py 8's default) and once with `protocol=2`. Prints one line
per check and exits 1 when any check failed.
"""

import sys
import threading
import time
import uuid

import redis

from checks import check, failures

HOST = "127.0.0.1"


def client(port, protocol):
    kwargs = {"host": HOST, "port": port, "socket_timeout": 10, "socket_connect_timeout": 5}
    if protocol is not None:
        kwargs["protocol"] = protocol
    return redis.Redis(**kwargs)


def info(r, key):
    """SEM.INFO as a dict of str -> value, whatever the protocol's map shape."""
    reply = r.execute_command("SEM.INFO", key)
    if isinstance(reply, list):
        reply = dict(zip(reply[0::2], reply[1::2]))
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in reply.items()}


def run(port, protocol):
    tag = f"protocol={protocol or 'default'}"
    key = f"jobs:{uuid.uuid4().hex}"
    a, b, c = (client(port, protocol) for _ in range(3))
    ta, tb, tc = (uuid.uuid4().hex for _ in range(3))

    first = a.execute_command("SEM.ACQUIRE", key, ta, 2, 10_000)
    second = b.execute_command("SEM.ACQUIRE", key, tb, 2, 10_000)
    check(f"{tag}: two permits of 2: [slot, fencing token] each",
          isinstance(first, list) and isinstance(second, list)
          and sorted([first[0], second[0]]) == [0, 1]
          and all(isinstance(x[1], int) and x[1] > 0 for x in (first, second)),
          f"{first!r} {second!r}")
    third = c.execute_command("SEM.ACQUIRE", key, tc, 2, 10_000)
    check(f"{tag}: a third holder is refused with nil", third is None, repr(third))

    try:
        c.execute_command("SEM.ACQUIRE", key, tc, 3, 10_000)
        check(f"{tag}: another count is refused while held", False, "no error")
    except redis.ResponseError as e:
        check(f"{tag}: another count is refused while held",
              "is held with 2 permits, not 3" in str(e), str(e))

    fields = info(a, key)
    check(f"{tag}: SEM.INFO shows 2 permits, 2 holders, no free slot",
          fields.get("permits") == 2 and fields.get("holders") == 2 and fields.get("free_slots") == [],
          repr(fields))

    # The third waits; a release of the first hands it the freed slot.
    got = {}

    def waiter():
        got["reply"] = c.execute_command("SEM.ACQUIRE", key, tc, 2, 10_000, "WAIT", 8_000)
        got["at"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 5
    while info(a, key).get("waiting") != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    released_at = time.monotonic()
    check(f"{tag}: SEM.RELEASE gives the permit back",
          a.execute_command("SEM.RELEASE", key, ta) == 1)
    t.join(10)
    reply = got.get("reply")
    check(f"{tag}: the waiter gets the freed slot, with a higher token",
          isinstance(reply, list) and reply[0] == first[0] and reply[1] > first[1], repr(reply))
    check(f"{tag}: ... within a second of the release",
          "at" in got and got["at"] - released_at < 1.0, repr(got.get("at", 0) - released_at))

    validity = b.execute_command("SEM.EXTEND", key, tb, 20_000)
    check(f"{tag}: SEM.EXTEND answers the validity in ms", 10_000 < validity <= 20_000, repr(validity))
    check(f"{tag}: a stranger's release answers 0",
          a.execute_command("SEM.RELEASE", key, uuid.uuid4().hex) == 0)
    check(f"{tag}: both holders release",
          b.execute_command("SEM.RELEASE", key, tb) == 1 and c.execute_command("SEM.RELEASE", key, tc) == 1)
    check(f"{tag}: SEM.INFO shows no holder", info(a, key).get("holders") == 0)


def main():
    port = int(sys.argv[1])
    print(f"redis-py {redis.__version__} against {HOST}:{port}", flush=True)
    for protocol in (None, 2):
        run(port, protocol)
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
