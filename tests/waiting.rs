//! Waiting for a lock on real masters: `LOCK.ACQUIRE key token ttl WAIT ms` queues in the
//! proxy, first come first served, and tries again only when the lock can have become free:
//! a release through this proxy, a release through another proxy (announced on the
//! masters), or the holder's TTL running out. A waiter that disconnects leaves the queue;
//! queues are bounded.

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use support::{ProxyProcess, fencing_ready, masters, proxy_with_metrics, query as cmd, scrape, total, urls};

/// A field of `LOCK.INFO key`'s map.
fn info_field(c: &mut redis::Connection, key: &str, field: &str) -> Value {
    let Ok(Value::Array(items)) = cmd(c, &["LOCK.INFO", key]) else {
        panic!("LOCK.INFO");
    };
    items
        .chunks(2)
        .find(|kv| kv[0] == Value::BulkString(field.as_bytes().to_vec()))
        .map(|kv| kv[1].clone())
        .unwrap_or_else(|| panic!("no {field} in LOCK.INFO"))
}

/// Waits until `n` requests wait for `key` in the proxy `c` talks to.
fn until_waiting(c: &mut redis::Connection, key: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_field(c, key, "waiting") != Value::Int(n) {
        assert!(Instant::now() < deadline, "never {n} waiting for {key}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Starts a client on its own thread that waits for `key` with `token`; its reply (and how
/// long it took) arrives on the channel.
fn waiter(
    proxy: &ProxyProcess,
    key: &'static str,
    token: &'static str,
    ttl: &'static str,
    wait: &'static str,
    done: mpsc::Sender<(&'static str, Value, Duration)>,
) -> thread::JoinHandle<redis::Connection> {
    let mut c = proxy.client();
    thread::spawn(move || {
        let start = Instant::now();
        let reply = cmd(&mut c, &["LOCK.ACQUIRE", key, token, ttl, "WAIT", wait]).expect("LOCK.ACQUIRE WAIT");
        let _ = done.send((token, reply, start.elapsed()));
        c
    })
}

/// The waits are under test, not the timeouts: a master's reply that comes late on a loaded
/// machine must not end a wait.
const CONFIG: &str = "backend_timeout_ms = 500";

fn granted(reply: &Value) -> bool {
    matches!(reply, Value::Int(_))
}

#[test]
fn waiters_get_the_lock_in_order_one_hand_off_per_release() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert!(granted(
        &cmd(&mut holder, &["LOCK.ACQUIRE", "lock:q", "h", "30000"]).unwrap()
    ));
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for (n, token) in ["w1", "w2", "w3"].into_iter().enumerate() {
        threads.push(waiter(&proxy, "lock:q", token, "30000", "10000", tx.clone()));
        until_waiting(&mut holder, "lock:q", n as i64 + 1);
    }
    // Each release hands the lock to the next in line, and to nobody else.
    let mut releaser = holder;
    let mut current = "h";
    for expected in ["w1", "w2", "w3"] {
        assert_eq!(
            cmd(&mut releaser, &["LOCK.RELEASE", "lock:q", current]),
            Ok(Value::Int(1))
        );
        let (token, reply, waited) = rx.recv_timeout(Duration::from_secs(5)).expect("a hand-off");
        assert_eq!(token, expected, "out of order");
        assert!(granted(&reply), "{reply:?}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        assert!(rx.try_recv().is_err(), "two waiters woke for one release");
        current = expected;
    }
    for t in threads {
        t.join().expect("waiter");
    }
}

#[test]
fn a_release_through_another_proxy_wakes_the_waiter() {
    let servers = masters(3);
    let backends = urls(&servers);
    let (first, second) = (
        ProxyProcess::start(&backends, CONFIG),
        ProxyProcess::start(&backends, CONFIG),
    );
    fencing_ready(&first);
    fencing_ready(&second);
    let mut holder = first.client();
    assert!(granted(
        &cmd(&mut holder, &["LOCK.ACQUIRE", "lock:x", "h", "30000"]).unwrap()
    ));
    let (tx, rx) = mpsc::channel();
    let t = waiter(&second, "lock:x", "w", "30000", "10000", tx);
    until_waiting(&mut second.client(), "lock:x", 1);
    let released = Instant::now();
    assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", "lock:x", "h"]), Ok(Value::Int(1)));
    let (_, reply, _) = rx.recv_timeout(Duration::from_secs(5)).expect("woken");
    assert!(granted(&reply), "{reply:?}");
    // Woken by the release (the holder's TTL was 30 s).
    assert!(released.elapsed() < Duration::from_secs(2), "{:?}", released.elapsed());
    t.join().expect("waiter");
}

/// The `eval` and `evalsha` calls the masters have served, less those that failed (an
/// `EVALSHA` meeting a master's empty script cache is sent again as `EVAL`, once per master
/// and script). Every request of the lock paths is a script: acquisitions, releases and the
/// announcements riding on them.
fn script_calls(servers: &[support::RedisServer]) -> i64 {
    servers
        .iter()
        .map(|s| {
            let mut c = redis::Client::open(s.url())
                .and_then(|c| c.get_connection())
                .expect("master");
            let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut c).expect("INFO");
            stats
                .lines()
                .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
                .map(|l| field(l, "calls") - field(l, "failed_calls"))
                .sum::<i64>()
        })
        .sum()
}

/// The fencing write-backs the proxies on `metrics` sent so far
/// (`redlock_fence_write_backs_total`): each is one more script on every master. A hand-off
/// can need one without anybody trying out of turn: when the head acts on a quorum's copies
/// of the release, the last master may still hold the old lock, refuse, and so keep its
/// fencing counter one behind; the next grant that counts that master's bump writes the
/// token back.
fn write_backs(metrics: &[u16]) -> i64 {
    metrics
        .iter()
        .map(|&port| total(&scrape(port), "redlock_fence_write_backs_total") as i64)
        .sum()
}

/// A number in a `cmdstat_` line: `name=<n>`.
fn field(line: &str, name: &str) -> i64 {
    line.split([':', ','])
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn proxies_take_turns_and_each_hand_off_is_one_release_and_one_acquisition() {
    let servers = masters(3);
    let backends = urls(&servers);
    let ((a, a_metrics), (b, b_metrics)) = (
        proxy_with_metrics(&backends, CONFIG),
        proxy_with_metrics(&backends, CONFIG),
    );
    fencing_ready(&a);
    fencing_ready(&b);
    let mut holder = a.client();
    assert!(granted(
        &cmd(&mut holder, &["LOCK.ACQUIRE", "lock:turns", "h", "30000"]).unwrap()
    ));
    // Three waiters at each proxy; each releases the lock as soon as it has it.
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for (proxy, tokens) in [(&a, ["a1", "a2", "a3"]), (&b, ["b1", "b2", "b3"])] {
        for (n, token) in tokens.into_iter().enumerate() {
            let mut c = proxy.client();
            let tx = tx.clone();
            threads.push(thread::spawn(move || {
                let reply = cmd(&mut c, &["LOCK.ACQUIRE", "lock:turns", token, "30000", "WAIT", "20000"]);
                tx.send(token).expect("send");
                assert!(granted(&reply.expect("LOCK.ACQUIRE")), "{token}");
                assert_eq!(cmd(&mut c, &["LOCK.RELEASE", "lock:turns", token]), Ok(Value::Int(1)));
            }));
            until_waiting(&mut proxy.client(), "lock:turns", n as i64 + 1);
        }
    }
    // Each proxy has heard that the other has waiters (its head was refused and said so).
    for (proxy, name) in [(&a, "a"), (&b, "b")] {
        let mut c = proxy.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        while info_field(&mut c, "lock:turns", "proxies_waiting") != Value::Int(1) {
            assert!(
                Instant::now() < deadline,
                "proxy {name} never heard of the other's waiters"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
    let (before, written) = (script_calls(&servers), write_backs(&[a_metrics, b_metrics]));
    assert_eq!(
        cmd(&mut holder, &["LOCK.RELEASE", "lock:turns", "h"]),
        Ok(Value::Int(1))
    );
    let order: Vec<&str> = (0..6)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("a hand-off"))
        .collect();
    for t in threads {
        t.join().expect("waiter");
    }
    // First come, first served at each proxy, and turn by turn across them.
    assert_eq!(order, ["a1", "b1", "a2", "b2", "a3", "b3"]);
    // One release (N) and one acquisition (N) per hand-off, and nothing else but fencing
    // write-backs (counted by the proxies, N each): no head tried out of turn, and the
    // announcements rode on the releases.
    let written = write_backs(&[a_metrics, b_metrics]) - written;
    let spent = script_calls(&servers) - before - 3 * written;
    assert_eq!(spent, 3 * (7 + 6), "7 releases and 6 acquisitions on 3 masters");
}

/// Hand-offs of a recipe between two proxies' waiters (`acquire`/`release`: the commands, the
/// token where `{}` stands; `info`: a field of the recipe's INFO map for its queue): one
/// release and one acquisition per hand-off, the announcements riding on the release scripts
/// (no request of their own: not counted here, since the masters' statistics count a script's
/// `PUBLISH` as one). With `two_proxies`, the waiters are spread over two proxies.
fn hand_offs_cost_one_release_and_one_acquisition(
    acquire: &[&str],
    release: &[&str],
    info: impl Fn(&mut redis::Connection, &str) -> i64,
    two_proxies: bool,
) {
    let servers = masters(3);
    let backends = urls(&servers);
    let (a, a_metrics) = proxy_with_metrics(&backends, CONFIG);
    let second = two_proxies.then(|| proxy_with_metrics(&backends, CONFIG));
    let b = second.as_ref().map_or(&a, |(b, _)| b);
    let ports: Vec<u16> = std::iter::once(a_metrics)
        .chain(second.as_ref().map(|(_, port)| *port))
        .collect();
    fencing_ready(&a);
    fencing_ready(b);
    let with = |parts: &[&str], token: &str| -> Vec<String> {
        parts
            .iter()
            .map(|p| if *p == "{}" { token.to_owned() } else { (*p).to_owned() })
            .collect()
    };
    let mut holder = a.client();
    let args = with(acquire, "h");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(
        matches!(cmd(&mut holder, &refs), Ok(Value::Int(_) | Value::Array(_))),
        "the first holder"
    );
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    let mut queued = 0;
    for (proxy, tokens) in [(&a, ["a1", "a2"]), (b, ["b1", "b2"])] {
        let mut n = if two_proxies { 0 } else { queued };
        for token in tokens {
            let mut c = proxy.client();
            let tx = tx.clone();
            let (mut acq, rel) = (with(acquire, token), with(release, token));
            acq.extend(["WAIT".to_owned(), "20000".to_owned()]);
            threads.push(thread::spawn(move || {
                let acq: Vec<&str> = acq.iter().map(String::as_str).collect();
                let rel: Vec<&str> = rel.iter().map(String::as_str).collect();
                let reply = cmd(&mut c, &acq).expect("acquire");
                tx.send(token).expect("send");
                assert!(matches!(reply, Value::Int(_) | Value::Array(_)), "{token}: {reply:?}");
                assert!(
                    matches!(cmd(&mut c, &rel), Ok(Value::Int(n)) if n >= 1),
                    "{token}'s release"
                );
            }));
            let mut c = proxy.client();
            let deadline = Instant::now() + Duration::from_secs(10);
            n += 1;
            queued += 1;
            while info(&mut c, "waiting") != n {
                assert!(Instant::now() < deadline, "{token} never waited");
                thread::sleep(Duration::from_millis(5));
            }
        }
    }
    // Each proxy has heard that the other has waiters (its head was refused and said so).
    for proxy in [&a, b].into_iter().filter(|_| two_proxies) {
        let mut c = proxy.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        while info(&mut c, "proxies_waiting") != 1 {
            assert!(Instant::now() < deadline, "a proxy never heard of the other's waiters");
            thread::sleep(Duration::from_millis(5));
        }
    }
    let (scripts, written) = (script_calls(&servers), write_backs(&ports));
    let args = with(release, "h");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(matches!(cmd(&mut holder, &refs), Ok(Value::Int(n)) if n >= 1));
    for _ in 0..4 {
        rx.recv_timeout(Duration::from_secs(10)).expect("a hand-off");
    }
    for t in threads {
        t.join().expect("waiter");
    }
    let written = write_backs(&ports) - written;
    assert_eq!(
        script_calls(&servers) - scripts - 3 * written,
        3 * (5 + 4),
        "5 releases and 4 acquisitions on 3 masters"
    );
}

#[test]
fn a_writers_hand_off_is_one_release_and_one_acquisition() {
    hand_offs_cost_one_release_and_one_acquisition(
        &["RWLOCK.WRITE", "rw:turns", "{}", "30000"],
        &["RWLOCK.RELEASE", "rw:turns", "{}"],
        |c, field| match cmd(c, &["RWLOCK.INFO", "rw:turns"]) {
            Ok(Value::Array(a)) => a
                .chunks(2)
                .find(|kv| kv[0] == Value::BulkString(field.as_bytes().to_vec()))
                .and_then(|kv| if let Value::Int(n) = kv[1] { Some(n) } else { None })
                .unwrap_or(-1),
            _ => -1,
        },
        true,
    );
}

#[test]
fn a_sets_hand_off_is_one_release_and_one_acquisition() {
    hand_offs_cost_one_release_and_one_acquisition(
        &["LOCK.ACQUIREALL", "{}", "30000", "3", "set:a", "set:b", "set:c"],
        &["LOCK.RELEASEALL", "{}", "3", "set:a", "set:b", "set:c"],
        |c, field| match info_field(c, "set:a", field) {
            Value::Int(n) => n,
            _ => -1,
        },
        false,
    );
}

#[test]
fn a_waiter_wakes_when_the_holders_ttl_runs_out() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    // The holder crashes, in effect: it never releases its 600 ms lock.
    assert!(granted(
        &cmd(&mut holder, &["LOCK.ACQUIRE", "lock:t", "h", "600"]).unwrap()
    ));
    let (tx, rx) = mpsc::channel();
    let t = waiter(&proxy, "lock:t", "w", "30000", "5000", tx);
    let (_, reply, waited) = rx.recv_timeout(Duration::from_secs(8)).expect("woken");
    assert!(granted(&reply), "{reply:?}");
    assert!(
        (Duration::from_millis(300)..Duration::from_millis(2000)).contains(&waited),
        "took the lock after {waited:?}"
    );
    t.join().expect("waiter");
}

#[test]
fn a_waiter_that_disconnects_leaves_the_queue_and_waits_end_at_their_deadline() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert!(granted(
        &cmd(&mut holder, &["LOCK.ACQUIRE", "lock:d", "h", "30000"]).unwrap()
    ));
    // A raw client queues, then goes away.
    let mut gone = proxy.raw();
    std::io::Write::write_all(
        &mut gone,
        b"*6\r\n$12\r\nLOCK.ACQUIRE\r\n$6\r\nlock:d\r\n$4\r\ngone\r\n$5\r\n30000\r\n$4\r\nWAIT\r\n$5\r\n10000\r\n",
    )
    .expect("write");
    until_waiting(&mut holder, "lock:d", 1);
    let (tx, rx) = mpsc::channel();
    let t = waiter(&proxy, "lock:d", "w", "30000", "10000", tx);
    until_waiting(&mut holder, "lock:d", 2);
    drop(gone);
    until_waiting(&mut holder, "lock:d", 1);
    // The release goes to the one still waiting.
    assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", "lock:d", "h"]), Ok(Value::Int(1)));
    let (token, reply, _) = rx.recv_timeout(Duration::from_secs(5)).expect("hand-off");
    assert_eq!(token, "w");
    assert!(granted(&reply), "{reply:?}");
    t.join().expect("waiter");
    // A wait that runs out answers nil, as a refused acquisition does.
    let start = Instant::now();
    assert_eq!(
        cmd(&mut holder, &["LOCK.ACQUIRE", "lock:d", "late", "30000", "WAIT", "300"]),
        Ok(Value::Nil)
    );
    assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
}

#[test]
fn queues_are_bounded() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), &format!("{CONFIG}\nmax_waiters_per_key = 1"));
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert!(granted(
        &cmd(&mut holder, &["LOCK.ACQUIRE", "lock:b", "h", "30000"]).unwrap()
    ));
    let (tx, rx) = mpsc::channel();
    let t = waiter(&proxy, "lock:b", "w1", "30000", "10000", tx);
    until_waiting(&mut holder, "lock:b", 1);
    let e = cmd(
        &mut proxy.client(),
        &["LOCK.ACQUIRE", "lock:b", "w2", "30000", "WAIT", "10000"],
    )
    .unwrap_err();
    assert!(e.to_string().contains("max_waiters_per_key"), "{e}");
    assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", "lock:b", "h"]), Ok(Value::Int(1)));
    let (_, reply, _) = rx.recv_timeout(Duration::from_secs(5)).expect("hand-off");
    assert!(granted(&reply), "{reply:?}");
    t.join().expect("waiter");
    // PROXY LOCKS lists queues (none left) for operators.
    assert_eq!(cmd(&mut holder, &["PROXY", "LOCKS"]), Ok(Value::Array(Vec::new())));
}

/// `BLPOP` is a wake-up on lock signal lists only (`signal_lists`): on any other list it
/// would answer an element that was never pushed and leave the real one (a wake-up answers
/// `1`), so it is refused before anything reaches the masters; a pushed element stays there.
#[test]
fn blpop_serves_only_signal_lists() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    for s in &servers {
        let _: i64 = redis::cmd("RPUSH")
            .arg("q")
            .arg("job-1")
            .query(&mut s.client())
            .expect("RPUSH");
    }
    let refused = cmd(&mut c, &["BLPOP", "q", "1"]).expect_err("BLPOP on a work queue");
    let text = refused.to_string();
    assert!(
        text.contains("signal_lists")
            && text.contains("lock-signal:*")
            && text.contains("not served through a majority"),
        "{text}"
    );
    let mixed = cmd(&mut c, &["BLPOP", "lock-signal:a", "q", "1"]).expect_err("one key is no signal list");
    assert!(mixed.to_string().contains("'q'"), "{mixed}");
    for s in &servers {
        let left: Vec<String> = redis::cmd("LRANGE")
            .arg("q")
            .arg(0)
            .arg(-1)
            .query(&mut s.client())
            .expect("LRANGE");
        assert_eq!(left, ["job-1"], "nothing was popped");
    }
    // A signal list still wakes its waiter at once when a master holds an element.
    for s in &servers {
        let _: i64 = redis::cmd("LPUSH")
            .arg("lock-signal:a")
            .arg("1")
            .query(&mut s.client())
            .expect("LPUSH");
    }
    let woken = cmd(&mut c, &["BLPOP", "lock-signal:a", "1"]).expect("BLPOP on a signal list");
    assert_eq!(
        woken,
        Value::Array(vec![
            Value::BulkString(b"lock-signal:a".to_vec()),
            Value::BulkString(b"1".to_vec())
        ])
    );
}

