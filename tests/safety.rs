//! The safety run behind `docs/safety-report.md`: one history of every acquisition, extension
//! and release made through two proxies over five real masters, while the whole fault mix
//! plays, phase after phase: master crashes, restarts empty and with their data, pauses
//! (SIGSTOP), slow links, partitions (a minority cut from one proxy, from the other, replies
//! held while requests still arrive), clock jumps and a fast clock on a master, and a
//! `kill -9` of a proxy. Each
//! proxy reaches each master through a relay of its own, so a link can be cut for one proxy
//! only; a cut holds bytes back as TCP does across a partition, and delivers them when it heals.
//!
//! Each client keeps the history of its operations: every acquisition, extension and release,
//! with the time it was invoked (sent) and completed (its reply read) and the fencing token
//! where there is one. The checker reads the histories and judges mutual exclusion from the
//! clients' own view: a holder counts its lock from the reply until the validity it can
//! compute from when it *sent* the request (`ttl − 1 % − 2 ms`; an extension's figure also
//! from its send), or until it starts its release; no two such grants of a lock may overlap.
//! Fencing tokens must increase (a token above every token of the lock answered before its
//! acquisition was sent).
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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
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
/// clock the run moves, the other three crashed and paused; the last of them persists every
/// write and is restarted with its data.
struct Masters {
    clocked: [FakeClockMaster; 2],
    plain: [RedisServer; 3],
}

impl Masters {
    fn start() -> Masters {
        Masters {
            clocked: [Version::V6_2, Version::V7_0].map(FakeClockMaster::start),
            // The last persists every write (`appendfsync always`): restarted with its data.
            plain: std::array::from_fn(|i| match i {
                2 => RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]),
                _ => RedisServer::start(),
            }),
        }
    }

    fn ports(&self) -> Vec<u16> {
        let clocked = self.clocked.iter().map(|m| m.port);
        clocked.chain(self.plain.iter().map(|m| m.port)).collect()
    }
}

/// A proxy that can be killed and started again; its clients find it by `port`.
struct RestartableProxy {
    process: Option<ProxyProcess>,
    port: Arc<AtomicU16>,
    backends: Vec<String>,
    config: String,
}

impl RestartableProxy {
    fn start(backends: Vec<String>, config: &str) -> RestartableProxy {
        let process = ProxyProcess::start(&backends, config);
        RestartableProxy {
            port: Arc::new(AtomicU16::new(process.port)),
            process: Some(process),
            backends,
            config: config.to_owned(),
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
        let process = ProxyProcess::start(&self.backends, &self.config);
        self.port.store(process.port, Ordering::SeqCst);
        self.process = Some(process);
    }
}

/// One operation as the client that made it saw it: invoked (the request sent) and completed
/// (its reply read), on the test's monotonic clock.
#[derive(Clone, Copy, Debug)]
struct Op {
    /// The lock, `lock:<key>`.
    key: u8,
    /// The client's round (its token is `c<client>-<round>`).
    round: u64,
    invoked: Duration,
    completed: Duration,
    what: What,
}

/// What an operation was, and what its reply said (`None`: an error reply or a lost
/// connection, from which the client learns nothing).
#[derive(Clone, Copy, Debug)]
enum What {
    /// `SET NX PX ttl` or `LOCK.ACQUIRE`: `Some(Some(token))` granted (with its fencing token
    /// when fenced), `Some(None)` refused.
    Acquire {
        ttl_ms: u64,
        granted: Option<Option<Option<u64>>>,
    },
    /// `LOCK.EXTEND`: the validity figure, 0 when not extended.
    Extend { figure_ms: Option<u64> },
    /// The release script: 1 released, 0 not held.
    Release { released: Option<bool> },
}

/// One client's history, in the order it made its operations (it makes one at a time).
struct History {
    client: u64,
    proxy: usize,
    ops: Vec<Op>,
    /// Connections lost (a proxy killed, a reply that never came) and made again.
    reconnects: u64,
    /// Error replies by their first words (`NOQUORUM 2 of 5`, ...).
    errors: std::collections::BTreeMap<String, u64>,
}

/// What the clients of one run share: its clock, its stop flag, the grants so far (for the
/// phases' lines and the long run's progress), and how long a holder works.
#[derive(Clone)]
struct Run {
    origin: Instant,
    stop: Arc<AtomicBool>,
    granted: Arc<AtomicU64>,
    hold: Duration,
}

impl Run {
    fn new(hold: Duration) -> Run {
        Run {
            origin: Instant::now(),
            stop: Arc::default(),
            granted: Arc::default(),
            hold,
        }
    }

    fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }
}

/// Runs one client until `run` stops: takes a random lock (plainly, or fenced for odd
/// clients), holds it for `run.hold`, sometimes extends it, releases it; returns every
/// operation it made.
fn client(id: u64, proxy: usize, port: Arc<AtomicU16>, run: Run) -> History {
    let mut history = History {
        client: id,
        proxy,
        ops: Vec::new(),
        reconnects: 0,
        errors: Default::default(),
    };
    let fenced = id % 2 == 1;
    let mut conn = None;
    let mut round = 0u64;
    while !run.stop.load(Ordering::Relaxed) {
        round += 1;
        let Some(c) = connected(&mut conn, &port) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let key = ((id * 7 + round * 13) % KEYS) as u8;
        let ttl_ms = 300 + (round * 37) % 500;
        let mut client = Client {
            c,
            id,
            key,
            round,
            run: &run,
            ops: &mut history.ops,
            errors: &mut history.errors,
        };
        if !client.round(ttl_ms, fenced, round.is_multiple_of(4)) {
            history.reconnects += 1;
            conn = None;
        }
    }
    history
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

/// One round of a client: the operations it makes on one lock, each recorded in `ops`.
struct Client<'a> {
    c: &'a mut redis::Connection,
    id: u64,
    key: u8,
    round: u64,
    run: &'a Run,
    ops: &'a mut Vec<Op>,
    errors: &'a mut std::collections::BTreeMap<String, u64>,
}

impl Client<'_> {
    /// Acquires, and when granted, sometimes extends, then releases; `false` when the
    /// connection was lost.
    fn round(&mut self, ttl_ms: u64, fenced: bool, extend: bool) -> bool {
        let (key, token) = (format!("lock:{}", self.key), format!("c{}-{}", self.id, self.round));
        let granted = self.op(
            |c| {
                if fenced {
                    let reply: Option<u64> = redis::cmd("LOCK.ACQUIRE").arg(&key).arg(&token).arg(ttl_ms).query(c)?;
                    Ok(reply.map(Some))
                } else {
                    let reply: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query(c)?;
                    Ok(reply.map(|_| None))
                }
            },
            |granted| What::Acquire { ttl_ms, granted },
        );
        match granted {
            Err(lost) => return !lost,
            Ok(None) => return true,
            Ok(Some(_)) => self.run.granted.fetch_add(1, Ordering::Relaxed),
        };
        std::thread::sleep(self.run.hold);
        if extend {
            let extended = self.op(
                |c| redis::cmd("LOCK.EXTEND").arg(&key).arg(&token).arg(ttl_ms).query(c),
                |figure_ms| What::Extend { figure_ms },
            );
            if extended == Err(true) {
                return false;
            }
        }
        let released = self.op(
            |c| {
                let n: i64 = redis::cmd("EVAL").arg(RELEASE).arg(1).arg(&key).arg(&token).query(c)?;
                Ok(n == 1)
            },
            |released| What::Release { released },
        );
        released != Err(true)
    }

    /// Makes one operation and records it; `Err(lost)` for an error reply (`false`) or a
    /// lost connection (`true`).
    fn op<T: Copy>(
        &mut self,
        call: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
        what: impl FnOnce(Option<T>) -> What,
    ) -> Result<T, bool> {
        let invoked = self.run.origin.elapsed();
        let reply = call(self.c);
        self.ops.push(Op {
            key: self.key,
            round: self.round,
            invoked,
            completed: self.run.origin.elapsed(),
            what: what(reply.as_ref().ok().copied()),
        });
        reply.map_err(|e| {
            let lost = e.is_io_error() || e.is_timeout() || e.is_connection_dropped();
            if !lost {
                let text = e.to_string();
                let kind: Vec<&str> = text.split_whitespace().take(6).collect();
                *self.errors.entry(kind.join(" ")).or_default() += 1;
            }
            lost
        })
    }
}

