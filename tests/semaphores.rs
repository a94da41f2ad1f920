//! Semaphores on real masters (`SEM.*`, docs/commands.md "Semaphores"): a k-permit semaphore
//! is k mutex slots, each a fenced lock on a majority (rule 14). Permits up to k and nil for
//! the next; the count fixed while held; one slot per token; fencing tokens rising per slot;
//! a release handing a permit to a waiter without polling; a `KEEPALIVE` permit outliving its
//! TTL and freed by its connection's end; and the checker: no instant with more than k
//! holders of one semaphore while masters are killed, paused and restarted under two proxies
//! (`KEEPALIVE` permits among them, held past their TTL as long as `SEM.INFO` confirms them),
//! a checker shown able to fail (on the same grants with k − 1, and on a counting semaphore
//! played over a majority, as docs/recipes-quorum.md's tight example).

mod support;

#[path = "sim/check.rs"]
#[allow(dead_code, reason = "the simulation's checker; this test uses its fencing property")]
mod check;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use support::{
    ProxyProcess, acquisition_rounds, fencing_ready, int, masters, proxy_with_metrics, query, recipes, until_rounds,
    urls,
};

/// A master's late reply on a loaded machine must not decide the tests below: they are about
/// slots, waits and sessions, not timeouts (the fault test keeps the default).
const CONFIG: &str = "backend_timeout_ms = 500";

