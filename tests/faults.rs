//! Masters dying: a minority down changes nothing; a majority down is `-NOQUORUM`.

mod support;

use std::time::{Duration, Instant};

use support::{DelayRelay, ProxyProcess, masters, urls};

fn acquire(c: &mut redis::Connection, key: &str, token: &str) -> redis::RedisResult<Option<String>> {
    redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query(c)
}

#[test]
fn two_of_five_killed_still_locks() {
    let mut servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(acquire(&mut c, "lock:warm", "t").unwrap().as_deref(), Some("OK"));
    servers[0].kill();
    servers[1].kill();
    for i in 0..20 {
        let key = format!("lock:k{i}");
        assert_eq!(acquire(&mut c, &key, "t").unwrap().as_deref(), Some("OK"), "{key}");
        assert_eq!(acquire(&mut c, &key, "u").unwrap(), None, "{key} held");
    }
}

#[test]
fn three_of_five_killed_is_noquorum() {
    let mut servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(acquire(&mut c, "lock:warm", "t").unwrap().as_deref(), Some("OK"));
    for s in &mut servers[..3] {
        s.kill();
    }
    for _ in 0..3 {
        let err = acquire(&mut c, "lock:q", "t").unwrap_err();
        assert_eq!(err.code(), Some("NOQUORUM"), "{err}");
        let detail = err.detail().unwrap_or_default();
        // The three killed masters are "down" once their connections are seen closed, and "did
        // not answer in time" for a request already queued on a connection that then closed:
        // which one depends on timing, but together they are the three that cannot vote.
        let reasons = detail
            .strip_prefix("2 of 5 masters can vote: ")
            .unwrap_or_else(|| panic!("{detail}"));
        let cannot: u32 = reasons
            .split([',', ';'])
            .filter_map(|reason| reason.split_whitespace().next()?.parse::<u32>().ok())
            .sum();
        assert_eq!(cannot, 3, "{detail}");
    }
    assert_eq!(
        servers[3].get("lock:q"),
        None,
        "the failed attempt was undone on the survivors"
    );
}

