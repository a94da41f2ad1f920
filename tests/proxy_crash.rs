//! A proxy killed (`kill -9`) under load, on real masters shared with a second proxy.
//!
//! Both proxies serve contending clients (`SET NX PX`, `LOCK.ACQUIRE`); p0 also keeps session
//! locks alive (`SET key token NX` without a TTL, held longer than their TTL) for which p1 has
//! waiters queued (`LOCK.ACQUIRE ... WAIT`), and the other way round for one more lock. Then p0
//! is killed. p1 must keep serving; p0's session locks, extended by nobody now, expire within
//! their fallback TTL (`default_ttl_ms`) and are then granted to p1's waiters; and the checker
//! (`tests/sim/check.rs`) must find no two grants overlapping and no fencing token regressing.
//!
//! What a holder believes: a session holder confirms its lock with `LOCK.INFO` every 200 ms
//! and believes it for the validity the proxy reported, counted from when it asked (docs/waiting-and-sessions.md:
//! "Ask (`LOCK.INFO`) before acting"); when its proxy dies, its next question fails and it stops
//! at the end of the validity it was last told. A waiter believes its grant for the validity
//! `LOCK.INFO` reports just after it.
//!
//! The control, `control_a_session_holder_that_trusts_its_lock_past_its_proxy_overlaps`:
//! the same crash, with session holders that believe their lock until they release it, as a
//! RESP2 client of a lock without a TTL does (redis-py's `Lock(timeout=None)`: it never asks,
//! so it cannot learn of the loss; docs/waiting-and-sessions.md, "Session locks"). After the crash nobody extends
//! their locks, p1's waiters are granted them within the TTL, and the holders, still at work,
//! overlap them: the checker must say so. A configuration-level control (the quarantine off, a
//! proxy over one master) would show an overlap a crash does not cause; the hazard a crash
//! brings is a lock that outlives its proxy while its holder works on, and the protection
//! against it is believing only what a live proxy confirms.

mod support;

#[path = "sim/check.rs"]
#[allow(
    dead_code,
    reason = "the simulation's checker: its overlap sweep and fencing property"
)]
mod check;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use support::contend::{Believed, Clients, Ctx, Fenced, Record, connect, validity_end};
use support::{ProxyProcess, fencing_ready, masters, urls};

/// The session locks' fallback TTL: what a crash costs them.
const SESSION_TTL_MS: u64 = 1500;
/// How long a session holder keeps its lock: well past its TTL (the proxy extends it), and past
/// the crash, which comes once each has been held longer than its TTL.
const HOLD: Duration = Duration::from_millis(4500);
/// How often a confirming session holder asks `LOCK.INFO`.
const CONFIRM_EVERY: Duration = Duration::from_millis(200);
/// The waiters' TTL and how long they wait.
const WAITER_TTL_MS: u64 = 1000;
const WAIT_MS: u64 = 8000;
/// p0's session locks (p1 waits for them), and p1's (p0 waits for it).
const P0_SESSIONS: [&str; 3] = ["session:0", "session:1", "session:2"];
const P1_SESSION: &str = "session:3";
const CONFIG: &str = "backend_timeout_ms = 200\nmax_ttl_ms = 5000\nlegacy_ttl_ms = 1500\ndefault_ttl_ms = 1500";

/// `LOCK.INFO key`: the validity left for `token`, if a quorum holds it; `Err` when the
/// connection failed.
fn confirmed(conn: &mut redis::Connection, key: &str, token: &str) -> Result<Option<Duration>, ()> {
    let reply: redis::RedisResult<Value> = redis::cmd("LOCK.INFO").arg(key).query(conn);
    let items = match reply {
        Ok(Value::Array(items)) => items,
        Ok(_) => return Ok(None),
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => return Err(()),
        Err(_) => return Ok(None),
    };
    let field = |name: &str| {
        items
            .chunks(2)
            .find(|kv| kv[0] == Value::BulkString(name.as_bytes().to_vec()))
            .map(|kv| kv[1].clone())
    };
    match (field("holder"), field("validity_ms")) {
        (Some(Value::BulkString(holder)), Some(Value::Int(ms))) if holder == token.as_bytes() && ms > 0 => {
            Ok(Some(Duration::from_millis(ms as u64)))
        }
        _ => Ok(None),
    }
}

/// Since when each session lock is held by its holder (`None`: not held), for the test to know
/// when to crash the proxy.
type Holding = Arc<Mutex<HashMap<String, Option<Duration>>>>;

