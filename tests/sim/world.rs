//! The simulated world every actor shares: the masters, the network's weather, the fault
//! injector's actions, the op budget, and what the checks found.
//!
//! Every change that can make a message late, lost or refused (a crash, a restart, a
//! failover, a partition starting or ending, a storm starting or ending) bumps one event
//! counter: a
//! check that needs clean conditions reads the counter before and after the operation and
//! applies only when nothing happened in between.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::check::{Fence, Grant, History, Kind, fingerprint};
use super::config::{Config, SEMAPHORE_PERMITS};
use super::faults::keeps_half;
use super::master::{SimMaster, lock};
use super::report::{Report, Tally};
use super::rng::Rng;

/// The network's state, global to all links.
#[derive(Debug)]
struct Weather {
    stormy: bool,
    /// When the current spell began.
    since: Instant,
}

/// The adversary that restarts masters at the worst moment.
#[derive(Debug)]
struct Nemesis {
    rng: Rng,
    /// When it last struck: it waits a quarantine between strikes, so that the masters are
    /// not all kept out of every quorum at once.
    last: Option<Instant>,
}

/// What happens to one request and its reply on the wire.
#[derive(Clone, Copy, Debug)]
pub struct Fate {
    /// The request never reaches the master.
    pub request_lost: bool,
    /// How long the request takes to arrive.
    pub request_delay: Duration,
    /// The master executes the request but the reply never arrives.
    pub reply_lost: bool,
    /// How long the reply takes to arrive.
    pub reply_delay: Duration,
}

/// Everything shared.
pub struct World {
    /// The run's parameters.
    pub cfg: Config,
    /// The masters, in configuration order.
    pub masters: Vec<Arc<SimMaster>>,
    start: Instant,
    weather: Mutex<Weather>,
    events: AtomicU64,
    stopped: AtomicBool,
    ops: AtomicU64,
    history: Mutex<History>,
    failures: Mutex<Vec<String>>,
    tally: Mutex<Tally>,
    trace: Option<Mutex<Vec<String>>>,
    nemesis: Mutex<Nemesis>,
}

impl World {
    /// A world of fresh masters, calm, at time zero. Must run inside the simulation's
    /// runtime (its clocks are tokio's paused clock).
    pub fn new(cfg: Config, nemesis: Rng) -> World {
        let masters = cfg
            .rates
            .iter()
            .enumerate()
            .map(|(i, &rate)| Arc::new(SimMaster::new(i, rate)))
            .collect();
        let now = Instant::now();
        World {
            trace: cfg.trace.then(|| Mutex::new(Vec::new())),
            cfg,
            masters,
            start: now,
            weather: Mutex::new(Weather {
                stormy: false,
                since: now,
            }),
            events: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            history: Mutex::new(History::default()),
            failures: Mutex::new(Vec::new()),
            tally: Mutex::new(Tally::default()),
            nemesis: Mutex::new(Nemesis {
                rng: nemesis,
                last: None,
            }),
        }
    }

    /// Simulated time since the start of the run.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Simulated time of `instant`, from the start of the run.
    pub fn at(&self, instant: Instant) -> Duration {
        instant.saturating_duration_since(self.start)
    }

    /// Logs an event when tracing (the message is only built then).
    pub fn note(&self, event: impl FnOnce() -> String) {
        if let Some(trace) = &self.trace {
            let line = format!("{:>10.3}s  {}", self.elapsed().as_secs_f64(), event());
            lock(trace).push(line);
        }
    }

    /// Records a failed property, with the seed to replay it.
    pub fn fail(&self, what: String) {
        let line = format!("seed {} at {:.3}s: {what}", self.cfg.seed, self.elapsed().as_secs_f64());
        self.note(|| format!("FAILURE {line}"));
        lock(&self.failures).push(line);
    }

    /// Updates the counters.
    pub fn tally(&self, update: impl FnOnce(&mut Tally)) {
        update(&mut lock(&self.tally));
    }