/// A permit: its slot and fencing token; `Ok(None)` when none was free; `Err` with the
/// error the proxy answered.
fn acquire(c: &mut redis::Connection, args: &[&str]) -> Result<Option<(i64, u64)>, String> {
    let mut all = vec!["SEM.ACQUIRE"];
    all.extend_from_slice(args);
    match query(c, &all) {
        Ok(Value::Array(items)) => match items.as_slice() {
            [Value::Int(slot), Value::Int(token)] => Ok(Some((*slot, *token as u64))),
            other => panic!("SEM.ACQUIRE answered {other:?}"),
        },
        Ok(Value::Nil) => Ok(None),
        Ok(other) => panic!("SEM.ACQUIRE answered {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

/// `SEM.INFO key` as a map.
fn info(c: &mut redis::Connection, key: &str) -> HashMap<String, Value> {
    recipes::info(c, "SEM.INFO", key)
}

/// Waits until `SEM.INFO key`'s `field` is `value` on the proxy `c` talks to.
fn until_info(c: &mut redis::Connection, key: &str, field: &str, value: Value) {
    recipes::until_info(c, "SEM.INFO", key, field, value);
}

#[test]
fn permits_up_to_k_then_nil_one_slot_per_token_and_a_fixed_count() {
    let servers = masters(3);
    let backends = urls(&servers);
    let (a, b) = (
        ProxyProcess::start(&backends, CONFIG),
        ProxyProcess::start(&backends, CONFIG),
    );
    fencing_ready(&a);
    let (mut c, mut other) = (a.client(), b.client());
    let mut slots: BTreeMap<i64, (&str, u64)> = BTreeMap::new();
    for token in ["t0", "t1", "t2"] {
        let (slot, fence) = acquire(&mut c, &["sem:a", token, "3", "30000"])
            .expect("no error")
            .unwrap_or_else(|| panic!("{token}: a permit is free"));
        assert!(
            slots.insert(slot, (token, fence)).is_none(),
            "slot {slot} granted twice"
        );
    }
    assert_eq!(slots.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(acquire(&mut c, &["sem:a", "t3", "3", "30000"]), Ok(None), "the 4th");
    assert_eq!(
        acquire(&mut other, &["sem:a", "t3", "3", "30000"]),
        Ok(None),
        "through the other proxy"
    );
    let shown = info(&mut c, "sem:a");
    assert_eq!(shown["permits"], Value::Int(3));
    assert_eq!(shown["holders"], Value::Int(3));
    assert_eq!(shown["free_slots"], Value::Array(vec![]));
    // Each slot's holder, as LOCK.INFO shows a lock's (RESP2: a flat array of slot, token).
    let Value::Array(tokens) = &shown["tokens"] else {
        panic!("tokens: {shown:?}");
    };
    let tokens: Vec<(i64, String)> = tokens
        .chunks(2)
        .map(|pair| match pair {
            [Value::Int(slot), Value::BulkString(token)] => (*slot, String::from_utf8_lossy(token).into_owned()),
            other => panic!("tokens: {other:?}"),
        })
        .collect();
    let holders: Vec<(i64, String)> = slots.iter().map(|(slot, (t, _))| (*slot, t.to_string())).collect();
    assert_eq!(tokens, holders, "each slot's holder");

    // A holder asking again gets an error, never a second slot; another count, an error.
    let again = acquire(&mut other, &["sem:a", "t0", "3", "30000"]).unwrap_err();
    assert!(again.contains("already holds slot"), "{again}");
    let count = acquire(&mut c, &["sem:a", "t9", "2", "30000"]).unwrap_err();
    assert!(count.contains("held with 3 permits, not 2"), "{count}");

    // Extended and released as locks are, through either proxy (the other asks the masters
    // which slot the token holds).
    assert!(int(&mut c, &["SEM.EXTEND", "sem:a", "t1", "30000"]) > 29_000);
    assert_eq!(int(&mut c, &["SEM.EXTEND", "sem:a", "nobody", "30000"]), 0);
    assert!(int(&mut other, &["SEM.EXTEND", "sem:a", "t2", "30000"]) > 29_000);
    assert_eq!(int(&mut other, &["SEM.RELEASE", "sem:a", "t1"]), 1);
    assert_eq!(int(&mut other, &["SEM.RELEASE", "sem:a", "t1"]), 0);
    let (slot, fence) = acquire(&mut c, &["sem:a", "t3", "3", "30000"]).unwrap().expect("freed");
    let (freed, (_, before)) = slots
        .iter()
        .find(|(_, (t, _))| *t == "t1")
        .map(|(s, t)| (*s, *t))
        .unwrap();
    assert_eq!(slot, freed, "the freed slot");
    assert!(fence > before, "its fencing token rises: {fence} > {before}");
    until_info(&mut other, "sem:a", "free_slots", Value::Array(vec![]));

    // Once no permit is held, the count may change.
    for token in ["t0", "t2", "t3"] {
        assert_eq!(int(&mut c, &["SEM.RELEASE", "sem:a", token]), 1, "{token}");
    }
    let free = info(&mut c, "sem:a");
    assert_eq!(
        (free["holders"].clone(), free["permits"].clone()),
        (Value::Int(0), Value::Int(3))
    );
    assert!(acquire(&mut c, &["sem:a", "u0", "2", "30000"]).unwrap().is_some());
    assert_eq!(info(&mut c, "sem:a")["permits"], Value::Int(2));

    // Fencing tokens rise per slot, whichever proxy grants them.
    let mut last: HashMap<i64, u64> = HashMap::new();
    for i in 0..20 {
        let proxy = if i % 2 == 0 { &mut c } else { &mut other };
        let token = format!("r{i}");
        let (slot, fence) = acquire(proxy, &["sem:a", &token, "2", "30000"])
            .unwrap()
            .expect("a permit");
        if let Some(previous) = last.insert(slot, fence) {
            assert!(fence > previous, "slot {slot}: {fence} after {previous}");
        }
        assert_eq!(int(proxy, &["SEM.RELEASE", "sem:a", &token]), 1);
    }
    assert_eq!(last.len(), 1, "the other slot stays held by u0: {last:?}");
    // The slots are the proxy's own keys: no client names them (rule 11).
    let reserved = query(&mut c, &["DEL", "redlock-proxy:sem:{sem:a}:sem:a:0"]).unwrap_err();
    assert!(reserved.to_string().contains("reserved"), "{reserved}");
}

#[test]
fn a_release_hands_a_permit_to_a_waiter_without_polling() {
    let servers = masters(3);
    let backends = urls(&servers);
    let ((a, metrics_a), (b, metrics_b)) = (
        proxy_with_metrics(&backends, CONFIG),
        proxy_with_metrics(&backends, CONFIG),
    );
    fencing_ready(&a);
    fencing_ready(&b);
    let mut holders = a.client();
    for token in ["h1", "h2"] {
        assert!(
            acquire(&mut holders, &["sem:w", token, "2", "30000"])
                .unwrap()
                .is_some()
        );
    }
    // A waiter at each proxy, the holders' TTL 30 s.
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for (proxy, metrics, token) in [(&b, metrics_b, "wb"), (&a, metrics_a, "wa")] {
        let rounds = acquisition_rounds(metrics);
        let mut c = proxy.client();
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let reply = acquire(&mut c, &["sem:w", token, "2", "30000", "WAIT", "20000"]);
            tx.send((token, reply, Instant::now())).expect("send");
            c
        }));
        until_info(&mut proxy.client(), "sem:w", "waiting", Value::Int(1));
        // Its first try (refused) is over on every master before the next step: `INFO` shows
        // it waiting from its enqueueing, before that try is sent.
        until_rounds(metrics, rounds + 1);
    }
    // Waiting costs the masters nothing: no polling while the permits are held.
    let before = recipes::script_calls(&servers);
    thread::sleep(Duration::from_millis(500));
    assert_eq!(recipes::script_calls(&servers), before, "a waiter polled the masters");
    let mut woken = Vec::new();
    for (via, token) in [(&a, "h1"), (&b, "h2")] {
        let released = Instant::now();
        assert_eq!(int(&mut via.client(), &["SEM.RELEASE", "sem:w", token]), 1);
        let (waiter, reply, at) = rx.recv_timeout(Duration::from_secs(5)).expect("a waiter woken");
        assert!(matches!(reply, Ok(Some(_))), "{waiter}: {reply:?}");
        assert!(
            at - released < Duration::from_secs(3),
            "woken by the release, not a TTL"
        );
        assert!(rx.try_recv().is_err(), "one release, one permit");
        woken.push(waiter);
    }
    woken.sort_unstable();
    assert_eq!(woken, ["wa", "wb"], "each waiter got a permit");
    for t in threads {
        t.join().expect("waiter");
    }
}

#[test]
fn a_keepalive_permit_outlives_its_ttl_and_its_connection_frees_it() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    let mut c = proxy.client();
    assert!(
        acquire(&mut holder, &["sem:k", "h", "1", "2000", "KEEPALIVE"])
            .unwrap()
            .is_some()
    );
    // One and a half TTLs later the permit is still held, kept alive by the proxy.
    thread::sleep(Duration::from_millis(3000));
    assert_eq!(info(&mut c, "sem:k")["holders"], Value::Int(1));
    assert_eq!(acquire(&mut c, &["sem:k", "w", "1", "2000"]), Ok(None));
    // The holder's connection ends: the permit goes to a waiter at once, well before the TTL
    // of its last extension (at least 1.3 s) runs out.
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let reply = acquire(&mut c, &["sem:k", "w", "1", "2000", "WAIT", "10000"]);
        tx.send((reply, Instant::now())).expect("send");
    });
    until_info(&mut proxy.client(), "sem:k", "waiting", Value::Int(1));
    let closed = Instant::now();
    drop(holder);
    let (reply, at) = rx.recv_timeout(Duration::from_secs(5)).expect("the waiter");
    assert!(matches!(reply, Ok(Some((0, _)))), "{reply:?}");
    assert!(
        at - closed < Duration::from_millis(1000),
        "freed by the close: {:?}",
        at - closed
    );
    waiter.join().expect("waiter");
}

