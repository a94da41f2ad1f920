"""Waiting and session locks, measured: what a hand-off costs the masters, how long it takes, and how
fast a crashed session holder's lock is free again.

usage (after `cargo build --release` and `tests/compat/setup.sh`):
    tests/compat/.venv/bin/python benches/waiting.py [--masters 3] [--waiters 200] [--seconds 60] [--trials 100] [--proxies 2]

It starts its own redis-server masters and two proxies (target/release/redlock-proxy) on free loopback
ports and stops them at the end. Three measurements, in one run:

1. `LOCK.ACQUIRE ... WAIT`: --waiters clients spread over the two proxies, all on one lock, all asking
   at once; each gets it once, holds it 1 ms and releases it. Commands sent to the masters per
   grant (from MONITOR on each master: every command the proxies sent but their health checks; the
   commands scripts run inside are reported apart), and the hand-off latency: from one holder's
   release answer to the next grant.
   The same for a semaphore of 2 permits (`SEM.ACQUIRE ... WAIT`: the hand-off is from any
   release to the next grant), a read-write lock's writers (`RWLOCK.WRITE ... WAIT`) and a set
   of three locks (`LOCK.ACQUIREALL ... WAIT`).
2. The same with redis-py's `Lock(blocking=True)`, which polls (`sleep=0.1`), through the proxies.
3. A `KEEPALIVE` holder process killed with `kill -9`, --trials times, with a 30 s TTL: how long until
   another client (waiting with `WAIT`) gets the lock.
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROXY = os.path.join(ROOT, "target", "release", "redlock-proxy")
# What the masters are asked to do on these paths is counted from MONITOR: every command a
# connection sent (health checks, PING and INFO, aside), by name. The commands scripts run inside
# (MONITOR shows them as coming from "lua": the PTTL a refused acquisition answers, the SETs of an
# acquisition, the PUBLISH a release script makes) are work inside one request, and counted apart.
IGNORED = ("ping", "info", "psubscribe", "client", "select", "hello", "monitor")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ping(port):
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=port, socket_timeout=1).ping():
                return
        except redis.RedisError:
            time.sleep(0.05)
    raise SystemExit(f"nothing answers on port {port}")


def start_masters(n, procs):
    ports = []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_ping(port)
        ports.append(port)
    return ports


def start_proxy(masters, workdir, procs):
    port = free_port()
    config = os.path.join(workdir, f"proxy-{port}.toml")
    backends = ", ".join(f'"redis://127.0.0.1:{m}"' for m in masters)
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\nbackends = [{backends}]\nquarantine = "restarts"\n'
                f'log_level = "warn"\nbackend_timeout_ms = 200\nmax_waiters_per_key = 100000\n')
    procs.append(subprocess.Popen([PROXY, "--config", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_ping(port)
    return port


class Monitor:
    """Counts, on every master, the commands its connections send (and those scripts run inside)
    while it runs, by name, from MONITOR."""

    def __init__(self, masters):
        self.requests = {}
        self.in_scripts = {}
        self.lock = threading.Lock()
        self.socks = []
        self.threads = []
        for port in masters:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"MONITOR\r\n")
            self.socks.append(sock)
            t = threading.Thread(target=self.read, args=(sock,), daemon=True)
            t.start()
            self.threads.append(t)

    def read(self, sock):
        buffer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\r\n")
            for line in lines:
                # +<time> [<db> <client>] "<command>" ...
                if not line.startswith(b"+") or b"] \"" not in line:
                    continue
                head, rest = line.split(b"] \"", 1)
                name = rest.split(b"\"", 1)[0].decode(errors="replace").lower()
                if name in IGNORED:
                    continue
                table = self.in_scripts if head.endswith(b" lua") else self.requests
                with self.lock:
                    table[name] = table.get(name, 0) + 1

    def stop(self):
        # The last commands are still on their way to MONITOR: a moment for them.
        time.sleep(0.5)
        for sock in self.socks:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for t in self.threads:
            t.join()
        with self.lock:
            return dict(self.requests), dict(self.in_scripts)


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Timeline:
    """Releases and grants on one clock, for the hand-off latency."""

    def __init__(self):
        self.lock = threading.Lock()
        self.last_release = None
        self.handoffs = []
        self.grants = 0

    def granted(self):
        now = time.monotonic()
        with self.lock:
            self.grants += 1
            if self.last_release is not None:
                self.handoffs.append(now - self.last_release)
                self.last_release = None

    def released(self):
        with self.lock:
            self.last_release = time.monotonic()


def run_clients(proxies, waiters, seconds, body):
    # `seconds` bounds the whole run: every client gives up then.
    stop = time.monotonic() + seconds
    timeline = Timeline()
    threads = [threading.Thread(target=body, args=(proxies[i % 2], i, stop, timeline)) for i in range(waiters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return timeline


def native_waiter(port, i, stop, timeline):
    r = redis.Redis(port=port, socket_timeout=120)
    token = f"w{i}"
    wait_ms = max(1, int((stop - time.monotonic()) * 1000))
    if r.execute_command("LOCK.ACQUIRE", "lock:hot", token, 5000, "WAIT", wait_ms) is None:
        return
    timeline.granted()
    time.sleep(0.001)
    r.execute_command("LOCK.RELEASE", "lock:hot", token)
    timeline.released()


def semaphore_waiter(port, i, stop, timeline):
    r = redis.Redis(port=port, socket_timeout=120)
    token = f"s{i}"
    wait_ms = max(1, int((stop - time.monotonic()) * 1000))
    if r.execute_command("SEM.ACQUIRE", "sem:hot", token, 2, 5000, "WAIT", wait_ms) is None:
        return
    timeline.granted()
    time.sleep(0.001)
    r.execute_command("SEM.RELEASE", "sem:hot", token)
    timeline.released()


def writer_waiter(port, i, stop, timeline):
    r = redis.Redis(port=port, socket_timeout=120)
    token = f"w{i}"
    wait_ms = max(1, int((stop - time.monotonic()) * 1000))
    if r.execute_command("RWLOCK.WRITE", "rw:hot", token, 5000, "WAIT", wait_ms) is None:
        return
    timeline.granted()
    time.sleep(0.001)
    r.execute_command("RWLOCK.RELEASE", "rw:hot", token)
    timeline.released()


def set_waiter(port, i, stop, timeline):
    r = redis.Redis(port=port, socket_timeout=120)
    token = f"m{i}"
    keys = ["set:a", "set:b", "set:c"]
    wait_ms = max(1, int((stop - time.monotonic()) * 1000))
    if r.execute_command("LOCK.ACQUIREALL", token, 5000, len(keys), *keys, "WAIT", wait_ms) is None:
        return
    timeline.granted()
    time.sleep(0.001)
    r.execute_command("LOCK.RELEASEALL", token, len(keys), *keys)
    timeline.released()


def polling_waiter(port, i, stop, timeline):
    r = redis.Redis(port=port, socket_timeout=120)
    lock = r.lock("lock:poll", timeout=5, blocking_timeout=max(0.01, stop - time.monotonic()))
    if not lock.acquire(blocking=True):
        return
    timeline.granted()
    time.sleep(0.001)
    try:
        lock.release()
    except redis.exceptions.LockError:
        pass
    timeline.released()


def measure(name, masters, proxies, waiters, seconds, body):
    monitor = Monitor(masters)
    started = time.monotonic()
    timeline = run_clients(proxies, waiters, seconds, body)
    elapsed = time.monotonic() - started
    requests, in_scripts = monitor.stop()
    calls = sum(requests.values())
    per = calls / max(1, timeline.grants)
    ms = [h * 1000 for h in timeline.handoffs]
    print(f"{name}: {timeline.grants} grants in {elapsed:.1f} s ({timeline.grants / elapsed:.0f}/s); "
          f"{calls} commands sent to {len(masters)} masters = {per:.2f} per grant = {per / len(masters):.2f} x N; "
          f"hand-off latency p50 {percentile(ms, 50):.2f} ms, p99 {percentile(ms, 99):.2f} ms; "
          f"by command {requests}; run inside scripts {in_scripts}",
          flush=True)
    return timeline.grants, per


HOLDER = """
import sys, time, redis
r = redis.Redis(port=int(sys.argv[1]))
token = r.execute_command("LOCK.ACQUIRE", "lock:crash", "holder", 30000, "KEEPALIVE")
print("held" if token is not None else "refused", flush=True)
time.sleep(600)
"""


def crash_trials(proxy, trials):
    times = []
    other = redis.Redis(port=proxy, socket_timeout=60)
    for n in range(trials):
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(proxy)], stdout=subprocess.PIPE, text=True)
        line = holder.stdout.readline().strip()
        if line != "held":
            holder.kill()
            raise SystemExit(f"trial {n}: the holder got {line!r}")
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        token = other.execute_command("LOCK.ACQUIRE", "lock:crash", f"next{n}", 30000, "WAIT", 35000)
        times.append(time.monotonic() - killed)
        holder.wait()
        if token is None:
            raise SystemExit(f"trial {n}: never free")
        other.execute_command("LOCK.RELEASE", "lock:crash", f"next{n}")
    ms = [t * 1000 for t in times]
    print(f"kill -9 of a KEEPALIVE holder (TTL 30 s), {trials} trials: free again after p50 "
          f"{percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms, max {max(ms):.1f} ms", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--waiters", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--proxies", type=int, default=2, choices=(1, 2))
    parser.add_argument("--only", choices=("lock", "semaphore", "writer", "set"),
                        help="measure the hand-offs of one recipe only")
    args = parser.parse_args()
    if not os.path.exists(PROXY):
        raise SystemExit(f"{PROXY} is missing: run `cargo build --release` first")
    procs = []
    with tempfile.TemporaryDirectory() as workdir:
        try:
            masters = start_masters(args.masters, procs)
            proxies = [start_proxy(masters, workdir, procs) for _ in range(args.proxies)]
            proxies = proxies * (2 // len(proxies))
            # A new database gets its fencing epochs on the first fenced acquisition (once per
            # database, docs/fencing.md F4): done before anything is measured.
            for port in set(proxies):
                r = redis.Redis(port=port)
                if r.execute_command("LOCK.ACQUIRE", "lock:warm-up", "w", 1000, "WAIT", 5000) is not None:
                    r.execute_command("LOCK.RELEASE", "lock:warm-up", "w")
            print(f"{args.masters} masters, {args.proxies} prox{'ies' if args.proxies > 1 else 'y'}, {args.waiters} clients (at most {args.seconds:.0f} s per mode), "
                  f"commit {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}",
                  flush=True)
            if args.only in (None, "lock"):
                native = measure("LOCK.ACQUIRE ... WAIT", masters, proxies, args.waiters, args.seconds, native_waiter)
            for recipe, name, body in (("semaphore", "SEM.ACQUIRE ... WAIT (2 permits)", semaphore_waiter),
                                       ("writer", "RWLOCK.WRITE ... WAIT", writer_waiter),
                                       ("set", "LOCK.ACQUIREALL ... WAIT (3 keys)", set_waiter)):
                if args.only in (None, recipe):
                    measure(name, masters, proxies, args.waiters, args.seconds, body)
            if args.only:
                return
            polling = measure("redis-py Lock(blocking=True)", masters, proxies, args.waiters, args.seconds, polling_waiter)
            print(f"commands per grant, polling / waiting: {polling[1] / max(native[1], 1e-9):.1f}x", flush=True)
            crash_trials(proxies[0], args.trials)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()


if __name__ == "__main__":
    main()
