"""Leader failover, measured: after `kill -9` of the leader's client process, how long until a new
leader is elected and every observer has been told (by RESP3 push, and by RESP2 long poll).

usage (after `cargo build --release` and `tests/compat/setup.sh`):
    tests/compat/.venv/bin/python benches/election_failover.py [--masters 3] [--trials 100] [--observers 4] [--ttl 30000]
(REDLOCK_PROXY_BIN=<path> to run another build than target/release/redlock-proxy.)

It starts its own redis-server masters and two proxies (target/release/redlock-proxy) on free
loopback ports and stops them at the end. Each trial:

1. a leader process (its own Python interpreter) campaigns through proxy 1 with `ELECT.CAMPAIGN
   bench <value> <ttl> WAIT ...` and keeps its connection open;
2. once every observer has been told of it, a standby campaigns through proxy 2 and waits in line;
3. the leader process is killed with SIGKILL; the clock starts;
4. the failover time is when the last of these happened: the standby's campaign answered its term,
   and each observer was told the standby's value with that term. Half the observers are RESP3
   connections that sent `ELECT.OBSERVE bench` (pushes), half RESP2 connections in a loop of
   `ELECT.OBSERVE bench AFTER <term> TIMEOUT 60000` (long polls), spread over both proxies;
5. the standby resigns, and the observers are told there is no leader.

The leadership's TTL (--ttl, 30 s by default) is what a client library that polls for the lock
would wait for after the crash: the number to compare with.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import redis

# The masters are started as benches/waiting.py starts them.
from waiting import free_port, start_masters, wait_ping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The release binary; REDLOCK_PROXY_BIN names another (a build with its own CARGO_TARGET_DIR).
PROXY = os.environ.get("REDLOCK_PROXY_BIN", os.path.join(ROOT, "target", "release", "redlock-proxy"))
ELECTION = "bench"


def start_proxy(masters, workdir, procs):
    port = free_port()
    config = os.path.join(workdir, f"proxy-{port}.toml")
    backends = ", ".join(f'"redis://127.0.0.1:{m}"' for m in masters)
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\nbackends = [{backends}]\nquarantine = "restarts"\n'
                f'log_level = "warn"\nbackend_timeout_ms = 200\nmax_ttl_ms = 60000\n')
    procs.append(subprocess.Popen([PROXY, "--config", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_ping(port)
    return port


class Seen:
    """What every observer was told, with when: (monotonic time, value or None, term or None)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.told = {}

    def tell(self, observer, value, term):
        with self.cond:
            self.told.setdefault(observer, []).append((time.monotonic(), value, term))
            self.cond.notify_all()

    def when_all_told(self, observers, value, term, timeout=60):
        """When each observer was first told (value, term): the latest of those times."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                times = []
                for o in observers:
                    at = [t for (t, v, tm) in self.told.get(o, []) if v == value and tm == term]
                    if not at:
                        break
                    times.append(at[0])
                else:
                    return max(times)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"observers never all told {value} {term}: {self.told}")
                self.cond.wait(left)


def read_frame(sock_file):
    """One RESP3 frame (the kinds the proxy answers an observer with)."""
    line = sock_file.readline()
    if not line:
        raise EOFError
    kind, rest = line[:1], line[1:-2]
    if kind in (b">", b"*", b"%"):
        n = int(rest)
        n = n * 2 if kind == b"%" else n
        return [read_frame(sock_file) for _ in range(n)]
    if kind == b"$":
        data = sock_file.read(int(rest) + 2)[:-2]
        return data.decode()
    if kind == b":":
        return int(rest)
    if kind == b"_":
        return None
    if kind == b"-":
        raise SystemExit(f"error from the proxy: {rest.decode()}")
    return rest.decode()


def command(*args):
    wire = f"*{len(args)}\r\n"
    for a in args:
        a = str(a)
        wire += f"${len(a.encode())}\r\n{a}\r\n"
    return wire.encode()


def push_observer(name, port, seen, ready):
    sock = socket.create_connection(("127.0.0.1", port))
    f = sock.makefile("rb")
    sock.sendall(command("HELLO", "3"))
    read_frame(f)
    sock.sendall(command("ELECT.OBSERVE", ELECTION))
    current = read_frame(f)
    seen.tell(name, *(current if current else (None, None)))
    ready.release()
    while True:
        try:
            frame = read_frame(f)
        except (EOFError, OSError):
            return
        if isinstance(frame, list) and frame and frame[0] == "leader":
            seen.tell(name, frame[2], frame[3])


def poll_observer(name, port, seen, ready):
    r = redis.Redis(port=port, socket_timeout=120, decode_responses=True)
    current = r.execute_command("ELECT.LEADER", ELECTION)
    term = current[1] if current else 0
    seen.tell(name, *(current if current else (None, None)))
    ready.release()
    while True:
        try:
            current = r.execute_command("ELECT.OBSERVE", ELECTION, "AFTER", term, "TIMEOUT", 60000)
        except (redis.ConnectionError, OSError):
            return
        new_term = current[1] if current else 0
        if new_term != term:
            term = new_term
            seen.tell(name, *(current if current else (None, None)))


LEADER = """
import sys, redis
r = redis.Redis(port=int(sys.argv[1]))
term = r.execute_command("ELECT.CAMPAIGN", sys.argv[2], sys.argv[3], int(sys.argv[4]), "WAIT", 60000)
print(term, flush=True)
sys.stdin.read()
"""


def waiting(port):
    lines = redis.Redis(port=port, decode_responses=True).execute_command("PROXY", "LOCKS", "redlock-proxy:elect:*")
    return any(line.endswith("waiting=1") for line in lines)


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def trials(proxies, n, ttl, seen, observers):
    standby = redis.Redis(port=proxies[1], socket_timeout=120, decode_responses=True)
    failovers, elected_after = [], []
    for i in range(n):
        value = f"leader-{i}"
        leader = subprocess.Popen([sys.executable, "-c", LEADER, str(proxies[0]), ELECTION, value, str(ttl)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = leader.stdout.readline().strip()
        if not line.isdigit():
            leader.kill()
            raise SystemExit(f"trial {i}: the leader got {line!r}")
        seen.when_all_told(observers, value, int(line))
        result = {}

        def campaign():
            result["term"] = standby.execute_command("ELECT.CAMPAIGN", ELECTION, f"standby-{i}", ttl, "WAIT", 60000)
            result["at"] = time.monotonic()

        t = threading.Thread(target=campaign)
        t.start()
        while not waiting(proxies[1]):
            time.sleep(0.001)
        killed = time.monotonic()
        os.kill(leader.pid, signal.SIGKILL)
        t.join()
        leader.wait()
        term = result["term"]
        if term is None:
            raise SystemExit(f"trial {i}: the standby was never elected")
        told = seen.when_all_told(observers, f"standby-{i}", term)
        elected_after.append((result["at"] - killed) * 1000)
        failovers.append((max(told, result["at"]) - killed) * 1000)
        standby.execute_command("ELECT.RESIGN", ELECTION, f"standby-{i}")
        seen.when_all_told(observers, None, None)
    return elected_after, failovers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--observers", type=int, default=4)
    parser.add_argument("--ttl", type=int, default=30000)
    args = parser.parse_args()
    if not os.path.exists(PROXY):
        raise SystemExit(f"{PROXY} is missing: run `cargo build --release` first")
    procs = []
    with tempfile.TemporaryDirectory() as workdir:
        try:
            masters = start_masters(args.masters, procs)
            proxies = [start_proxy(masters, workdir, procs) for _ in range(2)]
            # A new database gets its fencing epochs on the first fenced acquisition (once per
            # database, docs/fencing.md F4): done before anything is measured.
            r = redis.Redis(port=proxies[0])
            if r.execute_command("LOCK.ACQUIRE", "lock:warm-up", "w", 1000, "WAIT", 5000) is not None:
                r.execute_command("LOCK.RELEASE", "lock:warm-up", "w")
            seen, ready = Seen(), threading.Semaphore(0)
            names = []
            for o in range(args.observers):
                kind = push_observer if o % 2 == 0 else poll_observer
                name = f"{'push' if o % 2 == 0 else 'poll'}-{o}@proxy{o // 2 % 2 + 1}"
                threading.Thread(target=kind, args=(name, proxies[o // 2 % 2], seen, ready), daemon=True).start()
                names.append(name)
            for _ in names:
                ready.acquire()
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()
            print(f"{args.masters} masters, 2 proxies, {args.observers} observers ({', '.join(names)}), "
                  f"leadership TTL {args.ttl} ms, {args.trials} trials, commit {commit}", flush=True)
            elected, failovers = trials(proxies, args.trials, args.ttl, seen, names)
            for label, ms in (("new leader elected", elected), ("new leader elected and every observer told", failovers)):
                print(f"kill -9 of the leader's client -> {label}: p50 {percentile(ms, 50):.1f} ms, "
                      f"p99 {percentile(ms, 99):.1f} ms, max {max(ms):.1f} ms", flush=True)
            p99 = percentile(failovers, 99)
            print(f"target p99 < 1000 ms: {'met' if p99 < 1000 else 'NOT met'} ({p99:.1f} ms; a polling library waits the TTL, {args.ttl} ms)")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()


if __name__ == "__main__":
    main()
