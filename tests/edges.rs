//! Safety at the edges, on real masters: every reply means what Redis would mean, at the
//! moment the client reads it, and no write or delete touches a key another acquisition owns.
//! Each test is one flaw found by adversarial clients (refinements 4a, 5a, 7a, 8a, 11, 12 of
//! the rules in docs/safety-rules.md); each fails on a proxy that has it.

mod support;

use std::time::{Duration, Instant};

use redis::Value;
use support::{ProxyProcess, RedisServer, holders, masters, query, urls};

/// Runs one command that must not fail.
fn cmd(c: &mut redis::Connection, args: &[&str]) -> Value {
    query(c, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The error a command must answer, as the server wrote it (`CODE detail`).
fn error(c: &mut redis::Connection, args: &[&str]) -> String {
    match query(c, args) {
        Err(e) => match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            _ => e.to_string(),
        },
        Ok(v) => panic!("{args:?} answered {v:?}, not an error"),
    }
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

/// Waits (bounded) until `done` holds; panics with `what` otherwise.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rule 12: a refused `SET NX GET` never answers nil, which in Redis means "you got it".
#[test]
fn a_refused_set_nx_get_never_answers_nil() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    // Two holders, one free master: no value is held by a majority, and the attempt is
    // refused (it gets one master of three).
    servers[0].set("lock:g", "a");
    servers[1].set("lock:g", "b");
    let refused = error(&mut c, &["SET", "lock:g", "t", "NX", "GET", "PX", "10000"]);
    assert!(refused.contains("not acquired"), "{refused}");
    assert_eq!(holders(&servers, "lock:g", "t"), 0, "the partial grant was undone");
    // A value held by a majority is the answer, as Redis answers the holder's value.
    servers[2].set("lock:g", "a");
    assert_eq!(
        cmd(&mut c, &["SET", "lock:g", "t", "NX", "GET", "PX", "10000"]),
        bulk("a")
    );
    // And nil only to the winner.
    assert_eq!(
        cmd(&mut c, &["SET", "lock:h", "t", "NX", "GET", "PX", "10000"]),
        Value::Nil
    );
    assert_eq!(holders(&servers, "lock:h", "t"), 3);
}

/// Rule 5a: the undo of a failed attempt removes only what that attempt wrote. A holder
/// re-sends `SET NX` with its own token while one of its masters is paused: that master
/// receives the attempt's `SET` (refused there, behind the pause) and its undo; the key holds
/// an equal value, written by the earlier acquisition, and must survive.
#[test]
fn an_undo_never_deletes_an_equal_value_another_acquisition_wrote() {
    let servers = masters(5);
    // A long probe interval: the paused master is not marked down, so the attempt is sent
    // to it and times out there.
    let proxy = ProxyProcess::start(&urls(&servers), "backend_timeout_ms = 200\nprobe_interval_ms = 60000");
    let mut c = proxy.client();
    // Every master has the proxy's scripts cached (a release through the proxy), so that an
    // undo sent by SHA1 runs there too.
    assert_eq!(cmd(&mut c, &["LOCK.RELEASE", "lock:warm", "x"]), Value::Int(0));
    assert_eq!(cmd(&mut c, &["SET", "lock:u", "me", "NX", "PX", "60000"]), Value::Okay);
    wait_until("every master holds the lock", || holders(&servers, "lock:u", "me") == 5);
    // Master 4 lost the key (as after an eviction); master 3 is paused.
    redis::cmd("DEL")
        .arg("lock:u")
        .query::<i64>(&mut servers[4].client())
        .expect("DEL");
    servers[3].pause();
    // The re-sent acquisition: refused by 0-2, granted by 4, unanswered by 3: not acquired.
    assert_eq!(cmd(&mut c, &["SET", "lock:u", "me", "NX", "PX", "60000"]), Value::Nil);
    servers[3].resume();
    // Master 3 runs the attempt and its undo, then (the proxy's connection to it is in order)
    // a later acquisition of another key: once that lands, the undo has run.
    assert_eq!(
        cmd(&mut c, &["SET", "lock:u:after", "x", "NX", "PX", "60000"]),
        Value::Okay
    );
    wait_until("master 3 ran the attempt, its undo and the next request", || {
        servers[3].get("lock:u:after").is_some()
    });
    assert_eq!(
        servers[3].get("lock:u").as_deref(),
        Some("me"),
        "the undo deleted a key this attempt did not write"
    );
    assert_eq!(servers[4].get("lock:u"), None, "the attempt's own write was undone");
    assert_eq!(holders(&servers, "lock:u", "me"), 4, "the holder keeps its majority");
}

/// Three masters, the third behind a relay that can hold its replies back, and a proxy that
/// waits 200 ms for a master and does not probe (the held master is not marked down).
fn behind_a_relay() -> (Vec<RedisServer>, support::DelayRelay, ProxyProcess) {
    let servers = masters(3);
    let relay = support::DelayRelay::start(servers[2].port);
    let backends = [servers[0].url(), servers[1].url(), relay.url()];
    let proxy = ProxyProcess::start(&backends, "backend_timeout_ms = 200\nprobe_interval_ms = 60000");
    (servers, relay, proxy)
}

/// An attempt on `lock:late` that masters 0 and 1 refuse (another token holds it there) and
/// master 2 runs, its reply held back: answered nil, its write on master 2 known to the proxy
/// only when that reply comes.
fn a_refused_attempt_with_a_late_write(
    servers: &[RedisServer],
    relay: &support::DelayRelay,
    c: &mut redis::Connection,
    ttl: &str,
) {
    for s in &servers[..2] {
        redis::cmd("SET")
            .arg("lock:late")
            .arg("other")
            .arg("PX")
            .arg(60_000)
            .query::<()>(&mut s.client())
            .expect("SET");
    }
    relay.set_cut(support::Cut::Replies);
    assert_eq!(cmd(c, &["SET", "lock:late", "t", "NX", "PX", ttl]), Value::Nil);
    wait_until("master 2 ran the attempt", || {
        servers[2].get("lock:late").as_deref() == Some("t")
    });
}

/// How many scripts a master ran (`EVAL` and `EVALSHA` calls): an acquisition is plain
/// commands, so after start-up each one more is an undo.
fn scripts_run(server: &RedisServer) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.client())
        .expect("INFO");
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Rule 5a, late: a master that answers after the attempt was decided still has the attempt's
/// write undone, when its reply comes and says it wrote (here with 60 s of TTL left): the
/// reply names the write, so the undo needs no marker and waits for nothing.
#[test]
fn a_late_write_is_undone_when_its_reply_comes() {
    let (servers, relay, proxy) = behind_a_relay();
    let mut c = proxy.client();
    a_refused_attempt_with_a_late_write(&servers, &relay, &mut c, "60000");
    relay.set_cut(support::Cut::None);
    wait_until("the late write was undone", || servers[2].get("lock:late").is_none());
}

