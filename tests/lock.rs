//! Taking, contending for, releasing and expiring locks through the proxy over five real
//! masters; validity; undo of partial locks; scripts combined by the majority rule.

mod support;

use std::time::{Duration, Instant};

use support::{DelayRelay, ProxyProcess, RELEASE, RedisServer, acquire, holders, masters, release, urls};

#[test]
fn acquire_contend_release_on_five_masters() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();

    assert_eq!(acquire(&mut c, "lock:a", "t1", 10_000).as_deref(), Some("OK"));
    assert!(
        holders(&servers, "lock:a", "t1") >= 3,
        "a granted lock is held by a majority"
    );

    assert_eq!(
        acquire(&mut c, "lock:a", "t2", 10_000),
        None,
        "a held lock is refused with nil"
    );
    assert_eq!(
        holders(&servers, "lock:a", "t2"),
        0,
        "the refused attempt was undone everywhere"
    );

    assert_eq!(release(&mut c, "lock:a", "t2"), 0, "a non-owner cannot release");
    assert!(
        holders(&servers, "lock:a", "t1") >= 3,
        "the lock survives a non-owner's release"
    );

    assert_eq!(release(&mut c, "lock:a", "t1"), 1);
    assert_eq!(holders(&servers, "lock:a", "t1"), 0, "release reaches every master");

    assert_eq!(
        acquire(&mut c, "lock:a", "t2", 10_000).as_deref(),
        Some("OK"),
        "free again after release"
    );
}

#[test]
fn lock_expires_after_its_ttl() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    let start = Instant::now();
    assert_eq!(acquire(&mut c, "lock:exp", "t1", 300).as_deref(), Some("OK"));
    // Expiry is a time event: poll for it, and check it came neither early nor never.
    let mut taken_at = None;
    while start.elapsed() < Duration::from_secs(5) {
        if acquire(&mut c, "lock:exp", "t2", 10_000).is_some() {
            taken_at = Some(start.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let taken_at = taken_at.expect("the lock never expired");
    assert!(
        taken_at >= Duration::from_millis(290),
        "taken over after {taken_at:?}, before the TTL"
    );
}

#[test]
fn lock_without_ttl_gets_the_default_ttl() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 5000");
    let mut c = proxy.client();
    let reply: Option<String> = redis::cmd("SET")
        .arg("lock:n")
        .arg("t")
        .arg("NX")
        .query(&mut c)
        .unwrap();
    assert_eq!(reply.as_deref(), Some("OK"));
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock:n")
        .query(&mut servers[0].client())
        .unwrap();
    assert!((4000..=5000).contains(&pttl), "pttl {pttl}");
}

#[test]
fn ttl_above_max_is_refused() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "max_ttl_ms = 60000");
    let err = redis::cmd("SET")
        .arg("lock:m")
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(60_001)
        .query::<Option<String>>(&mut proxy.client())
        .unwrap_err();
    assert!(err.to_string().contains("exceeds max_ttl_ms (60000 ms)"), "{err}");
    assert_eq!(holders(&servers, "lock:m", "t"), 0);
}

#[test]
fn partial_lock_is_undone_on_every_master() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    // Another owner's key on 3 of 5 masters: only 2 can grant, short of the quorum of 3.
    for s in &servers[..3] {
        s.set("lock:u", "someone-else");
    }
    let mut c = proxy.client();
    assert_eq!(acquire(&mut c, "lock:u", "mine", 10_000), None);
    assert_eq!(
        holders(&servers, "lock:u", "mine"),
        0,
        "our partial keys on masters 3 and 4 are gone"
    );
    assert_eq!(
        holders(&servers, "lock:u", "someone-else"),
        3,
        "the other owner's keys are untouched"
    );
}

