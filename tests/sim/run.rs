//! One seeded run: proxies (the real quorum engine over simulated links), clients that take,
//! hold and release locks, liveness probes, the fault injector, and the final checks.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redlock_proxy::backend::health::QuarantineMode;
use redlock_proxy::clock::TokioClock;
use redlock_proxy::proxy::Outcome;
use redlock_proxy::quorum::{Acquired, Engine, Fenced, Settings};
use redlock_proxy::recipes::semaphore::SlotTaken;
use redlock_proxy::reply::Reply;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::check::{Fence, Grant};
use super::config::{Config, DRIFT_FACTOR, MAX_RATE_ERROR, SEMAPHORE_PERMITS, semaphores};
use super::faults;
use super::link::SimLink;
use super::recipes;
use super::report::Report;
use super::rng::Rng;
use super::world::World;

/// The real engine, over simulated links, timed by tokio's (paused) clock.
pub type SimEngine = Engine<SimLink, TokioClock>;

/// One proxy: an engine with its own links (and so its own view of every master's health).
pub struct Proxy {
    /// 0 or 1.
    pub index: usize,
    /// The engine under test.
    pub engine: SimEngine,
}

impl Proxy {
    /// Starts proxy `index` in quarantine `mode`: connects to every master and starts its
    /// periodic health probe.
    pub fn start(world: &Arc<World>, index: usize, mode: QuarantineMode, rng: &mut Rng) -> Arc<Proxy> {
        let links = world
            .masters
            .iter()
            .map(|m| SimLink::open(world, index, m, mode, rng.fork()))
            .collect();
        let settings = Settings {
            backend_timeout: world.cfg.timeout,
            drift_factor: DRIFT_FACTOR,
        };
        let proxy = Arc::new(Proxy {
            index,
            engine: Engine::new(links, TokioClock::new(), settings),
        });
        world.note(|| format!("proxy {index} starts in {mode:?} mode"));
        tokio::spawn(probes(world.clone(), proxy.clone()));
        proxy
    }

    /// Probes every master now.
    fn probe_all(&self) {
        self.engine.backends().iter().for_each(|link| link.probe());
    }

    /// How many masters would answer a request now, and vote.
    fn good_masters(&self) -> Vec<usize> {
        self.engine
            .backends()
            .iter()
            .filter(|link| link.is_good())
            .map(|link| link.master().index)
            .collect()
    }
}

/// The proxy's periodic health probe, until the run winds down.
async fn probes(world: Arc<World>, proxy: Arc<Proxy>) {
    while !world.stopped() {
        sleep(world.cfg.probe_every).await;
        proxy.probe_all();
    }
}

/// A lock a client holds.
pub struct Held {
    /// Its grant in the history.
    pub id: usize,
    /// When its validity ends.
    pub until: Instant,
}

/// What the engine answered an acquisition, plain or fenced.
#[derive(Debug)]
pub enum Answered {
    /// Granted, valid for this long from the answer.
    Yes {
        /// Rule 4's validity.
        validity: Duration,
    },
    /// Refused.
    No,
    /// Fewer than a quorum could vote (or, fenced, vouch for their counters): the error, as
    /// traces print it.
    NoQuorum(#[allow(dead_code)] String),
}

/// One acquisition: the engine's answer, and the lock if granted.
pub struct Attempt {
    /// What the engine said.
    pub result: Answered,
    /// The lock, when granted.
    pub held: Option<Held>,
}

fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Acquires `key` with `token` through `proxy`, recording the grant (property 1) or, for a
/// refusal under clean conditions, checking that the undo left nothing (property 2).
pub async fn acquire(world: &World, proxy: &Proxy, key: &str, token: &str, ttl: Duration) -> Attempt {
    acquire_as(world, proxy, key, token, ttl, Style::default()).await
}

/// How a client sends an acquisition.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    /// With `LOCK.ACQUIRE`: a fencing token (property 5).
    pub fenced: bool,
    /// The reply waits this long behind an earlier, slower command of the same connection
    /// before it is written; the connection settles it then (rule 4a, property 6).
    pub queued: Duration,
    /// The token may be one another acquisition holds now (a holder re-sending its own,
    /// legacy code writing the same timestamp): a refusal's undo must leave that holder's keys
    /// alone (rule 5a), and the clean-failure check (property 2) cannot tell them from this
    /// attempt's, so it is skipped.
    pub shared_value: bool,
    /// The key is slot of a semaphore of this many permits: taken with the semaphore's
    /// acquisition (a fenced lock whose masters also refuse another count, rule 14).
    pub permits: Option<u32>,
}

