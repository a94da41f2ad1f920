//! Network partitions between real proxies and real masters, each process in a network
//! namespace of its own, the faults made by the router between them (`tests/support/netns.rs`):
//! links cut both ways, cut one way (requests arrive, replies are lost), random loss, and
//! delay. Under each fault, contending clients on both proxies take three locks (`SET NX PX`
//! and, for half of them, `LOCK.ACQUIRE`), and the simulation's checker (`tests/sim/check.rs`)
//! looks for two grants of a lock that overlap (each believed from its reply to the end of the
//! validity counted from its send) and for fencing tokens that do not increase. Where a proxy
//! reaches a majority, its clients must keep being granted. Each test prints what a safety
//! report quotes: acquisitions checked, faults injected, violations found, time to recover.
//!
//! The control, `split_brain_control_a_proxy_trusting_its_minority_grants_twice`: the same
//! partition as `split_brain_needs_a_majority`, where the minority side's proxy is configured
//! with only the two masters it can reach (a proxy that trusts a minority); the checker must
//! find its grants overlapping the majority side's.

mod support;

#[path = "sim/check.rs"]
#[allow(
    dead_code,
    reason = "the simulation's checker: its overlap sweep and fencing property"
)]
mod check;

use std::time::{Duration, Instant};

use redis::Value;
use support::contend::{Clients, Ctx, Record, connect, validity_end};
use support::netns::{Net, isolated};
use support::{ProxyProcess, RedisServer, backend_line, fencing_ready};

/// Five masters and two proxies, one namespace each.
const LEAVES: [&str; 7] = ["m0", "m1", "m2", "m3", "m4", "p0", "p1"];
const MASTERS: [&str; 5] = ["m0", "m1", "m2", "m3", "m4"];
/// The locks the contending clients share.
const LOCKS: [&str; 3] = ["lock:0", "lock:1", "lock:2"];
/// A master that does not answer costs 100 ms; the TTLs the clients ask for are 80 to 580 ms.
const CONFIG: &str = "backend_timeout_ms = 100\nmax_ttl_ms = 30000\ndefault_ttl_ms = 2000\nlegacy_ttl_ms = 2000";

/// Each fault plays at least this long...
const MIN_PHASE: Duration = Duration::from_millis(1000);
/// ...and until every proxy that reaches a majority was granted this many locks asked for
/// during it, for at most `MAX_PHASE`.
const FLOOR: usize = 10;
const MAX_PHASE: Duration = Duration::from_secs(20);

/// The masters and proxies of a test, in their namespaces.
struct Setup {
    masters: Vec<RedisServer>,
    proxies: Vec<ProxyProcess>,
}

impl Setup {
    /// Starts `masters`, then one proxy per `(label, its masters)`, ready for fenced commands.
    fn start(net: &Net, masters: &[&str], proxies: &[(&str, &[&str])], config: &str) -> Setup {
        let servers: Vec<RedisServer> = masters.iter().map(|m| net.master(m)).collect();
        let url = |label: &str| servers[masters.iter().position(|m| *m == label).expect("a master")].url();
        let proxies: Vec<ProxyProcess> = proxies
            .iter()
            .map(|(label, of)| {
                let backends: Vec<String> = of.iter().map(|m| url(m)).collect();
                net.proxy(label, &backends, config)
            })
            .collect();
        for proxy in &proxies {
            fencing_ready(proxy);
        }
        Setup {
            masters: servers,
            proxies,
        }
    }

    /// `per_proxy` contending clients on every proxy, every other one fenced.
    fn contenders(&self, clients: &mut Clients, per_proxy: usize) {
        for (p, proxy) in self.proxies.iter().enumerate() {
            for n in 0..per_proxy {
                clients.contender(proxy.url(), p, format!("c{n}p{p}"), &LOCKS, n % 2 == 1);
            }
        }
    }

    /// How long until proxy `p` sees each of its `n` masters up again (after a heal).
    fn recovery(&self, p: usize, n: usize) -> Duration {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(20);
        while !(0..n).all(|i| backend_line(&self.proxies[p], i).contains("state=up")) {
            assert!(Instant::now() < deadline, "proxy {p} did not see its masters up again");
            std::thread::sleep(Duration::from_millis(10));
        }
        start.elapsed()
    }
}

