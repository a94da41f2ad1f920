//! The one place that decides a master's state: up, down, or quarantined after a restart.
//!
//! Rule 8 (delayed restart): a master that restarted without persistence lost its keys; if
//! it voted at once, a lock held on a bare majority that included it could be granted again.
//! So a master seen to have restarted takes part in no quorum until `max_ttl` (+ drift) has
//! passed since its restart: by then every lock granted before the restart has expired.
//!
//! A restart is seen as a `run_id` different from the last one seen, or, on first sight
//! (mode `always`), an uptime below the quarantine. It is checked on every (re)connection,
//! before the connection is used, and by the periodic probe.
//!
//! Rule 15: a master whose `run_id` another member showed first is that member's server
//! reached under a second URL; it is a duplicate, and does not vote ([`super::identity`]).
//! A master whose wall clock gained on the proxy's beyond the drift allowance may have
//! expired keys early, as a restarted one lost them: it is quarantined the same way
//! ([`super::wall_clock`]), judged at every probe and at every acquisition it votes on.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::identity::Identities;
use super::wall_clock::{Reading, WallClock};
use super::{Answer, BackendError, Place, Sink, split_time};
use crate::clock::Clock;

/// When to quarantine a restarted master.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum QuarantineMode {
    /// Restarts this proxy observes (a new `run_id`), and masters found with an uptime
    /// below the quarantine when first seen (they may have restarted just before the proxy).
    #[default]
    Always,
    /// Only restarts this proxy observes; masters are trusted when first seen. For a proxy
    /// started together with fresh masters, when no lock can predate them.
    Restarts,
    /// Never. Unsafe with masters that restart without persistence: for tests and for
    /// masters with `appendfsync always`.
    Off,
}

/// A master's state as the quorum engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Answering and voting.
    Up,
    /// Unreachable or not answering its probe: not tried, so it costs no timeout.
    Down,
    /// Restarted recently: no vote until `remaining` has passed.
    Quarantined {
        /// Time left.
        remaining: Duration,
    },
    /// Its master is the same process (same `run_id`) as member `of`'s, which showed it
    /// first: one server counts once (rule 15), so this member does not vote.
    Duplicate {
        /// The index of the member it duplicates.
        of: usize,
    },
}

impl State {
    /// `up`, `down` or `quarantined`, for `INFO` and logs.
    pub fn name(self) -> &'static str {
        match self {
            State::Up => "up",
            State::Down => "down",
            State::Quarantined { .. } => "quarantined",
            State::Duplicate { .. } => "duplicate",
        }
    }
}

/// One master's health.
pub struct Health {
    name: String,
    clock: Arc<dyn Clock>,
    mode: QuarantineMode,
    /// How long a restarted master stays out: `max_ttl` plus its drift allowance.
    quarantine: Duration,
    /// The registry of the members' `run_id`s and this member's index in it (none for a
    /// cluster's shards: see [`Identities`]).
    member: Option<(Arc<Identities>, usize)>,
    /// The master's wall clock as seen so far (rule 15), when it is judged: not with
    /// `quarantine = "off"`, nor where no clock reading is taken.
    wall: Option<Mutex<WallClock>>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The master's `run_id` when last seen.
    run_id: Option<String>,
    /// End of the quarantine, on [`Health::clock`].
    quarantined_until: Option<Duration>,
    /// Whether the last probe or connection attempt failed.
    down: bool,
    /// The member (index and name) whose master this one's is, when it is a duplicate.
    duplicate_of: Option<(usize, String)>,
    /// Why the last probe or connection attempt failed, for the status page: an operator
    /// who sees a master down asks why before anything else.
    down_why: Option<String>,
    /// What began or last lengthened the quarantine, for the status page.
    quarantine_why: Option<String>,
}

impl Health {
    /// Health for master `name`; a restarted master stays out for `quarantine`.
    pub fn new(name: impl Into<String>, clock: Arc<dyn Clock>, mode: QuarantineMode, quarantine: Duration) -> Health {
        Health {
            name: name.into(),
            clock,
            mode,
            quarantine,
            member: None,
            wall: None,
            inner: Mutex::new(Inner {
                down: true,
                ..Inner::default()
            }),
        }
    }

    /// The health of member `index`, checked against the other members' `run_id`s in
    /// `identities` each time its master's identity is seen.
    pub fn member_of(self, identities: Arc<Identities>, index: usize) -> Health {
        Health {
            member: Some((identities, index)),
            ..self
        }
    }

