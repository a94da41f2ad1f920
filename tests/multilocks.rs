//! Reentrant locks (`LOCK.ACQUIRE ... REENTRANT`) on real masters: a holder counts up and
//! must give as many holds back, and the lock stays held by a quorum while its holder
//! believes it holds one, whatever subset of masters each count up or down reached
//! (docs/recipes-quorum.md, "Reentrancy").

mod support;

use redlock_proxy::recipes::reentrant::lua::holds_key;

use redis::Value;
use support::{ProxyProcess, RedisServer, fencing_ready, holders, int, masters, query, urls};

/// `LOCK.ACQUIRE key token ttl REENTRANT`: the fencing token, or nil.
fn reenter(c: &mut redis::Connection, key: &str, token: &str) -> Option<i64> {
    match query(c, &["LOCK.ACQUIRE", key, token, "20000", "REENTRANT"]) {
        Ok(Value::Int(t)) => Some(t),
        Ok(Value::Nil) => None,
        other => panic!("LOCK.ACQUIRE REENTRANT: {other:?}"),
    }
}

#[test]
fn a_reentrant_holder_counts_up_and_gives_each_hold_back() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let token = reenter(&mut c, "re:a", "me").expect("free: taken");
    assert_eq!(support::lock_info(&mut c, "re:a", "holds"), Value::Int(1));
    assert_eq!(
        reenter(&mut c, "re:a", "me"),
        Some(token),
        "the lock's own fencing token"
    );
    assert_eq!(reenter(&mut c, "re:a", "me"), Some(token));
    assert_eq!(support::lock_info(&mut c, "re:a", "holds"), Value::Int(3));
    assert_eq!(reenter(&mut c, "re:a", "you"), None, "another token is refused");
    assert_eq!(
        query(&mut c, &["LOCK.ACQUIRE", "re:a", "me", "20000"]),
        Ok(Value::Nil),
        "without REENTRANT the holder is refused, as before"
    );
    for left in [2, 1] {
        assert_eq!(int(&mut c, &["LOCK.RELEASE", "re:a", "me"]), 1, "a hold given back");
        assert_eq!(support::lock_info(&mut c, "re:a", "holds"), Value::Int(left));
        assert_eq!(holders(&servers, "re:a", "me"), 3, "still held everywhere");
        assert_eq!(reenter(&mut c, "re:a", "you"), None);
    }
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "re:a", "me"]), 1, "the last hold");
    assert_eq!(holders(&servers, "re:a", "me"), 0, "freed with its last hold");
    assert_eq!(support::lock_info(&mut c, "re:a", "holds"), Value::Int(0));
    assert_eq!(
        int(&mut c, &["LOCK.RELEASE", "re:a", "me"]),
        0,
        "nothing left to give back"
    );
    let next = reenter(&mut c, "re:a", "you").expect("free again");
    assert!(next > token, "a new holder's token is higher");
    // Holds follow their lock's extension: a holder that extends keeps its holds.
    assert_eq!(reenter(&mut c, "re:a", "you"), Some(next));
    assert!(int(&mut c, &["LOCK.EXTEND", "re:a", "you", "30000"]) > 20_000);
    assert_eq!(support::lock_info(&mut c, "re:a", "holds"), Value::Int(2));
    // A lock of the same token taken again after its end is not given its old holds.
    let mut raw = servers[0].client();
    let _: () = redis::cmd("DEL").arg("re:a").query(&mut raw).expect("DEL");
    for s in &servers[1..] {
        let _: () = redis::cmd("DEL").arg("re:a").query(&mut s.client()).expect("DEL");
    }
    assert!(matches!(
        query(&mut c, &["LOCK.ACQUIRE", "re:a", "you", "20000"]),
        Ok(Value::Int(_))
    ));
    assert_eq!(
        support::lock_info(&mut c, "re:a", "holds"),
        Value::Int(1),
        "stale holds are not this lock's"
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "re:a", "you"]), 1);
    assert_eq!(
        holders(&servers, "re:a", "you"),
        0,
        "one release frees a lock taken once"
    );
}

/// The holds hash of `key` on one master: its extra holds.
fn extra_holds(server: &RedisServer, key: &str) -> Vec<String> {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&holds_key(key.as_bytes())[..])
        .query(&mut server.client())
        .expect("HKEYS");
    fields.into_iter().filter(|f| f != "owner" && f != "at").collect()
}