/// What the checker read from the histories, and the counts the report quotes.
#[derive(Default)]
struct Verdict {
    checked: check::History,
    refused: u64,
    failed: u64,
    extended: u64,
    extensions: u64,
    released: u64,
    releases: u64,
    reconnects: u64,
    errors: std::collections::BTreeMap<String, u64>,
}

impl Verdict {
    /// Reads one client's history: each grant, held from its reply until the validity the
    /// client computes from its send (`ttl − 1 % − 2 ms`), or an extension's figure from the
    /// extension's send when that came before the validity ran out, and never past the
    /// client's next step away from it (its release, or its next acquisition).
    fn read(&mut self, history: &History) {
        let mut held: Option<check::Grant> = None;
        self.reconnects += history.reconnects;
        for (kind, n) in &history.errors {
            *self.errors.entry(kind.clone()).or_default() += n;
        }
        for op in &history.ops {
            match op.what {
                What::Extend { figure_ms } => {
                    self.extensions += 1;
                    if let (Some(grant), Some(figure)) = (held.as_mut(), figure_ms.filter(|f| *f > 0))
                        && op.invoked < grant.until
                    {
                        grant.until = grant.until.max(op.invoked + Duration::from_millis(figure));
                        self.extended += 1;
                    }
                    continue;
                }
                What::Release { released } => {
                    self.releases += 1;
                    self.released += u64::from(released == Some(true));
                }
                What::Acquire { .. } => {}
            }
            if let Some(mut grant) = held.take() {
                grant.until = grant.until.min(op.invoked);
                self.checked.grant(grant);
            }
            if let What::Acquire { ttl_ms, granted } = op.what {
                match granted {
                    Some(Some(fence)) => held = Some(self.grant(history, op, ttl_ms, fence)),
                    Some(None) => self.refused += 1,
                    None => self.failed += 1,
                }
            }
        }
        if let Some(grant) = held {
            self.checked.grant(grant);
        }
    }

    fn grant(&mut self, history: &History, op: &Op, ttl_ms: u64, fence: Option<u64>) -> check::Grant {
        let (key, holder) = (format!("lock:{}", op.key), format!("c{}-{}", history.client, op.round));
        if let Some(token) = fence {
            self.checked.fence(check::Fence {
                key: key.clone(),
                token,
                holder: holder.clone(),
                sent: op.invoked,
                answered: op.completed,
            });
        }
        let ttl = Duration::from_millis(ttl_ms);
        check::Grant {
            key,
            token: holder,
            proxy: history.proxy,
            from: op.completed,
            until: op.invoked + ttl - ttl / 100 - Duration::from_millis(2),
        }
    }
}

/// Each master's state (`up`, `quarantined`, ...) in proxy `port`'s `INFO backends`.
fn backend_states(port: u16) -> String {
    let info = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
        .and_then(|mut c| redis::cmd("INFO").arg("backends").query::<String>(&mut c));
    let Ok(info) = info else {
        return "(no answer)".into();
    };
    let states: Vec<&str> = info
        .lines()
        .filter_map(|line| line.split(',').find_map(|field| field.strip_prefix("state=")))
        .collect();
    states.join(" ")
}

