//! `redis-cli` against the proxy, as a person trying it by hand would use it.

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
