//! `redis-cli` against the proxy, as a person trying it by hand would use it (its hints, typed
//! interactively, are checked in `tests/compat.rs`).

mod support;

use std::process::Command;

use support::{ProxyProcess, RELEASE, holders, masters, urls};

/// Runs `redis-cli -p <port> args...` and returns its output, trimmed.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install it, e.g. `apt-get install -y redis-tools`"));
    assert!(
        out.status.success(),
        "redis-cli failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn take_and_release_a_lock_with_redis_cli() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    assert_eq!(cli(proxy.port, &["SET", "lock:a", "t1", "NX", "PX", "10000"]), "OK");
    assert!(holders(&servers, "lock:a", "t1") >= 3);
    // redis-cli prints nothing for a nil when its output is not a terminal.
    assert_eq!(cli(proxy.port, &["SET", "lock:a", "t2", "NX", "PX", "10000"]), "");
    assert_eq!(cli(proxy.port, &["EVAL", RELEASE, "1", "lock:a", "t1"]), "1");
    assert_eq!(holders(&servers, "lock:a", "t1"), 0);
}

#[test]
fn redis_cli_sees_noquorum() {
    let mut servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    servers[0].kill();
    servers[1].kill();
    let out = cli(proxy.port, &["SET", "lock:q", "t", "NX", "PX", "10000"]);
    assert!(out.starts_with("NOQUORUM 1 of 3 masters can vote: 2 "), "{out}");
    assert!(out.ends_with("; see PROXY BACKENDS"), "{out}");
}

/// `redis-cli` reads the proxy's `COMMAND DOCS` (it asks for it to build its help and hints):
/// its `HELP <command>` shows the proxy's own commands with their arguments, as its hints show
/// them when typing. With an empty `COMMAND DOCS` it showed nothing.
#[test]
fn redis_cli_help_shows_the_proxys_commands() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let help = cli(proxy.port, &["HELP", "LOCK.ACQUIRE"]);
    assert!(help.contains("LOCK.ACQUIRE"), "{help}");
    assert!(help.contains("key token ttl_ms [WAIT ms] [KEEPALIVE]"), "{help}");
    assert!(help.contains("summary:"), "{help}");
    let help = cli(proxy.port, &["HELP", "PROXY", "QUARANTINE"]);
    assert!(help.contains("master [LIFT]"), "{help}");

    // The raw reply as redis-cli prints it: name, then the doc map.
    let docs = cli(proxy.port, &["--no-raw", "COMMAND", "DOCS", "LOCK.ACQUIRE"]);
    let lines: Vec<&str> = docs.lines().map(str::trim).collect();
    assert_eq!(lines.first(), Some(&"1) \"lock.acquire\""), "{docs}");
    for expected in ["\"summary\"", "\"arguments\"", "\"ttl_ms\"", "\"WAIT\"", "optional"] {
        assert!(docs.contains(expected), "no {expected} in:\n{docs}");
    }
}

/// The errors redis-cli shows for `CONFIG SET` and an unknown `PROXY` subcommand say what
/// is served.
#[test]
fn redis_cli_sees_what_is_and_is_not_served() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let set = cli(proxy.port, &["CONFIG", "SET", "timeout", "1"]);
    assert!(set.starts_with("ERR CONFIG SET is not supported by the proxy"), "{set}");
    let unknown = cli(proxy.port, &["PROXY", "HELLO"]);
    assert_eq!(unknown, "ERR unknown subcommand 'HELLO'. Try PROXY HELP.");
    let help = cli(proxy.port, &["PROXY", "HELP"]);
    assert!(help.starts_with("PROXY <subcommand>"), "{help}");
}