/// A phase of the mix: its name, and the fault it plays for its length.
type Phase<'m> = (&'static str, fn(&mut Mix<'m>));

/// The fault mix: each phase runs for `phase` with one kind of fault, then heals.
struct Mix<'a> {
    masters: &'a mut Masters,
    /// `relays[p][m]`: proxy `p`'s link to master `m`.
    relays: &'a [Vec<DelayRelay>],
    proxies: &'a mut [RestartableProxy],
    phase: Duration,
    injected: u64,
    run: &'a Run,
}

impl<'m> Mix<'m> {
    /// Plays every phase once; returns a line per phase.
    fn play(&mut self) -> Vec<String> {
        let phases: [Phase<'m>; 11] = [
            ("healthy", |mix| std::thread::sleep(mix.phase)),
            ("kill -9 of 2 masters, restarted empty", Self::crash_masters),
            (
                "kill -9 of a master that persists every write, restarted with its data",
                Self::crash_persisted,
            ),
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
            let before = self.run.granted();
            let start = Instant::now();
            fault(self);
            let granted = self.run.granted() - before;
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

    fn crash_persisted(&mut self) {
        self.masters.plain[2].kill();
        self.injected += 1;
        std::thread::sleep(self.phase / 2);
        self.masters.plain[2].restart_keeping_data();
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

/// Each proxy's relays to the masters (`[p][m]`).
fn relays(masters: &Masters) -> Vec<Vec<DelayRelay>> {
    (0..2)
        .map(|_| masters.ports().into_iter().map(DelayRelay::start).collect())
        .collect()
}

/// A proxy per set of relays, with `config`.
fn proxies(relays: &[Vec<DelayRelay>], config: &str) -> Vec<RestartableProxy> {
    relays
        .iter()
        .map(|links| RestartableProxy::start(links.iter().map(DelayRelay::url).collect(), config))
        .collect()
}

/// The clients of `run`, half on each proxy.
fn clients(proxies: &[RestartableProxy], run: &Run) -> Vec<std::thread::JoinHandle<History>> {
    (0..2 * clients_per_proxy())
        .map(|id| {
            let proxy = (id % 2) as usize;
            let (port, run) = (proxies[proxy].port.clone(), run.clone());
            std::thread::spawn(move || client(id, proxy, port, run))
        })
        .collect()
}

/// Stops the clients and reads their histories.
fn verdict(run: &Run, clients: Vec<std::thread::JoinHandle<History>>) -> (Verdict, usize) {
    run.stop.store(true, Ordering::Relaxed);
    let mut verdict = Verdict::default();
    let mut operations = 0;
    for c in clients {
        let history = c.join().expect("client thread");
        operations += history.ops.len();
        verdict.read(&history);
    }
    (verdict, operations)
}

/// Two faults of the mix at once, with holders working 100 ms: two masters cut from proxy 0,
/// whose grants then rest on the other three, and clock jumps on one of those three. A lock
/// proxy 0 granted then stands on two masters, while the two cut ones and the jumped one are
/// free for proxy 1's clients. Returns the checker's overlaps and the grants it checked.
fn partition_and_clock_jump(config: &str) -> (Vec<String>, usize) {
    let mut masters = Masters::start();
    let relays = relays(&masters);
    let proxies = proxies(&relays, config);
    let run = Run::new(Duration::from_millis(100));
    let clients = clients(&proxies, &run);
    std::thread::sleep(Duration::from_millis(500));
    relays[0][2].set_cut(Cut::Both);
    relays[0][3].set_cut(Cut::Both);
    std::thread::sleep(Duration::from_millis(1_000));
    // Three jumps, each a window of its own for the locks held at that moment.
    for _ in 0..3 {
        masters.clocked[0].jump_forward(Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(400));
    }
    let (verdict, operations) = verdict(&run, clients);
    let overlaps = verdict.checked.overlaps();
    println!(
        "{config:?}: {operations} operations, {} grants checked, {} overlaps",
        verdict.checked.len(),
        overlaps.len()
    );
    for o in overlaps.iter().take(3) {
        println!("  OVERLAP {o}");
    }
    (overlaps, verdict.checked.len())
}

/// The defended side of [`partition_and_clock_jump`]: no overlap.
#[test]
fn a_partition_and_a_clock_jump_at_once_grant_no_lock_twice() {
    let (overlaps, checked) = partition_and_clock_jump(CONFIG);
    assert!(
        overlaps.is_empty(),
        "overlapping grants: {:?}",
        &overlaps[..overlaps.len().min(3)]
    );
    assert!(checked >= 50, "only {checked} grants: the run saw too little");
}

/// The control: the same faults with the defences off (`quarantine = "off"`: no clock
/// judging), and the checker must find overlapping grants: the runs' 0 is not for want of
/// faults that can break mutual exclusion. The overlap needs a grant to land in a jump's
/// window, which a loaded machine (fewer operations per second) can miss: up to three runs.
#[test]
fn without_its_defences_a_partition_and_a_clock_jump_break_mutual_exclusion() {
    let config = format!("{CONFIG}\nquarantine = \"off\"");
    let found = (0..3).any(|_| !partition_and_clock_jump(&config).0.is_empty());
    assert!(
        found,
        "without its defences the checker saw no overlap in three runs: the control cannot fail the run"
    );
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
    let relays = relays(&masters);
    let mut proxies = proxies(&relays, CONFIG);
    let run = Run::new(Duration::ZERO);
    let clients = clients(&proxies, &run);
    let mut mix = Mix {
        masters: &mut masters,
        relays: &relays,
        proxies: &mut proxies,
        phase,
        injected: 0,
        run: &run,
    };
    let mut cycles = 0;
    let lines = loop {
        let lines = mix.play();
        cycles += 1;
        let granted = run.granted();
        if long {
            let states = backend_states(mix.proxies[0].port.load(Ordering::SeqCst));
            eprintln!(
                "cycle {cycles} at {} s: {granted} acquisitions; masters as proxy 0 sees them: {states}",
                run.origin.elapsed().as_secs()
            );
        }
        if !long || granted >= target {
            break lines;
        }
    };
    let (verdict, operations) = verdict(&run, clients);
    let elapsed = run.origin.elapsed().as_secs_f64();
    let (overlaps, regressions) = (verdict.checked.overlaps(), verdict.checked.fence_regressions());
    let granted = verdict.checked.len();
    println!("last cycle's phases:\n  {}", lines.join("\n  "));
    println!(
        "{cycles} cycles of the fault mix in {elapsed:.0} s, {} faults injected; {operations} operations in the \
         history: {granted} acquisitions granted and checked ({:.0}/s), {} refused, {} failed (error replies, \
         lost connections), {} of {} extensions extended, {} of {} releases released, {} reconnections; \
         {} fencing tokens; {} overlaps, {} token regressions",
        mix.injected,
        granted as f64 / elapsed,
        verdict.refused,
        verdict.failed,
        verdict.extended,
        verdict.extensions,
        verdict.released,
        verdict.releases,
        verdict.reconnects,
        verdict.checked.fences(),
        overlaps.len(),
        regressions.len(),
    );
    let mut errors: Vec<_> = verdict.errors.iter().collect();
    errors.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
    for (kind, n) in errors.iter().take(8) {
        println!("  error reply: {kind} ...: {n}");
    }
    for o in overlaps.iter().take(10) {
        println!("OVERLAP {o}");
    }
    check::assert_safe((overlaps, regressions));
    // The run checked something (each phase's share is in its line).
    assert!(granted >= 1_000, "only {granted} acquisitions: the run saw too little");
    let fences = verdict.checked.fences();
    assert!(fences >= 300, "only {fences} fencing tokens: the run saw too little");
    assert!(
        verdict.extended >= 100,
        "only {} extensions: the run saw too little",
        verdict.extended
    );
}