/// One permit as its client knew it: from the reply to the end of its validity (or its
/// release, if earlier), on the test's monotonic clock.
#[derive(Clone, Debug)]
#[allow(dead_code, reason = "shown in failure messages")]
struct Grant {
    key: String,
    client: String,
    slot: i64,
    from: Duration,
    until: Duration,
}

/// The latest a grant can be valid, as the client can compute it from when it sent the
/// request (rule 4: ttl − elapsed − (ttl × 0.01 + 2 ms); each slot's attempt started later).
fn validity_end(sent: Duration, ttl_ms: u64) -> Duration {
    let ttl = Duration::from_millis(ttl_ms);
    sent + ttl - ttl / 100 - Duration::from_millis(2)
}

/// The checker: every instant at which more than `k` grants of one key hold (grants are
/// half-open intervals `[from, until)`), as the grants then holding; at most 20 reported (the
/// simulation's checker, `History::more_than`, on these grants).
fn more_than(grants: &[Grant], k: usize) -> Vec<String> {
    let mut history = check::History::default();
    for g in grants {
        history.grant(check::Grant {
            key: g.key.clone(),
            token: format!("{} (slot {})", g.client, g.slot),
            proxy: 0,
            from: g.from,
            until: g.until,
        });
    }
    history.more_than(k, |key| Some(key.to_owned()))
}

