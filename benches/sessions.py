"""Session locks, measured: the proxy's memory per session lock and the keepalive load each puts on
every master.

usage (after `cargo build --release`):
    python3 benches/sessions.py [--masters 3] [--clients 100] [--per-client 100] [--ttl 1000] [--seconds 10]

It starts its own redis-server masters and one proxy (target/release/redlock-proxy) on free loopback
ports and stops them at the end. `--clients` connections each take `--per-client` session locks
(`LOCK.ACQUIRE key token ttl KEEPALIVE`, pipelined), then the proxy's RSS is read again and every
master's `total_commands_processed` is sampled over `--seconds` while the locks are only kept alive.
Prints: RSS before and after, bytes per session lock, commands per second per master, and commands
per second per master per session lock (the keepalive's cost: 3 per TTL-second expected).
"""

import argparse
import os
import socket
import subprocess
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def read_lines(sock, n):
    """Reads n one-line replies (integers, statuses, errors)."""
    buf = b""
    lines = []
    while len(lines) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("closed")
        buf += chunk
        *done, buf = buf.split(b"\r\n")
        lines.extend(done)
    return lines


def wait_ping(port):
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(resp("PING"))
                if s.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"port {port} never answered")


def script_calls(port):
    """Scripts the master ran (`EVAL` and `EVALSHA` calls): the proxy's requests, each an
    extension here. `total_commands_processed` also counts the commands inside scripts."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(resp("INFO", "commandstats"))
        s.settimeout(0.2)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    calls = 0
    for line in data.decode().splitlines():
        if line.startswith("cmdstat_eval:") or line.startswith("cmdstat_evalsha:"):
            calls += int(line.split("calls=")[1].split(",")[0])
    return calls


def info_field(port, field):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(resp("INFO", "stats"))
        data = b""
        while b"\r\n\r\n" not in data[-8:] and not data.endswith(b"\r\n"):
            data += s.recv(65536)
        time.sleep(0.01)
        try:
            s.settimeout(0.05)
            data += s.recv(65536)
        except OSError:
            pass
    for line in data.decode().splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":")[1])
    raise RuntimeError(field)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--masters", type=int, default=3)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-client", type=int, default=100)
    p.add_argument("--ttl", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=10)
    a = p.parse_args()
    work = tempfile.mkdtemp()
    procs = []
    try:
        ports = [free_port() for _ in range(a.masters)]
        for port in ports:
            procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                                           "--dir", work, "--dbfilename", f"d{port}.rdb"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports:
            wait_ping(port)
        proxy_port = free_port()
        config = os.path.join(work, "config.toml")
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{proxy_port}"\n')
            f.write("backends = [%s]\n" % ", ".join(f'"redis://127.0.0.1:{p}"' for p in ports))
            f.write('quarantine = "restarts"\nlog_level = "error"\n')
            f.write(f"max_session_locks_per_client = {a.per_client}\n")
            f.write(f"max_session_locks_per_user = {a.clients * a.per_client}\n")
            f.write(f"max_session_locks = {a.clients * a.per_client}\n")
        binary = os.path.join(os.path.dirname(__file__), "..", "target", "release", "redlock-proxy")
        proxy = subprocess.Popen([binary, "--config", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proxy)
        wait_ping(proxy_port)
        time.sleep(1)
        conns = [socket.create_connection(("127.0.0.1", proxy_port)) for _ in range(a.clients)]
        for c in conns:
            c.sendall(resp("PING"))
            read_lines(c, 1)
        time.sleep(0.5)
        before = rss_kib(proxy.pid)
        granted = 0
        refusals = {}
        # In pipelined batches of 10 per connection, one connection at a time: a burst of
        # thousands of fenced acquisitions at once would outrun the masters' 50 ms timeout.
        for i, c in enumerate(conns):
            for first in range(0, a.per_client, 10):
                batch = range(first, min(first + 10, a.per_client))
                c.sendall(b"".join(resp("LOCK.ACQUIRE", f"bench:{i}:{j}", "t", a.ttl, "KEEPALIVE") for j in batch))
                for line in read_lines(c, len(batch)):
                    if line.startswith(b":"):
                        granted += 1
                    else:
                        refusals[line[:60]] = refusals.get(line[:60], 0) + 1
        if refusals:
            print("not granted:", refusals)
        time.sleep(a.ttl / 1000)
        after = rss_kib(proxy.pid)
        start = [info_field(p, "total_commands_processed") for p in ports]
        scripts_start = [script_calls(p) for p in ports]
        t0 = time.time()
        time.sleep(a.seconds)
        end = [info_field(p, "total_commands_processed") for p in ports]
        scripts_end = [script_calls(p) for p in ports]
        elapsed = time.time() - t0
        script_rate = sum(e - s for s, e in zip(scripts_start, scripts_end)) / len(ports) / elapsed
        # The proxy's own probes of each master (INFO, every probe_interval_ms) are in the count.
        rates = [(e - s) / elapsed for s, e in zip(start, end)]
        rate = sum(rates) / len(rates)
        print(f"session locks granted: {granted} of {a.clients * a.per_client} (TTL {a.ttl} ms, {a.masters} masters)")
        print(f"proxy RSS: {before} KiB before, {after} KiB after: {(after - before) * 1024 / max(granted, 1):.0f} bytes per session lock")
        print(f"master commands/s (mean of masters, with those inside scripts): {rate:.0f}; per session lock: {rate / max(granted, 1):.2f}")
        print(f"proxy requests (scripts) per second per master: {script_rate:.0f}; per session lock: {script_rate / max(granted, 1):.2f}")
    finally:
        for proc in procs:
            proc.kill()


if __name__ == "__main__":
    main()