/// Makes master `server` miss the count-up that added `hold` (as a master that was cut off
/// during it): the hold removed there, the rest of the hash as it was.
fn miss(server: &RedisServer, key: &str, hold: &str) {
    let _: i64 = redis::cmd("HDEL")
        .arg(&holds_key(key.as_bytes())[..])
        .arg(hold)
        .query(&mut server.client())
        .expect("HDEL");
}

/// Whether a quorum of `servers` holds `key` for `token`.
fn held_by_quorum(servers: &[RedisServer], key: &str, token: &str) -> bool {
    holders(servers, key, token) > servers.len() / 2
}

/// The example: holds counted up on {A,B} then on {B,C} leave A=2, B=3, C=2. After
/// two releases the holder believes it holds one: a quorum must still hold the lock, and
/// another client must be refused.
#[test]
fn diverged_holds_keep_the_lock_held_while_one_is_believed() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let key = "re:diverged";
    reenter(&mut c, key, "me").expect("taken");
    reenter(&mut c, key, "me").expect("second hold");
    let second = extra_holds(&servers[1], key);
    assert_eq!(second.len(), 1);
    miss(&servers[2], key, &second[0]);
    reenter(&mut c, key, "me").expect("third hold");
    let third: Vec<String> = extra_holds(&servers[1], key)
        .into_iter()
        .filter(|h| *h != second[0])
        .collect();
    miss(&servers[0], key, &third[0]);
    let counts: Vec<usize> = servers.iter().map(|s| 1 + extra_holds(s, key).len()).collect();
    assert_eq!(counts, vec![2, 3, 2], "the issue's divergence");
    for believed in [2, 1] {
        assert_eq!(int(&mut c, &["LOCK.RELEASE", key, "me"]), 1);
        assert!(
            held_by_quorum(&servers, key, "me"),
            "the holder believes it holds {believed}: a quorum must hold the lock"
        );
        assert_eq!(reenter(&mut c, key, "other"), None, "and nobody else may take it");
    }
    assert_eq!(int(&mut c, &["LOCK.RELEASE", key, "me"]), 1);
    assert!(reenter(&mut c, key, "other").is_some(), "free after the last hold");
}

/// The same divergence under the naive design (a count per master, decremented, the lock
/// deleted at zero), run directly on the masters: the check above catches it. This is what
/// the test exists to fail on.
#[test]
fn the_check_catches_the_naive_decrement_and_delete_at_zero() {
    let servers = masters(3);
    let key = "naive";
    const UP: &str = "if redis.call('get', KEYS[1]) == false then redis.call('set', KEYS[1], ARGV[1], 'PX', 20000) end \
        if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('incr', KEYS[2]) end return 0";
    const DOWN: &str = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end \
        if redis.call('decr', KEYS[2]) <= 0 then redis.call('del', KEYS[1], KEYS[2]) end return 1";
    let run = |s: &RedisServer, script: &str| {
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(2)
            .arg(key)
            .arg("count")
            .arg("me")
            .query(&mut s.client())
            .expect("EVAL");
    };
    // Taken on all three; counted up on {B,C}, then on {A,B}: A=2, B=3, C=2.
    for s in &servers {
        run(s, UP);
    }
    for i in [1, 2] {
        run(&servers[i], UP);
    }
    for i in [0, 1] {
        run(&servers[i], UP);
    }
    // Two releases, each reaching every master.
    for _ in 0..2 {
        for s in &servers {
            run(s, DOWN);
        }
    }
    assert!(
        !held_by_quorum(&servers, key, "me"),
        "the naive variant frees a majority while its holder believes it holds one"
    );
}

/// Count-ups with a master paused during some of them: the late ones land when it resumes;
/// releases as many as the holder believes it holds keep a quorum until the last.
#[test]
fn holds_counted_up_with_a_master_paused_are_given_back_exactly() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let key = "re:paused";
    let token = reenter(&mut c, key, "me").expect("taken");
    servers[0].pause();
    assert_eq!(reenter(&mut c, key, "me"), Some(token));
    assert_eq!(reenter(&mut c, key, "me"), Some(token));
    servers[0].resume();
    servers[2].pause();
    assert_eq!(reenter(&mut c, key, "me"), Some(token));
    servers[2].resume();
    // Four holds: the lock's own and three counted up.
    for believed in [4, 3, 2, 1] {
        assert!(held_by_quorum(&servers, key, "me"), "believes {believed}");
        assert_eq!(reenter(&mut c, key, "other"), None);
        let released = query(&mut c, &["LOCK.RELEASE", key, "me"]);
        assert_eq!(released, Ok(Value::Int(1)), "a hold given back");
    }
    // The last release freed it on a quorum (stray holds can keep a minority until the TTL).
    assert!(!held_by_quorum(&servers, key, "me"));
}

