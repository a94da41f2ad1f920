"""The legacy SETNX lock and its token-checked replacement, through redlock-proxy.

Start a proxy first (`cargo run --release`, port 7379), then: python3 examples/legacy_setnx.py
"""
import sys
import time
import uuid

import redis

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 7379
r = redis.Redis(port=PORT)
TIMEOUT = 2


def legacy_acquire(name):
    while True:
        expires = time.time() + TIMEOUT + 1
        if r.setnx(name, expires):
            return expires
        held = r.get(name)
        if held is not None and float(held) < time.time():
            old = r.getset(name, time.time() + TIMEOUT + 1)
            if old is not None and float(old) < time.time():
                return expires
        time.sleep(0.01)


def legacy_release(name, expires):
    if time.time() < expires:
        r.delete(name)


RELEASE = r.register_script(
    'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end')


def acquire(name, ttl_ms=10_000):
    token = uuid.uuid4().hex
    return token if r.set(name, token, nx=True, px=ttl_ms) else None


def release(name, token):
    return RELEASE(keys=[name], args=[token]) == 1


if __name__ == "__main__":
    expires = legacy_acquire("lock.foo")
    print("legacy: acquired lock.foo, a second SETNX gets", r.setnx("lock.foo", 0))
    legacy_release("lock.foo", expires)
    print("legacy: released; SETNX now gets", r.setnx("lock.foo", time.time() + TIMEOUT + 1))
    r.delete("lock.foo")

    token = acquire("lock:report")
    print("token lock: acquired with", token, "- a second acquire gets", acquire("lock:report"))
    print("token lock: release by a stranger ->", release("lock:report", "stranger"))
    print("token lock: release by the owner ->", release("lock:report", token))