/// A timeout beyond a 64-bit deadline in milliseconds is Redis's `-ERR timeout is out of
/// range` (the proxy once panicked converting it), and the connection goes on.
#[test]
fn blpop_with_a_timeout_out_of_range_is_an_error() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut raw = proxy.raw();
    for timeout in ["1e20", "inf"] {
        let request = format!("BLPOP lock-signal:x {timeout}\r\n");
        support::expect_reply(&mut raw, request.as_bytes(), "-ERR timeout is out of range\r\n");
    }
    support::expect_reply(&mut raw, b"BLPOP lock-signal:x -1\r\n", "-ERR timeout is negative\r\n");
    support::expect_reply(&mut raw, b"PING\r\n", "+PONG\r\n");
    assert_eq!(
        cmd(&mut proxy.client(), &["PING"]),
        Ok(Value::SimpleString("PONG".into()))
    );
}

/// Issue 36, item 10: a release that another proxy's waiter waits for reaches it whichever
/// master was just paused (SIGSTOP: still up as far as the proxies know). The announcement
/// went to one master, taken in turn, and when that master was the paused one the waiter woke
/// only at the holder's TTL (5 s here); now every master that is up carries it. Each master is
/// paused for as many releases as there are masters, so that every master is, in turn, the
/// one the old rotation would have picked.
#[test]
fn a_release_reaches_a_waiter_on_another_proxy_whichever_master_is_paused() {
    let servers = masters(3);
    let backends = urls(&servers);
    let (a, b) = (
        ProxyProcess::start(&backends, CONFIG),
        ProxyProcess::start(&backends, CONFIG),
    );
    fencing_ready(&a);
    fencing_ready(&b);
    let mut holder = a.client();
    let mut woken = Vec::new();
    for paused in 0..servers.len() {
        for round in 0..servers.len() {
            let key = format!("lock:paused:{paused}:{round}");
            assert!(granted(
                &cmd(&mut holder, &["LOCK.ACQUIRE", &key, "h", "5000"]).expect("holder")
            ));
            let (tx, rx) = mpsc::channel();
            let mut c = b.client();
            let waiting_key = key.clone();
            let t = thread::spawn(move || {
                let reply = cmd(&mut c, &["LOCK.ACQUIRE", &waiting_key, "w", "5000", "WAIT", "10000"]);
                tx.send((reply, Instant::now())).expect("send");
                c
            });
            until_waiting(&mut b.client(), &key, 1);
            // The holder's proxy knows the waiter's: the release gives it the turn.
            let deadline = Instant::now() + Duration::from_secs(10);
            while info_field(&mut holder, &key, "proxies_waiting") != Value::Int(1) {
                assert!(
                    Instant::now() < deadline,
                    "the holder's proxy never heard of the waiter"
                );
                thread::sleep(Duration::from_millis(5));
            }
            servers[paused].pause();
            let released = Instant::now();
            assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", &key, "h"]), Ok(Value::Int(1)));
            let (reply, at) = rx.recv_timeout(Duration::from_secs(10)).expect("the waiter's answer");
            servers[paused].resume();
            assert!(
                granted(&reply.expect("LOCK.ACQUIRE WAIT")),
                "round {round}, master {paused} paused"
            );
            let after = at.duration_since(released);
            woken.push(after);
            assert!(
                after < Duration::from_secs(1),
                "master {paused} paused: the waiter got the lock {after:?} after the release (TTL 5 s)"
            );
            let mut c = t.join().expect("waiter");
            assert_eq!(cmd(&mut c, &["LOCK.RELEASE", &key, "w"]), Ok(Value::Int(1)));
        }
    }
    woken.sort();
    eprintln!("waiter granted after the release: {woken:?}");
}