/// Rule 5a, exact without a marker: an undo names the write by its token *and* the expiry
/// that write was given. The attempt's key on master 2 expires before its reply comes; the
/// same token is written there again (legacy code writing the same value, a holder re-sending
/// its own token); the late undo must leave that key alone. A compare-by-value undo deletes it.
#[test]
fn a_late_undo_spares_an_equal_value_written_after_its_expiry() {
    let (servers, relay, proxy) = behind_a_relay();
    let mut c = proxy.client();
    a_refused_attempt_with_a_late_write(&servers, &relay, &mut c, "300");
    wait_until("the attempt's key expired on master 2", || {
        servers[2].get("lock:late").is_none()
    });
    redis::cmd("SET")
        .arg("lock:late")
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(60_000)
        .query::<()>(&mut servers[2].client())
        .expect("SET");
    // The proxy's start-up ran its fencing epoch script on every master; one more is the undo.
    let before = scripts_run(&servers[2]);
    relay.set_cut(support::Cut::None);
    wait_until("the late undo ran on master 2", || {
        scripts_run(&servers[2]) == before + 1
    });
    assert_eq!(
        servers[2].get("lock:late").as_deref(),
        Some("t"),
        "the late undo deleted a key its attempt did not write"
    );
}

/// Rules 5a and 13: a holder's lock is changed by nothing but its own commands. The holder
/// of `lock:kept` ("h" on every master; master 2 then loses its copy) re-sends its `SET NX`
/// from a second connection: refused by masters 0 and 1, written on master 2, whose reply is
/// held back. The holder then extends its lock, which extends that copy too (it holds "h").
/// When the re-send's reply comes, its undo finds the key under another expiry: the holder's
/// now, left alone. An undo by value deletes it, and the holder's lock loses a master.
#[test]
fn a_late_undo_leaves_a_key_its_holder_extended_since() {
    let (servers, relay, proxy) = behind_a_relay();
    let (mut holder, mut second) = (proxy.client(), proxy.client());
    assert_eq!(
        cmd(&mut holder, &["SET", "lock:kept", "h", "NX", "PX", "60000"]),
        Value::Okay
    );
    wait_until("every master holds the lock", || {
        holders(&servers, "lock:kept", "h") == 3
    });
    redis::cmd("DEL")
        .arg("lock:kept")
        .query::<i64>(&mut servers[2].client())
        .expect("DEL");
    relay.set_cut(support::Cut::Replies);
    assert_eq!(
        cmd(&mut second, &["SET", "lock:kept", "h", "NX", "PX", "60000"]),
        Value::Nil
    );
    wait_until("master 2 ran the re-send", || {
        servers[2].get("lock:kept").as_deref() == Some("h")
    });
    assert_eq!(cmd(&mut holder, &["PEXPIRE", "lock:kept", "120000"]), Value::Int(1));
    let extended = |s: &RedisServer| {
        redis::cmd("PTTL")
            .arg("lock:kept")
            .query::<i64>(&mut s.client())
            .expect("PTTL")
    };
    wait_until("master 2 ran the extension", || extended(&servers[2]) > 60_000);
    let before = scripts_run(&servers[2]);
    relay.set_cut(support::Cut::None);
    wait_until("the late undo ran on master 2", || {
        scripts_run(&servers[2]) == before + 1
    });
    assert_eq!(
        holders(&servers, "lock:kept", "h"),
        3,
        "the late undo of a re-send deleted the holder's extended key"
    );
}

