//! What one seeded run looks like: sizes, timings and fault rates, all drawn from the seed,
//! so that a seed printed by a failing assertion is enough to replay the run exactly.

use std::time::Duration;

use redlock_proxy::backend::health::QuarantineMode;
use redlock_proxy::quorum::drift;

use super::rng::Rng;

/// The engine's drift factor (rule 4's default).
pub const DRIFT_FACTOR: f64 = 0.01;

/// How far a master's clock rate may stray from real time: ±0.5 %, so that any master is
/// within half of the engine's 1 % allowance of the proxy's clock.
pub const MAX_RATE_ERROR: f64 = 0.005;

/// How many times the backend timeout a delayed message may take on one leg in a storm.
pub const SLOWEST_LEG: u32 = 3;

/// The faults a run injects.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Mean time between two crashes of one master (each followed by a restart without
    /// persistence); `None`: masters never crash on their own.
    pub crash_gap: Option<Duration>,
    /// Mean time between two failovers of one master to a replica that missed about half
    /// the keys and has run far longer than `max_ttl`; `None`: no failovers.
    pub failover_gap: Option<Duration>,
    /// Mean time between two network partitions isolating one master.
    pub partition_gap: Option<Duration>,
    /// Whether the weather alternates between calm and stormy spells. Calm: every message
    /// leg takes at most a fifth of the backend timeout and none is lost. Stormy: some legs
    /// take up to [`SLOWEST_LEG`] timeouts and some messages are lost.
    pub storms: bool,
    /// In a storm, the probability that a request, or a reply, is lost.
    pub loss: f64,
    /// In a storm, the probability that a leg is slower than half the timeout.
    pub slow: f64,
    /// Restart a master at the worst moment: right after a grant held by exactly a bare
    /// majority, restart one of its holders and heal every partition (rule 8's scenario).
    pub worst_moment: bool,
    /// Probability that a client holding a lock crashes and never releases it.
    pub client_crash: f64,
}

impl Faults {
    /// No faults at all: for scripted scenarios, which inject their own.
    pub fn none() -> Faults {
        Faults {
            crash_gap: None,
            failover_gap: None,
            partition_gap: None,
            storms: false,
            loss: 0.0,
            slow: 0.0,
            worst_moment: false,
            client_crash: 0.0,
        }
    }
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed every other random choice of the run derives from.
    pub seed: u64,
    /// Number of independent masters (N).
    pub masters: usize,
    /// Each master's clock rate, within `1 ± MAX_RATE_ERROR`.
    pub rates: Vec<f64>,
    /// Number of proxies (engines) over the same masters: 1 or 2.
    pub proxies: usize,
    /// When set, the second proxy starts this late, in `Always` mode (a late proxy must not
    /// trust masters that restarted just before it: `Restarts` mode would be unsafe).
    pub late_join: Option<Duration>,
    /// Clients; client `i` talks to proxy `i % proxies`.
    pub clients: usize,
    /// Lock keys the clients fight over.
    pub keys: usize,
    /// Rule 3's per-backend timeout.
    pub timeout: Duration,
    /// The largest TTL a client asks for; the restart quarantine is derived from it.
    pub max_ttl: Duration,
    /// How often each proxy probes its masters with `INFO` (health, rule 8).
    pub probe_every: Duration,
    /// Operations (acquire and release calls) after which clients stop.
    pub ops: u64,
    /// Rule 8's mode for the proxies started at the beginning.
    pub mode: QuarantineMode,
    /// The faults injected.
    pub faults: Faults,
    /// Keep a log of every event (only for replaying one seed: it costs time and memory).
    pub trace: bool,
    /// Whether a reply is settled when it is written, as the proxy's connection does (rule
    /// 4a). Off only to show that the checker catches stale replies.
    pub settle_replies: bool,
}

impl Config {
    /// A random run for `seed`, of about `ops` operations, with proxies in `mode`.
    pub fn random(seed: u64, ops: u64, mode: QuarantineMode) -> Config {
        let mut rng = Rng::new(seed ^ 0xA076_1D64_78BD_642F);
        let masters = rng.pick(&[3, 3, 5, 5, 5, 7]);
        let max_ttl = rng.between(Duration::from_millis(200), Duration::from_millis(2_000));
        let proxies = if rng.chance(0.3) { 2 } else { 1 };
        let late_join = (proxies == 2 && rng.chance(0.5)).then(|| rng.between(Duration::ZERO, max_ttl * 3));
        let faults = Faults {
            crash_gap: rng.chance(0.85).then(|| max_ttl * rng.range(2, 12) as u32),
            failover_gap: None,
            partition_gap: rng.chance(0.85).then(|| max_ttl * rng.range(2, 12) as u32),
            storms: rng.chance(0.8),
            loss: rng.range(1, 8) as f64 / 100.0,
            slow: rng.range(5, 30) as f64 / 100.0,
            worst_moment: rng.chance(0.5),
            client_crash: rng.range(0, 8) as f64 / 100.0,
        };
        let mut config = Config {
            seed,
            rates: rates(&mut rng, masters),
            masters,
            proxies,
            late_join,
            clients: rng.range(3, 8) as usize,
            keys: rng.range(1, 3) as usize,
            timeout: rng.between(Duration::from_millis(20), Duration::from_millis(80)),
            max_ttl,
            probe_every: rng.between(Duration::from_millis(100), Duration::from_millis(1_000)),
            ops,
            mode,
            faults,
            trace: false,
            settle_replies: true,
        };
        // Drawn last, so that the rest of a seed's configuration is what it was before
        // failovers were simulated.
        config.faults.failover_gap = rng.chance(0.5).then(|| max_ttl * rng.range(2, 12) as u32);
        config
    }

