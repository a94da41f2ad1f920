//! Rule 4a: a lock reply must still be true when it is written to the client.
//!
//! Replies go back in request order, so an `OK` decided at quorum can wait behind a slower
//! command the same connection sent earlier (multiplexing clients do this in normal use).
//! Every reply that holds only for a while (a grant, a validity figure, a success judged by
//! rule 7) carries the moment it stops being true; the connection settles it when it writes
//! it: still true, it goes out as it is; no longer, it becomes its failure value and a grant
//! is undone.

use bytes::Bytes;
use tokio::time::{Duration, Instant};

use crate::quorum::Undo;
use crate::reply::Reply;
use crate::sessions::SessionGrant;

/// What `WATCH` read: each key with the value a majority held (`None`: absent).
pub type WatchedValues = Vec<(Bytes, Option<Bytes>)>;

/// A reply, and until when it is true.
#[derive(Debug)]
pub struct Outcome {
    /// What the client is told while the reply still holds.
    pub reply: Reply,
    /// For a reply that holds only for a while: when it stops, and what it becomes.
    pub valid: Option<Valid>,
    /// For a grant that becomes a session lock once the client has it.
    pub session: Option<SessionGrant>,
    /// For a grant of several locks at once (`LOCK.ACQUIREALL ... KEEPALIVE`): the session
    /// locks beyond [`Outcome::session`], started with it, or not at all.
    pub more_sessions: Vec<SessionGrant>,
    /// The session grants kept since they were granted (rule 16), by keeping id
    /// (`crate::sessions::Starter::begin`): confirmed when the reply is written.
    pub begun: Vec<u64>,
    /// The command's keys are free on a quorum after it (a release, whatever its text): what
    /// ends a session lock a script released (`crate::sessions::Effect::Script`).
    pub freed: bool,
    /// For `WATCH`: the value each key held on a majority, for the connection to keep.
    pub watched: Option<Box<WatchedValues>>,
    /// For `SEM.RELEASE` and `RWLOCK.RELEASE`: the key of the hold it released (a semaphore
    /// slot, a reader's hold), which a session lock of the token may keep
    /// (`crate::sessions::Effect::PermitReleased`).
    pub released_hold: Option<Bytes>,
}

/// An outcome as it stands when written.
#[derive(Debug)]
pub struct Settled {
    /// What the client is told.
    pub reply: Reply,
    /// A grant whose validity ran out before it was written: to be undone.
    pub undo: Option<Undo>,
    /// A grant the client now holds as a session lock.
    pub session: Option<SessionGrant>,
    /// See [`Outcome::more_sessions`]: empty when [`Settled::session`] is `None`.
    pub more_sessions: Vec<SessionGrant>,
    /// See [`Outcome::freed`].
    pub freed: bool,
    /// See [`Outcome::released_hold`].
    pub released_hold: Option<Bytes>,
}

/// How long a reply holds, and what it becomes after.
#[derive(Debug)]
pub enum Valid {
    /// The reply is true until `until`; after that it becomes `instead` (nil for `SET NX`, 0
    /// for `SETNX` and `PEXPIRE`, ...), and `undo`, for a grant, takes back the attempt that
    /// took it (rule 5a).
    Until {
        /// When the validity behind the reply runs out.
        until: Instant,
        /// The failure value.
        instead: Reply,
        /// The grant to take back.
        undo: Option<Box<Undo>>,
    },
    /// The reply reports validity left in milliseconds, figured at `figured`: an integer, or
    /// the `validity_ms` field of a map, one figure or one per slot (`SEM.INFO`). Each figure
    /// is reduced by the time until it is written, and is 0 once none is left.
    Counting {
        /// When the figures were what they say (at the latest).
        figured: Instant,
        /// How the figures are told: `TTL`'s in seconds, counted in milliseconds until
        /// written.
        unit: Unit,
    },
}

/// How a count of milliseconds left is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// As it is.
    Ms,
    /// In seconds, rounded as Redis rounds `TTL`: `(ms + 500) / 1000`.
    Seconds,
}

impl Outcome {
    /// Rule 16: begins keeping every grant of this outcome now, through `starter`: the grants
    /// move from `session` and `more_sessions` to the `begun` keepings, which the connection
    /// confirms when it writes the reply. A grant already past its validity is left as it is:
    /// the reply becomes its failure value and is undone.
    pub fn begin_keeping(&mut self, starter: &crate::sessions::Starter) {
        if self.session.is_none() || self.lapsed(Instant::now()) {
            return;
        }
        let grants = self.session.take().into_iter().chain(self.more_sessions.drain(..));
        self.begun = starter.begin(grants);
    }

    /// A reply that holds whenever it is written.
    pub fn plain(reply: Reply) -> Outcome {
        Outcome {
            reply,
            valid: None,
            session: None,
            more_sessions: Vec::new(),
            begun: Vec::new(),
            freed: false,
            watched: None,
            released_hold: None,
        }
    }