    /// The health of a master whose wall clock is judged against the proxy's with rule 4's
    /// `drift_factor` (rule 15), unless the quarantine is off.
    pub fn watching_clock(self, drift_factor: f64) -> Health {
        let wall = (self.mode != QuarantineMode::Off).then(|| Mutex::new(WallClock::new(drift_factor)));
        Health { wall, ..self }
    }

    /// Now, on the clock the health is kept by: when a request carrying a clock reading left.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Whether readings of the master's clock are judged: a request need carry none otherwise.
    pub fn watches_clock(&self) -> bool {
        self.wall.is_some()
    }

    /// Rule 15: a reading of the master's wall clock (`TIME`), taken by a request that left
    /// at `sent` (on [`Health::now`]'s clock) and whose reply is being read now. A clock that
    /// gained on the proxy's beyond the drift allowance quarantines the master, as a restart
    /// does: its keys may have expired early, so it votes again only once every lock granted
    /// before has expired. The reading's own reply (a vote) is then no vote: `Err`.
    pub fn clock_read(&self, sent: Duration, master: Duration) -> Result<(), BackendError> {
        let Some(wall) = &self.wall else {
            return Ok(());
        };
        let received = self.clock.now();
        // A panic while holding this lock cannot leave it inconsistent: one number, written whole.
        let mut wall = wall.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(ahead) = wall.read(Reading { sent, received, master }) else {
            drop(wall);
            // Rule 8: no vote from a master in quarantine, though this reading shows no jump
            // of its own. It is judged against the last one, and when that one found the jump
            // (another member of the same transaction, with the same `TIME`; a request in
            // flight at the jump) this one's gain since is nothing. Sent before the quarantine,
            // the request was admitted; its vote is refused here, when its reply is read.
            return match self.state() {
                State::Quarantined { remaining } => Err(BackendError::Quarantined { remaining }),
                _ => Ok(()),
            };
        };
        drop(wall);
        let mut inner = self.lock();
        // Logged when the master leaves the quorum, not at every reading that keeps it out
        // (a clock that keeps running fast is caught again at each one).
        let was_out = inner.quarantined_until.is_some_and(|until| until > received);
        if extend(&mut inner, received.saturating_add(self.quarantine)) {
            inner.quarantine_why = Some(format!(
                "wall clock ahead by {} ms beyond the drift allowance",
                ahead.as_millis()
            ));
            if !was_out {
                tracing::warn!(
                    backend = %self.name,
                    ahead_ms = ahead.as_millis() as u64,
                    quarantine_ms = self.quarantine.as_millis() as u64,
                    "backend's wall clock jumped forward or runs fast beyond the drift allowance: it may have \
                     expired locks early, so it is quarantined and takes no part in any quorum until every lock \
                     granted before has expired"
                );
            }
        }
        Err(BackendError::ClockAhead { ahead })
    }