#[test]
fn two_partial_keys_still_allow_a_majority() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    servers[0].set("lock:p", "stale");
    servers[1].set("lock:p", "stale");
    let mut c = proxy.client();
    assert_eq!(
        acquire(&mut c, "lock:p", "mine", 10_000).as_deref(),
        Some("OK"),
        "3 of 5 is a majority"
    );
    assert_eq!(holders(&servers, "lock:p", "mine"), 3);
}

/// Rule 4: a quorum that answers after the validity time has run out is no lock.
#[test]
fn slow_majority_beyond_validity_is_not_acquired() {
    let servers = masters(5);
    let relays: Vec<DelayRelay> = servers[..3].iter().map(|s| DelayRelay::start(s.port)).collect();
    let mut backends: Vec<String> = relays.iter().map(DelayRelay::url).collect();
    backends.extend(servers[3..].iter().map(RedisServer::url));
    // drift = 300 × 0.4 + 2 = 122 ms: a 300 ms lock is valid only if a quorum grants within 178 ms.
    let proxy = ProxyProcess::start(&backends, "drift_factor = 0.4\nbackend_timeout_ms = 1000");
    let mut c = proxy.client();

    assert_eq!(
        acquire(&mut c, "lock:v", "fast", 300).as_deref(),
        Some("OK"),
        "control: fast masters grant"
    );
    assert_eq!(release(&mut c, "lock:v", "fast"), 1);

    for relay in &relays {
        relay.set_delay(Duration::from_millis(220));
    }
    let start = Instant::now();
    assert_eq!(
        acquire(&mut c, "lock:v", "slow", 300),
        None,
        "granted after its validity ran out"
    );
    assert!(
        start.elapsed() < Duration::from_millis(300 + 1000),
        "held longer than TTL + undo"
    );
    assert_eq!(holders(&servers, "lock:v", "slow"), 0, "the late grants were undone");
}

#[test]
fn scripts_are_cached_by_sha_and_survive_a_master_flush() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(RELEASE).query(&mut c).unwrap();
    assert_eq!(sha.len(), 40);
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&sha)
        .arg("0".repeat(40))
        .query(&mut c)
        .unwrap();
    assert_eq!(exists, vec![1, 0]);
    // Every master forgets its scripts (as after a restart): the proxy still knows the source.
    for s in &servers {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut s.client()).unwrap();
    }
    assert_eq!(acquire(&mut c, "lock:s", "t", 10_000).as_deref(), Some("OK"));
    let released: i64 = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg("lock:s")
        .arg("t")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 1);
    let err = redis::cmd("EVALSHA")
        .arg("0".repeat(40))
        .arg(0)
        .query::<i64>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("NOSCRIPT"));
    assert_eq!(err.detail(), Some("No matching script. Please use EVAL."));
}

