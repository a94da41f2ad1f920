//! Masters far away, as Redlock asks for (independent masters in separate failure domains):
//! a master whose round trip fits `backend_timeout_ms` connects and votes with the default
//! `connect_timeout_ms`. Each master here sits behind a relay that holds its replies back by
//! 200 ms (100 ms each way, as between regions).

mod support;

use std::time::{Duration, Instant};

use redis::Value;
use support::{DelayRelay, ProxyProcess, backend_line, masters, query, release};

/// The round trip the relays add.
const ROUND_TRIP: Duration = Duration::from_millis(200);

#[test]
fn masters_a_200_ms_round_trip_away_connect_and_vote_with_the_default_timeouts() {
    let servers = masters(3);
    let relays: Vec<DelayRelay> = servers
        .iter()
        .map(|s| {
            let relay = DelayRelay::start(s.port);
            relay.set_delay(ROUND_TRIP);
            relay
        })
        .collect();
    let urls: Vec<String> = relays.iter().map(DelayRelay::url).collect();
    // One request fits (200 ms within 250 ms); the handshake of five or more round trips,
    // under one 250 ms bound, did not: every master stayed down with `connect timed out`.
    let proxy = ProxyProcess::start(&urls, "backend_timeout_ms = 250");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(0..3).all(|i| backend_line(&proxy, i).contains("state=up")) {
        assert!(
            Instant::now() < deadline,
            "masters 200 ms away never came up: {:?}\n{}",
            (0..3).map(|i| backend_line(&proxy, i)).collect::<Vec<_>>(),
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = proxy.client();
    let asked = Instant::now();
    let reply = query(&mut c, &["SET", "lock:far", "t1", "NX", "PX", "10000"]);
    let took = asked.elapsed();
    assert_eq!(reply, Ok(Value::Okay), "{}", proxy.log());
    assert!(
        took >= ROUND_TRIP,
        "the grant took {took:?}: the relays did not hold the replies back"
    );
    assert_eq!(
        query(&mut c, &["SET", "lock:far", "t2", "NX", "PX", "10000"]),
        Ok(Value::Nil)
    );
    assert_eq!(release(&mut c, "lock:far", "t1"), 1);
    // Still up after several probes (each probe is one round trip too).
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..3 {
        assert!(
            backend_line(&proxy, i).contains("state=up"),
            "member {i} went down: {}\n{}",
            backend_line(&proxy, i),
            proxy.log()
        );
    }
}

/// `--check-config` measures each master's round trip from where it runs, and says when a
/// timeout cannot fit it: here 200 ms against a 250 ms `backend_timeout_ms` (less than twice
/// the round trip: any jitter times out), and none against 1000 ms.
#[test]
fn check_config_warns_when_the_backend_timeout_cannot_fit_the_round_trip() {
    let server = support::RedisServer::start();
    let relay = DelayRelay::start(server.port);
    relay.set_delay(ROUND_TRIP);
    let check = |timeout_ms: &str| -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
            .current_dir(std::env::temp_dir())
            .args([
                "--backend",
                &relay.url(),
                "--backend-timeout-ms",
                timeout_ms,
                "--check-config",
            ])
            .output()
            .expect("run --check-config");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = check("250");
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("warning: member 0 (redis://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no warning about member 0: {stderr}"));
    assert!(
        warning.contains("ms measured, and backend_timeout_ms = 250 leaves it less than twice that"),
        "{warning}"
    );
    let stderr = check("1000");
    assert!(!stderr.contains("warning: member 0"), "{stderr}");
}
