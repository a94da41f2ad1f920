//! The safety run behind `docs/safety-report.md`: one history of every acquisition, extension
//! and release made through two proxies over five real masters, while the whole fault mix
//! plays, phase after phase: master crashes and empty restarts, pauses (SIGSTOP), slow links,
//! partitions (a minority cut from one proxy, from the other, replies held while requests
//! still arrive), clock jumps and a fast clock on a master, and a `kill -9` of a proxy. Each
//! proxy reaches each master through a relay of its own, so a link can be cut for one proxy
//! only; a cut holds bytes back as TCP does across a partition, and delivers them when it heals.
//!
//! The checker judges mutual exclusion from the clients' own view: a holder counts its lock
//! from the reply until the validity it can compute from when it *sent* the request (`ttl −
//! 1 % − 2 ms`; an extension's figure also from its send), or until it starts its release;
//! no two such grants of a lock may overlap. Fencing tokens must increase (a token above
//! every token of the lock answered before its acquisition was sent).
//!
//! The default run (the test suite's short mode, about 30 s) plays each phase once.
//! `SAFETY_LONG=1` repeats the mix until `SAFETY_ACQUISITIONS` grants (default 1,000,000) were
//! checked, with `SAFETY_CLIENTS` clients per proxy (default 6); the figures it prints are the
//! report's.

mod support;

#[path = "sim/check.rs"]
#[allow(
    dead_code,
    reason = "the simulation's checker: its grants, overlaps and fencing property"
)]
mod check;

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::clock::{FakeClockMaster, Version};
use support::{Cut, DelayRelay, ProxyProcess, RELEASE, RedisServer};

/// Locks the clients contend for.
const KEYS: u64 = 8;
/// Clients per proxy (`SAFETY_CLIENTS` for the long run: more clients, more grants a second).
fn clients_per_proxy() -> u64 {
    std::env::var("SAFETY_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}
/// The proxies' configuration: short TTLs, so a fault's consequences (a quarantine, a lock
/// outliving its holder's belief) play out within a phase.
const CONFIG: &str = "max_ttl_ms = 1000\ndefault_ttl_ms = 800\nlegacy_ttl_ms = 800\nbackend_timeout_ms = 50";

/// Five masters: the first two (Redis 6.2 and 7.0 built to run under libfaketime) under a
/// clock the run moves, the other three crashed and paused.
struct Masters {
    clocked: [FakeClockMaster; 2],
    plain: [RedisServer; 3],
}

impl Masters {
    fn start() -> Masters {
        Masters {
            clocked: [Version::V6_2, Version::V7_0].map(FakeClockMaster::start),
            plain: std::array::from_fn(|_| RedisServer::start()),
        }
    }

    fn ports(&self) -> Vec<u16> {
        let clocked = self.clocked.iter().map(|m| m.port);
        clocked.chain(self.plain.iter().map(|m| m.port)).collect()
    }
}

/// A proxy that can be killed and started again; its clients find it by `port`.
struct Slot {
    process: Option<ProxyProcess>,
    port: Arc<AtomicU16>,
    backends: Vec<String>,
}

impl Slot {
    fn start(backends: Vec<String>) -> Slot {
        let process = ProxyProcess::start(&backends, CONFIG);
        Slot {
            port: Arc::new(AtomicU16::new(process.port)),
            process: Some(process),
            backends,
        }
    }

    /// `kill -9`: what it held stays on the masters until its TTL runs out.
    fn crash(&mut self) {
        if let Some(process) = &self.process {
            support::signal(process.pid(), "-KILL");
        }
        self.process = None;
    }

    fn restart(&mut self) {
        let process = ProxyProcess::start(&self.backends, CONFIG);
        self.port.store(process.port, Ordering::SeqCst);
        self.process = Some(process);
    }
}

/// What every client recorded, and the counts the report quotes.
#[derive(Default)]
struct Seen {
    history: check::History,
    acquisitions: u64,
    refused: u64,
    extensions: u64,
    releases: u64,
    /// Error replies (`-NOQUORUM` while too many masters are out): refusals, not grants.
    error_replies: u64,
    /// Connections lost or timed out (a proxy killed), made again.
    reconnects: u64,
}

/// Runs one client until `stop`: takes a random lock (plainly, or fenced for odd clients),
/// sometimes extends it, releases it; records each grant and token in `seen`.
fn client(id: u64, proxy: usize, port: Arc<AtomicU16>, origin: Instant, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let name = format!("c{id}");
    let fenced = id % 2 == 1;
    let mut conn = None;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let Some(c) = connected(&mut conn, &port) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let key = format!("lock:{}", (id * 7 + i * 13) % KEYS);
        let token = format!("{name}-{i}");
        let ttl_ms = 300 + (i * 37) % 500;
        match round(c, &key, &token, ttl_ms, fenced, i.is_multiple_of(4), origin) {
            Ok(round) => {
                if round.broken {
                    conn = None;
                    seen.lock().expect("seen").reconnects += 1;
                }
                record(&seen, &name, proxy, &key, &token, round);
            }
            Err(e) if lost(&e) => {
                seen.lock().expect("seen").reconnects += 1;
                conn = None;
            }
            // An error reply to an acquisition (`-NOQUORUM`): a refusal.
            Err(_) => seen.lock().expect("seen").error_replies += 1,
        }
    }
}

/// A connection to the proxy's current port, made when there is none.
fn connected<'a>(conn: &'a mut Option<redis::Connection>, port: &AtomicU16) -> Option<&'a mut redis::Connection> {
    if conn.is_none() {
        let url = format!("redis://127.0.0.1:{}", port.load(Ordering::SeqCst));
        let c = redis::Client::open(url)
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
            .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        *conn = Some(c);
    }
    conn.as_mut()
}