/// Makes `servers` refuse every write (`OOM`).
fn out_of_memory(servers: &[RedisServer]) {
    for s in servers {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("1")
            .query::<()>(&mut s.client())
            .expect("CONFIG SET");
    }
}

/// Rule 5a: an error reply from a master (here `OOM`) is a failure, never a refusal: the
/// client hears that the service could not decide, and why, not "held by someone else".
#[test]
fn an_error_reply_is_a_failure_not_a_refusal() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    out_of_memory(&servers[..2]);
    let e = error(&mut c, &["SET", "lock:oom", "t", "NX", "PX", "10000"]);
    assert!(e.starts_with("NOQUORUM 1 of 3 masters can vote"), "{e}");
    assert!(e.contains("OOM"), "{e}");
}

/// Rule 4a: a lock reply is true when it is written. A pipelined `SET NX` is granted at once,
/// but its reply waits behind an earlier, slower command of the same connection (a refused
/// acquisition that waits one backend timeout for two paused masters); by then its validity
/// is gone, so it is answered nil and undone. An extension's validity figure is what is left when written.
#[test]
fn a_lock_reply_is_not_written_after_its_validity() {
    let servers = masters(5);
    // drift_factor 0.45: a 1 200 ms lock is valid for at most 656 ms, while its keys live
    // 1 200 ms (a 1 000 ms extension: 548 ms); the refusal ahead of them waits 700 ms for the
    // paused masters.
    let proxy = ProxyProcess::start(
        &urls(&servers),
        "backend_timeout_ms = 700\nprobe_interval_ms = 60000\ndrift_factor = 0.45",
    );
    let mut c = proxy.client();
    assert_eq!(cmd(&mut c, &["SET", "lock:e", "t", "NX", "PX", "1000"]), Value::Okay);
    for s in &servers[..3] {
        s.set("lock:slow", "other");
    }
    servers[3].pause();
    servers[4].pause();
    let sent = Instant::now();
    let (slow, granted, extended): (Value, Value, Value) = redis::pipe()
        .cmd("SET")
        .arg("lock:slow")
        .arg("x")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .cmd("SET")
        .arg("lock:c")
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(1200)
        .cmd("LOCK.EXTEND")
        .arg("lock:e")
        .arg("t")
        .arg(1000)
        .query(&mut c)
        .expect("pipeline");
    let answered = sent.elapsed();
    servers[3].resume();
    servers[4].resume();
    assert_eq!(slow, Value::Nil, "held by a majority");
    assert!(
        answered >= Duration::from_millis(700),
        "the refusal waited {answered:?}"
    );
    assert_eq!(
        granted,
        Value::Nil,
        "an OK written {answered:?} after a 656 ms validity"
    );
    assert_eq!(extended, Value::Int(0), "a validity figure that had run out");
    // The stale grant was undone at once (its keys would live until 1 200 ms).
    wait_until("the stale grant is undone", || holders(&servers, "lock:c", "t") == 0);
    assert!(sent.elapsed() < Duration::from_millis(1150), "undone only by expiry");
}