/// A session holder: takes `key` with `SET key token NX` (no TTL: a session lock, kept alive by
/// the proxy while the connection lives), holds it for [`HOLD`], releases it, again. When
/// `confirming`, it asks `LOCK.INFO` every [`CONFIRM_EVERY`] and believes the lock only for the
/// validity it was last told, counted from when it asked; otherwise it believes it until it
/// releases it.
fn session_holder(ctx: &Ctx, url: &str, proxy: usize, key: &str, confirming: bool, holding: &Holding) {
    let name = format!("s{proxy}-{key}");
    let mut conn = connect(url, Duration::from_secs(3)).expect("session holder connection");
    let mut i = 0;
    while !ctx.stopped() {
        i += 1;
        let token = format!("{name}-{i}");
        let sent = ctx.now();
        let reply: redis::RedisResult<Value> = redis::cmd("SET").arg(key).arg(&token).arg("NX").query(&mut conn);
        ctx.count(proxy, &reply);
        match reply {
            Ok(Value::Okay) => {}
            Ok(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(_) => {
                // Its proxy is gone (or the reply timed out): connect again, or stop.
                std::thread::sleep(Duration::from_millis(50));
                match connect(url, Duration::from_secs(3)) {
                    Ok(c) => conn = c,
                    Err(_) => return,
                }
                continue;
            }
        }
        let from = ctx.now();
        let mut until = validity_end(sent, SESSION_TTL_MS);
        holding.lock().expect("holding").insert(key.to_owned(), Some(from));
        let mut broken = false;
        while ctx.now() < from + HOLD && !ctx.stopped() {
            std::thread::sleep(CONFIRM_EVERY);
            if !confirming {
                continue;
            }
            let asked = ctx.now();
            match confirmed(&mut conn, key, &token) {
                // Told in time: it believes on, to the end of what it was told.
                Ok(Some(validity)) if asked < until => until = until.max(asked + validity),
                // Told too late, or not held: it stopped believing at `until`.
                Ok(_) => break,
                Err(()) => {
                    broken = true;
                    break;
                }
            }
            if ctx.now() >= until {
                break;
            }
        }
        let release_at = ctx.now();
        let released: redis::RedisResult<Value> = redis::cmd("EVAL")
            .arg(support::RELEASE)
            .arg(1)
            .arg(key)
            .arg(&token)
            .query(&mut conn);
        broken |= released.is_err_and(|e| e.is_io_error() || e.is_timeout() || e.is_connection_dropped());
        holding.lock().expect("holding").insert(key.to_owned(), None);
        ctx.held(Believed {
            key: key.to_owned(),
            token,
            proxy,
            sent,
            from,
            until: if confirming { release_at.min(until) } else { release_at },
        });
        if broken {
            match connect(url, Duration::from_secs(3)) {
                Ok(c) => conn = c,
                Err(_) => return,
            }
        }
    }
}

/// A waiter: `LOCK.ACQUIRE key token ttl WAIT ms`, again and again; a grant is believed for the
/// validity `LOCK.INFO` confirms just after it, held 100 ms and released. Its grants (when
/// the reply came) also go to `grants`, for the time to recover.
fn waiter(ctx: &Ctx, url: &str, proxy: usize, key: &str, grants: &Arc<Mutex<Vec<(String, Duration)>>>) {
    let name = format!("w{proxy}-{key}");
    let Ok(mut conn) = connect(url, Duration::from_millis(WAIT_MS + 3000)) else {
        return;
    };
    let mut i = 0;
    while !ctx.stopped() {
        i += 1;
        let token = format!("{name}-{i}");
        let sent = ctx.now();
        let reply: redis::RedisResult<Value> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&token)
            .arg(WAITER_TTL_MS)
            .arg("WAIT")
            .arg(WAIT_MS)
            .query(&mut conn);
        ctx.count(proxy, &reply);
        let fence = match reply {
            Ok(Value::Int(fence)) => fence,
            Ok(_) => continue,
            Err(_) => {
                // Its proxy is gone: it stops.
                std::thread::sleep(Duration::from_millis(50));
                match connect(url, Duration::from_millis(WAIT_MS + 3000)) {
                    Ok(c) => conn = c,
                    Err(_) => return,
                }
                continue;
            }
        };
        let from = ctx.now();
        grants.lock().expect("grants").push((key.to_owned(), from));
        ctx.fenced(Fenced {
            key: key.to_owned(),
            token: fence as u64,
            holder: token.clone(),
            sent,
            answered: from,
        });
        let asked = ctx.now();
        let until = match confirmed(&mut conn, key, &token) {
            Ok(Some(validity)) => asked + validity,
            _ => asked,
        };
        std::thread::sleep(Duration::from_millis(100).min(until.saturating_sub(ctx.now())));
        let release_at = ctx.now();
        let _: redis::RedisResult<Value> = redis::cmd("LOCK.RELEASE").arg(key).arg(&token).query(&mut conn);
        ctx.held(Believed {
            key: key.to_owned(),
            token,
            proxy,
            sent,
            from,
            until: release_at.min(until),
        });
    }
}