/// The reply-combining rule on the scripts of real clients (see the table of docs/commands.md).
#[test]
fn client_scripts_combine_by_the_majority_rule() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    // redsync's release: -1 when the key is missing on a quorum.
    let redsync = r#"local val = redis.call("GET", KEYS[1]) if val == ARGV[1] then return redis.call("DEL", KEYS[1]) elseif val == false then return -1 else return 0 end"#;
    let missing: i64 = redis::cmd("EVAL")
        .arg(redsync)
        .arg(1)
        .arg("lock:r")
        .arg("t")
        .query(&mut c)
        .unwrap();
    assert_eq!(missing, -1);
    // A pttl-returning script (pottery's locked()): the TTL a quorum still guarantees.
    assert_eq!(acquire(&mut c, "lock:r", "t", 10_000).as_deref(), Some("OK"));
    let pttl_script = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pttl', KEYS[1]) end return 0";
    let pttl: i64 = redis::cmd("EVAL")
        .arg(pttl_script)
        .arg(1)
        .arg("lock:r")
        .arg("t")
        .query(&mut c)
        .unwrap();
    assert!((9000..=10_000).contains(&pttl), "pttl {pttl}");
    let released: i64 = redis::cmd("EVAL")
        .arg(redsync)
        .arg(1)
        .arg("lock:r")
        .arg("t")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 1);
    // node-redlock's multi-key acquire returns #KEYS only where every key was free.
    let multi = r#"for _, key in ipairs(KEYS) do if redis.call("exists", key) == 1 then return 0 end end for _, key in ipairs(KEYS) do redis.call("set", key, ARGV[1], "PX", ARGV[2]) end return #KEYS"#;
    servers[0].set("lock:m2", "x");
    servers[1].set("lock:m2", "x");
    let got: i64 = redis::cmd("EVAL")
        .arg(multi)
        .arg(2)
        .arg("lock:m1")
        .arg("lock:m2")
        .arg("t")
        .arg(10_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(got, 2, "three of five masters granted both keys");
    servers[2].set("lock:m3", "x");
    servers[3].set("lock:m3", "x");
    servers[4].set("lock:m3", "x");
    let got: i64 = redis::cmd("EVAL")
        .arg(multi)
        .arg(1)
        .arg("lock:m3")
        .arg("t")
        .arg(10_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(got, 0);
}

/// A client that re-sends its `SET NX` (say, after a lost reply) gets nil, as from Redis,
/// and keeps the lock it holds: the undo never deletes a key our SET did not write.
#[test]
fn retry_with_the_same_token_keeps_the_lock() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(acquire(&mut c, "lock:same", "t1", 10_000).as_deref(), Some("OK"));
    assert_eq!(acquire(&mut c, "lock:same", "t1", 10_000), None);
    assert!(
        holders(&servers, "lock:same", "t1") >= 3,
        "the retry's undo deleted the held lock"
    );
    assert_eq!(release(&mut c, "lock:same", "t1"), 1);
}

/// Many clients' requests arriving in the same turn of the proxy's event loop: the first of
/// them are written to each master early, by the connections that queued them, while the
/// rest are still being read (`pipeline::Shared::write_early`). Each reply must still meet
/// its own request (a master answers a connection in order), and a contended key must still
/// go to exactly one client.
#[test]
fn requests_arriving_together_each_get_their_own_answer() {
    const CLIENTS: usize = 40;
    const KEYS: usize = 12;
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let start = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mut conn = proxy.client();
            let start = start.clone();
            std::thread::spawn(move || {
                // One write each: every client's whole pipeline at once.
                let mut pipe = redis::pipe();
                pipe.cmd("SET")
                    .arg("lock:together")
                    .arg(format!("c{c}"))
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000);
                for k in 0..KEYS {
                    let (key, token) = (format!("lock:{c}:{k}"), format!("t{c}:{k}"));
                    pipe.cmd("SET").arg(&key).arg(&token).arg("NX").arg("PX").arg(30_000);
                    pipe.cmd("GET").arg(&key);
                }
                start.wait();
                pipe.query::<Vec<Option<String>>>(&mut conn).unwrap()
            })
        })
        .collect();
    let mut winners = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let replies = client.join().unwrap();
        assert_eq!(replies.len(), 1 + 2 * KEYS);
        match replies[0].as_deref() {
            Some("OK") => winners.push(c),
            None => {}
            other => panic!("client {c}: {other:?} for the contended lock"),
        }
        for k in 0..KEYS {
            assert_eq!(
                replies[1 + 2 * k].as_deref(),
                Some("OK"),
                "client {c}, key {k}: its own lock"
            );
            assert_eq!(
                replies[2 + 2 * k].as_deref(),
                Some(format!("t{c}:{k}").as_str()),
                "client {c}, key {k}: GET answered with another request's value"
            );
            assert_eq!(holders(&servers, &format!("lock:{c}:{k}"), &format!("t{c}:{k}")), 3);
        }
    }
    assert_eq!(winners.len(), 1, "the contended lock went to {winners:?}");
    let winner = format!("c{}", winners[0]);
    assert!(
        holders(&servers, "lock:together", &winner) >= 2,
        "the winner holds a majority"
    );
}