/// Rule 4a, figures read from a slow master: `LOCK.INFO`'s `validity_ms` and `PTTL` are what
/// is left when the reply is written, counted from when the masters were asked. One master's
/// replies are held back 150 ms. `LOCK.INFO` reads the masters twice (the quorum's PTTLs, then
/// the holder's holds on every master, which waits for the slowest): a figure not reduced by
/// the second read outlived the keys by 149 ms (as written now: 52 ms short of them, the drift
/// allowance). `PTTL`, alone or in `MULTI`/`EXEC`, is the quorum's figure, read from the quick
/// masters before the slow one answered: counted from the read's end, it outlived them.
#[test]
fn figures_read_from_a_slow_master_count_from_the_read() {
    let (servers, relay, proxy) = behind_a_relay();
    let mut c = proxy.client();
    assert_eq!(cmd(&mut c, &["SET", "lock:i", "t", "NX", "PX", "5000"]), Value::Okay);
    relay.set_delay(Duration::from_millis(150));
    let pttl = |s: &RedisServer| -> i64 { redis::cmd("PTTL").arg("lock:i").query(&mut s.client()).expect("PTTL") };
    let validity = |reply: Value| {
        let Value::Array(items) = reply else {
            panic!("LOCK.INFO answered {reply:?}")
        };
        let field = |name: &str| items.chunks(2).find(|kv| kv[0] == bulk(name)).map(|kv| kv[1].clone());
        assert_eq!(field("holder"), Some(bulk("t")));
        match field("validity_ms") {
            Some(Value::Int(ms)) => ms,
            other => panic!("validity_ms: {other:?}"),
        }
    };
    type Ask = Box<dyn Fn(&mut redis::Connection) -> i64>;
    let asked: [(&str, Ask); 2] = [
        (
            "LOCK.INFO",
            Box::new(move |c| validity(cmd(c, &["LOCK.INFO", "lock:i"]))),
        ),
        (
            "PTTL in MULTI/EXEC",
            Box::new(|c| {
                let (ms,): (i64,) = redis::pipe().atomic().cmd("PTTL").arg("lock:i").query(c).expect("EXEC");
                ms
            }),
        ),
    ];
    for (what, ask) in asked {
        let sent = Instant::now();
        let figure = ask(&mut c);
        let answered = Instant::now();
        // The masters' own count, read after the reply: an upper bound of what was left when
        // it was written is the larger of the quick masters' PTTLs plus the time since.
        // Every figure here is whole milliseconds, each cut down by up to 1 ms (a master's PTTL,
        // the proxy's count of the time spent, the test's own reading): 3 ms of rounding are
        // allowed. What the test catches is a figure that outlived its keys by the held-back
        // master's 150 ms.
        let left = pttl(&servers[0]).max(pttl(&servers[1]));
        let bound = left + answered.elapsed().as_millis() as i64 + 3;
        assert!(
            answered - sent >= Duration::from_millis(150),
            "{what}: the reply did not wait for the held-back master"
        );
        assert!(
            figure <= bound,
            "{what} answered {figure} when the keys had at most {bound} ms left"
        );
    }
}

