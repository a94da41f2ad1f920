//! SIGTERM: the proxy stops accepting, finishes the requests in flight (no lock left
//! half-acquired), answers them, and exits cleanly.

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use support::{DelayRelay, ProxyProcess, RedisServer, masters};

#[test]
fn sigterm_finishes_requests_in_flight() {
    let servers = masters(5);
    let relays: Vec<DelayRelay> = servers.iter().map(|s| DelayRelay::start(s.port)).collect();
    let backends: Vec<String> = relays.iter().map(DelayRelay::url).collect();
    let mut proxy = ProxyProcess::start(&backends, "backend_timeout_ms = 2000");
    let mut raw = proxy.raw();
    // A client that sent nothing: the shutdown closes it too, rather than waiting out the grace.
    let mut idle = proxy.raw();
    let before: Vec<u64> = relays.iter().map(DelayRelay::sent).collect();
    for relay in &relays {
        relay.set_delay(Duration::from_millis(300));
    }
    let keys = 20;
    let mut request = Vec::new();
    for i in 0..keys {
        let key = format!("lock:s{i}");
        request.extend(
            format!(
                "*6\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$1\r\nt\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n10000\r\n",
                key.len()
            )
            .bytes(),
        );
    }
    raw.write_all(&request).expect("write");
    // The acquisitions are in flight once they reached the masters' relays (their replies are
    // held back 300 ms): then the signal comes.
    let deadline = Instant::now() + Duration::from_secs(5);
    while relays.iter().zip(&before).any(|(r, b)| r.sent() <= *b) {
        assert!(Instant::now() < deadline, "the requests never reached the masters");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (clean, log) = proxy.terminate_logged();
    assert!(clean, "the proxy did not exit cleanly on SIGTERM: {log}");
    assert!(
        !log.contains("shutdown grace over"),
        "a connection was left open until the grace ended: {log}"
    );
    let mut replies = String::new();
    raw.read_to_string(&mut replies).expect("replies, then close");
    assert_eq!(replies, "+OK\r\n".repeat(keys), "every request in flight was answered");
    let mut nothing = String::new();
    idle.read_to_string(&mut nothing).expect("the idle client is closed");
    assert_eq!(nothing, "", "the idle client was sent nothing");
    for i in 0..keys {
        let key = format!("lock:s{i}");
        let held = servers
            .iter()
            .filter(|s: &&RedisServer| s.get(&key).as_deref() == Some("t"))
            .count();
        assert!(held >= 3, "{key} granted but held by {held} masters");
    }
}