/// Runs the clients under the fault in place for at least [`MIN_PHASE`], and until each
/// proxy in `progress` (those that reach a majority) was granted [`FLOOR`] locks asked for
/// during it. Returns the phase's line for the report; fails when a proxy in `progress` did
/// not get there within [`MAX_PHASE`].
fn phase(ctx: &Ctx, name: &str, proxies: usize, progress: &[usize]) -> String {
    let start = ctx.now();
    let grants = |p: usize| ctx.with_record(|r| r.granted_since(p, start));
    loop {
        let elapsed = ctx.now() - start;
        if elapsed >= MIN_PHASE && progress.iter().all(|&p| grants(p) >= FLOOR) {
            break;
        }
        assert!(
            elapsed < MAX_PHASE,
            "{name}: proxies {progress:?} reach a majority but were granted only {:?} locks in {elapsed:?}",
            (0..proxies).map(grants).collect::<Vec<_>>()
        );
        // Polling a count the client threads raise.
        std::thread::sleep(Duration::from_millis(50));
    }
    let counts: Vec<String> = (0..proxies).map(|p| format!("p{p} {}", grants(p))).collect();
    format!(
        "  {name}: {:.1} s, grants {}",
        (ctx.now() - start).as_secs_f64(),
        counts.join(", ")
    )
}

/// The checker's verdict on a run: overlapping grants, and fencing tokens that did not
/// increase. Prints the figures.
fn verdict(test: &str, record: &Record, faults: &str, phases: &[String]) -> (Vec<String>, Vec<String>) {
    let mut history = check::History::default();
    for h in &record.held {
        history.grant(check::Grant {
            key: h.key.clone(),
            token: h.token.clone(),
            proxy: h.proxy,
            from: h.from,
            until: h.until,
        });
    }
    for f in &record.fences {
        history.fence(check::Fence {
            key: f.key.clone(),
            token: f.token,
            holder: f.holder.clone(),
            sent: f.sent,
            answered: f.answered,
        });
    }
    let (overlaps, regressions) = (history.overlaps(), history.fence_regressions());
    println!(
        "{test}: {} grants checked ({} fencing tokens), faults: {faults}; {} violations, {} token regressions",
        history.len(),
        history.fences(),
        overlaps.len(),
        regressions.len()
    );
    for (p, t) in record.tallies.iter().enumerate() {
        println!(
            "  requests through p{p}: {} ({} granted, {} refused, {} NOQUORUM, {} errors)",
            t.attempts, t.granted, t.refused, t.noquorum, t.errors
        );
    }
    for line in phases {
        println!("{line}");
    }
    for o in overlaps.iter().take(5) {
        println!("  OVERLAP {o}");
    }
    (overlaps, regressions)
}