/// Rule 4a, figures queued behind a slower reply: `LOCK.INFO`, `SEM.INFO` (one figure per
/// slot), `PTTL` and `TTL` pipelined behind an acquisition that waits 700 ms for a held lock
/// answer what is left when their replies are written, not when they were figured. Their keys
/// expire at most `ttl` after the grants were answered, and the replies are written no earlier
/// than 700 ms after they were sent. Before the fix `SEM.INFO` answered 9,895 ms where at most
/// 9,300 were left.
#[test]
fn figures_queued_behind_a_wait_are_what_is_left_when_written() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(
        cmd(&mut c, &["SET", "lock:busy", "other", "NX", "PX", "30000"]),
        Value::Okay
    );
    let Value::Int(_) = cmd(&mut c, &["LOCK.ACQUIRE", "lock:q", "t", "10000"]) else {
        panic!("LOCK.ACQUIRE answered no token")
    };
    let Value::Array(_) = cmd(&mut c, &["SEM.ACQUIRE", "sem:q", "t", "2", "10000"]) else {
        panic!("SEM.ACQUIRE answered no permit")
    };
    // One key per command read: a command waits for one in flight on the same key.
    for key in ["lock:p", "lock:t"] {
        assert_eq!(cmd(&mut c, &["SET", key, "t", "NX", "PX", "10000"]), Value::Okay);
    }
    let granted = Instant::now();
    let sent = Instant::now();
    let (waited, lock, sem, pttl, ttl): (Value, Value, Value, i64, i64) = redis::pipe()
        .cmd("LOCK.ACQUIRE")
        .arg("lock:busy")
        .arg("t")
        .arg(10_000)
        .arg("WAIT")
        .arg(700)
        .cmd("LOCK.INFO")
        .arg("lock:q")
        .cmd("SEM.INFO")
        .arg("sem:q")
        .cmd("PTTL")
        .arg("lock:p")
        .cmd("TTL")
        .arg("lock:t")
        .query(&mut c)
        .expect("pipeline");
    assert_eq!(waited, Value::Nil, "the lock is held for 30 s");
    // The keys were written before `granted`; the replies no earlier than `sent` + 700 ms.
    let bound = 10_000 - (sent + Duration::from_millis(700) - granted).as_millis() as i64;
    let field = |reply: &Value, name: &str| match reply {
        Value::Array(items) => items.chunks(2).find(|kv| kv[0] == bulk(name)).map(|kv| kv[1].clone()),
        other => panic!("{name}: {other:?}"),
    };
    let Some(Value::Int(lock_left)) = field(&lock, "validity_ms") else {
        panic!("LOCK.INFO: {lock:?}")
    };
    let Some(Value::Array(by_slot)) = field(&sem, "validity_ms") else {
        panic!("SEM.INFO: {sem:?}")
    };
    let [Value::Int(_slot), Value::Int(sem_left)] = by_slot.as_slice() else {
        panic!("SEM.INFO's validity_ms: {by_slot:?}")
    };
    for (what, left) in [("LOCK.INFO", lock_left), ("SEM.INFO", *sem_left), ("PTTL", pttl)] {
        assert!(
            left <= bound,
            "{what} answered {left} ms, written when at most {bound} ms were left"
        );
    }
    // TTL rounds as Redis does: (ms + 500) / 1000.
    assert!(
        ttl <= (bound + 500) / 1000,
        "TTL answered {ttl} s, written when at most {bound} ms were left"
    );
}

/// Rule 7a: rule 7 judges the reply, not the script's text. Extensions written in styles the
/// text cannot reveal, `SET XX PX`, and `PEXPIRE` inside `MULTI`/`EXEC` count only within
/// the new validity; a 2 ms TTL never has any (its drift allowance alone is 2.02 ms).
#[test]
fn rule_7_judges_every_write_that_leaves_a_ttl() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    // Takes the lock again once the last 2 ms write has expired.
    let take = |c: &mut redis::Connection| {
        let mut got = Value::Nil;
        wait_until("the lock is free again", || {
            got = cmd(c, &["SET", "lock:s", "me", "NX", "PX", "60000"]);
            got == Value::Okay
        });
        got
    };
    assert_eq!(take(&mut c), Value::Okay);
    // The command name in ARGV: the text names no expire.
    let by_argv = "return redis.call(ARGV[1], KEYS[1], ARGV[2])";
    assert_eq!(
        cmd(&mut c, &["EVAL", by_argv, "1", "lock:s", "pexpire", "30000"]),
        Value::Int(1)
    );
    let e = error(&mut c, &["EVAL", by_argv, "1", "lock:s", "pexpire", "2"]);
    assert!(e.contains("withheld"), "{e}");
    // An option built from pieces, and a bulk string for success.
    assert_eq!(take(&mut c), Value::Okay);
    let pieces = "redis.call('set', KEYS[1], ARGV[1], 'P'..'X', ARGV[2]) return 'extended'";
    assert_eq!(
        cmd(&mut c, &["EVAL", pieces, "1", "lock:s", "me", "30000"]),
        bulk("extended")
    );
    let e = error(&mut c, &["EVAL", pieces, "1", "lock:s", "me", "2"]);
    assert!(e.contains("withheld"), "{e}");
    // SET XX PX: nil, Redis's "not written".
    assert_eq!(take(&mut c), Value::Okay);
    assert_eq!(cmd(&mut c, &["SET", "lock:s", "me", "XX", "PX", "30000"]), Value::Okay);
    assert_eq!(cmd(&mut c, &["SET", "lock:s", "me", "XX", "PX", "2"]), Value::Nil);
    // PEXPIRE inside a transaction: 0 at its position.
    assert_eq!(take(&mut c), Value::Okay);
    let exec: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("PEXPIRE")
        .arg("lock:s")
        .arg(2)
        .query(&mut c)
        .expect("MULTI/EXEC");
    assert_eq!(exec, vec![Value::Int(0)]);
    // SET NX inside a transaction is refused when queued: the transaction is aborted.
    let e = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("lock:t")
        .arg("me")
        .arg("NX")
        .arg("PX")
        .arg(1000)
        .query::<Vec<Value>>(&mut c)
        .expect_err("SET NX in MULTI")
        .to_string();
    assert!(e.contains("EXECABORT") || e.contains("cannot be queued"), "{e}");
    assert_eq!(holders(&servers, "lock:t", "me"), 0);
}

