//! Leader election on real masters (`ELECT.*`, docs/commands.md "Leader election"): leadership
//! is a fenced session lock per election, its term the grant's fencing token. One leader per
//! term and terms rising; a second campaigner waiting in line and taking over at once when the
//! leader resigns or its connection drops, without polling the masters; observers told of each
//! change by push (RESP3) and by long poll (RESP2), through the proxy that made the change or
//! another one; and the checker: no instant with two leaders of one election, and terms
//! strictly rising per election, while masters are killed, paused and restarted under two
//! proxies, with the checker shown able to fail (on the same leaderships believed a TTL
//! longer, and on an election a client library holds on one master at a time).

mod support;

#[path = "sim/check.rs"]
#[allow(dead_code, reason = "the simulation's checker; this test uses its grants and fences")]
mod check;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use redis_protocol::resp3::types::BytesFrame;
use support::resp3::Resp3;
use support::{
    ProxyProcess, acquisition_rounds, fencing_ready, masters, proxy_with_metrics, query, recipes, scrape, total,
    until_rounds, urls,
};

/// A master's late reply on a loaded machine must not decide the tests below: they are about
/// terms, waits and observers, not timeouts (the fault test keeps the default).
const CONFIG: &str = "backend_timeout_ms = 500";

/// `ELECT.CAMPAIGN` as `args` after the name: the term, `Ok(None)` for nil, `Err` with the
/// error the proxy answered.
fn campaign(c: &mut redis::Connection, args: &[&str]) -> Result<Option<u64>, String> {
    let mut all = vec!["ELECT.CAMPAIGN"];
    all.extend_from_slice(args);
    match query(c, &all) {
        Ok(Value::Int(term)) => Ok(Some(term as u64)),
        Ok(Value::Nil) => Ok(None),
        Ok(other) => panic!("ELECT.CAMPAIGN answered {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

/// A `[value, term]` reply (RESP2), or `None` for nil.
fn leader_of(reply: Value) -> Option<(String, u64)> {
    match reply {
        Value::Nil => None,
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(v), Value::Int(t)] => Some((String::from_utf8_lossy(v).into_owned(), *t as u64)),
            other => panic!("not [value, term]: {other:?}"),
        },
        other => panic!("not a leader: {other:?}"),
    }
}

fn leader(c: &mut redis::Connection, election: &str) -> Option<(String, u64)> {
    leader_of(query(c, &["ELECT.LEADER", election]).expect("ELECT.LEADER"))
}

/// Waits until the proxy `c` talks to has `n` requests waiting in an election's line.
fn until_waiting(c: &mut redis::Connection, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let wanted = format!("waiting={n}");
    loop {
        let Ok(Value::Array(lines)) = query(c, &["PROXY", "LOCKS", "redlock-proxy:elect:*"]) else {
            panic!("PROXY LOCKS");
        };
        let text: Vec<String> = lines
            .iter()
            .map(|l| match l {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        if text.iter().any(|l| l.ends_with(&wanted)) {
            return;
        }
        assert!(Instant::now() < deadline, "never {wanted}: {text:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// The fencing write-backs the proxy with `/metrics` on `metrics` has sent
/// (`redlock_fence_write_backs_total`): each is one more script on every master.
fn write_backs(metrics: u16) -> i64 {
    total(&scrape(metrics), "redlock_fence_write_backs_total") as i64
}

/// A frame's text or integer items, `nil` for a null.
fn items(frame: &BytesFrame) -> Vec<String> {
    let data = match frame {
        BytesFrame::Push { data, .. } | BytesFrame::Array { data, .. } => data,
        BytesFrame::Null => return vec!["nil".into()],
        other => panic!("not an array or push: {other:?}"),
    };
    data.iter()
        .map(|f| match f {
            BytesFrame::BlobString { data, .. } => String::from_utf8_lossy(data).into_owned(),
            BytesFrame::Number { data, .. } => data.to_string(),
            BytesFrame::Null => "nil".into(),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn one_leader_per_term_a_waiter_takes_over_at_once_on_resign_and_on_a_dropped_connection() {
    let servers = masters(3);
    let (proxy, metrics) = proxy_with_metrics(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut a = proxy.client();
    let mut reader = proxy.client();
    assert_eq!(leader(&mut reader, "svc"), None, "nobody leads yet");
    let t1 = campaign(&mut a, &["svc", "10.0.0.1:7000", "1000"])
        .expect("A")
        .expect("A leads");
    assert_eq!(leader(&mut reader, "svc"), Some(("10.0.0.1:7000".into(), t1)));
    // One leader: another campaign without WAIT is nil, and the leadership is kept alive past
    // its TTL while A's connection is open (a session lock).
    let mut other = proxy.client();
    assert_eq!(campaign(&mut other, &["svc", "x", "1000"]), Ok(None));
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(leader(&mut reader, "svc"), Some(("10.0.0.1:7000".into(), t1)));
    // B waits in line (through its own connection, in a thread).
    let (tx, rx) = mpsc::channel();
    let rounds = acquisition_rounds(metrics);
    let spawned = Instant::now();
    let b = {
        let port = proxy.port;
        let tx = tx.clone();
        thread::spawn(move || {
            let mut b = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection())
                .expect("B");
            let term = campaign(&mut b, &["svc", "10.0.0.2:7000", "5000", "WAIT", "20000"]);
            tx.send((term, Instant::now())).expect("send");
            // B stays leader until its connection drops.
            b
        })
    };
    until_waiting(&mut reader, 1);
    // `PROXY LOCKS` shows B in line from its enqueueing, before its first try is sent: the
    // window below opens once that try (refused) is over on every master, or its scripts
    // would land in it.
    until_rounds(metrics, rounds + 1);
    // While it waits, nobody polls the masters. What they may serve meanwhile, on each: A's
    // keepalive, one extension at least TTL/3 after the last one answered, so at most
    // ⌊window / (TTL/3)⌋ + 1 in the window (4 in 1 s: the window outlasts the sleep, and the
    // fourth tick of a period just over 1/3 s fits in it now and then); B's tries after its
    // first, each when the PTTL of A's lease its refusal reported has passed, which A's
    // keepalive keeps above 2 TTL/3 less an extension's round (TTL/10 allowed for it on a
    // loaded machine), so at most ⌊time since B began / (2 TTL/3 − TTL/10)⌋; and a fencing
    // write-back, counted by the proxy.
    let ttl = Duration::from_millis(1000);
    let opened = Instant::now();
    let (scripts, written) = (recipes::script_calls(&servers), write_backs(metrics));
    let tries = acquisition_rounds(metrics);
    thread::sleep(Duration::from_millis(1000));
    let during = recipes::script_calls(&servers) - scripts;
    let (tries, written) = (acquisition_rounds(metrics) - tries, write_backs(metrics) - written);
    let (window, waited) = (opened.elapsed(), spawned.elapsed());
    let extensions = (window.as_micros() / (ttl / 3).as_micros()) as i64 + 1;
    let retries = (waited.as_micros() / (ttl * 2 / 3 - ttl / 10).as_micros()) as i64;
    assert!(
        tries <= retries,
        "B tried {tries} times in {window:?} while A's lease was kept: at most {retries} can run out"
    );
    assert!(
        during <= 3 * (extensions + retries + written),
        "{during} scripts on the masters in {window:?} while B waited: more than {extensions} extensions of A, {retries} tries of B and {written} fencing write-backs on each of 3"
    );
    // A resigns: B leads at once, with a higher term.
    assert_eq!(query(&mut a, &["ELECT.RESIGN", "svc", "nobody"]), Ok(Value::Int(0)));
    let resigned = Instant::now();
    assert_eq!(
        query(&mut a, &["ELECT.RESIGN", "svc", "10.0.0.1:7000"]),
        Ok(Value::Int(1))
    );
    let (term, at) = rx.recv_timeout(Duration::from_secs(10)).expect("B's campaign");
    let t2 = term.expect("B").expect("B leads");
    assert!(t2 > t1, "terms rise: {t1} then {t2}");
    assert!(
        at - resigned < Duration::from_millis(500),
        "B led after {:?}",
        at - resigned
    );
    assert_eq!(leader(&mut reader, "svc"), Some(("10.0.0.2:7000".into(), t2)));
    // C waits; B's connection drops (its client dies): C leads at once, not after B's 5 s TTL.
    let c = {
        let port = proxy.port;
        thread::spawn(move || {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection())
                .expect("C");
            let term = campaign(&mut c, &["svc", "10.0.0.3:7000", "5000", "WAIT", "20000"]);
            tx.send((term, Instant::now())).expect("send");
            c
        })
    };
    until_waiting(&mut reader, 1);
    let dropped = Instant::now();
    drop(b.join().expect("B"));
    let (term, at) = rx.recv_timeout(Duration::from_secs(10)).expect("C's campaign");
    let t3 = term.expect("C").expect("C leads");
    assert!(t3 > t2, "terms rise: {t2} then {t3}");
    assert!(
        at - dropped < Duration::from_millis(1000),
        "C led after {:?}",
        at - dropped
    );
    assert_eq!(leader(&mut reader, "svc"), Some(("10.0.0.3:7000".into(), t3)));
    drop(c.join().expect("C"));
}

#[test]
fn observers_are_told_by_push_and_by_long_poll_including_changes_through_another_proxy() {
    let servers = masters(3);
    let p1 = ProxyProcess::start(&urls(&servers), CONFIG);
    let p2 = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&p1);
    let mut observer = Resp3::connect(&p1);
    assert_eq!(items(&observer.call(&["ELECT.OBSERVE", "db"])), ["nil"]);
    // A RESP2 client cannot be pushed to: it is told how to long-poll.
    let mut poller = p1.client();
    let e = query(&mut poller, &["ELECT.OBSERVE", "db"]).expect_err("RESP2 without AFTER");
    assert!(e.to_string().contains("AFTER"), "{e}");
    // A leader elected through the other proxy is pushed here (nothing else watches it here).
    let mut a = p2.client();
    let elected = Instant::now();
    let t1 = campaign(&mut a, &["db", "db-a", "3000"]).expect("A").expect("A leads");
    let push = observer.next();
    let told = elected.elapsed();
    assert!(matches!(push, BytesFrame::Push { .. }), "{push:?}");
    assert_eq!(items(&push), ["leader", "db", "db-a", &t1.to_string()]);
    assert!(told < Duration::from_millis(1000), "told after {told:?}");
    // A long poll after another term answers at once; after the current term, it times out
    // with the current leader.
    let poll = |c: &mut redis::Connection, after: u64, ms: u64| {
        let (after, ms) = (after.to_string(), ms.to_string());
        leader_of(query(c, &["ELECT.OBSERVE", "db", "AFTER", &after, "TIMEOUT", &ms]).expect("poll"))
    };
    assert_eq!(poll(&mut poller, 0, 10000), Some(("db-a".into(), t1)));
    let started = Instant::now();
    assert_eq!(poll(&mut poller, t1, 300), Some(("db-a".into(), t1)));
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A long poll here after A's term; B waits here; A's connection (on the other proxy)
    // drops: the observer is told, in order, at most "nobody" and then B with a higher term,
    // and the long poll answers the change, after it.
    let polled = {
        let port = p1.port;
        thread::spawn(move || {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection())
                .expect("poller");
            (poll(&mut c, t1, 10000), Instant::now())
        })
    };
    let (tx, rx) = mpsc::channel();
    let b = {
        let port = p1.port;
        thread::spawn(move || {
            let mut b = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection())
                .expect("B");
            tx.send(campaign(&mut b, &["db", "db-b", "3000", "WAIT", "20000"]))
                .expect("send");
            b
        })
    };
    until_waiting(&mut poller, 1);
    // (The poll has had time to start waiting; if it had not, it would answer later anyway.)
    thread::sleep(Duration::from_millis(200));
    let dropped = Instant::now();
    drop(a);
    let t2 = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("B")
        .expect("B")
        .expect("B leads");
    assert!(t2 > t1);
    let mut push = observer.next();
    if items(&push) == ["leader", "db", "nil", "nil"] {
        push = observer.next();
    }
    let told = dropped.elapsed();
    assert_eq!(items(&push), ["leader", "db", "db-b", &t2.to_string()]);
    assert!(told < Duration::from_millis(1000), "told after {told:?}");
    let (seen, answered) = polled.join().expect("poll");
    assert!(answered > dropped, "the long poll answered before the change");
    assert!(
        answered - dropped < Duration::from_millis(1000),
        "{:?}",
        answered - dropped
    );
    if let Some(seen) = seen {
        assert_eq!(seen, ("db-b".into(), t2));
    }
    // B resigns: "nobody" is pushed; after UNOBSERVE nothing more is.
    let mut b = b.join().expect("B");
    assert_eq!(query(&mut b, &["ELECT.RESIGN", "db", "db-b"]), Ok(Value::Int(1)));
    assert_eq!(items(&observer.next()), ["leader", "db", "nil", "nil"]);
    assert!(matches!(
        observer.call(&["ELECT.UNOBSERVE", "db"]),
        BytesFrame::Number { data: 1, .. }
    ));
    let mut c = p2.client();
    let t3 = campaign(&mut c, &["db", "db-c", "3000"]).expect("C").expect("C leads");
    assert!(t3 > t2);
    assert_eq!(leader(&mut poller, "db"), Some(("db-c".into(), t3)));
    assert!(
        matches!(observer.call(&["PING"]), BytesFrame::SimpleString { .. }),
        "no push after UNOBSERVE"
    );
    // Switching to RESP2 ends an observation: no push reaches a RESP2 connection.
    assert_eq!(
        items(&observer.call(&["ELECT.OBSERVE", "db"])),
        ["db-c", &t3.to_string()]
    );
    assert!(matches!(observer.call(&["HELLO", "2"]), BytesFrame::Array { .. }));
    assert_eq!(query(&mut c, &["ELECT.RESIGN", "db", "db-c"]), Ok(Value::Int(1)));
    assert_eq!(leader(&mut poller, "db"), None);
    assert!(
        matches!(observer.call(&["PING"]), BytesFrame::SimpleString { .. }),
        "no push after HELLO 2"
    );
}

/// The latest a leadership can be valid, as the client can compute it from when it sent its
/// campaign (rule 4: ttl − elapsed − (ttl × 0.01 + 2 ms)); the fault test's leaders resign
/// before it, so the keepalive never has to be trusted by the checker.
fn validity_end(sent: Duration, ttl_ms: u64) -> Duration {
    let ttl = Duration::from_millis(ttl_ms);
    sent + ttl - ttl / 100 - Duration::from_millis(2)
}

/// What the campaigners of the fault test saw.
#[derive(Default)]
struct Seen {
    history: check::History,
    /// Campaigns answered nil (somebody led), and errors (`NOQUORUM`...) by text.
    refused: usize,
    errors: BTreeMap<String, usize>,
    waited: usize,
    /// Resignations that were not a quorum's release (the campaigner reconnected: its session
    /// ends with its connection).
    unresigned: usize,
}

/// The elections the fault test's campaigners share.
const ELECTIONS: [&str; 3] = ["el:a", "el:b", "el:c"];

fn connect(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("campaigner connection")
}

/// A campaigner: campaigns for one of [`ELECTIONS`] through `port` (every other round waiting
/// in line), leads briefly, resigns; records each leadership and its term.
fn campaigner(name: String, port: u16, origin: Instant, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>, n: u64) {
    let mut c = connect(port);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let election = ELECTIONS[((i + n) % 3) as usize];
        let value = format!("{name}-{i}");
        let ttl_ms = 200 + (i * 37 + n) % 500;
        let ttl = ttl_ms.to_string();
        let mut args = vec![election, &value, &ttl];
        let waits = i.is_multiple_of(2);
        if waits {
            args.extend(["WAIT", "150"]);
        }
        let sent = origin.elapsed();
        let reply = campaign(&mut c, &args);
        let from = origin.elapsed();
        let Ok(Some(term)) = reply else {
            let mut seen = seen.lock().expect("seen");
            match reply {
                Ok(_) => seen.refused += 1,
                Err(e) => *seen.errors.entry(e.chars().take(60).collect()).or_default() += 1,
            }
            continue;
        };
        thread::sleep(Duration::from_millis(i % 3));
        let resign_at = origin.elapsed();
        let resigned = query(&mut c, &["ELECT.RESIGN", election, &value]);
        let mut seen = seen.lock().expect("seen");
        if resigned != Ok(Value::Int(1)) {
            // Not released by a quorum (or told lost): the session ends with the connection.
            seen.unresigned += 1;
            c = connect(port);
        }
        seen.waited += usize::from(waits);
        seen.history.fence(check::Fence {
            key: election.to_owned(),
            token: term,
            holder: value.clone(),
            sent,
            answered: from,
        });
        seen.history.grant(check::Grant {
            key: election.to_owned(),
            token: value,
            proxy: (n % 2) as usize,
            from,
            until: resign_at.min(validity_end(sent, ttl_ms)),
        });
    }
}

#[test]
fn one_leader_per_term_and_terms_rising_under_master_faults_across_two_proxies() {
    let (seen, report) = recipes::under_faults(
        "leaderships",
        8,
        |n, port, origin, stop, seen| campaigner(format!("c{n}"), port, origin, stop, seen, n as u64),
        |seen: &Seen| seen.history.len(),
    );
    println!("{}", report.join("\n"));
    println!(
        "{} leaderships ({} terms; {} after a WAIT), {} refused, {} not resigned by a quorum, errors {:?}",
        seen.history.len(),
        seen.history.fences(),
        seen.waited,
        seen.refused,
        seen.unresigned,
        seen.errors
    );
    let overlaps = seen.history.overlaps();
    let regressions = seen.history.fence_regressions();
    for o in overlaps.iter().take(5) {
        println!("TWO LEADERS: {o}");
    }
    // Coverage: enough leaderships in every election, contention (refusals) and waits.
    for election in ELECTIONS {
        let n = seen.history.grants().iter().filter(|g| g.key == election).count();
        assert!(n >= 50, "{election}: only {n} leaderships");
    }
    assert!(
        seen.refused >= 20 && seen.waited >= 30,
        "refused {}, waited {}",
        seen.refused,
        seen.waited
    );
    // The control: the same leaderships, each believed for a TTL longer than it was valid,
    // show instants with two leaders: the checker can fail.
    let mut late = check::History::default();
    for g in seen.history.grants() {
        let mut g = g.clone();
        g.until += Duration::from_millis(700);
        late.grant(g);
    }
    assert!(!late.overlaps().is_empty(), "the checker never fails on late beliefs");
    check::assert_safe((overlaps, regressions));
}

/// A client library's election held on one master at a time (each campaigner keeps the first
/// master that says yes, and takes its term from that master's counter), as the fault test's
/// checker sees it: two leaders at once, and a term not above the one before.
#[test]
fn the_checker_catches_an_election_held_on_one_master_at_a_time() {
    let servers = masters(3);
    let origin = Instant::now();
    let mut history = check::History::default();
    for (who, server) in [("a", &servers[0]), ("b", &servers[1])] {
        let mut c = server.client();
        let sent = origin.elapsed();
        let took: Value = redis::cmd("SET")
            .arg("el")
            .arg(who)
            .arg("NX")
            .arg("PX")
            .arg(5000)
            .query(&mut c)
            .expect("SET NX");
        assert_eq!(took, Value::Okay, "{who} leads on its master");
        let term: u64 = redis::cmd("INCR").arg("el:term").query(&mut c).expect("INCR");
        let from = origin.elapsed();
        history.fence(check::Fence {
            key: "el".into(),
            token: term,
            holder: who.into(),
            sent,
            answered: from,
        });
        history.grant(check::Grant {
            key: "el".into(),
            token: who.into(),
            proxy: 0,
            from,
            until: validity_end(sent, 5000),
        });
    }
    assert!(!history.overlaps().is_empty(), "two leaders at once are seen");
    assert!(
        !history.fence_regressions().is_empty(),
        "a term not above the last is seen"
    );
    // The proxy, asked the same on the same masters, elects one leader with rising terms.
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let (mut a, mut b) = (proxy.client(), proxy.client());
    let t1 = campaign(&mut a, &["el2", "a", "5000"]).expect("a").expect("a leads");
    assert_eq!(campaign(&mut b, &["el2", "b", "5000"]), Ok(None));
    assert_eq!(query(&mut a, &["ELECT.RESIGN", "el2", "a"]), Ok(Value::Int(1)));
    let t2 = campaign(&mut b, &["el2", "b", "5000"]).expect("b").expect("b leads");
    assert!(t2 > t1);
}

/// A candidate that observes its election on the connection it campaigns on is told of other
/// leaders while its campaign waits (its pushes do not wait for its campaign's reply), and
/// of itself once it leads.
#[test]
fn a_candidate_observing_its_election_is_told_while_its_campaign_waits() {
    let servers = masters(3);
    let p1 = ProxyProcess::start(&urls(&servers), CONFIG);
    let p2 = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&p1);
    let mut me = Resp3::connect(&p1);
    assert_eq!(items(&me.call(&["ELECT.OBSERVE", "jobs"])), ["nil"]);
    let mut a = p2.client();
    let t1 = campaign(&mut a, &["jobs", "a", "3000"]).expect("A").expect("A leads");
    assert_eq!(items(&me.next()), ["leader", "jobs", "a", &t1.to_string()]);
    me.send(&["ELECT.CAMPAIGN", "jobs", "me", "3000", "WAIT", "20000"]);
    let mut reader = p1.client();
    until_waiting(&mut reader, 1);
    // A resigns; another leader may come and go first: each is pushed while the campaign
    // waits, and the campaign's term comes with a push of this candidate.
    assert_eq!(query(&mut a, &["ELECT.RESIGN", "jobs", "a"]), Ok(Value::Int(1)));
    let mut term = None;
    let mut pushed_me = None;
    while term.is_none() || pushed_me.is_none() {
        match me.next() {
            BytesFrame::Number { data, .. } => term = Some(data as u64),
            push @ BytesFrame::Push { .. } => {
                let got = items(&push);
                if got[2] == "me" {
                    pushed_me = Some(got[3].parse::<u64>().expect("term"));
                } else {
                    assert_eq!(got[..3], ["leader", "jobs", "nil"], "{got:?}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(term, pushed_me);
    assert!(term.expect("term") > t1);
}

/// Waits until `proxy` reports member `i` in `state` (`INFO backends`).
fn until_member(proxy: &ProxyProcess, i: usize, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let wanted = format!("state={state}");
    while !support::backend_line(proxy, i).contains(&wanted) {
        assert!(Instant::now() < deadline, "member {i} never {wanted}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Issue 36, item 9, on real masters: a leader that a quorum holds is named, with the term
/// its campaign was answered, although one master that holds it shows a higher counter. L
/// leads while master 4 is down; two rivals are refused, and each bumps master 4's counter,
/// where the lock is free (and is undone there); L resigns; N is granted while master 4 is
/// paused, and its write lands there when it resumes, bumping master 4's counter past N's
/// term. Before, `ELECT.LEADER` answered nil for N's whole term (the highest counter among
/// the holders, vouched for by one master, was taken for the term).
#[test]
fn a_leader_is_named_although_a_master_holding_it_shows_a_higher_counter() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let key = "redlock-proxy:elect:{e}:e";
    let counter_key = format!("redlock-proxy:fence:c:{key}");
    let counter = |i: usize| -> Option<u64> {
        let value = servers[i].get(&counter_key)?;
        value.rsplit(' ').next()?.parse().ok()
    };
    // Master 4 down: L's grant never reaches it.
    servers[4].pause();
    until_member(&proxy, 4, "down");
    let mut l = proxy.client();
    let t_l = campaign(&mut l, &["e", "L", "30000"]).expect("L").expect("L leads");
    servers[4].resume();
    until_member(&proxy, 4, "up");
    // Two rivals, refused (well before L's first extension heals the lock onto master 4).
    for rival in ["R1", "R2"] {
        assert_eq!(campaign(&mut proxy.client(), &["e", rival, "30000"]), Ok(None));
    }
    assert_eq!(servers[4].get(key), None, "the rivals were undone on master 4");
    let mut reader = proxy.client();
    assert_eq!(leader(&mut reader, "e"), Some(("L".into(), t_l)));
    assert_eq!(
        query(&mut l, &["ELECT.RESIGN", "e", "L"]).expect("resign"),
        Value::Int(1)
    );
    // N, while master 4 is paused: granted by masters 0-3, its write on master 4 queued.
    servers[4].pause();
    let mut n = proxy.client();
    let granted = campaign(&mut n, &["e", "N", "30000"]);
    servers[4].resume();
    let t_n = granted.expect("N").expect("N leads");
    assert!(t_n > t_l);
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers[4].get(key).as_deref() != Some("N") {
        assert!(Instant::now() < deadline, "N's write never landed on master 4");
        thread::sleep(Duration::from_millis(10));
    }
    // The scenario: N held on all five, four counters at N's term, master 4's above it.
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(server.get(key).as_deref(), Some("N"), "master {i}");
    }
    assert_eq!((0..4).map(counter).collect::<Vec<_>>(), vec![Some(t_n); 4]);
    assert!(
        counter(4).is_some_and(|c| c > t_n),
        "master 4's counter {:?}, N's term {t_n}",
        counter(4)
    );
    // N leads, in the term it was granted, through every reading.
    assert_eq!(leader(&mut reader, "e"), Some(("N".into(), t_n)));
    assert_eq!(leader(&mut proxy.client(), "e"), Some(("N".into(), t_n)));
}
