"""python-redis-lock (redis_lock.Lock) against redlock-proxy.

usage: python_redis_lock.py PORT

python-redis-lock waits for a held lock with BLPOP on a signal list that its release script
fills with LPUSH; through the proxy that is a wake-up (never a grant): the waiter then takes
the lock with the quorum SET NX as usual. Prints one line per check, exits 1 when any failed.
"""

import multiprocessing
import sys
import time
import traceback

import redis
import redis_lock

from checks import check, failures


def client(port):
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)


def holder(port, name, expire, hold_s, renew, held, done):
    """Another process: takes the lock, tells, holds it for hold_s, releases."""
    lock = redis_lock.Lock(client(port), name, expire=expire, auto_renewal=renew)
    assert lock.acquire(blocking=False)
    held.set()
    time.sleep(hold_s)
    lock.release()
    done.set()


def start_holder(port, name, expire, hold_s, renew=False):
    held, done = multiprocessing.Event(), multiprocessing.Event()
    p = multiprocessing.Process(target=holder, args=(port, name, expire, hold_s, renew, held, done))
    p.start()
    if not held.wait(10):
        raise RuntimeError("the holder never got the lock")
    return p, done


def run(port):
    r = client(port)
    # A blocking acquire waits on the signal list and wakes at the holder's release, long
    # before the holder's 60 s expiry.
    p, done = start_holder(port, "job", expire=60, hold_s=0.5)
    waiter = redis_lock.Lock(r, "job", expire=60)
    check("acquire(blocking=False) while held -> False", waiter.acquire(blocking=False) is False)
    start = time.monotonic()
    got = waiter.acquire(timeout=20)
    waited = time.monotonic() - start
    check("acquire(timeout=20) waits for the release -> True", got is True)
    check("woken by the release, not the expiry (< 5 s)", waited < 5, f"waited {waited:.2f} s")
    check("the holder had released first", done.is_set())
    p.join()
    waiter.release()

    # A wait that runs out answers False.
    p, done = start_holder(port, "busy", expire=60, hold_s=3)
    start = time.monotonic()
    got = redis_lock.Lock(r, "busy", expire=60).acquire(timeout=1)
    waited = time.monotonic() - start
    check("acquire(timeout=1) while held for longer -> False", got is False)
    check("... after about 1 s", 0.9 <= waited < 3, f"waited {waited:.2f} s")
    p.join()

    # auto_renewal keeps a 1 s lock for 3 s; a rival waiting gets it after the release.
    p, done = start_holder(port, "renewed", expire=1, hold_s=3, renew=True)
    rival = redis_lock.Lock(r, "renewed", expire=10)
    start = time.monotonic()
    refused = 0
    while not done.is_set() and time.monotonic() - start < 2.5:
        refused += rival.acquire(blocking=False) is False
        time.sleep(0.2)
    check("auto_renewal holds a 1 s lock past its expiry", refused >= 10 and not done.is_set(), f"{refused} refusals")
    check("the rival gets it after the release", rival.acquire(timeout=10) is True)
    p.join()
    rival.release()

    # Failure values stay failures (rule 7 never turns them into success).
    free = redis_lock.Lock(r, "free", expire=10)
    try:
        free.release()
        check("release of a lock not held raises NotAcquired", False, "no exception")
    except redis_lock.NotAcquired:
        check("release of a lock not held raises NotAcquired", True)
    short = redis_lock.Lock(r, "short", expire=1)
    check("acquire a 1 s lock", short.acquire(blocking=False) is True)
    time.sleep(1.5)
    try:
        short.extend(5)
        check("extend of an expired lock raises", False, "no exception")
    except redis_lock.NotAcquired:
        check("extend of an expired lock raises", True)
    r.close()


def main():
    port = int(sys.argv[1])
    print(f"python-redis-lock {redis_lock.__version__} with redis-py {redis.__version__} against 127.0.0.1:{port}", flush=True)
    try:
        run(port)
    except Exception:
        check("run completed without an exception", False, traceback.format_exc())
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
