//! Read-write locks on real masters (`RWLOCK.*`, docs/commands.md "Read-write locks"): many
//! readers at once and a writer refused, a writer and readers refused, a token holding the
//! lock in one mode refused a second hold, releases waking waiters without polling, a waiting
//! writer granted despite a continuous stream of readers, `KEEPALIVE` holds outliving their
//! TTL and freed by their connection's end, fencing tokens rising across read and write
//! grants; and the checker: never a writer's validity overlapping any other holder's, readers
//! overlapping each other, while masters are killed, paused and restarted under two proxies,
//! with the checker shown able to fail (the same grants judged as writers, and a writer that
//! ignores readers played over a majority).

mod support;

#[path = "sim/check.rs"]
#[allow(dead_code, reason = "the simulation's checker; this test uses its fencing property")]
mod check;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use support::{
    ProxyProcess, acquisition_rounds, fencing_ready, int, masters, proxy_with_metrics, query, recipes, until_rounds,
    urls,
};

/// A master's late reply on a loaded machine must not decide the tests below: they are about
/// holds, waits and sessions, not timeouts (the fault test keeps the default).
const CONFIG: &str = "backend_timeout_ms = 500";

/// `RWLOCK.READ` (`READ`) or `RWLOCK.WRITE` (`WRITE`) with `args`: the fencing token,
/// `Ok(None)` when refused, `Err` with the error the proxy answered.
fn take(c: &mut redis::Connection, mode: &str, args: &[&str]) -> Result<Option<u64>, String> {
    let name = format!("RWLOCK.{mode}");
    let mut all = vec![name.as_str()];
    all.extend_from_slice(args);
    match query(c, &all) {
        Ok(Value::Int(token)) => Ok(Some(token as u64)),
        Ok(Value::Nil) => Ok(None),
        Ok(other) => panic!("{name} answered {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

fn read(c: &mut redis::Connection, args: &[&str]) -> Result<Option<u64>, String> {
    take(c, "READ", args)
}

fn write(c: &mut redis::Connection, args: &[&str]) -> Result<Option<u64>, String> {
    take(c, "WRITE", args)
}

/// `RWLOCK.INFO key` as a map.
fn info(c: &mut redis::Connection, key: &str) -> HashMap<String, Value> {
    recipes::info(c, "RWLOCK.INFO", key)
}

/// The readers `RWLOCK.INFO` shows, sorted.
fn readers(c: &mut redis::Connection, key: &str) -> Vec<String> {
    let Value::Array(tokens) = &info(c, key)["readers"] else {
        panic!("readers");
    };
    let mut tokens: Vec<String> = tokens
        .iter()
        .map(|t| match t {
            Value::BulkString(t) => String::from_utf8_lossy(t).into_owned(),
            other => panic!("reader {other:?}"),
        })
        .collect();
    tokens.sort();
    tokens
}

/// Waits until `RWLOCK.INFO key`'s `field` is `value` on the proxy `c` talks to.
fn until_info(c: &mut redis::Connection, key: &str, field: &str, value: Value) {
    recipes::until_info(c, "RWLOCK.INFO", key, field, value);
}

#[test]
fn readers_share_a_writer_excludes_and_a_token_holds_once() {
    let servers = masters(3);
    let backends = urls(&servers);
    let (a, b) = (
        ProxyProcess::start(&backends, CONFIG),
        ProxyProcess::start(&backends, CONFIG),
    );
    fencing_ready(&a);
    let (mut c, mut other) = (a.client(), b.client());
    let mut last = 0;
    // Many readers at once, through either proxy; each grant's token above the last.
    for (i, token) in ["r1", "r2", "r3"].into_iter().enumerate() {
        let proxy = if i % 2 == 0 { &mut c } else { &mut other };
        let fence = read(proxy, &["rw:a", token, "30000"])
            .expect("no error")
            .unwrap_or_else(|| panic!("{token}: readers share"));
        assert!(fence > last, "{fence} after {last}");
        last = fence;
    }
    assert_eq!(readers(&mut other, "rw:a"), ["r1", "r2", "r3"]);
    assert_eq!(info(&mut c, "rw:a")["writer"], Value::Nil);
    // A writer is refused while any reader holds, through either proxy.
    assert_eq!(write(&mut c, &["rw:a", "w1", "30000"]), Ok(None));
    assert_eq!(write(&mut other, &["rw:a", "w1", "30000"]), Ok(None));
    // A reader asking to write would wait for itself: an error that says so, not a hold.
    let upgrade = write(&mut other, &["rw:a", "r2", "30000"]).unwrap_err();
    assert!(
        upgrade.contains("already holds a read lock") && upgrade.contains("not upgraded"),
        "{upgrade}"
    );
    let twice = read(&mut c, &["rw:a", "r1", "30000"]).unwrap_err();
    assert!(twice.contains("already holds a read lock"), "{twice}");
    // Extended and released as locks are, through either proxy.
    assert!(int(&mut c, &["RWLOCK.EXTEND", "rw:a", "r2", "30000"]) > 29_000);
    assert_eq!(int(&mut c, &["RWLOCK.EXTEND", "rw:a", "nobody", "30000"]), 0);
    for token in ["r1", "r2", "r3"] {
        assert_eq!(int(&mut other, &["RWLOCK.RELEASE", "rw:a", token]), 1, "{token}");
    }
    assert_eq!(int(&mut other, &["RWLOCK.RELEASE", "rw:a", "r1"]), 0, "released once");
    // No reader left: the writer is granted, above every reader's token.
    let fence = write(&mut c, &["rw:a", "w1", "30000"]).unwrap().expect("the writer");
    assert!(fence > last, "the writer's token {fence} above the readers' {last}");
    last = fence;
    let shown = info(&mut other, "rw:a");
    assert_eq!(shown["writer"], Value::BulkString(b"w1".to_vec()));
    assert_eq!(shown["fencing_token"], Value::Int(fence as i64));
    // A writer holds: readers and other writers are refused, through either proxy.
    assert_eq!(read(&mut c, &["rw:a", "r4", "30000"]), Ok(None));
    assert_eq!(read(&mut other, &["rw:a", "r4", "30000"]), Ok(None));
    assert_eq!(write(&mut other, &["rw:a", "w2", "30000"]), Ok(None));
    let downgrade = read(&mut other, &["rw:a", "w1", "30000"]).unwrap_err();
    assert!(downgrade.contains("already holds a write lock"), "{downgrade}");
    assert!(int(&mut other, &["RWLOCK.EXTEND", "rw:a", "w1", "30000"]) > 29_000);
    assert_eq!(int(&mut other, &["RWLOCK.RELEASE", "rw:a", "w1"]), 1);
    // Tokens rise across read and write grants, whichever proxy grants them.
    for i in 0..20 {
        let proxy = if i % 2 == 0 { &mut c } else { &mut other };
        let token = format!("t{i}");
        let mode = if i % 3 == 0 { "WRITE" } else { "READ" };
        let fence = take(proxy, mode, &["rw:a", &token, "30000"]).unwrap().expect("free");
        assert!(fence > last, "{mode} {fence} after {last}");
        last = fence;
        assert_eq!(int(proxy, &["RWLOCK.RELEASE", "rw:a", &token]), 1);
    }
    let free = info(&mut c, "rw:a");
    assert_eq!(
        (free["writer"].clone(), free["readers"].clone()),
        (Value::Nil, Value::Array(vec![]))
    );
    // The lock's keys are the proxy's own: no client names them (rule 11).
    let reserved = query(&mut c, &["DEL", "redlock-proxy:rw:{rw:a}:rw:a:w"]).unwrap_err();
    assert!(reserved.to_string().contains("reserved"), "{reserved}");
    // Every key of the lock on the masters carries a TTL at most the longest asked (8a), but
    // the fencing counter (never expiring, as every lock's).
    for server in &servers {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("redlock-proxy:rw:*")
            .query(&mut server.client())
            .expect("KEYS");
        for key in keys {
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut server.client()).expect("PTTL");
            assert!((0..=30_000).contains(&pttl) || pttl == -2, "{key}: {pttl}");
        }
    }
}

#[test]
fn releases_wake_waiters_without_polling() {
    let servers = masters(3);
    let backends = urls(&servers);
    let ((a, metrics_a), (b, metrics_b)) = (
        proxy_with_metrics(&backends, CONFIG),
        proxy_with_metrics(&backends, CONFIG),
    );
    fencing_ready(&a);
    fencing_ready(&b);
    let mut holder = a.client();
    assert!(write(&mut holder, &["rw:w", "w", "30000"]).unwrap().is_some());
    // Two readers waiting, one at each proxy, the writer's TTL 30 s.
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for (proxy, metrics, token) in [(&b, metrics_b, "rb"), (&a, metrics_a, "ra")] {
        let rounds = acquisition_rounds(metrics);
        let mut c = proxy.client();
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let reply = read(&mut c, &["rw:w", token, "30000", "WAIT", "20000"]);
            tx.send((token, reply, Instant::now())).expect("send");
        }));
        until_info(&mut proxy.client(), "rw:w", "waiting", Value::Int(1));
        // Its first try (refused) is over on every master before the next step: `INFO` shows
        // it waiting from its enqueueing, before that try is sent.
        until_rounds(metrics, rounds + 1);
    }
    // Waiting costs the masters nothing: no polling while the writer holds.
    let before = recipes::script_calls(&servers);
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        recipes::script_calls(&servers),
        before,
        "a waiting reader polled the masters"
    );
    let released = Instant::now();
    assert_eq!(int(&mut b.client(), &["RWLOCK.RELEASE", "rw:w", "w"]), 1);
    let mut woken = Vec::new();
    for _ in 0..2 {
        let (waiter, reply, at) = rx.recv_timeout(Duration::from_secs(5)).expect("a reader woken");
        assert!(matches!(reply, Ok(Some(_))), "{waiter}: {reply:?}");
        assert!(
            at - released < Duration::from_secs(3),
            "woken by the release, not a TTL"
        );
        woken.push(waiter);
    }
    woken.sort_unstable();
    assert_eq!(woken, ["ra", "rb"], "one release, both readers in");
    for t in threads {
        t.join().expect("waiter");
    }
    // A writer waiting for the two readers is granted at the second release.
    let mut c = b.client();
    let waiter = thread::spawn(move || {
        let reply = write(&mut c, &["rw:w", "w2", "30000", "WAIT", "20000"]);
        (reply, Instant::now())
    });
    until_info(&mut b.client(), "rw:w", "writer_waiting", Value::Int(1));
    // Its intent turns new readers away, through any proxy.
    assert_eq!(read(&mut a.client(), &["rw:w", "late", "30000"]), Ok(None));
    assert_eq!(int(&mut a.client(), &["RWLOCK.RELEASE", "rw:w", "ra"]), 1);
    let released = Instant::now();
    assert_eq!(int(&mut b.client(), &["RWLOCK.RELEASE", "rw:w", "rb"]), 1);
    let (reply, at) = waiter.join().expect("writer");
    assert!(matches!(reply, Ok(Some(_))), "{reply:?}");
    assert!(
        at - released < Duration::from_secs(3),
        "woken by the release, not a TTL"
    );
    let shown = info(&mut a.client(), "rw:w");
    assert_eq!(
        (shown["writer"].clone(), shown["writer_waiting"].clone()),
        (Value::BulkString(b"w2".to_vec()), Value::Int(0))
    );
}