/// How many grants began while `k - 1` others of their key held: the bound was reached.
fn at_the_bound(grants: &[Grant], k: usize) -> usize {
    grants
        .iter()
        .filter(|g| {
            grants
                .iter()
                .filter(|o| o.key == g.key && o.from <= g.from && g.from < o.until)
                .count()
                >= k
        })
        .count()
}

#[test]
fn the_checker_counts_holders_per_instant() {
    let g = |from: u64, until: u64| Grant {
        key: "s".into(),
        client: format!("{from}"),
        slot: 0,
        from: Duration::from_millis(from),
        until: Duration::from_millis(until),
    };
    let grants = [g(0, 10), g(5, 15), g(10, 20), g(12, 14)];
    assert!(more_than(&grants, 3).is_empty());
    assert_eq!(more_than(&grants, 2).len(), 1, "5..10 has two, 12..14 has three");
    assert_eq!(
        more_than(&grants[..3], 1).len(),
        2,
        "a grant ending as another begins is no overlap"
    );
    assert_eq!(at_the_bound(&grants, 3), 1);
}

/// What the clients of the fault test saw.
#[derive(Default)]
struct Seen {
    grants: Vec<Grant>,
    fences: check::History,
    /// Acquisitions answered nil (no permit free), and errors (`NOQUORUM`...) by text.
    refused: usize,
    errors: BTreeMap<String, usize>,
    waited: usize,
    /// `KEEPALIVE` permits believed past their TTL without a break (confirmed by `SEM.INFO`).
    past_ttl: usize,
}

/// Permits of the semaphores the fault test's clients share.
const SEMAPHORES: [(&str, usize); 2] = [("sem:x", 3), ("sem:y", 2)];

/// A client: takes a permit of one of [`SEMAPHORES`] through `port` (every third round with
/// `WAIT`), holds it briefly, releases it; records each grant. Clients 4 and 9 take their
/// permits with `KEEPALIVE` and hold them past their TTL ([`confirm_session`]).
fn client(name: String, port: u16, origin: Instant, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>, n: u64) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("client connection");
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let (key, k) = SEMAPHORES[((i + n) % 2) as usize];
        let token = format!("{name}-{i}");
        let ttl_ms = 200 + (i * 37 + n) % 500;
        let (permits, ttl) = (k.to_string(), ttl_ms.to_string());
        let mut args = vec![key, &token, &permits, &ttl];
        let waits = i.is_multiple_of(3);
        if waits {
            args.extend(["WAIT", "150"]);
        }
        let session = n % 5 == 4;
        if session {
            args.push("KEEPALIVE");
        }
        let sent = origin.elapsed();
        let reply = acquire(&mut c, &args);
        let from = origin.elapsed();
        let Ok(Some((slot, fence))) = reply else {
            let mut seen = seen.lock().expect("seen");
            match reply {
                Ok(_) => seen.refused += 1,
                Err(e) => *seen.errors.entry(e.chars().take(60).collect()).or_default() += 1,
            }
            continue;
        };
        let mut held = vec![(from, validity_end(sent, ttl_ms))];
        if session {
            confirm_session(&mut c, key, &token, slot, ttl_ms, origin, &mut held);
        } else {
            thread::sleep(Duration::from_millis(i % 3));
        }
        let release_at = origin.elapsed();
        let _ = query(&mut c, &["SEM.RELEASE", key, &token]);
        let mut seen = seen.lock().expect("seen");
        seen.waited += usize::from(waits);
        seen.past_ttl += usize::from(held.len() == 1 && held[0].1 > validity_end(sent, ttl_ms));
        seen.fences.fence(check::Fence {
            key: format!("{key}#{slot}"),
            token: fence,
            holder: name.clone(),
            sent,
            answered: from,
        });
        seen.grants.extend(held.into_iter().map(|(from, until)| Grant {
            key: key.to_owned(),
            client: name.clone(),
            slot,
            from,
            until: release_at.min(until),
        }));
    }
}