/// One acquisition attempt and what followed, on the test's clock.
struct Round {
    sent: Duration,
    /// When the grant's reply was read, its fencing token, and when the client stops
    /// believing it holds the lock (validity from the send, an extension's figure from its
    /// send, or the start of the release, whichever ends it first).
    held: Option<(Duration, Option<u64>, Duration)>,
    extended: bool,
    /// The connection was lost after the grant: made again for the next round.
    broken: bool,
}

fn round(
    c: &mut redis::Connection,
    key: &str,
    token: &str,
    ttl_ms: u64,
    fenced: bool,
    extend: bool,
    origin: Instant,
) -> redis::RedisResult<Round> {
    let sent = origin.elapsed();
    let fence = if fenced {
        let reply: Option<u64> = redis::cmd("LOCK.ACQUIRE").arg(key).arg(token).arg(ttl_ms).query(c)?;
        reply.map(Some)
    } else {
        let reply: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query(c)?;
        reply.map(|_| None)
    };
    let from = origin.elapsed();
    let Some(fence) = fence else {
        return Ok(Round {
            sent,
            held: None,
            extended: false,
            broken: false,
        });
    };
    let ttl = Duration::from_millis(ttl_ms);
    let mut until = sent + ttl - ttl / 100 - Duration::from_millis(2);
    let (mut extended, mut broken) = (false, false);
    // From here on the grant is recorded whatever happens: an error only ends the round.
    if extend {
        let extend_sent = origin.elapsed();
        let figure: redis::RedisResult<u64> = redis::cmd("LOCK.EXTEND").arg(key).arg(token).arg(ttl_ms).query(c);
        broken |= figure.as_ref().is_err_and(lost);
        // Only a figure that continues the grant extends the belief: one read after the
        // validity ran out says nothing of the time in between.
        if let Ok(figure) = figure
            && figure > 0
            && extend_sent < until
        {
            until = until.max(extend_sent + Duration::from_millis(figure));
            extended = true;
        }
    }
    let release_sent = origin.elapsed();
    if !broken {
        let released: redis::RedisResult<i64> = redis::cmd("EVAL").arg(RELEASE).arg(1).arg(key).arg(token).query(c);
        broken |= released.as_ref().is_err_and(lost);
    }
    Ok(Round {
        sent,
        held: Some((from, fence, until.min(release_sent))),
        extended,
        broken,
    })
}

/// Whether an error lost the connection (a proxy killed, a reply that never came).
fn lost(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
}