    /// Rule 8 switched off, with the worst-moment restarts (or failovers, in runs that have
    /// them) and frequent partitions (so that locks often sit on a bare majority): runs that
    /// must show violations.
    pub fn quarantine_off(seed: u64, ops: u64) -> Config {
        let mut config = Config::random(seed, ops, QuarantineMode::Off);
        let mut rng = Rng::new(seed ^ 0xE703_7ED1_A0B4_28DB);
        config.masters = rng.pick(&[3, 5]);
        config.rates = rates(&mut rng, config.masters);
        config.late_join = None;
        config.keys = 1;
        config.faults.worst_moment = true;
        config.faults.partition_gap = Some(config.max_ttl);
        config
    }

    /// [`Config::random`] with every master's clock running `rate` times real time: beyond
    /// the engine's allowance, keys expire on the masters while their holders still count
    /// on them, which the checker must catch.
    pub fn drifting(seed: u64, ops: u64, rate: f64) -> Config {
        let mut config = Config::random(seed, ops, QuarantineMode::Restarts);
        config.rates = vec![rate; config.masters];
        config
    }

    /// A fixed, fault-free world of `masters` masters for scripted scenarios.
    pub fn scripted(masters: usize, mode: QuarantineMode) -> Config {
        Config {
            seed: 0,
            masters,
            rates: vec![1.0; masters],
            proxies: 1,
            late_join: None,
            clients: 0,
            keys: 1,
            timeout: Duration::from_millis(50),
            max_ttl: Duration::from_millis(1_000),
            probe_every: Duration::from_millis(500),
            ops: u64::MAX,
            mode,
            faults: Faults::none(),
            trace: false,
            settle_replies: true,
        }
    }

    /// Rule 2: how many masters must agree.
    pub fn quorum(&self) -> usize {
        self.masters / 2 + 1
    }

    /// Rule 8: how long a restarted master stays out of every quorum: `max_ttl` plus its
    /// drift allowance, so that every lock granted before the restart has expired.
    pub fn quarantine(&self) -> Duration {
        self.max_ttl + drift(self.max_ttl, DRIFT_FACTOR)
    }

    /// The longest one message leg can take.
    pub fn slowest_leg(&self) -> Duration {
        self.timeout * SLOWEST_LEG
    }

    /// How long after a storm every message sent during it has arrived or been lost: only
    /// then do the "clean conditions" checks apply.
    pub fn settle(&self) -> Duration {
        self.slowest_leg() * 2 + self.timeout
    }

    /// A TTL for one acquisition: mostly a sizeable fraction of `max_ttl`, sometimes one too
    /// short to leave any validity after the drift allowance (rule 4's refusal path).
    pub fn ttl(&self, rng: &mut Rng) -> Duration {
        if rng.chance(0.05) {
            return rng.between(Duration::from_millis(1), self.timeout * 2);
        }
        rng.between((self.max_ttl / 10).max(self.timeout), self.max_ttl)
    }
}

/// Per-master clock rates within `1 ± MAX_RATE_ERROR`, the extremes included now and then.
fn rates(rng: &mut Rng, masters: usize) -> Vec<f64> {
    (0..masters)
        .map(|_| match rng.range(0, 5) {
            0 => 1.0 - MAX_RATE_ERROR,
            1 => 1.0 + MAX_RATE_ERROR,
            _ => 1.0 + (rng.unit() * 2.0 - 1.0) * MAX_RATE_ERROR,
        })
        .collect()
}

/// The semaphores the semaphore clients share (`sem:0`, `sem:1`), of this many permits each.
pub const SEMAPHORE_PERMITS: u32 = 2;

/// The names of the semaphores' keys on the masters.
pub fn semaphores() -> [redlock_proxy::recipes::semaphore::Names; 2] {
    [0, 1].map(|j| redlock_proxy::recipes::semaphore::Names::of(format!("sem:{j}").as_bytes()))
}
