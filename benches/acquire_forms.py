#!/usr/bin/env python3
"""What each way of writing an acquisition costs a master, in one run: CPU time (`INFO cpu`,
user + system) per acquisition, against a plain `SET key token NX PX ttl` in the same run.

One redis-server on a free port; 4 client processes send random keys (nearly every call
grants, so the whole success path runs) pipelined `--depth` deep, as the proxy batches its
requests to a master. The forms, each the levers of BENCHMARKS.md "The masters' cost of
exactness":

  set            SET NX PX alone (the floor; no clock reading, no way to name the write)
  set+time       SET NX PX and TIME pipelined (not atomic: the lever not taken)
  transaction    MULTI, SET NX PX, TIME, EXEC: what the proxy sends
  tx+pttl        MULTI, SET NX PX, PTTL, TIME, EXEC (the first form tried: PTTL is not needed)
  script-1key    EVALSHA of a one-key script: SET NX PX, TIME, else PTTL
  script-marker  EVALSHA of the script the proxy ran before: SET NX PX, a marker key, TIME
  eval-marker    the same sent as EVAL with its source, as the proxy sent it
  group4, group16  one transaction for 4 (16) acquisitions queued together: MULTI, the
                 SET NX PX of each, one TIME, EXEC

    python3 benches/acquire_forms.py [--count 200000] [--rounds 3] [--depth 16]
"""
import argparse
import multiprocessing as mp
import os
import random
import socket
import subprocess
import tempfile
import time

MARKER = ("if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
          "redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[2]) local t = redis.call('time') "
          "return {1, t[1], t[2]} end return {redis.call('pttl', KEYS[1])}")
ONE_KEY = ("if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
           "local t = redis.call('time') return {1, t[1], t[2]} end return {redis.call('pttl', KEYS[1])}")


def enc(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def skip(buf, i):
    """The index after the reply at i, or None if it is not all in."""
    j = buf.find(b"\r\n", i)
    if j < 0:
        return None
    kind = buf[i:i + 1]
    if kind in (b"+", b"-", b":"):
        return j + 2
    n = int(buf[i + 1:j])
    if kind == b"$":
        end = j + 2 + max(n, 0) + (2 if n >= 0 else 0)
        return end if end <= len(buf) else None
    k = j + 2
    for _ in range(max(n, 0)):
        k = skip(buf, k)
        if k is None:
            return None
    return k


def request(form, key, sha):
    ttl, token = 10000, b"0123456789abcdef0123"
    if form == "set":
        return enc("SET", key, token, "NX", "PX", ttl), 1
    if form == "set+time":
        return enc("SET", key, token, "NX", "PX", ttl) + enc("TIME"), 2
    if form == "transaction":
        return enc("MULTI") + enc("SET", key, token, "NX", "PX", ttl) + enc("TIME") + enc("EXEC"), 4
    if form == "tx+pttl":
        return enc("MULTI") + enc("SET", key, token, "NX", "PX", ttl) + enc("PTTL", key) + enc("TIME") + enc("EXEC"), 5
    marker = b"redlock-proxy:a:{" + key + b"}" + key
    if form == "script-1key":
        return enc("EVALSHA", sha[form], 1, key, token, ttl), 1
    if form == "script-marker":
        return enc("EVALSHA", sha[form], 2, key, marker, token, ttl, "0123456789abcdef:123456"), 1
    return enc("EVAL", MARKER, 2, key, marker, token, ttl, "0123456789abcdef:123456"), 1


def client(port, form, count, depth, seed, sha):
    rng = random.Random(seed)
    s = socket.create_connection(("127.0.0.1", port))
    done = 0
    while done < count:
        batch, replies = [], 0
        if form.startswith("group"):
            size = int(form[len("group"):])
            for first in range(0, depth, size):
                sets = [enc("SET", b"lock:%d" % rng.randrange(10 ** 12), b"0123456789abcdef0123", "NX", "PX", 10000)
                        for _ in range(min(size, depth - first))]
                batch.append(enc("MULTI") + b"".join(sets) + enc("TIME") + enc("EXEC"))
                replies += len(sets) + 3
        for _ in range(0 if form.startswith("group") else depth):
            wire, n = request(form, b"lock:%d" % rng.randrange(10 ** 12), sha)
            batch.append(wire)
            replies += n
        s.sendall(b"".join(batch))
        buf, at, got = b"", 0, 0
        while got < replies:
            buf += s.recv(1 << 20)
            while got < replies:
                end = skip(buf, at)
                if end is None:
                    break
                at, got = end, got + 1
        done += depth


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *map(str, args)], capture_output=True, text=True).stdout.strip()


def cpu(port):
    info = cli(port, "INFO", "cpu")
    # The main thread's: the commands' work, not the background thread freeing a FLUSHALL's keys.
    main = ("used_cpu_user_main_thread:", "used_cpu_sys_main_thread:")
    return sum(float(l.split(":")[1]) for l in info.splitlines() if l.startswith(main))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000, help="acquisitions per form and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depth", type=int, default=16, help="pipeline depth")
    opts = parser.parse_args()
    count, rounds, depth = opts.count, opts.rounds, opts.depth
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", folder], stdout=subprocess.DEVNULL)
    try:
        while cli(port, "PING") != "PONG":
            time.sleep(0.05)
        sha = {"script-1key": cli(port, "SCRIPT", "LOAD", ONE_KEY), "script-marker": cli(port, "SCRIPT", "LOAD", MARKER)}
        forms = ["set", "set+time", "transaction", "tx+pttl", "script-1key", "script-marker", "eval-marker",
                 "group4", "group16"]
        version = cli(port, "INFO", "server").split("redis_version:")[1].split()[0]
        print(f"redis {version}, {count} acquisitions per form, pipelined {depth} deep, {rounds} rounds")
        results = {f: [] for f in forms}
        for r in range(rounds):
            for form in forms if r % 2 == 0 else forms[::-1]:
                cli(port, "FLUSHALL", "SYNC")
                before = cpu(port)
                workers = [mp.Process(target=client, args=(port, form, count // 4, depth, i, sha)) for i in range(4)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                results[form].append((cpu(port) - before) / count * 1e6)
        floor = sorted(results["set"])[len(results["set"]) // 2]
        for form in forms:
            us = sorted(results[form])[len(results[form]) // 2]
            print(f"{form:<14} {us:6.2f} us/acquisition  {us / floor:4.2f}x SET NX PX")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