    /// The command's keys are free on a quorum after it.
    pub fn freed(mut self) -> Outcome {
        self.freed = true;
        self
    }

    /// It released the hold `key` (see [`Outcome::released_hold`]).
    pub fn released_hold(mut self, key: Option<Bytes>) -> Outcome {
        self.released_hold = key;
        self
    }

    /// These grants, once written, become session locks together (several locks at once).
    pub fn with_sessions(mut self, grants: Vec<SessionGrant>) -> Outcome {
        let mut grants = grants.into_iter();
        self.session = grants.next();
        self.more_sessions = grants.collect();
        self
    }

    /// This grant, once written, becomes a session lock (`crate::sessions`).
    pub fn with_session(mut self, grant: SessionGrant) -> Outcome {
        self.session = Some(grant);
        self
    }

    /// A reply that holds for `validity` from now; after that it becomes `instead` and
    /// `undo`, if any, takes the grant back.
    pub fn until(reply: Reply, validity: Duration, instead: Reply, undo: Option<Undo>) -> Outcome {
        Outcome {
            reply,
            valid: Some(Valid::Until {
                until: Instant::now() + validity,
                instead,
                undo: undo.map(Box::new),
            }),
            session: None,
            more_sessions: Vec::new(),
            begun: Vec::new(),
            freed: false,
            watched: None,
            released_hold: None,
        }
    }

    /// A reply reporting validity left as of now, in milliseconds (see [`Valid::Counting`]):
    /// each figure is reduced by the time until it is written.
    pub fn remaining(reply: Reply) -> Outcome {
        Outcome::remaining_since(reply, Instant::now())
    }

    /// [`Outcome::remaining`] for figures that were true at `figured`: a read's start, when
    /// the figures are what the masters said during it.
    pub fn remaining_since(reply: Reply, figured: Instant) -> Outcome {
        Outcome {
            valid: Some(Valid::Counting {
                figured,
                unit: Unit::Ms,
            }),
            ..Outcome::plain(reply)
        }
    }

    /// `TTL`'s reply: `ms` left at `figured`, told in seconds when written.
    pub fn seconds_remaining_since(ms: i64, figured: Instant) -> Outcome {
        Outcome {
            valid: Some(Valid::Counting {
                figured,
                unit: Unit::Seconds,
            }),
            ..Outcome::plain(Reply::Int(ms))
        }
    }

    /// Whether the reply's validity has run out at `now`: it would be written as its failure
    /// value.
    pub fn lapsed(&self, now: Instant) -> bool {
        matches!(self.valid, Some(Valid::Until { until, .. }) if until <= now)
    }

    /// Its begun session grants are still kept and valid (`crate::sessions::SessionLocks::confirm`):
    /// the reply holds whenever it is written now, however old its own validity.
    pub fn kept(mut self) -> Outcome {
        if matches!(self.valid, Some(Valid::Until { .. })) {
            self.valid = None;
        }
        self
    }

    /// Its begun session grants were lost or ran out before it was written: a grant becomes
    /// its failure value and is undone, as one whose validity ran out (rule 16). `false` when
    /// the reply has no failure value (it is written as it is; the caller tells the loss).
    pub fn lapse(&mut self, now: Instant) -> bool {
        match &mut self.valid {
            Some(Valid::Until { until, .. }) => {
                *until = (*until).min(now);
                true
            }
            _ => false,
        }
    }

    /// The reply as it stands at `now`, the moment it is written: the grant to undo if it no
    /// longer holds, or the session lock it starts if it does.
    pub fn settle(self, now: Instant) -> Settled {
        let Some(valid) = self.valid else {
            return Settled {
                reply: self.reply,
                undo: None,
                session: self.session,
                more_sessions: self.more_sessions,
                freed: self.freed,
                released_hold: self.released_hold,
            };
        };
        let (reply, undo, session, more_sessions) = match valid {
            Valid::Counting { figured, unit } => {
                let elapsed = now.saturating_duration_since(figured);
                (told(self.reply, elapsed, unit), None, self.session, self.more_sessions)
            }
            Valid::Until { until, .. } if until > now => (self.reply, None, self.session, self.more_sessions),
            Valid::Until { instead, undo, .. } => (instead, undo.map(|u| *u), None, Vec::new()),
        };
        Settled {
            reply,
            undo,
            session,
            more_sessions,
            freed: self.freed,
            released_hold: self.released_hold,
        }
    }
}

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Outcome {
        Outcome::plain(reply)
    }
}