/// What a crash run came to.
struct Crash {
    record: Record,
    /// For each of p0's session locks, how long after the kill p1's waiter was granted it.
    recovered: Vec<(String, Duration)>,
    /// When the kill happened, on the clients' clock.
    killed_at: Duration,
    /// How long each session lock had been held then.
    held_at_kill: Vec<Option<Duration>>,
    /// p1's grants of locks asked for after the kill, and over how long.
    p1_after: usize,
    after: Duration,
}

/// Runs the load, kills p0 once its session locks are held and p1's waiters queue for them,
/// and runs on until p1's waiters got every one of them (and p1 served [`FLOOR`] more grants).
fn crash(confirming: bool) -> Crash {
    let servers = masters(3);
    let backends = urls(&servers);
    let mut proxies = [
        ProxyProcess::start(&backends, CONFIG),
        ProxyProcess::start(&backends, CONFIG),
    ];
    for p in &proxies {
        fencing_ready(p);
    }
    let (url0, url1) = (proxies[0].url(), proxies[1].url());
    let mut clients = Clients::new();
    let ctx = clients.ctx().clone();
    for (p, url) in [&url0, &url1].into_iter().enumerate() {
        for n in 0..2 {
            clients.contender(
                url.clone(),
                p,
                format!("c{n}p{p}"),
                &["lock:0", "lock:1", "lock:2"],
                n == 1,
            );
        }
    }
    let holding: Holding = Arc::default();
    for key in P0_SESSIONS {
        let (url, holding) = (url0.clone(), holding.clone());
        clients.spawn(move |ctx| session_holder(&ctx, &url, 0, key, confirming, &holding));
    }
    let (url, held) = (url1.clone(), holding.clone());
    clients.spawn(move |ctx| session_holder(&ctx, &url, 1, P1_SESSION, true, &held));
    // p0's session locks held (and p1's), then the waiters.
    let held_for = |now: Duration| -> Vec<Option<Duration>> {
        let h = holding.lock().expect("holding");
        P0_SESSIONS
            .iter()
            .chain([&P1_SESSION])
            .map(|k| h.get(*k).copied().flatten().map(|from| now - from))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while held_for(ctx.now()).contains(&None) {
        assert!(
            Instant::now() < deadline,
            "the session holders never all held their locks"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let grants: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
    for key in P0_SESSIONS {
        let (url, grants) = (url1.clone(), grants.clone());
        clients.spawn(move |ctx| waiter(&ctx, &url, 1, key, &grants));
    }
    let (url, waited) = (url0.clone(), grants.clone());
    clients.spawn(move |ctx| waiter(&ctx, &url, 0, P1_SESSION, &waited));
    let (mut watch0, mut watch1) = (proxies[0].client(), proxies[1].client());
    let waiting = |c: &mut redis::Connection, key: &str| {
        let reply: redis::RedisResult<Value> = redis::cmd("LOCK.INFO").arg(key).query(c);
        let Ok(Value::Array(items)) = reply else { return false };
        items
            .chunks(2)
            .any(|kv| kv[0] == Value::BulkString(b"waiting".to_vec()) && kv[1] == Value::Int(1))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(P0_SESSIONS.iter().all(|k| waiting(&mut watch1, k)) && waiting(&mut watch0, P1_SESSION)) {
        assert!(Instant::now() < deadline, "the waiters never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The crash comes once each session lock has been kept alive past its TTL.
    let past_ttl = Duration::from_millis(SESSION_TTL_MS + 200);
    while !held_for(ctx.now()).iter().all(|h| h.is_some_and(|h| h > past_ttl)) {
        let held = held_for(ctx.now());
        assert!(
            !held.contains(&None),
            "a session holder let go before the crash (held for {held:?}; each holds {HOLD:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let held_at_kill = held_for(ctx.now());
    // The crash.
    kill9(proxies[0].pid());
    let killed_at = ctx.now();
    let recovered = |grants: &[(String, Duration)]| -> Vec<(String, Duration)> {
        P0_SESSIONS
            .iter()
            .filter_map(|k| {
                grants
                    .iter()
                    .filter(|(key, at)| key == k && *at > killed_at)
                    .map(|(_, at)| (k.to_string(), *at - killed_at))
                    .min_by_key(|(_, d)| *d)
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let after = ctx.now() - killed_at;
        let p1_after = ctx.with_record(|r| r.granted_since(1, killed_at));
        let done = recovered(&grants.lock().expect("grants")).len() == P0_SESSIONS.len();
        if done && p1_after >= FLOOR && after >= Duration::from_millis(1500) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the crash: p1's waiters got {:?} of p0's session locks, p1 granted {p1_after} locks",
            recovered(&grants.lock().expect("grants"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = ctx.now() - killed_at;
    let p1_after = ctx.with_record(|r| r.granted_since(1, killed_at));
    let recovered = recovered(&grants.lock().expect("grants"));
    let record = clients.stop();
    proxies[1].terminate();
    Crash {
        record,
        recovered,
        killed_at,
        held_at_kill,
        p1_after,
        after,
    }
}

/// p1 must serve at least this many grants asked for after the crash.
const FLOOR: usize = 10;

/// `kill -9 pid`.
fn kill9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
}

/// The checker's verdict, with the figures printed.
fn verdict(test: &str, crash: &Crash) -> (Vec<String>, Vec<String>) {
    let mut history = check::History::default();
    for h in &crash.record.held {
        history.grant(check::Grant {
            key: h.key.clone(),
            token: h.token.clone(),
            proxy: h.proxy,
            from: h.from,
            until: h.until,
        });
    }
    for f in &crash.record.fences {
        history.fence(check::Fence {
            key: f.key.clone(),
            token: f.token,
            holder: f.holder.clone(),
            sent: f.sent,
            answered: f.answered,
        });
    }
    let (overlaps, regressions) = (history.overlaps(), history.fence_regressions());
    let sessions = crash
        .record
        .held
        .iter()
        .filter(|h| h.key.starts_with("session:"))
        .count();
    println!(
        "{test}: {} grants checked ({sessions} of session locks and their waiters, {} fencing tokens); \
         1 proxy killed (kill -9) at {:.2} s; {} violations, {} token regressions",
        history.len(),
        history.fences(),
        crash.killed_at.as_secs_f64(),
        overlaps.len(),
        regressions.len()
    );
    let recovered: Vec<String> = crash
        .recovered
        .iter()
        .map(|(k, d)| format!("{k} {} ms", d.as_millis()))
        .collect();
    let held: Vec<String> = crash
        .held_at_kill
        .iter()
        .map(|h| h.map_or("-".into(), |h| format!("{} ms", h.as_millis())))
        .collect();
    println!(
        "  session locks held at the kill for {} (kept alive past their {SESSION_TTL_MS} ms TTL); p0's granted to \
         p1's waiters after the kill: {}",
        held.join(", "),
        recovered.join(", ")
    );
    println!(
        "  p1 granted {} locks asked for in the {:.1} s after the kill",
        crash.p1_after,
        crash.after.as_secs_f64()
    );
    for (p, t) in crash.record.tallies.iter().enumerate() {
        println!(
            "  requests through p{p}: {} ({} granted, {} refused, {} NOQUORUM, {} errors)",
            t.attempts, t.granted, t.refused, t.noquorum, t.errors
        );
    }
    for o in overlaps.iter().take(5) {
        println!("  OVERLAP {o}");
    }
    (overlaps, regressions)
}

#[test]
fn a_killed_proxys_session_locks_expire_and_pass_to_the_other_proxys_waiters() {
    let crash = crash(true);
    let (overlaps, regressions) = verdict(
        "a_killed_proxys_session_locks_expire_and_pass_to_the_other_proxys_waiters",
        &crash,
    );
    for (key, after) in &crash.recovered {
        assert!(
            *after <= Duration::from_millis(SESSION_TTL_MS + 1000),
            "{key} was granted {after:?} after the crash: later than its TTL allows"
        );
    }
    assert!(crash.p1_after >= FLOOR, "p1 stopped serving");
    assert!(
        overlaps.is_empty(),
        "overlapping grants: {:?}",
        &overlaps[..overlaps.len().min(3)]
    );
    assert!(regressions.is_empty(), "fencing tokens regressed: {regressions:?}");
}

/// The control (see the file's comment): holders that trust their session lock until they
/// release it, across their proxy's crash.
#[test]
fn control_a_session_holder_that_trusts_its_lock_past_its_proxy_overlaps() {
    let crash = crash(false);
    let (overlaps, _) = verdict(
        "control_a_session_holder_that_trusts_its_lock_past_its_proxy_overlaps",
        &crash,
    );
    assert!(
        overlaps
            .iter()
            .any(|o| o.contains("session:") && o.contains("proxy 0") && o.contains("proxy 1")),
        "the checker found no waiter's grant overlapping a trusting holder's: {overlaps:?}"
    );
}