/// Rule 8a: a script may not leave a declared key above `max_ttl_ms` (an additive extension
/// here): the key is capped and the extension does not count.
#[test]
fn a_script_cannot_push_a_ttl_above_max_ttl() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(
        &urls(&servers),
        "max_ttl_ms = 10000\ndefault_ttl_ms = 5000\nlegacy_ttl_ms = 5000",
    );
    let mut c = proxy.client();
    assert_eq!(cmd(&mut c, &["SET", "lock:m", "me", "NX", "PX", "8000"]), Value::Okay);
    let additive = "return redis.call('pexpire', KEYS[1], redis.call('pttl', KEYS[1]) + ARGV[1])";
    let e = error(&mut c, &["EVAL", additive, "1", "lock:m", "8000"]);
    assert!(e.contains("max_ttl_ms"), "{e}");
    for s in &servers {
        let ttl: i64 = redis::cmd("PTTL").arg("lock:m").query(&mut s.client()).expect("PTTL");
        assert!((0..=10_000).contains(&ttl), "master left at {ttl} ms");
    }
    // A script writing a declared key without any TTL is capped as well.
    let e = error(
        &mut c,
        &["EVAL", "return redis.call('set', KEYS[1], 'v')", "1", "plain:k"],
    );
    assert!(e.contains("max_ttl_ms"), "{e}");
    let ttl: i64 = redis::cmd("PTTL")
        .arg("plain:k")
        .query(&mut servers[0].client())
        .expect("PTTL");
    assert!((0..=10_000).contains(&ttl), "left at {ttl}");
}

/// Rule 11: the proxy's own keys (fencing counters and epochs) cannot
/// be named by a client, so fencing tokens never go backwards.
#[test]
fn the_proxys_own_keys_are_out_of_reach() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    let token = |c: &mut redis::Connection| -> i64 {
        for _ in 0..50 {
            // The first fenced acquisition of a database may meet a master still being probed.
            match query(c, &["LOCK.ACQUIRE", "lock:f", "t", "10000"]) {
                Ok(Value::Int(t)) => {
                    assert_eq!(cmd(c, &["LOCK.RELEASE", "lock:f", "t"]), Value::Int(1));
                    return t;
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        panic!("no fencing token");
    };
    let first = token(&mut c);
    for args in [
        &["DEL", "redlock-proxy:fence:c:lock:f"][..],
        &["SET", "redlock-proxy:fence:epoch", "x"],
        &["WATCH", "redlock-proxy:fence:c:lock:f"],
        &[
            "EVAL",
            "return redis.call('del', KEYS[1])",
            "1",
            "redlock-proxy:fence:c:lock:f",
        ],
        &["GET", "redlock-proxy:a:{lock:f}lock:f"],
    ] {
        let e = error(&mut c, args);
        assert!(e.contains("reserved"), "{args:?}: {e}");
    }
    assert!(token(&mut c) > first, "tokens went backwards");
}

/// A client's `SELECT` of a database the masters lack gets the masters' error; it does not
/// mark the masters down for everyone else.
#[test]
fn a_missing_database_is_that_databases_problem() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(&["--databases", "8"])).collect();
    let proxy = ProxyProcess::start(&urls(&servers), "databases = 16");
    let mut other = proxy.client();
    let mut c = proxy.client();
    assert_eq!(cmd(&mut c, &["SELECT", "9"]), Value::Okay);
    let e = error(&mut c, &["SET", "lock:db", "t", "NX", "PX", "10000"]);
    assert!(e.contains("DB index is out of range"), "{e}");
    // Twice: the proxy keeps retrying database 9 in the background, and nothing else moves.
    let e = error(&mut c, &["SET", "lock:db", "t", "NX", "PX", "10000"]);
    assert!(e.contains("DB index is out of range"), "{e}");
    assert_eq!(
        cmd(&mut other, &["SET", "lock:db", "t", "NX", "PX", "10000"]),
        Value::Okay
    );
    let Value::Array(lines) = cmd(&mut other, &["PROXY", "BACKENDS"]) else {
        panic!("PROXY BACKENDS");
    };
    for line in lines {
        let Value::BulkString(line) = line else { panic!() };
        let line = String::from_utf8_lossy(&line).into_owned();
        assert!(line.contains("up"), "{line}");
    }
}