#[test]
fn a_waiting_writer_is_granted_despite_a_stream_of_readers() {
    let servers = masters(3);
    let backends = urls(&servers);
    let proxies = [
        ProxyProcess::start(&backends, CONFIG),
        ProxyProcess::start(&backends, CONFIG),
    ];
    fencing_ready(&proxies[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let (granted, overlapping) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let holding = Arc::new(AtomicUsize::new(0));
    // Six readers, each holding 150 ms and asking again at once: some reader always holds.
    let streams: Vec<_> = (0..6)
        .map(|n| {
            let mut c = proxies[n % 2].client();
            let (stop, granted, overlapping, holding) =
                (stop.clone(), granted.clone(), overlapping.clone(), holding.clone());
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(25 * n as u64));
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let token = format!("r{n}-{i}");
                    if let Ok(Some(_)) = read(&mut c, &["rw:s", &token, "5000"]) {
                        granted.fetch_add(1, Ordering::Relaxed);
                        if holding.fetch_add(1, Ordering::Relaxed) > 0 {
                            overlapping.fetch_add(1, Ordering::Relaxed);
                        }
                        thread::sleep(Duration::from_millis(150));
                        holding.fetch_sub(1, Ordering::Relaxed);
                        let _ = query(&mut c, &["RWLOCK.RELEASE", "rw:s", &token]);
                    } else {
                        thread::sleep(Duration::from_millis(5));
                    }
                }
            })
        })
        .collect();
    let streaming = Instant::now();
    while granted.load(Ordering::Relaxed) < 12 {
        assert!(
            streaming.elapsed() < Duration::from_secs(10),
            "the readers do not stream"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let before = granted.load(Ordering::Relaxed);
    let mut c = proxies[1].client();
    let started = Instant::now();
    let reply = write(&mut c, &["rw:s", "writer", "5000", "WAIT", "10000"]);
    let waited = started.elapsed();
    let readers_meanwhile = granted.load(Ordering::Relaxed) - before;
    assert!(
        matches!(reply, Ok(Some(_))),
        "the writer starved: {reply:?} after {waited:?}"
    );
    // Readers that held drain (150 ms each); new ones are turned away by the intent.
    assert!(waited < Duration::from_secs(2), "granted only after {waited:?}");
    assert_eq!(
        readers(&mut c, "rw:s"),
        Vec::<String>::new(),
        "no reader with the writer"
    );
    assert_eq!(int(&mut c, &["RWLOCK.RELEASE", "rw:s", "writer"]), 1);
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for r in streams {
        r.join().expect("reader");
    }
    println!(
        "writer granted after {waited:?}, {readers_meanwhile} reads granted meanwhile, {} overlapping reads in all",
        overlapping.load(Ordering::Relaxed)
    );
    assert!(overlapping.load(Ordering::Relaxed) > 0, "readers shared the lock");
}

#[test]
fn keepalive_holds_outlive_their_ttl_and_their_connection_frees_them() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    let mut c = proxy.client();
    // Two readers kept alive by one connection (each its own session hold).
    for token in ["k1", "k2"] {
        assert!(
            read(&mut holder, &["rw:k", token, "2000", "KEEPALIVE"])
                .unwrap()
                .is_some()
        );
    }
    // One and a half TTLs later both still hold, kept alive by the proxy.
    thread::sleep(Duration::from_millis(3000));
    assert_eq!(readers(&mut c, "rw:k"), ["k1", "k2"]);
    assert_eq!(write(&mut c, &["rw:k", "w", "2000"]), Ok(None));
    // The holder releases one itself: its keeping ends silently, the other stays.
    assert_eq!(int(&mut holder, &["RWLOCK.RELEASE", "rw:k", "k1"]), 1);
    thread::sleep(Duration::from_millis(1000));
    assert_eq!(readers(&mut c, "rw:k"), ["k2"]);
    // The holder's connection ends: a waiting writer gets the lock at once, well before the
    // TTL of the last extension (at least 1.3 s) runs out.
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let reply = write(&mut c, &["rw:k", "w", "2000", "KEEPALIVE", "WAIT", "10000"]);
        tx.send((reply, Instant::now())).expect("send");
        c
    });
    until_info(&mut proxy.client(), "rw:k", "waiting", Value::Int(1));
    let closed = Instant::now();
    drop(holder);
    let (reply, at) = rx.recv_timeout(Duration::from_secs(5)).expect("the writer");
    assert!(matches!(reply, Ok(Some(_))), "{reply:?}");
    assert!(
        at - closed < Duration::from_millis(1000),
        "freed by the close: {:?}",
        at - closed
    );
    let writer = waiter.join().expect("writer");
    // The writer, kept alive too, outlives its TTL; its connection's end frees it.
    thread::sleep(Duration::from_millis(3000));
    let mut c = proxy.client();
    assert_eq!(info(&mut c, "rw:k")["writer"], Value::BulkString(b"w".to_vec()));
    assert_eq!(read(&mut c, &["rw:k", "r", "2000"]), Ok(None));
    let closed = Instant::now();
    drop(writer);
    // Freed at once by the close (its TTL of at least 1.3 s left would take longer).
    while info(&mut c, "rw:k")["writer"] != Value::Nil {
        assert!(closed.elapsed() < Duration::from_millis(1000), "not freed by the close");
        thread::sleep(Duration::from_millis(10));
    }
    assert!(
        read(&mut c, &["rw:k", "r2", "2000"]).unwrap().is_some(),
        "the writer's close freed it"
    );
}