    /// One acquire or release call happened.
    pub fn count_op(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether clients may start another operation.
    pub fn budget_left(&self) -> bool {
        self.ops.load(Ordering::Relaxed) < self.cfg.ops && !self.stopped()
    }

    /// Whether the run is winding down: no more faults.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    fn event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    // ----- the network -----------------------------------------------------------------

    /// Draws what happens to one request and its reply, given the weather.
    pub fn fate(&self, rng: &mut Rng) -> Fate {
        let stormy = lock(&self.weather).stormy;
        let (timeout, faults) = (self.cfg.timeout, &self.cfg.faults);
        let leg = |rng: &mut Rng| match stormy {
            false => rng.between(Duration::ZERO, timeout / 5),
            true if rng.chance(faults.slow) => rng.between(timeout / 2, self.cfg.slowest_leg()),
            true => rng.between(Duration::ZERO, timeout / 2),
        };
        Fate {
            request_lost: stormy && rng.chance(faults.loss),
            request_delay: leg(rng),
            reply_lost: stormy && rng.chance(faults.loss),
            reply_delay: leg(rng),
        }
    }

    /// The event count, if the network has been calm long enough for every message of the
    /// last storm to have arrived or been lost: every leg now takes at most a fifth of the
    /// timeout and none is lost.
    pub fn calm_mark(&self) -> Option<u64> {
        let weather = lock(&self.weather);
        let settled = !weather.stormy && weather.since + self.cfg.settle() <= Instant::now();
        settled.then(|| self.events.load(Ordering::Relaxed))
    }

    /// [`World::calm_mark`], and every master running and reachable.
    pub fn clean_mark(&self) -> Option<u64> {
        let mark = self.calm_mark()?;
        self.masters.iter().all(|m| m.is_reachable()).then_some(mark)
    }

    // ----- faults ----------------------------------------------------------------------

    /// Master `i` crashes.
    pub fn crash(&self, i: usize) {
        self.masters[i].crash();
        self.event();
        self.tally(|t| t.crashes += 1);
        self.note(|| format!("m{i} CRASHES"));
    }

    /// Master `i`, if down, restarts empty.
    pub fn restart(&self, i: usize) {
        if self.masters[i].restart() {
            self.event();
            self.note(|| format!("m{i} RESTARTS empty"));
        }
    }

    /// Master `i`, if up, fails over to a replica that has only the keys for which `keep` is
    /// true (see [`SimMaster::fail_over`]).
    pub fn fail_over(&self, i: usize, keep: impl FnMut(&[u8]) -> bool) {
        if let Some(lost) = self.masters[i].fail_over(keep) {
            self.event();
            self.tally(|t| t.failovers += 1);
            self.note(|| format!("m{i} FAILS OVER to a replica missing {lost} keys"));
        }
    }

    /// Cuts master `i` off the network, or reconnects it.
    pub fn partition(&self, i: usize, cut: bool) {
        if self.masters[i].set_partitioned(cut) {
            self.event();
            if cut {
                self.tally(|t| t.partitions += 1);
            }
            self.note(|| format!("m{i} {}", if cut { "PARTITIONED" } else { "reconnected" }));
        }
    }

    /// A storm starts or ends.
    pub fn storm(&self, stormy: bool) {
        let mut weather = lock(&self.weather);
        if weather.stormy == stormy {
            return;
        }
        *weather = Weather {
            stormy,
            since: Instant::now(),
        };
        drop(weather);
        self.event();
        if stormy {
            self.tally(|t| t.storms += 1);
        }
        self.note(|| (if stormy { "STORM begins" } else { "calm" }).to_string());
    }

    /// The end of the run: no more faults; every master restarted and reconnected, calm.
    pub fn stop_and_heal(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for i in 0..self.masters.len() {
            self.restart(i);
            self.partition(i, false);
        }
        self.storm(false);
    }

    /// The worst-moment nemesis, told of every grant: when exactly a bare majority holds
    /// the lock, it restarts one of the holders (empty) and heals every partition, so that
    /// the restarted master and the minority that missed the lock form a new majority. Only
    /// rule 8's quarantine stands between that and a second grant. In runs with failovers,
    /// half the time the holder fails over instead, to a replica that missed the grant (and
    /// half the other keys): its long uptime must not spare it the quarantine.
    pub fn after_grant(&self, key: &str, token: &str) {
        if !self.cfg.faults.worst_moment || self.stopped() {
            return;
        }
        let now = Instant::now();
        let mut nemesis = lock(&self.nemesis);
        if nemesis.last.is_some_and(|last| now < last + self.cfg.quarantine()) {
            return;
        }
        let holders: Vec<usize> = (0..self.masters.len())
            .filter(|&i| self.masters[i].holds(key, token))
            .collect();
        if holders.len() != self.cfg.quorum() {
            return;
        }
        let victim = nemesis.rng.pick(&holders);
        nemesis.last = Some(now);
        let fail_over = (self.cfg.faults.failover_gap.is_some() && nemesis.rng.chance(0.5))
            .then(|| keeps_half(nemesis.rng.next_u64()));
        drop(nemesis);
        let how = if fail_over.is_some() { "fail over" } else { "restart" };
        self.note(|| format!("NEMESIS: {key} by {token} held on bare majority {holders:?}; {how} m{victim}"));
        self.tally(|t| t.worst_moments += 1);
        match fail_over {
            Some(mut half) => self.fail_over(victim, |k| k != key.as_bytes() && half(k)),
            None => {
                self.crash(victim);
                self.restart(victim);
            }
        }
        for i in 0..self.masters.len() {
            self.partition(i, false);
        }
    }

    // ----- checks ------------------------------------------------------------------------

    /// Records a grant (property 1 is checked over all of them at the end).
    pub fn record_grant(&self, grant: Grant) -> usize {
        self.note(|| format!("GRANT {grant}"));
        lock(&self.history).grant(grant)
    }

    /// Records a grant of `kind` (a read-write lock's hold); returns its id.
    pub fn record_hold(&self, grant: Grant, kind: Kind) -> usize {
        self.note(|| format!("GRANT {kind:?} {grant}"));
        lock(&self.history).hold(grant, kind)
    }

    /// Records a fencing token (property 5 is checked over all of them at the end).
    pub fn record_fence(&self, fence: Fence) {
        self.note(|| format!("FENCE {} {} to {}", fence.key, fence.token, fence.holder));
        lock(&self.history).fence(fence);
    }

    /// The holder of grant `id` stops holding it now.
    pub fn end_grant(&self, id: usize) {
        lock(&self.history).end(id, self.elapsed());
    }

    /// Which of `masters` hold `token` under `key` now (ground truth).
    pub fn holders(&self, key: &str, token: &str, masters: &[usize]) -> Vec<usize> {
        masters
            .iter()
            .copied()
            .filter(|&i| self.masters[i].holds(key, token))
            .collect()
    }

    /// Property 2: none of `masters` may hold `token` under `key` any more (`after` says
    /// what should have removed it).
    pub fn check_absent(&self, key: &str, token: &str, masters: &[usize], after: &str) {
        let left = self.holders(key, token, masters);
        if !left.is_empty() {
            self.fail(format!(
                "orphan: after {after}, {key} still holds {token} on masters {left:?}"
            ));
        }
    }

    /// Property 2, at the very end: once every TTL has passed, no master holds anything.
    pub fn check_empty(&self) {
        for master in &self.masters {
            // Fencing counters and epochs never expire: they are not leftovers.
            let count = master.key_count() - master.fence_key_count(self.cfg.keys);
            if count != 0 {
                let keys: Vec<String> = (0..self.cfg.keys)
                    .map(|k| format!("lock:{k}"))
                    .filter_map(|key| master.value(&key).map(|v| format!("{key}={v}")))
                    .collect();
                self.fail(format!(
                    "m{} still holds {count} keys after every TTL passed: {keys:?}",
                    master.index
                ));
            }
        }
    }

    /// What the run came to.
    pub fn report(&self) -> Report {
        let history = lock(&self.history);
        let ops = self.ops.load(Ordering::Relaxed);
        Report {
            seed: self.cfg.seed,
            ops,
            grants: history.len() as u64,
            violations: history
                .overlaps()
                .into_iter()
                .map(|v| format!("seed {}: mutual exclusion violated: {v}", self.cfg.seed))
                .chain(
                    history
                        .more_than(SEMAPHORE_PERMITS as usize, semaphore_of)
                        .into_iter()
                        .map(|v| format!("seed {}: semaphore bound violated: {v}", self.cfg.seed)),
                )
                .chain(
                    history
                        .rw_overlaps()
                        .into_iter()
                        .map(|v| format!("seed {}: read-write exclusion violated: {v}", self.cfg.seed)),
                )
                .collect(),
            failures: lock(&self.failures).clone(),
            fences: history.fences() as u64,
            fence_violations: history
                .fence_regressions()
                .into_iter()
                .map(|v| format!("seed {}: fencing token regressed: {v}", self.cfg.seed))
                .collect(),
            tally: lock(&self.tally).clone(),
            sim_time: self.elapsed(),
            fingerprint: fingerprint(&history, ops),
            trace: self.trace.as_ref().map(|t| lock(t).clone()).unwrap_or_default(),
        }
    }
}

/// The semaphore a slot key belongs to (its name without the slot's number); `None` for a
/// lock's key.
fn semaphore_of(key: &str) -> Option<String> {
    let rest = key.strip_prefix("redlock-proxy:sem:")?;
    rest.rsplit_once(':').map(|(base, _)| base.to_owned())
}