/// Scripts Redis 7 runs run through the proxy: a `#!lua` shebang with flags, and `...` at
/// the top level.
#[test]
fn scripts_with_a_shebang_or_varargs_run_as_on_redis() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(cmd(&mut c, &["SET", "lock:v", "me", "NX", "PX", "10000"]), Value::Okay);
    // Extensions (the scripts an earlier proxy wrapped by their text, and broke).
    let shebang = "#!lua\nreturn redis.call('pexpire', KEYS[1], ARGV[1])";
    assert_eq!(cmd(&mut c, &["EVAL", shebang, "1", "lock:v", "20000"]), Value::Int(1));
    let varargs = "return redis.call('pexpire', KEYS[1], ARGV[1]) + select('#', ...)";
    assert_eq!(cmd(&mut c, &["EVAL", varargs, "1", "lock:v", "20000"]), Value::Int(1));
    // A read-only script declared as such.
    let read_only = "#!lua flags=no-writes\nreturn redis.call('get', KEYS[1])";
    assert_eq!(cmd(&mut c, &["EVAL", read_only, "1", "lock:v"]), bulk("me"));
}

/// Rule 7 may withhold a success, never manufacture one. python-redis-lock's scripts answer 0
/// for success and 1 or 2 for failure; releasing a lock that is not held, or extending one
/// that expired, must answer what Redis answers (1), not 0.
#[test]
fn a_scripts_failure_is_never_turned_into_success() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    // In the style of python-redis-lock 4.0.1: KEYS = the lock, its signal list.
    let release = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 1 end \
redis.call('del', KEYS[2]) redis.call('lpush', KEYS[2], 1) redis.call('pexpire', KEYS[2], ARGV[2]) \
redis.call('del', KEYS[1]) return 0";
    let extend = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 1 \
elseif redis.call('ttl', KEYS[1]) == -1 then return 2 \
else redis.call('pexpire', KEYS[1], ARGV[2]) return 0 end";
    let run = |c: &mut redis::Connection, script: &str, token: &str, ms: &str| {
        cmd(c, &["EVAL", script, "2", "lock:p", "lock:p:signal", token, ms])
    };
    assert_eq!(
        run(&mut c, release, "nobody", "1000"),
        Value::Int(1),
        "release of a free lock"
    );
    assert_eq!(
        run(&mut c, extend, "nobody", "5000"),
        Value::Int(1),
        "extend of an expired lock"
    );
    assert_eq!(cmd(&mut c, &["SET", "lock:p", "me", "NX", "PX", "10000"]), Value::Okay);
    assert_eq!(
        run(&mut c, release, "other", "1000"),
        Value::Int(1),
        "release by another token"
    );
    assert_eq!(run(&mut c, extend, "me", "20000"), Value::Int(0), "the holder extends");
    assert_eq!(run(&mut c, release, "me", "1000"), Value::Int(0), "the holder releases");
}

/// A newcomer's fresh masters are quarantined on first sight (`quarantine = "always"`): the
/// client's error says so, and for how long.
#[test]
fn noquorum_says_why_the_masters_cannot_vote() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "quarantine = \"always\"\nmax_ttl_ms = 300000");
    let mut c = proxy.client();
    let e = error(&mut c, &["SET", "lock:n", "t", "NX", "PX", "10000"]);
    assert!(
        e.starts_with(
            "NOQUORUM 0 of 3 masters can vote: 3 quarantined after a (possible) restart, the first votes again in "
        ),
        "{e}"
    );
    assert!(e.ends_with("s; see PROXY BACKENDS"), "{e}");
}

