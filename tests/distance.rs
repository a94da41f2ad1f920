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