/// The same five masters for both proxies.
fn both_over_all() -> [(&'static str, &'static [&'static str]); 2] {
    [("p0", &MASTERS), ("p1", &MASTERS)]
}

/// Two of five masters cut from one proxy, both ways: it decides on the other three, the other
/// proxy on all five.
#[test]
fn a_minority_cut_from_one_proxy() {
    isolated("a_minority_cut_from_one_proxy", &LEAVES, |net| {
        let setup = Setup::start(net, &MASTERS, &both_over_all(), CONFIG);
        let mut clients = Clients::new();
        setup.contenders(&mut clients, 3);
        let ctx = clients.ctx().clone();
        let mut phases = vec![phase(&ctx, "healthy", 2, &[0, 1])];
        net.cut("p0", "m3");
        net.cut("p0", "m4");
        phases.push(phase(&ctx, "p0 cut from m3, m4", 2, &[0, 1]));
        net.heal();
        let recovered = setup.recovery(0, 5);
        phases.push(phase(&ctx, "healed", 2, &[0, 1]));
        let record = clients.stop();
        let faults = format!(
            "2 links cut, {} packets dropped; p0 saw its 5 masters up {} ms after the heal",
            net.dropped(),
            recovered.as_millis()
        );
        check::assert_safe(verdict("a_minority_cut_from_one_proxy", &record, &faults, &phases));
    });
}

/// Minorities cut from both proxies: first the same two masters cut from both (an isolated
/// minority); then a different minority from each (p0 from m3, m4; p1 from m0, m1), so that the
/// majorities the two proxies reach share one master, m2, which alone keeps them apart.
#[test]
fn minorities_cut_from_both_proxies() {
    isolated("minorities_cut_from_both_proxies", &LEAVES, |net| {
        let setup = Setup::start(net, &MASTERS, &both_over_all(), CONFIG);
        let mut clients = Clients::new();
        setup.contenders(&mut clients, 3);
        let ctx = clients.ctx().clone();
        let mut phases = vec![phase(&ctx, "healthy", 2, &[0, 1])];
        for p in ["p0", "p1"] {
            net.cut(p, "m3");
            net.cut(p, "m4");
        }
        phases.push(phase(&ctx, "m3, m4 cut from both proxies", 2, &[0, 1]));
        net.heal();
        net.cut("p0", "m3");
        net.cut("p0", "m4");
        net.cut("p1", "m0");
        net.cut("p1", "m1");
        phases.push(phase(
            &ctx,
            "p0 cut from m3, m4; p1 from m0, m1 (only m2 shared)",
            2,
            &[0, 1],
        ));
        net.heal();
        let recovered = [setup.recovery(0, 5), setup.recovery(1, 5)];
        phases.push(phase(&ctx, "healed", 2, &[0, 1]));
        let record = clients.stop();
        let faults = format!(
            "8 links cut in two phases, {} packets dropped; all masters up again {} ms (p0) and {} ms (p1) after the heal",
            net.dropped(),
            recovered[0].as_millis(),
            recovered[1].as_millis()
        );
        check::assert_safe(verdict("minorities_cut_from_both_proxies", &record, &faults, &phases));
    });
}

/// A field of `LOCK.INFO key`'s map.
fn info_field(c: &mut redis::Connection, key: &str, field: &str) -> Value {
    let reply: redis::RedisResult<Value> = redis::cmd("LOCK.INFO").arg(key).query(c);
    let Ok(Value::Array(items)) = reply else {
        panic!("LOCK.INFO {key}: {reply:?}");
    };
    items
        .chunks(2)
        .find(|kv| kv[0] == Value::BulkString(field.as_bytes().to_vec()))
        .map(|kv| kv[1].clone())
        .unwrap_or_else(|| panic!("no {field} in LOCK.INFO"))
}

/// The TTL of the hand-off lock: a waiter woken by the release, not by this running out, is
/// woken well within it.
const HANDOFF_TTL_MS: u64 = 2000;

/// One hand-off of `lock:handoff`: a holder takes it through `holder` (proxy number `hp`), a
/// waiter queues for it through `waiter` (`LOCK.ACQUIRE ... WAIT`), the holder releases it.
/// Returns how long after the release the waiter was granted; records both grants.
fn hand_off(
    ctx: &Ctx,
    (holder, hp): (&ProxyProcess, usize),
    (waiter, wp): (&ProxyProcess, usize),
    round: usize,
) -> Duration {
    let key = "lock:handoff";
    let mut h = connect(&holder.url(), Duration::from_secs(5)).expect("holder connection");
    let token = format!("h{round}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let (sent, fence) = loop {
        let sent = ctx.now();
        let reply: redis::RedisResult<Value> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&token)
            .arg(HANDOFF_TTL_MS)
            .query(&mut h);
        if let Ok(Value::Int(fence)) = reply {
            break (sent, fence);
        }
        assert!(Instant::now() < deadline, "the holder never got {key}: {reply:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let from = ctx.now();
    ctx.fenced(support::contend::Fenced {
        key: key.into(),
        token: fence as u64,
        holder: token.clone(),
        sent,
        answered: from,
    });
    let url = waiter.url();
    let waiter_ctx = ctx.clone();
    let waiter_token = format!("w{round}");
    let queued = std::thread::spawn(move || {
        let mut w = connect(&url, Duration::from_secs(15)).expect("waiter connection");
        let sent = waiter_ctx.now();
        let reply: redis::RedisResult<Value> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&waiter_token)
            .arg(HANDOFF_TTL_MS)
            .arg("WAIT")
            .arg(2 * HANDOFF_TTL_MS)
            .query(&mut w);
        (sent, waiter_ctx.now(), reply, w, waiter_token)
    });
    let mut watch = connect(&waiter.url(), Duration::from_secs(5)).expect("connection");
    let deadline = Instant::now() + Duration::from_secs(5);
    while info_field(&mut watch, key, "waiting") != Value::Int(1) {
        assert!(Instant::now() < deadline, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    let released_at = ctx.now();
    let released: redis::RedisResult<Value> = redis::cmd("LOCK.RELEASE").arg(key).arg(&token).query(&mut h);
    assert_eq!(released, Ok(Value::Int(1)), "the holder's release");
    ctx.held(support::contend::Believed {
        key: key.into(),
        token,
        proxy: hp,
        sent,
        from,
        until: released_at.min(validity_end(sent, HANDOFF_TTL_MS)),
    });
    let (wsent, granted_at, reply, mut w, waiter_token) = queued.join().expect("waiter thread");
    let Ok(Value::Int(fence)) = reply else {
        panic!("the waiter was not granted: {reply:?}");
    };
    ctx.fenced(support::contend::Fenced {
        key: key.into(),
        token: fence as u64,
        holder: waiter_token.clone(),
        sent: wsent,
        answered: granted_at,
    });
    let release_at = ctx.now();
    let _: redis::RedisResult<Value> = redis::cmd("LOCK.RELEASE").arg(key).arg(&waiter_token).query(&mut w);
    ctx.held(support::contend::Believed {
        key: key.into(),
        token: waiter_token,
        proxy: wp,
        sent: wsent,
        from: granted_at,
        until: release_at.min(validity_end(wsent, HANDOFF_TTL_MS)),
    });
    granted_at - released_at
}

/// The two proxies cut from each other. They never talk to each other directly: a release is
/// announced on a master, where every proxy listens (docs/waiting-and-sessions.md, "Waiting"), so a waiter on one
/// proxy is still woken by a release through the other, well before the holder's TTL. Then
/// each proxy is also cut from a different master (p0 from m0, p1 from m2): the announcement
/// goes to every master the releasing proxy reaches, so the waiter hears it from the one
/// master both reach, and takes its turn a backend timeout later, when the copies from the
/// other masters have not come (until 2026-11-28 it went to one master, in turn, and when that
/// was the one the waiter's proxy cannot hear, the waiter woke at the holder's TTL: 1 or 2 of
/// the 4 hand-offs).
#[test]
fn proxies_cut_from_each_other() {
    let leaves = ["m0", "m1", "m2", "p0", "p1"];
    isolated("proxies_cut_from_each_other", &leaves, |net| {
        let masters = ["m0", "m1", "m2"];
        let setup = Setup::start(net, &masters, &[("p0", &masters), ("p1", &masters)], CONFIG);
        let mut clients = Clients::new();
        setup.contenders(&mut clients, 2);
        let ctx = clients.ctx().clone();
        let (p0, p1) = ((&setup.proxies[0], 0), (&setup.proxies[1], 1));
        net.cut("p0", "p1");
        let mut prompt = Vec::new();
        for round in 0..4 {
            let (holder, waiter) = if round % 2 == 0 { (p0, p1) } else { (p1, p0) };
            prompt.push(hand_off(&ctx, holder, waiter, round));
        }
        let mut phases = vec![phase(&ctx, "p0 and p1 cut from each other", 2, &[0, 1])];
        // The proxies never talk to each other directly: the cut between them drops nothing.
        let between = net.dropped();
        net.cut("p0", "m0");
        net.cut("p1", "m2");
        let mut late = Vec::new();
        for round in 4..8 {
            let (holder, waiter) = if round % 2 == 0 { (p0, p1) } else { (p1, p0) };
            late.push(hand_off(&ctx, holder, waiter, round));
        }
        phases.push(phase(&ctx, "and p0 cut from m0, p1 from m2", 2, &[0, 1]));
        net.heal();
        let record = clients.stop();
        let ms = |d: &[Duration]| {
            d.iter()
                .map(|d| d.as_millis().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        phases.push(format!(
            "  wake-ups across proxies cut from each other: {} ms after the release",
            ms(&prompt)
        ));
        phases.push(format!(
            "  with each proxy also cut from a different master: {} ms (holder's TTL {HANDOFF_TTL_MS} ms)",
            ms(&late)
        ));
        let faults = format!(
            "5 links cut, {} packets dropped ({between} of them between the proxies)",
            net.dropped()
        );
        let found = verdict("proxies_cut_from_each_other", &record, &faults, &phases);
        for wake in &prompt {
            assert!(
                *wake < Duration::from_millis(1000),
                "a waiter woke {wake:?} after a release through the other proxy: {prompt:?}"
            );
        }
        for wake in &late {
            assert!(
                *wake < Duration::from_millis(1000),
                "a waiter woke {wake:?} after the release (the holder's TTL: {HANDOFF_TTL_MS} ms): {late:?}"
            );
        }
        check::assert_safe(found);
    });
}

/// Asymmetric cuts: requests reach the masters, their replies (and acknowledgements) to p0 are
/// lost. First from a minority (m3, m4): p0 decides on the other three. Then from a majority
/// (m2, m3, m4): p0's acquisitions land on those masters, unanswered (the masters hold partial
/// locks), so p0 grants nothing; it must undo them, and p1 keeps granting. An acquisition of
/// `lock:asym` with a 20 s TTL sent through p0 just after the cut shows the undo: its partial
/// keys must be gone from the masters soon after the heal, long before their TTL.
#[test]
fn replies_lost_on_the_way_back() {
    isolated("replies_lost_on_the_way_back", &LEAVES, |net| {
        let setup = Setup::start(net, &MASTERS, &both_over_all(), CONFIG);
        let mut clients = Clients::new();
        setup.contenders(&mut clients, 3);
        let ctx = clients.ctx().clone();
        let mut phases = vec![phase(&ctx, "healthy", 2, &[0, 1])];
        net.cut_one_way("m3", "p0");
        net.cut_one_way("m4", "p0");
        phases.push(phase(&ctx, "replies of m3, m4 to p0 lost", 2, &[0, 1]));
        net.heal();
        setup.recovery(0, 5);
        // The partial locks, read on the masters directly (the router's own traffic is not cut),
        // every few ms while the unanswered acquisitions go out: the undo of one can land while
        // the cut lasts (requests still arrive), a backend timeout after its write.
        let partial = |masters: &[RedisServer]| -> Vec<String> {
            masters
                .iter()
                .enumerate()
                .filter_map(|(i, m)| m.get("lock:asym").map(|v| format!("m{i}={v}")))
                .collect()
        };
        let urls: Vec<String> = setup.masters.iter().map(RedisServer::url).collect();
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sampler = {
            let sampling = sampling.clone();
            std::thread::spawn(move || {
                let mut conns: Vec<redis::Connection> = urls
                    .iter()
                    .map(|u| connect(u, Duration::from_secs(2)).expect("master connection"))
                    .collect();
                let mut seen = std::collections::BTreeSet::new();
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, c) in conns.iter_mut().enumerate() {
                        let value: Option<String> = redis::cmd("GET").arg("lock:asym").query(c).expect("GET");
                        if let Some(v) = value {
                            seen.insert(format!("m{i}={v}"));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                seen
            })
        };
        for m in ["m2", "m3", "m4"] {
            net.cut_one_way(m, "p0");
        }
        let cut_at = ctx.now();
        let mut probe = connect(&setup.proxies[0].url(), Duration::from_secs(5)).expect("probe connection");
        let mut replies = Vec::new();
        for k in 0..3 {
            let reply: redis::RedisResult<Value> = redis::cmd("SET")
                .arg("lock:asym")
                .arg(format!("asym-{k}"))
                .arg("NX")
                .arg("PX")
                .arg(20_000)
                .query(&mut probe);
            assert!(
                !matches!(reply, Ok(Value::Okay)),
                "p0 granted without a majority's replies"
            );
            replies.push(format!("{reply:?}"));
        }
        phases.push(phase(&ctx, "replies of m2, m3, m4 to p0 lost", 2, &[1]));
        // An 8 s cut, as seen in the field: long enough for TCP's retransmission backoff to
        // grow to seconds on the connections whose replies are lost.
        if let Some(left) = Duration::from_secs(8).checked_sub(ctx.now() - cut_at) {
            std::thread::sleep(left);
        }
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        let seen = sampler.join().expect("sampler");
        let at_heal = partial(&setup.masters);
        let p0_granted = ctx.with_record(|r| r.granted_since(0, cut_at));
        net.heal();
        let healed = Instant::now();
        // The connections whose replies were lost are given up, not waited on (TCP's
        // retransmission backoff kept them silent for 5-6 s after an 8 s cut): fresh ones
        // work as soon as the network does.
        setup.recovery(0, 5);
        let recovered = healed.elapsed();
        let deadline = healed + Duration::from_secs(15);
        let mut left = partial(&setup.masters);
        while !left.is_empty() {
            assert!(
                Instant::now() < deadline,
                "p0's partial locks are still on the masters 15 s after the heal (not undone): {left:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
            left = partial(&setup.masters);
        }
        let undone = healed.elapsed();
        let mut after = connect(&setup.proxies[1].url(), Duration::from_secs(5)).expect("connection");
        let reply: redis::RedisResult<Value> = redis::cmd("SET")
            .arg("lock:asym")
            .arg("after")
            .arg("NX")
            .arg("PX")
            .arg(1000)
            .query(&mut after);
        phases.push(phase(&ctx, "healed", 2, &[0, 1]));
        let record = clients.stop();
        phases.push(format!(
            "  p0's acquisitions of lock:asym (20 s TTL) under the cut answered {replies:?}; partial locks seen on \
             the masters: {seen:?}, left at the heal: {at_heal:?}, all gone {} ms after it; p1's acquisition \
             of it then: {reply:?}",
            undone.as_millis()
        ));
        let faults = format!(
            "5 one-way cuts, {} packets dropped; p0 saw its masters up {} ms after the heal",
            net.dropped(),
            recovered.as_millis()
        );
        let found = verdict("replies_lost_on_the_way_back", &record, &faults, &phases);
        assert_eq!(
            p0_granted, 0,
            "p0 granted locks asked for while a majority's replies were lost"
        );
        assert!(
            !seen.is_empty(),
            "no partial lock seen: the acquisition did not land where its replies were lost"
        );
        assert_eq!(reply, Ok(Value::Okay), "the undone lock is free for p1");
        assert!(
            recovered < Duration::from_secs(1),
            "p0 saw its masters up only {recovered:?} after the one-way cut healed"
        );
        check::assert_safe(found);
    });
}

/// Delay and loss (a delay line and random drops in the router; see `tests/support/netns.rs`
/// for why not netem): one proxy's links to two masters slower but within the backend timeout;
/// the other's beyond it (those masters count as not answering); a slow majority (every grant
/// waits for one slow master, its validity shortened by the wait); then 20 % of the packets
/// lost on each proxy's links to three masters (TCP retransmits them, hundreds of ms late).
#[test]
fn delay_and_loss() {
    isolated("delay_and_loss", &LEAVES, |net| {
        let config = "backend_timeout_ms = 150\nmax_ttl_ms = 30000\ndefault_ttl_ms = 2000\nlegacy_ttl_ms = 2000";
        let setup = Setup::start(net, &MASTERS, &both_over_all(), config);
        let mut clients = Clients::new();
        setup.contenders(&mut clients, 3);
        let ctx = clients.ctx().clone();
        let mut phases = vec![phase(&ctx, "healthy", 2, &[0, 1])];
        let mut delayed = 0;
        let line = net.delay("p0", &["m0", "m1"], Duration::from_millis(30));
        phases.push(phase(
            &ctx,
            "p0-m0, p0-m1 delayed 30 ms each way (timeout 150)",
            2,
            &[0, 1],
        ));
        delayed += line.stop();
        let line = net.delay("p1", &["m3", "m4"], Duration::from_millis(100));
        phases.push(phase(
            &ctx,
            "p1-m3, p1-m4 delayed 100 ms each way (beyond it)",
            2,
            &[0, 1],
        ));
        delayed += line.stop();
        let line = net.delay("p0", &["m0", "m1", "m2"], Duration::from_millis(45));
        phases.push(phase(&ctx, "p0 to a majority delayed 45 ms each way", 2, &[0, 1]));
        delayed += line.stop();
        for m in ["m0", "m1", "m2"] {
            net.lose("p0", m, 20);
        }
        for m in ["m2", "m3", "m4"] {
            net.lose("p1", m, 20);
        }
        phases.push(phase(&ctx, "20 % loss on p0-m0..m2 and p1-m2..m4", 2, &[0, 1]));
        net.heal();
        let recovered = [setup.recovery(0, 5), setup.recovery(1, 5)];
        phases.push(phase(&ctx, "healed", 2, &[0, 1]));
        let record = clients.stop();
        let faults = format!(
            "{delayed} packets delayed, {} dropped; all masters up {} ms (p0) and {} ms (p1) after the heal",
            net.dropped(),
            recovered[0].as_millis(),
            recovered[1].as_millis()
        );
        check::assert_safe(verdict("delay_and_loss", &record, &faults, &phases));
    });
}

/// A partition into two sides: {p0, m0, m1, m2} and {p1, m3, m4}. p1 is configured with
/// `p1_masters`. Returns what the clients recorded, p1's grants asked for during the
/// partition, the report's phases and faults.
fn split_brain(net: &Net, test: &str, p1_masters: &[&str]) -> (Record, usize, Vec<String>, String) {
    let setup = Setup::start(net, &MASTERS, &[("p0", &MASTERS), ("p1", p1_masters)], CONFIG);
    for m in ["m3", "m4"] {
        net.cut("p0", m);
    }
    for m in ["m0", "m1", "m2"] {
        net.cut("p1", m);
    }
    let mut clients = Clients::new();
    setup.contenders(&mut clients, 3);
    let ctx = clients.ctx().clone();
    let mut phases = vec![phase(&ctx, "split into {p0, m0-m2} and {p1, m3, m4}", 2, &[0])];
    let p1_granted = ctx.with_record(|r| r.granted_since(1, Duration::ZERO));
    net.heal();
    let recovered = setup.recovery(1, p1_masters.len());
    phases.push(phase(&ctx, "healed", 2, &[0, 1]));
    let record = clients.stop();
    let faults = format!(
        "5 links cut, {} packets dropped; p1 saw its masters up {} ms after the heal",
        net.dropped(),
        recovered.as_millis()
    );
    println!("{test}: p1 over {p1_masters:?}");
    (record, p1_granted, phases, faults)
}

/// Split brain with the protection in place: the minority side's proxy knows all five masters,
/// reaches two, and grants nothing until the heal.
#[test]
fn split_brain_needs_a_majority() {
    isolated("split_brain_needs_a_majority", &LEAVES, |net| {
        let test = "split_brain_needs_a_majority";
        let (record, p1_granted, phases, faults) = split_brain(net, test, &MASTERS);
        let found = verdict(test, &record, &faults, &phases);
        assert_eq!(p1_granted, 0, "the minority side granted locks");
        assert!(
            record.tallies[1].noquorum > 0,
            "the minority side's clients were never told NOQUORUM"
        );
        check::assert_safe(found);
    });
}

/// The control: the same split, with the minority side's proxy configured with only the two
/// masters it reaches (it trusts a minority of the five). Its clients are granted the locks
/// the majority side's clients hold, and the checker must say so.
#[test]
fn split_brain_control_a_proxy_trusting_its_minority_grants_twice() {
    let test = "split_brain_control_a_proxy_trusting_its_minority_grants_twice";
    isolated(test, &LEAVES, |net| {
        let (record, p1_granted, phases, faults) = split_brain(net, test, &["m3", "m4"]);
        let (overlaps, _) = verdict(test, &record, &faults, &phases);
        assert!(p1_granted > 0, "the minority proxy granted nothing");
        assert!(
            overlaps.iter().any(|o| o.contains("proxy 0") && o.contains("proxy 1")),
            "the checker found no grant of the minority side overlapping the majority side's: {overlaps:?}"
        );
    });
}