fn record(seen: &Mutex<Seen>, name: &str, proxy: usize, key: &str, token: &str, round: Round) {
    let mut seen = seen.lock().expect("seen");
    let Some((from, fence, until)) = round.held else {
        seen.refused += 1;
        return;
    };
    seen.acquisitions += 1;
    seen.releases += u64::from(!round.broken);
    seen.extensions += u64::from(round.extended);
    if let Some(token) = fence {
        seen.history.fence(check::Fence {
            key: key.to_owned(),
            token,
            holder: name.to_owned(),
            sent: round.sent,
            answered: from,
        });
    }
    seen.history.grant(check::Grant {
        key: key.to_owned(),
        token: token.to_owned(),
        proxy,
        from,
        until,
    });
}

/// A phase of the mix: its name, and the fault it plays for its length.
type Phase<'m> = (&'static str, fn(&mut Mix<'m>));

/// The fault mix: each phase runs for `phase` with one kind of fault, then heals.
struct Mix<'a> {
    masters: &'a mut Masters,
    /// `relays[p][m]`: proxy `p`'s link to master `m`.
    relays: &'a [Vec<DelayRelay>],
    proxies: &'a mut [Slot],
    phase: Duration,
    injected: u64,
}

impl<'m> Mix<'m> {
    /// Plays every phase once; returns a line per phase.
    fn play(&mut self, seen: &Mutex<Seen>) -> Vec<String> {
        let phases: [Phase<'m>; 10] = [
            ("healthy", |mix| std::thread::sleep(mix.phase)),
            ("kill -9 of 2 masters, restarted empty", Self::crash_masters),
            ("SIGSTOP of 2 masters past every TTL", Self::pause_masters),
            ("one master's link slower than the timeout", Self::slow_link),
            ("a minority cut from each proxy, a different one", Self::partition),
            ("a master's replies held from one proxy", Self::replies_held),
            ("one master's clock jumps 5 s ahead (6.2)", Self::clock_jump),
            ("one master's clock runs 50 % fast (7.0)", Self::clock_fast),
            ("kill -9 of one proxy, restarted", Self::crash_proxy),
            ("a clock jump during a partition and a pause", Self::mixed),
        ];
        let mut lines = Vec::new();
        for (name, fault) in phases {
            let before = seen.lock().expect("seen").acquisitions;
            let start = Instant::now();
            fault(self);
            let granted = seen.lock().expect("seen").acquisitions - before;
            lines.push(format!(
                "{name}: {granted} acquisitions ({:.0}/s)",
                granted as f64 / start.elapsed().as_secs_f64()
            ));
        }
        lines
    }

    fn crash_masters(&mut self) {
        self.masters.plain[0].kill();
        self.masters.plain[1].kill();
        self.injected += 2;
        std::thread::sleep(self.phase / 2);
        self.masters.plain[0].restart();
        self.masters.plain[1].restart();
        std::thread::sleep(self.phase / 2);
    }

    fn pause_masters(&mut self) {
        let [_, a, b] = &self.masters.plain;
        a.pause();
        b.pause();
        self.injected += 2;
        std::thread::sleep(self.phase.max(Duration::from_millis(1_200)));
        a.resume();
        b.resume();
    }

    fn slow_link(&mut self) {
        for relays in self.relays {
            relays[0].set_delay(Duration::from_millis(80));
        }
        self.injected += 1;
        std::thread::sleep(self.phase);
        for relays in self.relays {
            relays[0].set_delay(Duration::ZERO);
        }
    }

    /// Proxy 0 loses masters 0 and 1, proxy 1 masters 2 and 3: each keeps a majority, and
    /// the two majorities meet only in master 4.
    fn partition(&mut self) {
        let cuts = [(0, 0), (0, 1), (1, 2), (1, 3)];
        for (p, m) in cuts {
            self.relays[p][m].set_cut(Cut::Both);
        }
        self.injected += 1;
        std::thread::sleep(self.phase);
        for (p, m) in cuts {
            self.relays[p][m].set_cut(Cut::None);
        }
    }

    fn replies_held(&mut self) {
        self.relays[0][4].set_cut(Cut::Replies);
        self.injected += 1;
        std::thread::sleep(self.phase);
        self.relays[0][4].set_cut(Cut::None);
    }