/// One hold as its client knew it: from the reply to the end of its validity (or its release,
/// if earlier), on the test's monotonic clock.
#[derive(Clone, Debug)]
#[allow(dead_code, reason = "shown in failure messages")]
struct Grant {
    key: String,
    client: String,
    writer: bool,
    from: Duration,
    until: Duration,
}

/// The latest a grant can be valid, as the client can compute it from when it sent the
/// request (rule 4: ttl − elapsed − (ttl × 0.01 + 2 ms)).
fn validity_end(sent: Duration, ttl_ms: u64) -> Duration {
    let ttl = Duration::from_millis(ttl_ms);
    sent + ttl - ttl / 100 - Duration::from_millis(2)
}

/// The checker: every pair of grants of one key that overlap (half-open `[from, until)`)
/// where either is a writer, at most 20 reported; and how many pairs of readers overlapped.
fn conflicts(grants: &[Grant]) -> (Vec<(Grant, Grant)>, usize) {
    let mut by_key: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for g in grants {
        by_key.entry(&g.key).or_default().push(g);
    }
    let (mut found, mut shared) = (Vec::new(), 0);
    for list in by_key.values_mut() {
        list.sort_by_key(|g| g.from);
        for (i, g) in list.iter().enumerate() {
            // Sorted by start: the later ones that start before `g` ends overlap it.
            for o in list[i + 1..].iter().take_while(|o| o.from < g.until) {
                if g.writer || o.writer {
                    if found.len() < 20 {
                        found.push(((*g).clone(), (*o).clone()));
                    }
                } else {
                    shared += 1;
                }
            }
        }
    }
    (found, shared)
}

