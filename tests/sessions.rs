//! Session locks on real masters: a lock taken with `LOCK.ACQUIRE ... KEEPALIVE` (or with
//! `SET key token NX` and no TTL) lives as long as the connection that took it, is released
//! at once when that connection ends, however it ends, is held at most `max_hold_ms`, and is
//! reported lost (a RESP3 push, a RESP2 error) when a quorum stops extending it.

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use redis::Value;
use redis_protocol::resp3::types::BytesFrame;
use support::resp3::{Resp3, push_items};
use support::{ProxyProcess, fencing_ready, holders, masters, query as cmd, urls};

/// Whether another client can take `key` now (it releases it again at once).
fn free(proxy: &ProxyProcess, key: &str) -> bool {
    let mut c = proxy.client();
    let took = cmd(&mut c, &["SET", key, "other", "NX", "PX", "10000"]).expect("SET NX") == Value::Okay;
    if took {
        cmd(&mut c, &["LOCK.RELEASE", key, "other"]).expect("LOCK.RELEASE");
    }
    took
}

/// Asserts that `key` stays held for `span` (checked every 50 ms by another client).
fn stays_held(proxy: &ProxyProcess, key: &str, span: Duration) {
    let start = Instant::now();
    while start.elapsed() < span {
        assert!(!free(proxy, key), "{key} was free after {:?}", start.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until another client can take `key`; returns how long that took.
fn until_free(proxy: &ProxyProcess, key: &str) -> Duration {
    let start = Instant::now();
    while !free(proxy, key) {
        assert!(start.elapsed() < Duration::from_secs(10), "{key} never became free");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

#[test]
fn a_keepalive_lock_lives_as_long_as_its_connection() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    let token = cmd(&mut holder, &["LOCK.ACQUIRE", "lock:k", "me", "300", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    // Four TTLs later it is still held: the proxy extends it.
    stays_held(&proxy, "lock:k", Duration::from_millis(1200));
    // The holder releases it as usual; the keepalive stops.
    assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", "lock:k", "me"]), Ok(Value::Int(1)));
    assert!(free(&proxy, "lock:k"));
    assert_eq!(holders(&servers, "lock:k", "me"), 0);
}

#[test]
fn a_session_lock_is_released_when_its_connection_ends_however_it_ends() {
    // QUIT, RESET, end of stream, CLIENT KILL, the idle timeout.
    let servers = masters(3);
    // A 30 s TTL: without the session, each lock would stay for 30 s.
    let proxy = ProxyProcess::start(&urls(&servers), "timeout = 1");
    fencing_ready(&proxy);
    let take = |c: &mut redis::Connection, key: &str| {
        let token = cmd(c, &["LOCK.ACQUIRE", key, "me", "30000", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
        assert!(matches!(token, Value::Int(_)), "{token:?}");
    };
    // QUIT.
    let mut c = proxy.client();
    take(&mut c, "lock:quit");
    assert_eq!(cmd(&mut c, &["QUIT"]), Ok(Value::Okay));
    assert!(until_free(&proxy, "lock:quit") < Duration::from_secs(1));
    // RESET (the connection stays, its session locks end).
    let mut c = proxy.client();
    take(&mut c, "lock:reset");
    assert_eq!(cmd(&mut c, &["RESET"]), Ok(Value::SimpleString("RESET".into())));
    assert!(until_free(&proxy, "lock:reset") < Duration::from_secs(1));
    // End of stream: the client goes away.
    let mut c = proxy.client();
    take(&mut c, "lock:eof");
    drop(c);
    assert!(until_free(&proxy, "lock:eof") < Duration::from_secs(1));
    // An operator's CLIENT KILL ID closes it.
    let mut c = proxy.client();
    take(&mut c, "lock:kill");
    let Ok(Value::Int(id)) = cmd(&mut c, &["CLIENT", "ID"]) else {
        panic!("CLIENT ID");
    };
    let mut admin = proxy.client();
    assert_eq!(
        cmd(&mut admin, &["CLIENT", "KILL", "ID", &id.to_string()]),
        Ok(Value::Int(1))
    );
    assert!(until_free(&proxy, "lock:kill") < Duration::from_secs(1));
    assert!(cmd(&mut c, &["PING"]).is_err(), "the killed connection is closed");
    assert_eq!(cmd(&mut admin, &["CLIENT", "KILL", "ID", "999999"]), Ok(Value::Int(0)));
    // The idle timeout (1 s) closes the connection.
    let mut c = proxy.client();
    take(&mut c, "lock:idle");
    let waited = until_free(&proxy, "lock:idle");
    assert!(
        (Duration::from_millis(700)..Duration::from_millis(2500)).contains(&waited),
        "freed after {waited:?}"
    );
    drop(c);
}

#[test]
fn a_lock_taken_without_a_ttl_is_a_session_lock() {
    let servers = masters(3);
    // redis-py's Lock(timeout=None) sends SET key token NX: held until released, not for
    // default_ttl_ms (here 300 ms).
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 300");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert_eq!(cmd(&mut holder, &["SET", "lock:n", "me", "NX"]), Ok(Value::Okay));
    stays_held(&proxy, "lock:n", Duration::from_millis(1000));
    // Released by its holder's own script: the keepalive stops, the lock is free.
    let release = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
    assert_eq!(
        cmd(&mut holder, &["EVAL", release, "1", "lock:n", "me"]),
        Ok(Value::Int(1))
    );
    assert!(free(&proxy, "lock:n"));
    // Taken again and the holder disconnects: free at once.
    assert_eq!(cmd(&mut holder, &["SET", "lock:n", "me", "NX"]), Ok(Value::Okay));
    drop(holder);
    assert!(until_free(&proxy, "lock:n") < Duration::from_millis(300));
}

#[test]
fn a_session_lock_is_held_at_most_max_hold_ms() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "max_hold_ms = 600");
    fencing_ready(&proxy);
    let mut holder = Resp3::connect(&proxy);
    let start = Instant::now();
    assert!(matches!(
        holder.call(&["LOCK.ACQUIRE", "lock:h", "me", "200", "KEEPALIVE"]),
        BytesFrame::Number { .. }
    ));
    let push = holder.next();
    let held = start.elapsed();
    assert_eq!(push_items(&push), ["lock-lost", "lock:h", "me", "max-hold"]);
    assert!(held >= Duration::from_millis(550), "lost after {held:?}");
    assert!(free(&proxy, "lock:h"), "released at max_hold_ms");
}

#[test]
fn a_lost_session_lock_is_reported_by_push_or_by_error() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    // RESP3: a push message as soon as it is lost.
    let mut resp3 = Resp3::connect(&proxy);
    assert!(matches!(
        resp3.call(&["LOCK.ACQUIRE", "lock:p3", "me", "400", "KEEPALIVE"]),
        BytesFrame::Number { .. }
    ));
    // RESP2: an error for its next LOCK.* command on the key.
    let mut resp2 = proxy.client();
    let token = cmd(&mut resp2, &["LOCK.ACQUIRE", "lock:p2", "me", "400", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    // A quorum of masters paused past the validity: no extension can count.
    servers[1].pause();
    servers[2].pause();
    let push = resp3.next();
    assert_eq!(push_items(&push), ["lock-lost", "lock:p3", "me", "not-extended"]);
    // By now lock:p2 (same TTL, taken just after) is lost too, or about to be.
    let deadline = Instant::now() + Duration::from_secs(5);
    let error = loop {
        // Until the loss, LOCK.INFO answers NOQUORUM (two masters are paused).
        match cmd(&mut resp2, &["LOCK.INFO", "lock:p2"]) {
            Err(e) if e.code() == Some("LOCKLOST") => break e,
            _ => {
                assert!(Instant::now() < deadline, "the RESP2 client was never told");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(error.to_string().contains("not-extended"), "{error}");
    servers[1].resume();
    servers[2].resume();
}

/// The standard compare-and-delete release script every client library sends.
const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

#[test]
fn a_non_holders_failed_or_read_only_commands_do_not_end_a_session_lock() {
    // Rule 13: on a connection several callers share (ioredis, node-redis, StackExchange.Redis,
    // a pool), a caller without the lock sends the release script with its stale token, or
    // another failed or read-only command naming the key: the holder's lock stays kept alive.
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 500");
    fencing_ready(&proxy);
    let mut shared = proxy.client();
    let token = cmd(&mut shared, &["LOCK.ACQUIRE", "job:1", "tokA", "500", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    assert_eq!(cmd(&mut shared, &["SET", "job:2", "tokA", "NX"]), Ok(Value::Okay));
    for key in ["job:1", "job:2"] {
        let refused: [(&[&str], Value); 4] = [
            (&["EVAL", RELEASE, "1", key, "stale"], Value::Int(0)),
            (&["LOCK.RELEASE", key, "stale"], Value::Int(0)),
            (&["DELEX", key, "IFEQ", "stale"], Value::Int(0)),
            (&["SET", key, "x", "IFEQ", "stale", "PX", "500"], Value::Nil),
        ];
        for (command, expected) in refused {
            assert_eq!(cmd(&mut shared, command), Ok(expected), "{command:?}");
        }
        let read = cmd(&mut shared, &["EVAL", "return redis.call('pttl', KEYS[1])", "1", key]);
        assert!(matches!(read, Ok(Value::Int(ms)) if ms > 0), "{read:?}");
    }
    // Three TTLs later both are still held, by tokA.
    stays_held(&proxy, "job:1", Duration::from_millis(1500));
    assert!(!free(&proxy, "job:2"));
    assert_eq!(holders(&servers, "job:1", "tokA"), 3);
    assert_eq!(holders(&servers, "job:2", "tokA"), 3);
    // The holder's own release ends them.
    assert_eq!(cmd(&mut shared, &["LOCK.RELEASE", "job:1", "tokA"]), Ok(Value::Int(1)));
    assert_eq!(
        cmd(&mut shared, &["EVAL", RELEASE, "1", "job:2", "tokA"]),
        Ok(Value::Int(1))
    );
    assert!(free(&proxy, "job:1") && free(&proxy, "job:2"));
}

#[test]
fn a_transaction_that_was_discarded_does_not_end_a_session_lock() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 300");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert_eq!(cmd(&mut holder, &["SET", "lock:tx", "me", "NX"]), Ok(Value::Okay));
    assert_eq!(cmd(&mut holder, &["MULTI"]), Ok(Value::Okay));
    assert_eq!(
        cmd(&mut holder, &["DEL", "lock:tx"]),
        Ok(Value::SimpleString("QUEUED".into()))
    );
    assert_eq!(cmd(&mut holder, &["DISCARD"]), Ok(Value::Okay));
    stays_held(&proxy, "lock:tx", Duration::from_millis(1000));
}

#[test]
fn a_session_lock_deleted_without_its_token_is_reported_lost_at_once() {
    // A successful DEL through the holder's connection may be another caller's: the holder
    // is told at once (a RESP3 push right after the DEL's reply).
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 300");
    let mut shared = Resp3::connect(&proxy);
    assert!(matches!(
        shared.call(&["SET", "lock:del", "me", "NX"]),
        BytesFrame::SimpleString { .. }
    ));
    assert!(matches!(
        shared.call(&["DEL", "lock:del"]),
        BytesFrame::Number { data: 1, .. }
    ));
    let push = shared.next();
    assert_eq!(push_items(&push), ["lock-lost", "lock:del", "me", "deleted"]);
}

#[test]
fn set_nx_get_without_a_ttl_is_a_session_lock() {
    // Rule 12's nil is "you got it": SET NX GET with no TTL is granted like SET NX with no
    // TTL, a session lock, not a lock for default_ttl_ms.
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 300");
    let mut holder = proxy.client();
    assert_eq!(cmd(&mut holder, &["SET", "lock:g", "A", "NX", "GET"]), Ok(Value::Nil));
    stays_held(&proxy, "lock:g", Duration::from_millis(1000));
    drop(holder);
    assert!(until_free(&proxy, "lock:g") < Duration::from_millis(300));
}

#[test]
fn a_client_that_leaves_while_waiting_is_never_granted() {
    // W pipelines a waiting acquisition and a LOCK.INFO on the same key, then closes its
    // socket. Its end of stream is seen at once: it leaves the queue, and Z behind it is
    // granted as soon as the holder releases (not after the 5 s TTL of a grant to nobody).
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    let token = cmd(&mut holder, &["LOCK.ACQUIRE", "lock:w", "H", "5000"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    let mut w = proxy.raw();
    w.write_all(b"LOCK.ACQUIRE lock:w W 5000 WAIT 20000\r\nLOCK.INFO lock:w\r\n")
        .expect("write");
    let mut observer = proxy.client();
    wait_for_waiters(&mut observer, "lock:w", 1);
    w.shutdown(std::net::Shutdown::Both).expect("shutdown");
    drop(w);
    // W's departure takes it out of the queue at once.
    wait_for_waiters(&mut observer, "lock:w", 0);
    let z = std::thread::spawn({
        let mut z = proxy.client();
        move || {
            let token = cmd(&mut z, &["LOCK.ACQUIRE", "lock:w", "Z", "5000", "WAIT", "20000"]).expect("Z");
            (token, Instant::now())
        }
    });
    wait_for_waiters(&mut observer, "lock:w", 1);
    let released = Instant::now();
    assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", "lock:w", "H"]), Ok(Value::Int(1)));
    let (token, granted) = z.join().expect("Z");
    assert!(matches!(token, Value::Int(_)), "Z granted: {token:?}");
    let after = granted - released;
    assert!(
        after < Duration::from_millis(1500),
        "Z granted {after:?} after the release"
    );
    assert_eq!(holders(&servers, "lock:w", "W"), 0, "W was never granted");
}

/// Waits until `key` has `n` requests waiting in the proxy (`LOCK.INFO`'s `waiting`).
fn wait_for_waiters(c: &mut redis::Connection, key: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = cmd(c, &["LOCK.INFO", key]).expect("LOCK.INFO");
        let pairs: Vec<(Value, Value)> = match info {
            Value::Map(pairs) => pairs,
            Value::Array(items) => items.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect(),
            other => panic!("LOCK.INFO: {other:?}"),
        };
        let waiting = pairs.iter().find_map(|(k, v)| match (k, v) {
            (Value::BulkString(name), Value::Int(n)) if name == b"waiting" => Some(*n),
            _ => None,
        });
        if waiting == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "{key}: waiting {waiting:?}, never {n}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_lost_lock_is_told_at_once_while_the_connection_waits_for_another() {
    // A RESP3 holder of L1 (max_hold_ms = 1000) pipelines a wait for L2 and a LOCK.INFO of
    // L2: the loss of L1 at 1 s is pushed at once, not when the wait for L2 ends at 4 s.
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "max_hold_ms = 1000");
    fencing_ready(&proxy);
    let mut other = proxy.client();
    let token = cmd(&mut other, &["LOCK.ACQUIRE", "lock:l2", "O", "10000"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    let mut a = Resp3::connect(&proxy);
    let start = Instant::now();
    assert!(matches!(
        a.call(&["LOCK.ACQUIRE", "lock:l1", "A", "3000", "KEEPALIVE"]),
        BytesFrame::Number { .. }
    ));
    a.send(&["LOCK.ACQUIRE", "lock:l2", "A", "3000", "WAIT", "4000"]);
    a.send(&["LOCK.INFO", "lock:l2"]);
    let push = a.next();
    let told = start.elapsed();
    assert_eq!(push_items(&push), ["lock-lost", "lock:l1", "A", "max-hold"]);
    assert!(told < Duration::from_millis(2500), "told after {told:?}");
    // The wait then ends (nil at 4 s), and LOCK.INFO answers after it, in order.
    assert!(matches!(a.next(), BytesFrame::Null), "the wait ran out");
    assert!(matches!(a.next(), BytesFrame::Map { .. }));
}

#[test]
fn a_client_killed_while_waiting_releases_its_session_locks_at_once() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut other = proxy.client();
    let token = cmd(&mut other, &["LOCK.ACQUIRE", "lock:k2", "O", "10000"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    // The client takes a session lock, then pipelines a wait for a held lock and a command
    // behind it; an operator kills it while it waits.
    let mut raw = proxy.raw();
    raw.write_all(b"CLIENT ID\r\n").expect("write");
    let mut buf = [0u8; 64];
    let n = raw.read(&mut buf).expect("read");
    let raw_id: i64 = String::from_utf8_lossy(&buf[1..n]).trim().parse().expect("id");
    raw.write_all(
        b"LOCK.ACQUIRE lock:k3 R 30000 KEEPALIVE\r\nLOCK.ACQUIRE lock:k2 R 3000 WAIT 20000\r\nLOCK.INFO lock:k2\r\n",
    )
    .expect("write");
    wait_for_waiters(&mut other, "lock:k2", 1);
    let mut admin = proxy.client();
    let killed = Instant::now();
    assert_eq!(
        cmd(&mut admin, &["CLIENT", "KILL", "ID", &raw_id.to_string()]),
        Ok(Value::Int(1))
    );
    assert!(until_free(&proxy, "lock:k3") < Duration::from_secs(1));
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "released {:?} after the kill",
        killed.elapsed()
    );
    wait_for_waiters(&mut other, "lock:k2", 0);
}

#[test]
fn session_locks_are_bounded() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(
        &urls(&servers),
        "max_session_locks_per_client = 2\nmax_session_locks_per_user = 3\nmin_keepalive_ttl_ms = 1000",
    );
    fencing_ready(&proxy);
    let mut a = proxy.client();
    assert_eq!(cmd(&mut a, &["SET", "s:1", "t", "NX"]), Ok(Value::Okay));
    let token = cmd(&mut a, &["LOCK.ACQUIRE", "s:2", "t", "2000", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    // Per connection.
    let error = cmd(&mut a, &["SET", "s:3", "t", "NX"]).expect_err("past the bound");
    assert!(error.to_string().contains("max_session_locks_per_client"), "{error}");
    // A lock with a TTL is not a session lock: not bounded.
    assert_eq!(cmd(&mut a, &["SET", "s:3", "t", "NX", "PX", "5000"]), Ok(Value::Okay));
    // Per user (the default user, over two connections).
    let mut b = proxy.client();
    assert_eq!(cmd(&mut b, &["SET", "s:4", "t", "NX"]), Ok(Value::Okay));
    let error = cmd(&mut b, &["SET", "s:5", "t", "NX"]).expect_err("past the bound");
    assert!(error.to_string().contains("max_session_locks_per_user"), "{error}");
    // The keepalive floor.
    drop(a);
    let error = cmd(&mut b, &["LOCK.ACQUIRE", "s:6", "t", "999", "KEEPALIVE"]).expect_err("below the floor");
    assert!(error.to_string().contains("min_keepalive_ttl_ms"), "{error}");
    // Released ones free their places: `a` is gone, two more fit.
    let token = cmd(&mut b, &["LOCK.ACQUIRE", "s:6", "t", "1000", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
}

/// Several session locks at once (`LOCK.ACQUIREALL ... KEEPALIVE`) count one each against
/// the bounds: a set that would pass one is refused whole, before anything is sent, and a
/// set that fits fills it. (Counted as one per command, a pipeline of 64-key sets took 64
/// times the bound.)
#[test]
fn several_session_locks_at_once_count_one_each() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(
        &urls(&servers),
        "max_session_locks_per_client = 2\nmin_keepalive_ttl_ms = 1000",
    );
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let all = |n: usize| {
        let keys: Vec<String> = (0..n).map(|i| format!("s:all:{n}:{i}")).collect();
        let mut args = vec!["LOCK.ACQUIREALL".to_string(), "t".into(), "2000".into(), n.to_string()];
        args.extend(keys);
        args.push("KEEPALIVE".into());
        args
    };
    let ask = |c: &mut redis::Connection, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cmd(c, &args)
    };
    let error = ask(&mut c, all(3)).expect_err("three session locks past a bound of two");
    assert!(error.to_string().contains("max_session_locks_per_client"), "{error}");
    assert_eq!(holders(&servers, "s:all:3:0", "t"), 0, "nothing was sent");
    let tokens = ask(&mut c, all(2)).expect("two fit");
    assert!(matches!(&tokens, Value::Array(t) if t.len() == 2), "{tokens:?}");
    let error = cmd(&mut c, &["SET", "s:7", "t", "NX"]).expect_err("past the bound");
    assert!(error.to_string().contains("max_session_locks_per_client"), "{error}");
}

#[test]
fn a_change_is_told_at_once_to_every_session_of_the_lock() {
    // Rule 13 with two sessions of one token on one lock (`REENTRANT ... KEEPALIVE` through
    // two connections, a pool's): a DEL by a third connection is pushed to both at once. (The
    // proxy reached only the later one; the earlier heard of it when its next extension
    // failed, 2 s later with this TTL.)
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "min_keepalive_ttl_ms = 1000");
    fencing_ready(&proxy);
    let mut first = Resp3::connect(&proxy);
    let mut second = Resp3::connect(&proxy);
    let mut other = proxy.client();
    for holder in [&mut first, &mut second] {
        let token = holder.call(&["LOCK.ACQUIRE", "lock:two", "me", "6000", "REENTRANT", "KEEPALIVE"]);
        assert!(matches!(token, BytesFrame::Number { .. }), "{token:?}");
    }
    let started = Instant::now();
    assert_eq!(cmd(&mut other, &["DEL", "lock:two"]), Ok(Value::Int(1)));
    for holder in [&mut first, &mut second] {
        assert_eq!(push_items(&holder.next()), ["lock-lost", "lock:two", "me", "deleted"]);
    }
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "told after {:?}",
        started.elapsed()
    );
}

#[test]
fn a_change_through_another_connection_is_told_to_the_holder_at_once() {
    // Rule 13 across connections of one proxy: a DEL or PEXPIRE without the holder's token on
    // another connection is pushed to the holder right away (not when its keepalive fails);
    // so is the holder's own release through another connection (a pool's): `released`.
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 2000");
    let mut holder = Resp3::connect(&proxy);
    let mut other = proxy.client();
    for (key, clobber) in [
        ("lock:x1", vec!["DEL", "lock:x1"]),
        ("lock:x2", vec!["PEXPIRE", "lock:x2", "1"]),
    ] {
        assert!(matches!(
            holder.call(&["SET", key, "me", "NX"]),
            BytesFrame::SimpleString { .. }
        ));
        let started = Instant::now();
        // (`PEXPIRE k 1` answers 0: rule 7 finds no validity in 1 ms; the masters set it.)
        assert!(matches!(cmd(&mut other, &clobber), Ok(Value::Int(_))), "{clobber:?}");
        let push = holder.next();
        let reason = if clobber[0] == "DEL" {
            "deleted"
        } else {
            "expire-changed"
        };
        assert_eq!(push_items(&push), ["lock-lost", key, "me", reason]);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "told after {:?}",
            started.elapsed()
        );
    }
    // The holder's token released through another connection (a pool's, or anyone who read
    // it from LOCK.INFO): the keeping ends, and the holder is told at once (rule 16), once.
    assert!(matches!(
        holder.call(&["SET", "lock:x3", "me", "NX"]),
        BytesFrame::SimpleString { .. }
    ));
    let started = Instant::now();
    assert_eq!(
        cmd(&mut other, &["EVAL", RELEASE, "1", "lock:x3", "me"]),
        Ok(Value::Int(1))
    );
    assert_eq!(push_items(&holder.next()), ["lock-lost", "lock:x3", "me", "released"]);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "told after {:?}",
        started.elapsed()
    );
    // Past the TTL a failing keepalive would have reported by: only PONG comes.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        matches!(holder.call(&["PING"]), BytesFrame::SimpleString { .. }),
        "no second lock-lost push"
    );
    let info = cmd(&mut other, &["LOCK.INFO", "lock:x3"]).expect("LOCK.INFO");
    assert!(format!("{info:?}").contains("session"), "{info:?}");
    assert!(
        !format!("{info:?}").contains("client_id"),
        "no session holder left: {info:?}"
    );
}