    /// `place`, for a [`super::Request::timed`] request leaving now: behind the judge of its
    /// reply's clock reading ([`Health::clock_read`]).
    pub fn timed(health: &Arc<Health>, place: Place) -> Place {
        let sink = Timed {
            place: Mutex::new(Some(place)),
            health: health.clone(),
            sent: health.now(),
        };
        Place::new(Arc::new(sink), 0)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave it inconsistent: every field is a
        // plain value written whole.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current state.
    pub fn state(&self) -> State {
        let inner = self.lock();
        let now = self.clock.now();
        match inner.quarantined_until {
            Some(until) if until > now => State::Quarantined { remaining: until - now },
            _ => match &inner.duplicate_of {
                Some((of, _)) => State::Duplicate { of: *of },
                None if inner.down => State::Down,
                None => State::Up,
            },
        }
    }

    /// Whether a request may go to this master now (rule 8; and rule 3: a master known
    /// down is not waited for).
    pub fn admit(&self) -> Result<(), BackendError> {
        match self.state() {
            State::Up => Ok(()),
            State::Down => Err(BackendError::Down),
            State::Quarantined { remaining } => Err(BackendError::Quarantined { remaining }),
            State::Duplicate { of } => Err(BackendError::Duplicate { of }),
        }
    }

    /// Whether a cleanup request (an owner-checked delete) may go to the master: also when it
    /// is marked down (the connection decides), never while quarantined or a duplicate (it
    /// votes on nothing, and was sent nothing to undo).
    pub fn admit_cleanup(&self) -> Result<(), BackendError> {
        match self.state() {
            State::Quarantined { remaining } => Err(BackendError::Quarantined { remaining }),
            State::Duplicate { of } => Err(BackendError::Duplicate { of }),
            State::Up | State::Down => Ok(()),
        }
    }

    /// Whether a read of the proxy's own bookkeeping may go to the master
    /// ([`super::Request::inspect`]): also while it is quarantined (it says what it holds;
    /// it votes on nothing), never while it is down or a duplicate.
    pub fn admit_inspection(&self) -> Result<(), BackendError> {
        match self.state() {
            State::Up | State::Quarantined { .. } => Ok(()),
            State::Down => Err(BackendError::Down),
            State::Duplicate { of } => Err(BackendError::Duplicate { of }),
        }
    }

    /// The master answered with its identity: `run_id` and uptime. Quarantines it when that
    /// shows a restart (rule 8), keeps it out while another member showed that `run_id` first
    /// (rule 15), and marks it up.
    pub fn observed(&self, run_id: &str, uptime: Duration) {
        // The registry first, without this health's lock: it is asked by every member.
        let duplicate_of = self
            .member
            .as_ref()
            .and_then(|(identities, index)| identities.seen(*index, &self.name, run_id));
        let mut inner = self.lock();
        if inner.duplicate_of != duplicate_of {
            match &duplicate_of {
                Some((of, other)) => tracing::error!(
                    backend = %self.name,
                    duplicate_of = %other,
                    member = of,
                    run_id,
                    "backend {} is the same Redis server (same run_id) as backend {other}: one server must not \
                     be two quorum members, so it does not vote until the run ids differ; list each master once",
                    self.name
                ),
                None => {
                    tracing::warn!(backend = %self.name, run_id, "backend no longer a duplicate of another member: it votes again")
                }
            }
            inner.duplicate_of = duplicate_of;
        }
        let now = self.clock.now();
        // Until `max_ttl` (and its drift) after the keys it lacks could last have been written
        // (rule 8; by 8a every such key expires within max_ttl of that moment).
        let (why, until) = match &inner.run_id {
            // Another process answers: a restart, or a replica promoted in a failover (a
            // Sentinel group's or a cluster shard's). A promoted replica's uptime says nothing
            // about when it became master, and the process it replaced may have taken writes
            // until the proxy stopped using it, which is now at the latest: counted from now.
            Some(known) if known != run_id => (
                Some((
                    "backend restarted or failed over (new run_id)",
                    "only if it kept its data",
                )),
                now + self.quarantine,
            ),
            Some(_) => (None, now),
            // `uptime` is the least the uptime can be (see `parse_identity`): the quarantine
            // runs from the latest moment the master may have restarted, which may be before
            // this proxy started (its clock's origin): every proxy computes the same end.
            None if self.mode == QuarantineMode::Always && uptime < self.quarantine => (
                Some((
                    "backend first seen with an uptime below max_ttl: it may have restarted just before",
                    "only if no lock can predate it: a new master, or one that kept its data",
                )),
                now + (self.quarantine - uptime),
            ),
            None => (None, now),
        };
        if let Some((why, lift_only)) = why
            && self.mode != QuarantineMode::Off
            && extend(&mut inner, until)
        {
            inner.quarantine_why = Some(why.to_owned());
            tracing::warn!(
                backend = %self.name,
                run_id,
                uptime_ms = uptime.as_millis() as u64,
                quarantine_ms = until.saturating_sub(now).as_millis() as u64,
                "{why}: quarantined for {} s, it takes no part in any quorum until every lock granted before \
                 its restart has expired (lift it with PROXY QUARANTINE {} LIFT {lift_only})",
                until.saturating_sub(now).as_secs(),
                self.name
            );
        }
        match inner.quarantined_until {
            // One line each way: reachable but not voting, then voting once the quarantine ran
            // out (seen by the probe), so that "up" is never logged for a master that does not vote.
            Some(until) if until > now && inner.down => {
                let secs = (until - now).as_secs();
                tracing::info!(backend = %self.name, "backend reachable; quarantined, it votes again in {secs} s");
            }
            Some(until) if until > now => {}
            Some(_) => {
                inner.quarantined_until = None;
                tracing::info!(backend = %self.name, "backend's quarantine is over: up, it votes again");
            }
            None if inner.down => tracing::info!(backend = %self.name, "backend up"),
            None => {}
        }
        inner.down = false;
        inner.run_id = Some(run_id.to_owned());
    }

    /// The member's master moved (a Sentinel group failed over): the new master may lack
    /// the last writes, so it is a restart with data loss (rule 8), counted from now, the
    /// latest the proxy may have written to the old one. Applied before any connection moves.
    pub fn switched(&self, from: &str, to: &str) {
        if self.mode == QuarantineMode::Off {
            tracing::warn!(backend = %self.name, from, to, "failover: the master moved (quarantine off)");
            return;
        }
        tracing::warn!(
            backend = %self.name,
            from,
            to,
            quarantine_ms = self.quarantine.as_millis() as u64,
            "failover: the master moved; quarantined, it takes no part in any quorum until every lock granted before has expired"
        );
        let mut inner = self.lock();
        if extend(&mut inner, self.clock.now() + self.quarantine) {
            inner.quarantine_why = Some(format!("failover: the master moved from {from} to {to}"));
        }
    }

    /// The master did not answer its probe, or a connection to it failed.
    pub fn failed(&self, why: &str) {
        let mut inner = self.lock();
        if !inner.down {
            tracing::warn!(backend = %self.name, error = %why, "backend down");
        }
        inner.down = true;
        // A master stays down through many failed probes, each with the same reason.
        if inner.down_why.as_deref() != Some(why) {
            inner.down_why = Some(why.to_owned());
        }
    }

    /// Ends a quarantine early (an operator who knows the master kept its data). Whether it
    /// was quarantined: lifting nothing changes nothing, and logs nothing.
    pub fn lift_quarantine(&self) -> bool {
        let now = self.clock.now();
        let mut inner = self.lock();
        let was = inner.quarantined_until.is_some_and(|until| until > now);
        inner.quarantined_until = None;
        drop(inner);
        if was {
            tracing::warn!(backend = %self.name, "quarantine lifted by an operator");
        }
        was
    }

    /// Quarantines the master from now on (an operator who knows it restarted unseen).
    pub fn quarantine_now(&self) {
        let until = self.clock.now() + self.quarantine;
        tracing::warn!(backend = %self.name, quarantine_ms = self.quarantine.as_millis() as u64, "quarantined by an operator");
        let mut inner = self.lock();
        inner.quarantined_until = Some(until);
        inner.quarantine_why = Some("quarantined by an operator (PROXY QUARANTINE)".to_owned());
    }

    /// Why the master is not up, when known: what began its quarantine, why it was last
    /// marked down, or which member it duplicates; `None` while it is up. For the status page.
    pub fn why(&self) -> Option<String> {
        let state = self.state();
        let inner = self.lock();
        match state {
            State::Up => None,
            State::Down => inner.down_why.clone(),
            State::Quarantined { .. } => inner.quarantine_why.clone(),
            State::Duplicate { .. } => inner
                .duplicate_of
                .as_ref()
                .map(|(of, name)| format!("the same Redis server (run_id) as backend {of} ({name})")),
        }
    }

    /// The last `run_id` seen.
    pub fn run_id(&self) -> Option<String> {
        self.lock().run_id.clone()
    }
}

/// Rule 15: where the answer to a [`Request::timed`] request goes first. Its clock reading is
/// judged against the master's history before the reply is handed on without it: a vote from
/// a master whose clock jumped ahead becomes [`BackendError::ClockAhead`], no vote.
struct Timed {
    place: Mutex<Option<Place>>,
    health: Arc<Health>,
    /// When the request left: the reading was taken after.
    sent: Duration,
}

impl Timed {
    fn take(&self) -> Option<Place> {
        // A panic while holding this lock cannot leave it inconsistent: it holds one value.
        self.place
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

impl Sink for Timed {
    fn complete(&self, _: usize, answer: Answer) {
        let Some(place) = self.take() else { return };
        place.complete(answer.and_then(|reply| match split_time(reply) {
            (reply, Some(master)) => self.health.clock_read(self.sent, master).map(|()| reply),
            (reply, None) => Ok(reply),
        }));
    }

    fn is_open(&self, _: usize) -> bool {
        let place = self.place.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        place.as_ref().is_some_and(Place::is_open)
    }
}

/// Keeps the master out until `until` at least (a quarantine is only ever lengthened: two
/// reasons to distrust it do not cancel out); whether that lengthened it.
fn extend(inner: &mut Inner, until: Duration) -> bool {
    let longer = inner.quarantined_until.is_none_or(|u| u < until);
    if longer {
        inner.quarantined_until = Some(until);
    }
    longer
}

/// Reads `run_id` and the uptime from an `INFO server` reply: the least the uptime can be,
/// since the quarantine must run from the latest moment the master may have restarted.
///
/// Redis computes `uptime_in_seconds` as the difference of two whole-second wall-clock
/// readings, so it may exceed the true uptime by up to a second: the proxy takes one second
/// less. `uptime_in_milliseconds` (the embedded masters) is taken as it is.
pub fn parse_identity(info: &str) -> Option<(String, Duration)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
    };
    let run_id = field("run_id")?.to_owned();
    let uptime = match field("uptime_in_milliseconds").and_then(|v| v.parse::<u64>().ok()) {
        Some(ms) => Duration::from_millis(ms),
        None => Duration::from_secs(field("uptime_in_seconds")?.parse::<u64>().ok()?.saturating_sub(1)),
    };
    Some((run_id, uptime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Manual(AtomicU64);

    impl Clock for Manual {
        fn now(&self) -> Duration {
            Duration::from_millis(self.0.load(Ordering::SeqCst))
        }
    }

    fn health(mode: QuarantineMode) -> (Arc<Manual>, Health) {
        let clock = Arc::new(Manual(AtomicU64::new(1_000_000)));
        let h = Health::new("m", clock.clone(), mode, Duration::from_secs(10));
        (clock, h)
    }

    /// Rule 15 with readings of one moment: acquisitions that shared a transaction (one
    /// `TIME`), or requests in flight when the master's clock jumped. The first reading after
    /// the jump quarantines the master; every later vote is refused too, though its reading,
    /// judged against that first one, shows no jump of its own.
    #[test]
    fn every_vote_read_after_a_jump_is_refused_not_only_the_first() {
        let (clock, h) = health(QuarantineMode::Always);
        let h = h.watching_clock(0.01);
        let wall = Duration::from_secs(1_700_000_000);
        let sent = clock.now();
        assert_eq!(h.clock_read(sent, sent + wall), Ok(()));
        clock.0.fetch_add(100, Ordering::SeqCst);
        let sent = clock.now();
        let jumped = sent + wall + Duration::from_secs(5);
        assert!(matches!(
            h.clock_read(sent, jumped),
            Err(BackendError::ClockAhead { .. })
        ));
        assert!(
            matches!(h.clock_read(sent, jumped), Err(BackendError::Quarantined { .. })),
            "another member of the same transaction"
        );
        clock.0.fetch_add(1, Ordering::SeqCst);
        assert!(
            matches!(
                h.clock_read(sent, jumped + Duration::from_millis(1)),
                Err(BackendError::Quarantined { .. })
            ),
            "a request in flight at the jump"
        );
    }

    /// Item 8b of the issue: a proxy that has just started (its clock's origin is its start)
    /// counted a master's quarantine from its own start, not the master's (the subtraction of
    /// the uptime stopped at the origin): masters up for 7 s were quarantined for the whole
    /// quarantine, and a second proxy started later computed an end of its own.
    #[test]
    fn a_master_first_seen_is_quarantined_from_its_own_start_by_every_proxy() {
        let started_first = Arc::new(Manual(AtomicU64::new(0)));
        let first = Health::new(
            "m",
            started_first.clone(),
            QuarantineMode::Always,
            Duration::from_secs(10),
        );
        first.observed("a", Duration::from_secs(7));
        assert_eq!(
            first.state(),
            State::Quarantined {
                remaining: Duration::from_secs(3)
            }
        );
        // Another proxy, started 2 s later (its clock at its origin), sees an uptime of 9 s.
        let started_later = Arc::new(Manual(AtomicU64::new(0)));
        let later = Health::new("m", started_later, QuarantineMode::Always, Duration::from_secs(10));
        later.observed("a", Duration::from_secs(9));
        assert_eq!(
            later.state(),
            State::Quarantined {
                remaining: Duration::from_secs(1)
            },
            "the same end"
        );
    }

    #[test]
    fn a_new_run_id_is_a_restart() {
        let (clock, h) = health(QuarantineMode::Always);
        h.observed("a", Duration::from_secs(3600));
        assert_eq!(h.state(), State::Up);
        h.observed("b", Duration::from_secs(2));
        assert_eq!(
            h.state(),
            State::Quarantined {
                remaining: Duration::from_secs(10)
            },
            "counted from when the new process was seen, not from its start"
        );
        assert_eq!(
            h.admit(),
            Err(BackendError::Quarantined {
                remaining: Duration::from_secs(10)
            })
        );
        clock.0.fetch_add(10_000, Ordering::SeqCst);
        assert_eq!(h.state(), State::Up, "back after max_ttl since it was seen");
    }

    /// A failover: the member's master is now a replica that has run for an hour. Counted
    /// from its start (as a restart once was), the quarantine would be over before it began,
    /// and the replica, missing the last writes, would vote at once.
    #[test]
    fn a_promoted_replica_is_quarantined_whatever_its_uptime() {
        let (clock, h) = health(QuarantineMode::Always);
        h.observed("old-master", Duration::from_secs(7200));
        h.observed("replica", Duration::from_secs(3600));
        assert_eq!(
            h.state(),
            State::Quarantined {
                remaining: Duration::from_secs(10)
            }
        );
        clock.0.fetch_add(9_999, Ordering::SeqCst);
        assert!(matches!(h.state(), State::Quarantined { .. }));
        h.observed("old-master", Duration::from_secs(7210));
        assert_eq!(
            h.state(),
            State::Quarantined {
                remaining: Duration::from_secs(10)
            },
            "failing back is a failover too"
        );
    }

    #[test]
    fn first_sight_young_master_depends_on_mode() {
        let (_, always) = health(QuarantineMode::Always);
        always.observed("a", Duration::from_secs(1));
        assert!(matches!(always.state(), State::Quarantined { .. }));
        let (_, restarts) = health(QuarantineMode::Restarts);
        restarts.observed("a", Duration::from_secs(1));
        assert_eq!(restarts.state(), State::Up);
        let (_, old) = health(QuarantineMode::Always);
        old.observed("a", Duration::from_secs(60));
        assert_eq!(old.state(), State::Up, "up longer than any lock lives");
    }

    #[test]
    fn off_never_quarantines() {
        let (_, h) = health(QuarantineMode::Off);
        h.observed("a", Duration::from_secs(1));
        h.observed("b", Duration::ZERO);
        assert_eq!(h.state(), State::Up);
    }

    #[test]
    fn down_until_observed() {
        let (_, h) = health(QuarantineMode::Restarts);
        assert_eq!(h.admit(), Err(BackendError::Down));
        h.observed("a", Duration::from_secs(1));
        h.failed("probe timed out");
        assert_eq!(h.state(), State::Down);
        assert_eq!(h.admit(), Err(BackendError::Down));
        assert_eq!(
            h.admit_cleanup(),
            Ok(()),
            "an undo still goes out on an open connection"
        );
        h.observed("a", Duration::from_secs(2));
        assert_eq!(h.state(), State::Up, "same run: no quarantine");
        h.observed("b", Duration::from_secs(1));
        assert_eq!(
            h.admit_cleanup(),
            Err(BackendError::Quarantined {
                remaining: Duration::from_secs(10)
            }),
            "a quarantined master gets nothing"
        );
    }

    /// The status page says why a master is out: the reason that fits its state now.
    #[test]
    fn why_follows_the_state() {
        let (clock, h) = health(QuarantineMode::Restarts);
        assert_eq!(h.why(), None, "never seen: down, for no known reason yet");
        h.failed("connect timed out");
        assert_eq!(h.why().as_deref(), Some("connect timed out"));
        h.observed("a", Duration::from_secs(1));
        assert_eq!(h.why(), None, "up");
        h.observed("b", Duration::from_secs(1));
        assert_eq!(
            h.why().as_deref(),
            Some("backend restarted or failed over (new run_id)")
        );
        h.failed("probe timed out");
        assert!(
            h.why().is_some_and(|w| w.contains("new run_id")),
            "quarantined and down: the quarantine is what keeps it out longest"
        );
        clock.0.fetch_add(10_000, Ordering::SeqCst);
        assert_eq!(
            h.why().as_deref(),
            Some("probe timed out"),
            "the quarantine is over, still down"
        );
        h.quarantine_now();
        assert!(h.why().is_some_and(|w| w.contains("operator")));
    }

    #[test]
    fn identity_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\nuptime_in_seconds:42\r\n";
        // Whole seconds may overstate the uptime by up to one: the least it can be is 41 s.
        assert_eq!(parse_identity(info), Some(("abc".into(), Duration::from_secs(41))));
        let ms = "run_id:x\r\nuptime_in_seconds:1\r\nuptime_in_milliseconds:1500\r\n";
        assert_eq!(parse_identity(ms), Some(("x".into(), Duration::from_millis(1500))));
        assert_eq!(parse_identity("nothing"), None);
    }
}