/// `reply`'s figures of milliseconds left, `elapsed` after they were true, as they are told
/// in `unit` ([`Unit::Seconds`]: one positive figure, rounded as Redis rounds `TTL`).
pub fn told(reply: Reply, elapsed: Duration, unit: Unit) -> Reply {
    match (counted_down(reply, elapsed), unit) {
        (Reply::Int(ms), Unit::Seconds) if ms > 0 => Reply::Int(ms.saturating_add(500) / 1000),
        (left, _) => left,
    }
}

/// `reply` with each of its validity figures reduced by `elapsed` (see [`Valid::Counting`]).
fn counted_down(reply: Reply, elapsed: Duration) -> Reply {
    match reply {
        Reply::Int(ms) => Reply::Int(less(ms, elapsed)),
        Reply::Map(fields) => Reply::Map(
            fields
                .into_iter()
                .map(|(name, value)| match &name {
                    Reply::Bulk(n) if n.as_ref() == b"validity_ms" => (name, figures_less(value, elapsed)),
                    _ => (name, value),
                })
                .collect(),
        ),
        other => other,
    }
}

/// A `validity_ms` field reduced by `elapsed`: one figure, or one per slot.
fn figures_less(value: Reply, elapsed: Duration) -> Reply {
    match value {
        Reply::Int(ms) => Reply::Int(less(ms, elapsed)),
        Reply::Map(rows) => Reply::Map(
            rows.into_iter()
                .map(|(slot, ms)| match ms {
                    Reply::Int(ms) => (slot, Reply::Int(less(ms, elapsed))),
                    other => (slot, other),
                })
                .collect(),
        ),
        other => other,
    }
}

/// `ms` less `elapsed`, in whole ms: 0 once none is left, and a positive figure never rounds
/// down to 0, which would read as "none". A figure that is not positive stays as it is.
fn less(ms: i64, elapsed: Duration) -> i64 {
    let Ok(figure @ 1..) = u64::try_from(ms) else {
        return ms;
    };
    let left = Duration::from_millis(figure).saturating_sub(elapsed);
    if left.is_zero() {
        0
    } else {
        i64::try_from(left.as_millis()).unwrap_or(i64::MAX).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_grant_past_its_validity_becomes_its_failure_value() {
        let granted = Outcome::until(Reply::ok(), Duration::from_millis(50), Reply::Nil, None);
        tokio::time::advance(Duration::from_millis(49)).await;
        assert_eq!(granted.settle(Instant::now()).reply, Reply::ok(), "still valid");
        let granted = Outcome::until(Reply::ok(), Duration::from_millis(50), Reply::Nil, None);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(granted.settle(Instant::now()).reply, Reply::Nil, "expired while queued");
    }

    #[tokio::test(start_paused = true)]
    async fn a_validity_figure_is_what_is_left_when_written() {
        let extended = Outcome::remaining(Reply::Int(900));
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(extended.settle(Instant::now()).reply, Reply::Int(600));
        let extended = Outcome::remaining(Reply::Int(57));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(
            extended.settle(Instant::now()).reply,
            Reply::Int(0),
            "none left: 0, never 57"
        );
        let info = Reply::Map(vec![(Reply::bulk("validity_ms"), Reply::Int(500))]);
        let info = Outcome::remaining(info);
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(
            info.settle(Instant::now()).reply,
            Reply::Map(vec![(Reply::bulk("validity_ms"), Reply::Int(300))])
        );
    }

    /// `TTL`: counted down in milliseconds, told in seconds as Redis rounds them.
    #[tokio::test(start_paused = true)]
    async fn a_ttl_in_seconds_is_rounded_only_when_written() {
        let ttl = Outcome::seconds_remaining_since(1700, Instant::now());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(ttl.settle(Instant::now()).reply, Reply::Int(2), "1 600 ms");
        let ttl = Outcome::seconds_remaining_since(1700, Instant::now());
        tokio::time::advance(Duration::from_millis(201)).await;
        assert_eq!(ttl.settle(Instant::now()).reply, Reply::Int(1), "1 499 ms");
        let ttl = Outcome::seconds_remaining_since(1700, Instant::now());
        tokio::time::advance(Duration::from_millis(1700)).await;
        assert_eq!(ttl.settle(Instant::now()).reply, Reply::Int(0), "none left");
    }

    /// `SEM.INFO`'s figures, one per held slot, each counted down alike; nothing else in the
    /// reply changes.
    #[tokio::test(start_paused = true)]
    async fn every_slots_figure_is_what_is_left_when_written() {
        let slots = |a: i64, b: i64| Reply::Map(vec![(Reply::Int(0), Reply::Int(a)), (Reply::Int(3), Reply::Int(b))]);
        let info = |a: i64, b: i64| {
            Reply::Map(vec![
                (Reply::bulk("holders"), Reply::Int(2)),
                (Reply::bulk("validity_ms"), slots(a, b)),
            ])
        };
        let shown = Outcome::remaining(info(800, 150));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(shown.settle(Instant::now()).reply, info(600, 0));
    }
}