/// [`acquire`], sent in `style`.
pub async fn acquire_as(world: &World, proxy: &Proxy, key: &str, token: &str, ttl: Duration, style: Style) -> Attempt {
    let clean = world.clean_mark();
    let sent = world.elapsed();
    world.note(|| format!("p{} acquire {key} {token} ttl {ttl:?} {style:?}", proxy.index));
    // The engine's answer: validity, the undo of the grant, and its fencing token.
    let (decided, fence) = if let Some(permits) = style.permits {
        match proxy
            .engine
            .acquire_slot(0, bytes(key), bytes(token), ttl, permits)
            .await
        {
            SlotTaken::Lock(Fenced::Yes { token, validity, undo }) => (Ok((validity, undo)), Some(token)),
            SlotTaken::Lock(Fenced::No { .. }) | SlotTaken::Refused(_) => (Err(Answered::No), None),
            SlotTaken::Lock(Fenced::NoQuorum(e)) => (Err(Answered::NoQuorum(e.to_string())), None),
            SlotTaken::Lock(Fenced::Unfenced(u)) => (Err(Answered::NoQuorum(u.to_string())), None),
        }
    } else if style.fenced {
        match proxy.engine.acquire_fenced(0, bytes(key), bytes(token), ttl).await {
            Fenced::Yes { token, validity, undo } => (Ok((validity, undo)), Some(token)),
            Fenced::No { .. } => (Err(Answered::No), None),
            Fenced::NoQuorum(e) => (Err(Answered::NoQuorum(e.to_string())), None),
            Fenced::Unfenced(u) => (Err(Answered::NoQuorum(u.to_string())), None),
        }
    } else {
        match proxy.engine.acquire(0, bytes(key), bytes(token), ttl).await {
            Acquired::Yes { validity, undo } => (Ok((validity, Some(undo))), None),
            Acquired::No { .. } => (Err(Answered::No), None),
            Acquired::NoQuorum(e) => (Err(Answered::NoQuorum(e.to_string())), None),
        }
    };
    world.count_op();
    let decided_at = Instant::now();
    // Rule 4a, as the connection does it: the reply is settled when it is written.
    let result = match decided {
        Ok((validity, undo)) => {
            let outcome = Outcome::until(Reply::ok(), validity, Reply::Nil, undo);
            if !style.queued.is_zero() {
                sleep(style.queued).await;
            }
            match outcome.settle(Instant::now()).undo {
                Some(undo) if world.cfg.settle_replies => {
                    world.tally(|t| t.stale_replies += 1);
                    proxy.engine.undo(&undo).await;
                    Answered::No
                }
                _ => Answered::Yes { validity },
            }
        }
        Err(answered) => answered,
    };
    let now = Instant::now();
    world.note(|| format!("p{} acquire {key} {token} -> {result:?}", proxy.index));
    let held = match result {
        Answered::Yes { validity } => {
            // The engine's promise: a quorum holds the lock for at least `validity` from when
            // it decided (`ttl − elapsed − drift`, elapsed from before the first send). The
            // client holds it from the moment the reply reaches it (property 6: never after
            // the validity ended).
            let until = decided_at + validity;
            if until <= now {
                world.fail(format!(
                    "stale reply: {key} granted to {token} at {:.3}s, valid only until {:.3}s",
                    world.at(now).as_secs_f64(),
                    world.at(until).as_secs_f64()
                ));
            }
            if let Some(fence) = fence {
                world.record_fence(Fence {
                    key: key.into(),
                    token: fence,
                    holder: token.into(),
                    sent,
                    answered: world.at(now),
                });
            }
            let grant = Grant {
                key: key.into(),
                token: token.into(),
                proxy: proxy.index,
                from: world.at(now),
                until: world.at(until),
            };
            let id = world.record_grant(grant);
            world.after_grant(key, token);
            Some(Held { id, until })
        }
        Answered::No | Answered::NoQuorum(_) => {
            if !style.shared_value && clean.is_some() && clean == world.clean_mark() {
                world.tally(|t| t.clean_failures += 1);
                // A master that did not answer in time is undone in the background (behind
                // the write, on the same link): under clean conditions that takes less than
                // one timeout. The token is this attempt's alone, so nothing else removes it.
                sleep(world.cfg.timeout).await;
                let all: Vec<usize> = (0..world.masters.len()).collect();
                world.check_absent(key, token, &all, "a refused acquisition under clean conditions");
            }
            None
        }
    };
    Attempt { result, held }
}