/// Rule 8: a master that comes back empty (a new run_id) votes in no quorum until every
/// lock granted before its restart has expired (max_ttl_ms + drift), then rejoins.
#[test]
fn restarted_master_is_quarantined_then_rejoins() {
    let mut servers = masters(3);
    let config = "max_ttl_ms = 1500\ndefault_ttl_ms = 1000\nlegacy_ttl_ms = 1000";
    let proxy = ProxyProcess::start(&urls(&servers), config);
    let mut c = proxy.client();
    let ttl_acquire = |c: &mut redis::Connection, key: &str| -> redis::RedisResult<Option<String>> {
        redis::cmd("SET")
            .arg(key)
            .arg("t")
            .arg("NX")
            .arg("PX")
            .arg(1000)
            .query(c)
    };
    assert_eq!(ttl_acquire(&mut c, "lock:before").unwrap().as_deref(), Some("OK"));
    servers[0].restart();
    let restarted = Instant::now();
    servers[1].kill();
    // The proxy sees the new run_id when it reconnects, before any request uses it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !info_backends(&mut c).contains("state=quarantined") {
        assert!(
            Instant::now() < deadline,
            "never quarantined: {}",
            info_backends(&mut c)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = ttl_acquire(&mut c, "lock:q").unwrap_err();
    assert_eq!(err.code(), Some("NOQUORUM"), "a quarantined master voted: {err}");
    // After max_ttl_ms (+ drift) since its restart it votes again.
    loop {
        match ttl_acquire(&mut c, "lock:q") {
            Ok(Some(_)) => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("never rejoined: {other:?}"),
        }
    }
    assert!(
        restarted.elapsed() >= Duration::from_millis(1500),
        "rejoined after {:?}",
        restarted.elapsed()
    );
}

fn info_backends(c: &mut redis::Connection) -> String {
    redis::cmd("INFO").arg("backends").query(c).expect("INFO backends")
}

/// Rule 8's ordering on one master connection: a request admitted while a database's first
/// connection is being opened must be admitted again once it is open. Here the master is
/// paused while the request for database 5 waits, the member is quarantined meanwhile (as a
/// failover's switch does), and the master resumes: the request must be refused, not sent
/// to the process whose quarantine began after it was first admitted.
#[test]
fn a_request_waiting_for_its_connection_is_admitted_again() {
    use redlock_proxy::backend::health::{Health, QuarantineMode};
    use redlock_proxy::backend::redis::{RedisBackend, Settings};
    use redlock_proxy::backend::{BackendError, Request, call};
    use redlock_proxy::clock::{Clock, TokioClock};
    use std::sync::Arc;

    let server = support::RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let settings = Settings {
            tls: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(1),
            probe_interval: Duration::from_secs(60),
            databases: 16,
            greeting: None,
            preload: &[],
            shared_transactions: true,
        };
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let health = |name: &str| Health::new(name, clock, QuarantineMode::Restarts, Duration::from_secs(30));
        let backend = Arc::new(RedisBackend::new(&server.url(), settings, health).expect("backend"));
        backend.connect().await;
        server.pause();
        let set = Request::new(
            5,
            ["SET", "lock:ordered", "t"]
                .map(|a: &'static str| bytes::Bytes::from_static(a.as_bytes()))
                .to_vec(),
        );
        let waiting = call(&backend, &set, None);
        tokio::pin!(waiting);
        // One poll starts the request: admitted, it waits for database 5's first connection.
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        backend.health().quarantine_now();
        server.resume();
        let answer = waiting.await;
        assert!(
            matches!(answer, Err(BackendError::Quarantined { .. })),
            "sent to a quarantined master: {answer:?}"
        );
    });
    let mut c = server.client();
    let _: () = redis::cmd("SELECT").arg(5).query(&mut c).expect("SELECT");
    let value: Option<String> = redis::cmd("GET").arg("lock:ordered").query(&mut c).expect("GET");
    assert_eq!(value, None, "the request reached the master");
}

/// Rule 15: one Redis server reached under two URLs (here through a relay, as another
/// address of its host or a NAT would reach it; config validation cannot tell) counts once.
/// With the third member stopped, only one server is left: no majority, whatever its two
/// members answer.
#[test]
fn one_server_under_two_urls_votes_once() {
    let mut servers = masters(2);
    let relay = DelayRelay::start(servers[0].port);
    // Another database, as in `h:p/0` and `h:p/1`: each member's `SET NX` finds its key free.
    let backends = [servers[0].url(), format!("{}/1", relay.url()), servers[1].url()];
    let proxy = ProxyProcess::start(&backends, "");
    let mut c = proxy.client();
    servers[1].kill();
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..5 {
        let err = acquire(&mut c, &format!("lock:dup{i}"), "t").expect_err("one server formed a majority");
        assert_eq!(err.code(), Some("NOQUORUM"), "{err}");
        assert!(
            err.detail()
                .unwrap_or_default()
                .contains("the same server (same run_id) as another member"),
            "{err}"
        );
    }
    // Whichever of its two members showed the run id first keeps the vote.
    let info = info_backends(&mut c);
    let direct = format!("duplicate_of=0:127.0.0.1:{}", servers[0].port);
    let relayed = format!("duplicate_of=1:127.0.0.1:{}", relay.port);
    assert!(info.contains(&direct) || info.contains(&relayed), "{info}");
    let admin: Vec<String> = redis::cmd("PROXY")
        .arg("BACKENDS")
        .query(&mut c)
        .expect("PROXY BACKENDS");
    assert_eq!(
        admin.iter().filter(|l| l.contains("state=duplicate")).count(),
        1,
        "{admin:?}"
    );
}