/// Acquisitions queued together on a master share one transaction (one `TIME` for all their
/// `SET`s): each still reads its own `SET`'s result, and an undo still removes exactly the key
/// its own attempt wrote, with the expiry read from the shared clock reading. Half the keys are
/// held on two of three masters by someone else: those attempts are refused, and their write
/// on the first master must be undone; the others are granted and kept.
#[test]
fn acquisitions_sharing_a_transaction_are_each_their_own() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let keys: Vec<String> = (0..64).map(|i| format!("lock:shared:{i}")).collect();
    for s in &servers[1..] {
        for key in keys.iter().skip(1).step_by(2) {
            redis::cmd("SET")
                .arg(key)
                .arg("other")
                .arg("PX")
                .arg(60_000)
                .query::<()>(&mut s.client())
                .expect("SET");
        }
    }
    let exec_calls = |s: &RedisServer| -> (u64, u64) {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut s.client())
            .expect("INFO");
        let calls = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse().expect("calls"))
        };
        (calls("exec"), calls("set"))
    };
    let before = exec_calls(&servers[0]);
    let replies = support::acquire_pipelined(&mut proxy.client(), &keys, "me", 60_000).expect("pipeline");
    let (exec, set) = exec_calls(&servers[0]);
    let (exec, set) = (exec - before.0, set - before.1);
    assert_eq!(set, 64);
    assert!(
        exec < set,
        "the acquisitions did not share transactions: {exec} EXEC for {set} SET"
    );
    for (i, (key, reply)) in keys.iter().zip(&replies).enumerate() {
        if i % 2 == 0 {
            assert_eq!(reply, &Value::Okay, "{key}");
            assert_eq!(holders(&servers, key, "me"), 3, "{key}");
        } else {
            assert_eq!(reply, &Value::Nil, "{key}");
            wait_until("the refused attempt's write is undone", || {
                servers[0].get(key).is_none()
            });
            assert_eq!(
                holders(&servers, key, "other"),
                2,
                "{key}: another acquisition's key was touched"
            );
        }
    }
    // An `OOM` while queuing aborts the whole shared transaction: every member fails, none is
    // read as a refusal or a grant.
    out_of_memory(&servers[..2]);
    let keys: Vec<String> = (0..16).map(|i| format!("lock:oom:{i}")).collect();
    let failures = support::acquire_pipelined(&mut proxy.client(), &keys, "me", 60_000)
        .expect_err("an aborted transaction is no answer")
        .to_string();
    for i in 0..16 {
        let failure = format!("(Index {i}, error: \"NOQUORUM\": 1 of 3 masters can vote: 2 answered an error (OOM");
        assert!(failures.contains(&failure), "lock:oom:{i}: {failures}");
    }
}

/// Rule 5a for a write that shared a transaction: its expiry is known only between the clock
/// readings before and after the transaction's writes (a master descheduled in the middle of a
/// long one runs its first `SET` more than a millisecond before the last `TIME`: an undo that
/// named the write by the later reading alone missed it, once in CI, and left the key to its
/// TTL). On a real master: the undo between the two readings removes the write; one by the
/// later reading alone does not; neither removes a write whose expiry lies outside them.
#[test]
fn an_undo_between_two_clock_readings_removes_exactly_its_write() {
    let server = RedisServer::start();
    let mut c = server.client();
    let undo = |c: &mut redis::Connection, args: &[i64]| -> i64 {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(redlock_proxy::lua::own::UNDO).arg(1).arg("lock:u").arg("me");
        for a in args {
            cmd.arg(*a);
        }
        cmd.query(c).expect("UNDO")
    };
    let write = |c: &mut redis::Connection| -> i64 {
        redis::cmd("SET")
            .arg("lock:u")
            .arg("me")
            .arg("PX")
            .arg(60_000)
            .query::<()>(c)
            .expect("SET");
        redis::cmd("PEXPIRETIME").arg("lock:u").query(c).expect("PEXPIRETIME")
    };
    let expiry = write(&mut c);
    // The write ran 3 ms before the later reading: that reading alone misses it.
    assert_eq!(undo(&mut c, &[expiry + 3]), 0, "named by the later reading alone");
    // Readings that do not bracket it: kept.
    assert_eq!(undo(&mut c, &[expiry - 5, expiry - 10]), 0, "readings before the write");
    assert_eq!(undo(&mut c, &[expiry + 10, expiry + 5]), 0, "readings after the write");
    assert_eq!(server.get("lock:u").as_deref(), Some("me"));
    // Bracketed by the two readings: removed.
    assert_eq!(undo(&mut c, &[expiry + 3, expiry - 2]), 1);
    assert_eq!(server.get("lock:u"), None);
    // One reading, as a lone acquisition has: within the millisecond either side, as before.
    let expiry = write(&mut c);
    assert_eq!(undo(&mut c, &[expiry + 1]), 1);
}