#[test]
fn the_checker_finds_a_writer_with_anyone() {
    let g = |from: u64, until: u64, writer: bool| Grant {
        key: "k".into(),
        client: format!("{from}"),
        writer,
        from: Duration::from_millis(from),
        until: Duration::from_millis(until),
    };
    let (found, shared) = conflicts(&[g(0, 10, false), g(5, 15, false), g(15, 20, true), g(30, 40, true)]);
    assert_eq!(
        (found.len(), shared),
        (0, 1),
        "a writer starting as a reader ends is no overlap"
    );
    let (found, _) = conflicts(&[g(0, 10, false), g(9, 12, true)]);
    assert_eq!(found.len(), 1, "a writer with a reader");
    let (found, _) = conflicts(&[g(0, 10, true), g(2, 3, true), g(20, 30, false)]);
    assert_eq!(found.len(), 1, "two writers");
}

/// What the clients of the fault test saw.
#[derive(Default)]
struct Seen {
    grants: Vec<Grant>,
    fences: check::History,
    refused: usize,
    errors: BTreeMap<String, usize>,
    waited: usize,
}

/// The locks the fault test's clients share.
const LOCKS: [&str; 2] = ["rw:x", "rw:y"];

/// A client: takes a read hold (two rounds in three) or the write hold of one of [`LOCKS`]
/// through `port` (every third round with `WAIT`), holds it briefly, releases it; records
/// each grant.
fn client(name: String, port: u16, origin: Instant, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>, n: u64) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("client connection");
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = LOCKS[((i + n) % 2) as usize];
        let token = format!("{name}-{i}");
        let writer = (i + n).is_multiple_of(3);
        let ttl_ms = 200 + (i * 37 + n) % 500;
        let ttl = ttl_ms.to_string();
        let mut args = vec![key, &token, &ttl];
        let waits = (i / 2).is_multiple_of(3);
        if waits {
            args.extend(["WAIT", "150"]);
        }
        let sent = origin.elapsed();
        let reply = take(&mut c, if writer { "WRITE" } else { "READ" }, &args);
        let from = origin.elapsed();
        let Ok(Some(fence)) = reply else {
            let mut seen = seen.lock().expect("seen");
            match reply {
                Ok(_) => seen.refused += 1,
                Err(e) => *seen.errors.entry(e.chars().take(60).collect()).or_default() += 1,
            }
            continue;
        };
        // Readers hold longer than writers, so that they share.
        thread::sleep(Duration::from_millis(if writer { i % 3 } else { 5 + i % 20 }));
        let release_at = origin.elapsed();
        let _ = query(&mut c, &["RWLOCK.RELEASE", key, &token]);
        let mut seen = seen.lock().expect("seen");
        seen.waited += usize::from(waits);
        seen.fences.fence(check::Fence {
            key: key.to_owned(),
            token: fence,
            holder: name.clone(),
            sent,
            answered: from,
        });
        seen.grants.push(Grant {
            key: key.to_owned(),
            client: name.clone(),
            writer,
            from,
            until: release_at.min(validity_end(sent, ttl_ms)),
        });
    }
}