/// A `KEEPALIVE` permit's holder: holds it for one and a half TTLs, believing it as long as
/// `SEM.INFO` confirms it, each confirmation counted from when it was sent (the proxy must
/// keep a session permit valid on a quorum through the faults). `held` starts with the
/// grant's own validity and gains one interval per confirmation; a confirmation that comes
/// after the belief lapsed starts a new interval from when it is read.
fn confirm_session(
    c: &mut redis::Connection,
    key: &str,
    token: &str,
    slot: i64,
    ttl_ms: u64,
    origin: Instant,
    held: &mut Vec<(Duration, Duration)>,
) {
    for _ in 0..6 {
        thread::sleep(Duration::from_millis(ttl_ms / 4));
        let sent = origin.elapsed();
        let Some(validity) = slot_validity(c, key, token, slot) else {
            continue;
        };
        let now = origin.elapsed();
        let until = sent + validity;
        match held.last_mut() {
            Some(last) if now < last.1 => last.1 = last.1.max(until),
            _ => held.push((now, until)),
        }
    }
}

/// The validity `SEM.INFO` gives `token`'s hold of `slot`, if a quorum holds it for `token`
/// (an error, such as `NOQUORUM` while masters are down, confirms nothing).
fn slot_validity(c: &mut redis::Connection, key: &str, token: &str, slot: i64) -> Option<Duration> {
    let Ok(Value::Array(items)) = query(c, &["SEM.INFO", key]) else {
        return None;
    };
    let field = |name: &str| -> Option<Vec<Value>> {
        let at = items.chunks(2).position(|kv| kv[0] == Value::BulkString(name.into()))?;
        match &items[at * 2 + 1] {
            Value::Array(flat) => Some(flat.clone()),
            _ => None,
        }
    };
    let of_slot = |flat: Vec<Value>| {
        flat.chunks(2)
            .find(|kv| kv[0] == Value::Int(slot))
            .map(|kv| kv[1].clone())
    };
    let holder = of_slot(field("tokens")?)?;
    match (holder, of_slot(field("validity_ms")?)?) {
        (Value::BulkString(t), Value::Int(ms)) if t == token.as_bytes() && ms > 0 => {
            Some(Duration::from_millis(ms as u64))
        }
        _ => None,
    }
}

