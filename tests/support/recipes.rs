//! What the lock recipes' fault checkers share (tests/semaphores.rs, rwlocks.rs, election.rs,
//! multikey.rs): two proxies over five masters with short TTLs, the schedule of master
//! faults each plays while its clients run, and a recipe's `*.INFO` read as a map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use super::{ProxyProcess, RedisServer, fencing_ready, masters, query, urls};

/// Short TTLs, so that the quarantine of a restarted master (`max_ttl_ms`) ends within a phase.
pub const CONFIG: &str = "max_ttl_ms = 1000\ndefault_ttl_ms = 800\nlegacy_ttl_ms = 800";

/// Two proxies over `servers` (the second on the multi-threaded runtime), the database's
/// fencing epochs made.
pub fn two_proxies(servers: &[RedisServer]) -> [ProxyProcess; 2] {
    let proxies = [
        ProxyProcess::start(&urls(servers), CONFIG),
        ProxyProcess::start(&urls(servers), &format!("{CONFIG}\nthreads = 2")),
    ];
    fencing_ready(&proxies[0]);
    proxies
}

/// A fault checker's run: `clients` client loops, the n-th through proxy n % 2 of
/// [`two_proxies`] over five masters, while [`play_faults`] plays (`grants`: how many grants
/// they recorded so far, for its report). Each loop is given its number, its proxy's port, the
/// run's time origin, the flag that stops it and what every client saw; it returns once the
/// flag is up. Returns what they saw and the schedule's report.
pub fn under_faults<S, F>(unit: &str, clients: usize, client: F, grants: impl Fn(&S) -> usize) -> (S, Vec<String>)
where
    S: Default + Send + 'static,
    F: Fn(usize, u16, Instant, Arc<AtomicBool>, Arc<Mutex<S>>) + Send + Clone + 'static,
{
    let mut servers = masters(5);
    let proxies = two_proxies(&servers);
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(S::default()));
    let loops: Vec<_> = (0..clients)
        .map(|n| {
            let (client, port, stop, seen) = (client.clone(), proxies[n % 2].port, stop.clone(), seen.clone());
            thread::spawn(move || client(n, port, origin, stop, seen))
        })
        .collect();
    let report = play_faults(&mut servers, unit, || grants(&seen.lock().expect("seen")));
    stop.store(true, Ordering::Relaxed);
    for client in loops {
        client.join().expect("client");
    }
    let seen = Arc::try_unwrap(seen).ok().expect("every client ended");
    (seen.into_inner().expect("seen"), report)
}

/// How long each phase of [`play_faults`] lasts.
pub const PHASE: Duration = Duration::from_millis(2000);

/// The faults, a phase of [`PHASE`] each, on five masters: healthy; kill -9 of two; the two
/// restarted empty (quarantined); SIGSTOP of two others, then SIGCONT; the fifth killed and
/// restarted at once; healthy again. With phases of 2 s the first two are repaired (fencing's
/// F5) before the fifth loses its data; shorter, three of five masters can lose their fencing
/// counters before any repair, and fenced grants then stop for good (docs/fencing.md, "What it
/// does not guarantee": availability, never safety). `count` says how many grants the clients recorded so
/// far; one line per phase, `<phase>: <grants per second> <unit>/s`.
///
/// `FAULT_ROUNDS=n` plays the schedule n times in a row (a long run; 1 by default).
pub fn play_faults(servers: &mut [RedisServer], unit: &str, count: impl Fn() -> usize) -> Vec<String> {
    let rounds: usize = std::env::var("FAULT_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let mut report = Vec::new();
    for round in 1..=rounds {
        let mut lines = play_round(servers, unit, &count);
        if rounds > 1 {
            lines
                .iter_mut()
                .for_each(|line| *line = format!("round {round}, {line}"));
        }
        report.extend(lines);
    }
    report
}

/// One round of [`play_faults`].
fn play_round(servers: &mut [RedisServer], unit: &str, count: &impl Fn() -> usize) -> Vec<String> {
    let step = PHASE;
    let mut report = Vec::new();
    let mut phase = |name: &str, f: &mut dyn FnMut(&mut [RedisServer])| {
        let (before, start) = (count(), Instant::now());
        f(servers);
        let rate = (count() - before) as f64 / start.elapsed().as_secs_f64();
        report.push(format!("{name}: {rate:.0} {unit}/s"));
    };
    phase("healthy", &mut |_| thread::sleep(step));
    phase("kill -9 of 2 masters", &mut |s| {
        s[0].kill();
        s[1].kill();
        thread::sleep(step);
    });
    phase("the 2 restarted empty (quarantined)", &mut |s| {
        s[0].restart();
        s[1].restart();
        thread::sleep(step);
    });
    phase("SIGSTOP of 2 masters", &mut |s| {
        s[2].pause();
        s[3].pause();
        thread::sleep(step);
        s[2].resume();
        s[3].resume();
    });
    phase("kill -9 of 1 master and restart at once", &mut |s| {
        s[4].restart();
        thread::sleep(step);
    });
    phase("healthy again", &mut |_| thread::sleep(step));
    report
}

/// The `eval` and `evalsha` calls `servers` have served so far (every request of a recipe's
/// paths is a script): how a test shows that waiting sends nothing to the masters.
pub fn script_calls(servers: &[RedisServer]) -> i64 {
    servers
        .iter()
        .map(|s| {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut s.client())
                .expect("INFO");
            stats
                .lines()
                .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
                .filter_map(|l| {
                    l.split([':', ','])
                        .find_map(|kv| kv.strip_prefix("calls=")?.parse::<i64>().ok())
                })
                .sum::<i64>()
        })
        .sum()
}

/// A recipe's `*.INFO` map (`SEM.INFO`, `RWLOCK.INFO`) of `key`, as field -> value.
pub fn info(c: &mut redis::Connection, command: &str, key: &str) -> HashMap<String, Value> {
    let Ok(Value::Array(items)) = query(c, &[command, key]) else {
        panic!("{command}");
    };
    items
        .chunks(2)
        .map(|kv| match &kv[0] {
            Value::BulkString(name) => (String::from_utf8_lossy(name).into_owned(), kv[1].clone()),
            other => panic!("{command} field {other:?}"),
        })
        .collect()
}

/// Waits (10 s at most) until `command key` answers `value` for `field`.
pub fn until_info(c: &mut redis::Connection, command: &str, key: &str, field: &str, value: Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while info(c, command, key)[field] != value {
        assert!(
            Instant::now() < deadline,
            "{key}: {field} never {value:?}: {:?}",
            info(c, command, key)
        );
        thread::sleep(Duration::from_millis(5));
    }
}
