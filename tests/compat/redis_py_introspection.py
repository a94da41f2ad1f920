"""redis-py's command introspection against redlock-proxy.

usage: redis_py_introspection.py PORT

`command()` (COMMAND, parsed by redis-py into name -> arity, flags, key positions),
`command_count()`, `command_list()` with its filters, `command_getkeys()`,
`command_getkeysandflags()`, COMMAND INFO and a container's HELP, once with redis-py's
default protocol (RESP3 in 8.x) and once with `protocol=2`. Prints one line per check and
exits 1 when any check failed.
"""

import sys
import traceback

import redis

from checks import check, failures

HOST = "127.0.0.1"


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def run(port, protocol):
    p = f"[protocol={protocol or 'default'}]"
    kwargs = {"host": HOST, "port": port, "socket_timeout": 5, "socket_connect_timeout": 5}
    if protocol is not None:
        kwargs["protocol"] = protocol
    r = redis.Redis(**kwargs)

    commands = r.command()
    acquire = commands.get("lock.acquire")
    check(f"{p} command() has lock.acquire", acquire is not None, f"{sorted(commands)!r}")
    if acquire is not None:
        check(f"{p} lock.acquire arity -4", acquire["arity"] == -4, repr(acquire))
        positions = (acquire["first_key_pos"], acquire["last_key_pos"], acquire["step_count"])
        check(f"{p} lock.acquire key positions 1 1 1", positions == (1, 1, 1), repr(acquire))
        flags = {text(f) for f in acquire["flags"]}
        check(f"{p} lock.acquire flags: write, module", {"write", "module"} <= flags, repr(flags))
    get = commands.get("get", {})
    check(f"{p} get: arity 2, readonly", get.get("arity") == 2 and "readonly" in {text(f) for f in get.get("flags", [])}, repr(get))
    check(f"{p} command_count() == len(command())", r.command_count() == len(commands), f"{r.command_count()} vs {len(commands)}")

    names = {text(n) for n in r.command_list()}
    check(f"{p} command_list() has subcommands (client|kill)", "client|kill" in names, repr(sorted(names)))
    scripting = {text(n) for n in r.command_list(category="scripting")}
    check(f"{p} command_list(category=scripting) has eval", "eval" in scripting and "get" not in scripting, repr(scripting))
    native = {text(n) for n in r.command_list(module="redlock-proxy")}
    check(f"{p} command_list(module=redlock-proxy) is the native commands", "lock.release" in native and "get" not in native, repr(native))
    locks = {text(n) for n in r.command_list(pattern="lock.*")}
    check(f"{p} command_list(pattern=lock.*) has the seven LOCK commands", len(locks) == 7, repr(locks))

    keys = [text(k) for k in r.command_getkeys("LOCK.ACQUIRE", "lock:x", "t", 1000, "KEEPALIVE")]
    check(f"{p} command_getkeys(LOCK.ACQUIRE ...)", keys == ["lock:x"], repr(keys))
    keys = [text(k) for k in r.command_getkeys("EVAL", "return 1", 2, "a", "b", "x")]
    check(f"{p} command_getkeys(EVAL ... 2 a b x)", keys == ["a", "b"], repr(keys))
    with_flags = r.command_getkeysandflags("DEL", "a")
    check(f"{p} command_getkeysandflags(DEL a)", text(with_flags[0][0]) == "a" and "delete" in {text(f) for f in with_flags[0][1]}, repr(with_flags))

    info = r.execute_command("COMMAND INFO", "lock.release", "nope")
    check(f"{p} COMMAND INFO lock.release: 10 fields", len(info[0]) == 10 and text(info[0][0]) == "lock.release", repr(info))
    check(f"{p} COMMAND INFO of an unknown name is None", info[1] is None, repr(info))

    help_lines = [text(line) for line in r.execute_command("PROXY HELP")]
    check(f"{p} PROXY HELP", help_lines[0].startswith("PROXY <subcommand>") and "QUARANTINE <master> [LIFT]" in help_lines, repr(help_lines))
    r.close()


def main():
    if len(sys.argv) < 2:
        print("usage: redis_py_introspection.py PORT", file=sys.stderr)
        return 2
    port = int(sys.argv[1])
    print(f"redis-py {redis.__version__} against 127.0.0.1:{port}", flush=True)
    for protocol in (None, 2):
        try:
            run(port, protocol)
        except Exception:
            check(f"[protocol={protocol}] run completed without an exception", False, traceback.format_exc())
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