/// Releases `held` through `proxy`. Every master that answered the release script ran it
/// after every earlier request of this proxy (the link is FIFO), so none of them may still
/// hold the token (property 2).
pub async fn release(world: &World, proxy: &Proxy, key: &str, token: &str, held: &Held) {
    world.end_grant(held.id);
    let answers = proxy.engine.release(0, bytes(key), bytes(token)).await;
    world.count_op();
    let answered: Vec<usize> = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| matches!(a, Ok(Reply::Int(_))))
        .map(|(i, _)| i)
        .collect();
    world.note(|| format!("p{} release {key} {token} -> answered by {answered:?}", proxy.index));
    let unanswered: Vec<usize> = (0..world.masters.len()).filter(|i| !answered.contains(i)).collect();
    let left = world.holders(key, token, &unanswered).len() as u64;
    world.tally(|t| {
        t.released_masters += answered.len() as u64;
        t.unreleased += left;
    });
    world.check_absent(key, token, &answered, "a release these masters answered");
}

/// A client: takes a random lock with a random TTL, holds it (often to the very end of its
/// validity, the edge that rule 4's arithmetic must get right; sometimes past it; sometimes
/// crashing and never releasing), releases, and rests; after a refusal it retries soon, as
/// lock clients do, so that a lock freed early is taken at once. Its acquisitions come in
/// every style: fenced; with the reply queued behind a slower command of a shared
/// connection (rule 4a); as a holder re-sending `SET NX` with its own token (rule 5a); or as
/// legacy code whose value is a timestamp in whole seconds, shared by every legacy client in
/// that second, which never releases (rule 5a: another attempt's undo must not remove it).
async fn client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: Rng) {
    let cfg = &world.cfg;
    let mut attempt = 0u64;
    while world.budget_left() {
        let key = format!("lock:{}", rng.index(cfg.keys));
        let legacy = rng.chance(0.15);
        let token = if legacy {
            format!("legacy:{}", world.elapsed().as_secs())
        } else {
            format!("c{id}.{attempt}")
        };
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let style = Style {
            fenced: rng.chance(0.5),
            queued: if rng.chance(0.2) {
                rng.between(Duration::ZERO, ttl)
            } else {
                Duration::ZERO
            },
            shared_value: legacy,
            permits: None,
        };
        let attempt = acquire_as(&world, &proxy, &key, &token, ttl, style).await;
        // As the proxy does after a fenced command: repair in the background (F5).
        if style.fenced && proxy.engine.recovery_wanted(0) {
            let proxy = proxy.clone();
            tokio::spawn(async move { proxy.engine.recover(0).await });
        }
        let Some(mut held) = attempt.held else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        if legacy {
            // The legacy holder works until its validity ends and lets the key expire.
            sleep(held.until.saturating_duration_since(Instant::now())).await;
            continue;
        }
        if rng.chance(0.2) {
            // The holder re-sends its acquisition with its own token (a retry after a lost
            // reply): Redis answers nil and the holder keeps its lock.
            sleep(rng.between(Duration::ZERO, held.until.saturating_duration_since(Instant::now()) / 2)).await;
            let again = Style {
                shared_value: true,
                ..style
            };
            world.tally(|t| t.resends += 1);
            if let Some(renewed) = acquire_as(&world, &proxy, &key, &token, ttl, again).await.held {
                // Granted again (its keys were lost): it now holds by the new grant.
                world.end_grant(held.id);
                held = renewed;
            }
        }
        if rng.chance(cfg.faults.client_crash) {
            // The holder dies: its grant stands until its validity ends, and its key stays
            // on the masters until the TTL.
            world.note(|| format!("client {id} CRASHES holding {key} ({})", held.id));
            continue;
        }
        sleep(hold_time(&mut rng, held.until)).await;
        release(&world, &proxy, &key, &token, &held).await;
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// A semaphore client: takes a permit of one of the [`semaphores`] by trying its slots in
/// turn from a random one (each slot a fenced lock, rule 14), holds it as a lock client does
/// (sometimes crashing), releases it. Every slot's grants join the history as locks of their
/// own (property 1: one holder per slot, so at most k per semaphore; property 5: tokens rise
/// per slot), and the semaphore's bound is checked at the end ([`World::report`]).
async fn semaphore_client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: Rng) {
    let cfg = &world.cfg;
    let all = semaphores();
    let mut attempt = 0u64;
    while world.budget_left() {
        let names = &all[rng.index(all.len())];
        let token = format!("s{id}.{attempt}");
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let style = Style {
            permits: Some(SEMAPHORE_PERMITS),
            queued: if rng.chance(0.2) {
                rng.between(Duration::ZERO, ttl)
            } else {
                Duration::ZERO
            },
            ..Style::default()
        };
        let first = rng.index(SEMAPHORE_PERMITS as usize) as u32;
        let mut taken = None;
        for offset in 0..SEMAPHORE_PERMITS {
            let key = String::from_utf8_lossy(&names.slot((first + offset) % SEMAPHORE_PERMITS)).into_owned();
            if let Some(held) = acquire_as(&world, &proxy, &key, &token, ttl, style).await.held {
                taken = Some((key, held));
                break;
            }
        }
        if proxy.engine.recovery_wanted(0) {
            let proxy = proxy.clone();
            tokio::spawn(async move { proxy.engine.recover(0).await });
        }
        let Some((key, held)) = taken else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        world.tally(|t| t.permits += 1);
        if rng.chance(cfg.faults.client_crash) {
            world.note(|| format!("client s{id} CRASHES holding {key} ({})", held.id));
            continue;
        }
        sleep(hold_time(&mut rng, held.until)).await;
        release(&world, &proxy, &key, &token, &held).await;
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// How long a client holds a lock valid until `until`: to the last moment of its validity
/// (a third of the time), less, or more (it overstays: its grant still ends at `until`).
pub fn hold_time(rng: &mut Rng, until: Instant) -> Duration {
    let left = until.saturating_duration_since(Instant::now());
    match rng.range(0, 9) {
        0..=2 => left,
        3 => rng.between(left, left * 3 / 2),
        _ => rng.between(Duration::ZERO, left),
    }
}

/// Property 3: now and then, when the network is calm and a quorum of masters is up,
/// reachable and admitted by this proxy, an acquisition of a fresh key must succeed.
async fn liveness(world: Arc<World>, proxy: Arc<Proxy>, mut rng: Rng) {
    let cfg = &world.cfg;
    let mut n = 0u64;
    while world.budget_left() {
        sleep(rng.between(cfg.max_ttl / 2, cfg.max_ttl * 2)).await;
        let Some(calm) = world.calm_mark() else {
            continue;
        };
        proxy.probe_all();
        let good = proxy.good_masters();
        if good.len() < cfg.quorum() {
            continue;
        }
        let (key, token) = (
            format!("probe:{}:{n}", proxy.index),
            format!("probe{}.{n}", proxy.index),
        );
        n += 1;
        let attempt = acquire(&world, &proxy, &key, &token, cfg.max_ttl).await;
        match attempt.held {
            Some(held) => {
                world.tally(|t| t.liveness_checks += 1);
                release(&world, &proxy, &key, &token, &held).await;
            }
            None if world.calm_mark() == Some(calm) => {
                world.tally(|t| t.liveness_checks += 1);
                world.fail(format!(
                    "liveness: uncontended acquire of {key} answered {:?} with masters {good:?} up, \
                     reachable and admitted by proxy {} (quorum {}) and every message leg under a fifth \
                     of the timeout",
                    attempt.result,
                    proxy.index,
                    cfg.quorum()
                ));
            }
            None => {}
        }
    }
}

/// Starts the clients of `proxy` and its liveness prober.
fn start_clients(world: &Arc<World>, proxy: &Arc<Proxy>, rng: &mut Rng) -> Vec<JoinHandle<()>> {
    let mut actors: Vec<JoinHandle<()>> = (0..world.cfg.clients)
        .filter(|id| id % world.cfg.proxies == proxy.index)
        .map(|id| tokio::spawn(client(world.clone(), proxy.clone(), id, rng.fork())))
        .collect();
    // A semaphore client per proxy, beside the lock clients.
    actors.push(tokio::spawn(semaphore_client(
        world.clone(),
        proxy.clone(),
        proxy.index,
        rng.fork(),
    )));
    // And one client of each other recipe.
    let (w, p, i) = (world.clone(), proxy.clone(), proxy.index);
    actors.push(tokio::spawn(recipes::rw_client(w.clone(), p.clone(), i, rng.fork())));
    actors.push(tokio::spawn(recipes::multikey_client(
        w.clone(),
        p.clone(),
        i,
        rng.fork(),
    )));
    actors.push(tokio::spawn(recipes::election_client(
        w.clone(),
        p.clone(),
        i,
        rng.fork(),
    )));
    actors.push(tokio::spawn(recipes::reentrant_client(
        w.clone(),
        p.clone(),
        i,
        rng.fork(),
    )));
    actors.push(tokio::spawn(recipes::session_client(w, p, i, rng.fork())));
    actors.push(tokio::spawn(liveness(world.clone(), proxy.clone(), rng.fork())));
    actors
}

/// The second proxy: from the start, or joining late in `Always` mode.
async fn second_proxy(world: Arc<World>, mut rng: Rng) {
    let (delay, mode) = match (world.cfg.late_join, world.cfg.mode) {
        (Some(delay), QuarantineMode::Off) => (delay, QuarantineMode::Off),
        (Some(delay), _) => (delay, QuarantineMode::Always),
        (None, mode) => (Duration::ZERO, mode),
    };
    sleep(delay).await;
    let proxy = Proxy::start(&world, 1, mode, &mut rng);
    join(start_clients(&world, &proxy, &mut rng)).await;
}

/// Waits for every actor.
async fn join(actors: Vec<JoinHandle<()>>) {
    for actor in actors {
        actor.await.expect("a simulated actor panicked");
    }
}

/// A runtime for one run: current-thread, so that scheduling is deterministic, with tokio's
/// clock paused, so that simulated time jumps from one timer to the next.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime with a paused clock")
}

/// Runs the simulation `cfg` describes, to the end, and checks it.
pub fn run(cfg: Config) -> Report {
    runtime().block_on(simulate(cfg))
}

async fn simulate(cfg: Config) -> Report {
    let mut rng = Rng::new(cfg.seed);
    let world = Arc::new(World::new(cfg, rng.fork()));
    faults::spawn(&world, &mut rng);
    let first = Proxy::start(&world, 0, world.cfg.mode, &mut rng);
    let mut actors = start_clients(&world, &first, &mut rng);
    if world.cfg.proxies == 2 {
        actors.push(tokio::spawn(second_proxy(world.clone(), rng.fork())));
    }
    join(actors).await;
    world.stop_and_heal();
    // Every message still on the wire arrives, then every key it may have set expires
    // (a master whose clock runs slow keeps a key a little longer in real time).
    let slowest_expiry = world.cfg.max_ttl.mul_f64(1.0 / (1.0 - MAX_RATE_ERROR));
    sleep(world.cfg.settle() + slowest_expiry + Duration::from_millis(10)).await;
    world.check_empty();
    world.report()
}