#[test]
fn never_a_writer_with_anyone_under_master_faults_across_two_proxies() {
    let (seen, report) = recipes::under_faults(
        "holds",
        10,
        |n, port, origin, stop, seen| client(format!("c{n}"), port, origin, stop, seen, n as u64),
        |seen: &Seen| seen.grants.len(),
    );
    println!("{}", report.join("\n"));
    let (found, shared) = conflicts(&seen.grants);
    let writers = seen.grants.iter().filter(|g| g.writer).count();
    println!(
        "{} holds ({writers} writes, {} after a WAIT), {} refused, errors {:?}, {shared} pairs of readers overlapping",
        seen.grants.len(),
        seen.waited,
        seen.refused,
        seen.errors,
    );
    for (a, b) in found.iter().take(5) {
        println!("WRITER WITH ANOTHER: {a:?} and {b:?}");
    }
    // Every token is new: no conflict of a token's own is ever right.
    assert!(!seen.errors.keys().any(|e| e.contains("holds")), "{:?}", seen.errors);
    // Coverage: enough holds of each mode, refusals (contention), waits, and readers sharing
    // (concurrency is real).
    assert!(
        seen.grants.len() >= 300 && writers >= 50,
        "only {} holds, {writers} writes",
        seen.grants.len()
    );
    assert!(
        seen.refused >= 20 && seen.waited >= 30,
        "refused {}, waited {}",
        seen.refused,
        seen.waited
    );
    assert!(shared >= 20, "readers overlapped only {shared} times");
    // The control: the same grants, every reader judged as a writer, show overlaps: the
    // checker can fail.
    let as_writers: Vec<Grant> = seen
        .grants
        .iter()
        .cloned()
        .map(|g| Grant { writer: true, ..g })
        .collect();
    assert!(!conflicts(&as_writers).0.is_empty(), "the checker never fails");
    let overlaps = found.iter().map(|(a, b)| format!("{a:?} with {b:?}")).collect();
    check::assert_safe((overlaps, seen.fences.fence_regressions()));
}