#[test]
fn at_most_k_holders_under_master_faults_across_two_proxies() {
    let (seen, report) = recipes::under_faults(
        "permits",
        10,
        |n, port, origin, stop, seen| client(format!("c{n}"), port, origin, stop, seen, n as u64),
        |seen: &Seen| seen.grants.len(),
    );
    println!("{}", report.join("\n"));
    let bound: usize = SEMAPHORES
        .iter()
        .map(|(key, k)| {
            let grants: Vec<Grant> = seen.grants.iter().filter(|g| g.key == *key).cloned().collect();
            at_the_bound(&grants, *k)
        })
        .sum();
    println!(
        "{} permits ({} after a WAIT, {} session permits held past their TTL), {} refused, errors {:?}, {} granted with the semaphore full",
        seen.grants.len(),
        seen.waited,
        seen.past_ttl,
        seen.refused,
        seen.errors,
        bound
    );
    let mut over = Vec::new();
    for (key, k) in SEMAPHORES {
        let grants: Vec<Grant> = seen.grants.iter().filter(|g| g.key == key).cloned().collect();
        over.extend(more_than(&grants, k));
    }
    for holders in over.iter().take(5) {
        println!("MORE THAN k: {holders}");
    }
    // Every token is new and every client names the same count: no conflict is ever right.
    assert!(
        !seen.errors.keys().any(|e| e.contains("holds") || e.contains("permits")),
        "{:?}",
        seen.errors
    );
    // Coverage: enough permits, semaphores full often, refusals (contention) and waits.
    assert!(seen.grants.len() >= 300, "only {} permits", seen.grants.len());
    assert!(bound >= 50, "the bound was reached only {bound} times");
    assert!(
        seen.past_ttl >= 10,
        "only {} session permits held past their TTL",
        seen.past_ttl
    );
    assert!(
        seen.refused >= 20 && seen.waited >= 30,
        "refused {}, waited {}",
        seen.refused,
        seen.waited
    );
    // The control: the same grants, judged with one permit fewer than the proxy gave out,
    // show instants over the bound: the checker can fail.
    let control: usize = SEMAPHORES
        .iter()
        .map(|(key, k)| {
            let grants: Vec<Grant> = seen.grants.iter().filter(|g| g.key == *key).cloned().collect();
            more_than(&grants, k - 1).len()
        })
        .sum();
    assert!(control > 0, "the checker never fails with k - 1");
    check::assert_safe((over, seen.fences.fence_regressions()));
}

/// docs/recipes-quorum.md's tight example on real masters: N = 5, k = 2, a quorum of 3. A
/// counting semaphore (each master admits while it holds fewer than k) reached by the
/// adversary's choice of masters admits three holders, A on {1,2,3}, B on {4,5,1}, C on
/// {2,3,4}, and the checker sees it; the proxy's slots, asked the same, answer C nil.
#[test]
fn the_checker_catches_a_counting_semaphore_over_a_majority() {
    let servers = masters(5);
    let counting = "if redis.call('scard', KEYS[1]) < tonumber(ARGV[2]) then \
                    redis.call('sadd', KEYS[1], ARGV[1]) redis.call('pexpire', KEYS[1], 30000) return 1 end return 0";
    let origin = Instant::now();
    let mut grants = Vec::new();
    for (holder, reached) in [("A", [0, 1, 2]), ("B", [3, 4, 0]), ("C", [1, 2, 3])] {
        let sent = origin.elapsed();
        let accepted: i64 = reached
            .iter()
            .map(|&m| -> i64 {
                redis::cmd("EVAL")
                    .arg(counting)
                    .arg(1)
                    .arg("counting")
                    .arg(holder)
                    .arg(2)
                    .query(&mut servers[m].client())
                    .expect("EVAL")
            })
            .sum();
        assert_eq!(accepted, 3, "{holder}: a quorum accepted");
        grants.push(Grant {
            key: "counting".into(),
            client: holder.into(),
            slot: -1,
            from: origin.elapsed(),
            until: validity_end(sent, 30_000),
        });
    }
    assert_eq!(
        more_than(&grants, 2).len(),
        1,
        "three holders of two permits: {grants:?}"
    );

    // The same three through the proxy: two permits, then nil.
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut c = proxy.client();
    assert!(acquire(&mut c, &["sem:tight", "A", "2", "30000"]).unwrap().is_some());
    assert!(acquire(&mut c, &["sem:tight", "B", "2", "30000"]).unwrap().is_some());
    assert_eq!(acquire(&mut c, &["sem:tight", "C", "2", "30000"]), Ok(None));
}