/// Waits (bounded) until `done` holds; panics with `what` otherwise.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Rule 13 with reentrancy: a session lock's end gives back its one hold, as `LOCK.RELEASE`
/// would. A hold the same token took again through another connection (a pool's) keeps the
/// lock: its holder was answered a fencing token valid for 10 s. (The session's end used to
/// delete the lock whatever its holds: 500 ms later another client was granted it.)
#[test]
fn a_sessions_end_leaves_a_reentry_through_another_connection_held() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "min_keepalive_ttl_ms = 1000");
    fencing_ready(&proxy);
    let mut session = proxy.client();
    let mut pooled = proxy.client();
    let token = query(
        &mut session,
        &["LOCK.ACQUIRE", "lock:s", "t", "3000", "REENTRANT", "KEEPALIVE"],
    );
    assert!(matches!(token, Ok(Value::Int(_))), "{token:?}");
    assert_eq!(
        query(&mut pooled, &["LOCK.ACQUIRE", "lock:s", "t", "10000", "REENTRANT"]),
        token
    );
    assert_eq!(support::lock_info(&mut pooled, "lock:s", "holds"), Value::Int(2));
    drop(session);
    wait_until("the session's hold is given back", || {
        support::lock_info(&mut pooled, "lock:s", "holds") != Value::Int(2)
    });
    assert_eq!(
        support::lock_info(&mut pooled, "lock:s", "holds"),
        Value::Int(1),
        "the reentry's hold is left"
    );
    assert!(holders(&servers, "lock:s", "t") >= 2, "held by a majority");
    let mut other = proxy.client();
    assert_eq!(
        query(&mut other, &["SET", "lock:s", "other", "NX", "PX", "10000"]),
        Ok(Value::Nil)
    );
    assert_eq!(query(&mut pooled, &["LOCK.RELEASE", "lock:s", "t"]), Ok(Value::Int(1)));
    assert_eq!(holders(&servers, "lock:s", "t"), 0, "its last hold freed it");
}

/// Rule 13 with reentrancy: a reentry's hold given back through another connection
/// (`LOCK.RELEASE`, `LOCK.RELEASEALL`) is one hold of several, not the session holder's
/// release: its session lock stays kept alive. (It used to end the keepalive silently: the
/// lock expired under a holder told nothing.)
#[test]
fn giving_back_a_reentry_keeps_the_session_alive() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "min_keepalive_ttl_ms = 1000");
    fencing_ready(&proxy);
    let mut session = proxy.client();
    let mut pooled = proxy.client();
    let give_back = [
        ("lock:r1", vec!["LOCK.RELEASE", "lock:r1", "t"]),
        ("lock:r2", vec!["LOCK.RELEASEALL", "t", "1", "lock:r2"]),
    ];
    for (key, release) in &give_back {
        let token = query(
            &mut session,
            &["LOCK.ACQUIRE", key, "t", "1000", "REENTRANT", "KEEPALIVE"],
        );
        assert!(matches!(token, Ok(Value::Int(_))), "{token:?}");
        assert_eq!(
            query(&mut pooled, &["LOCK.ACQUIRE", key, "t", "1000", "REENTRANT"]),
            token
        );
        assert_eq!(query(&mut pooled, release), Ok(Value::Int(1)), "{release:?}");
        assert_eq!(support::lock_info(&mut pooled, key, "holds"), Value::Int(1));
    }
    // Two and a half TTLs: only the session's keepalive keeps the locks.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    for (key, _) in &give_back {
        assert_eq!(holders(&servers, key, "t"), 3, "{key} kept alive");
        assert_eq!(support::lock_info(&mut session, key, "holds"), Value::Int(1), "{key}");
        assert_ne!(
            support::lock_info(&mut session, key, "session"),
            Value::Nil,
            "{key} is a session lock"
        );
    }
}