/// A broken read-write lock on real masters: a writer that takes its key by `SET NX` on a
/// majority without looking at the readers is granted while a reader, granted by the same
/// readers' script on another majority, holds; the checker sees it. The proxy, asked the same,
/// answers the writer nil.
#[test]
fn the_checker_catches_a_writer_that_ignores_readers() {
    let servers = masters(5);
    let origin = Instant::now();
    let mut grants = Vec::new();
    let sent = origin.elapsed();
    for m in [0, 1, 2] {
        let added: i64 = redis::cmd("ZADD")
            .arg("broken:r")
            .arg(9_999_999_999_999_i64)
            .arg("R")
            .query(&mut servers[m].client())
            .expect("ZADD");
        assert_eq!(added, 1);
    }
    grants.push(Grant {
        key: "broken".into(),
        client: "R".into(),
        writer: false,
        from: origin.elapsed(),
        until: validity_end(sent, 30_000),
    });
    let sent = origin.elapsed();
    for m in [2, 3, 4] {
        let set: Option<String> = redis::cmd("SET")
            .arg("broken:w")
            .arg("W")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(&mut servers[m].client())
            .expect("SET");
        assert_eq!(set.as_deref(), Some("OK"));
    }
    grants.push(Grant {
        key: "broken".into(),
        client: "W".into(),
        writer: true,
        from: origin.elapsed(),
        until: validity_end(sent, 30_000),
    });
    assert_eq!(conflicts(&grants).0.len(), 1, "a writer with a reader: {grants:?}");

    // The same through the proxy: the reader holds, the writer is refused.
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut c = proxy.client();
    assert!(read(&mut c, &["rw:broken", "R", "30000"]).unwrap().is_some());
    assert_eq!(write(&mut c, &["rw:broken", "W", "30000"]), Ok(None));
}