    fn clock_jump(&mut self) {
        self.masters.clocked[0].jump_forward(Duration::from_secs(5));
        self.injected += 1;
        std::thread::sleep(self.phase);
    }

    fn clock_fast(&mut self) {
        self.masters.clocked[1].set_speed(1.5);
        self.injected += 1;
        std::thread::sleep(self.phase);
        self.masters.clocked[1].set_speed(1.0);
    }

    fn crash_proxy(&mut self) {
        self.proxies[1].crash();
        self.injected += 1;
        std::thread::sleep(self.phase / 2);
        self.proxies[1].restart();
        std::thread::sleep(self.phase / 2);
    }

    fn mixed(&mut self) {
        self.relays[1][3].set_cut(Cut::Both);
        self.masters.plain[2].pause();
        self.masters.clocked[0].jump_forward(Duration::from_secs(5));
        self.injected += 3;
        std::thread::sleep(self.phase);
        self.masters.plain[2].resume();
        self.relays[1][3].set_cut(Cut::None);
    }
}

#[test]
fn no_two_grants_overlap_across_the_whole_fault_mix() {
    let long = std::env::var("SAFETY_LONG").is_ok_and(|v| v == "1");
    let target: u64 = std::env::var("SAFETY_ACQUISITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let phase = Duration::from_millis(if long { 4_000 } else { 2_500 });
    let mut masters = Masters::start();
    let relays: Vec<Vec<DelayRelay>> = (0..2)
        .map(|_| masters.ports().into_iter().map(DelayRelay::start).collect())
        .collect();
    let mut proxies: Vec<Slot> = relays
        .iter()
        .map(|links| Slot::start(links.iter().map(DelayRelay::url).collect()))
        .collect();
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let clients: Vec<_> = (0..2 * clients_per_proxy())
        .map(|id| {
            let proxy = (id % 2) as usize;
            let (port, stop, seen) = (proxies[proxy].port.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || client(id, proxy, port, origin, stop, seen))
        })
        .collect();
    let cycles = AtomicU64::new(0);
    let mut mix = Mix {
        masters: &mut masters,
        relays: &relays,
        proxies: &mut proxies,
        phase,
        injected: 0,
    };
    let lines = loop {
        let lines = mix.play(&seen);
        let done = cycles.fetch_add(1, Ordering::Relaxed) + 1;
        if long {
            let seen = seen.lock().expect("seen");
            let at = origin.elapsed().as_secs();
            eprintln!("cycle {done} at {at} s: {} acquisitions", seen.acquisitions);
        }
        if !long || seen.lock().expect("seen").acquisitions >= target {
            break lines;
        }
    };
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    let seen = seen.lock().expect("seen");
    let overlaps = seen.history.overlaps();
    let regressions = seen.history.fence_regressions();
    let elapsed = origin.elapsed().as_secs_f64();
    println!("last cycle's phases:\n  {}", lines.join("\n  "));
    println!(
        "{} cycles of the fault mix in {elapsed:.0} s, {} faults injected: {} acquisitions checked ({:.0}/s), \
         {} refused, {} error replies, {} extended, {} released, {} reconnections; {} fencing tokens; {} overlaps, \
         {} token regressions",
        cycles.load(Ordering::Relaxed),
        mix.injected,
        seen.acquisitions,
        seen.acquisitions as f64 / elapsed,
        seen.refused,
        seen.error_replies,
        seen.extensions,
        seen.releases,
        seen.reconnects,
        seen.history.fences(),
        overlaps.len(),
        regressions.len(),
    );
    for o in overlaps.iter().take(10) {
        println!("OVERLAP {o}");
    }
    check::assert_safe((overlaps, regressions));
    // The run checked something: every phase granted locks (a phase's share is in its line).
    assert!(
        seen.acquisitions >= 1_000,
        "only {} acquisitions: the run saw too little",
        seen.acquisitions
    );
    assert!(
        seen.history.fences() >= 300,
        "only {} fencing tokens",
        seen.history.fences()
    );
    assert!(seen.extensions >= 100, "only {} extensions", seen.extensions);
}
