//! The election's commands as the proxy reads them: `ELECT.*`, typed.

use bytes::Bytes;

use crate::command::call::{Call, LockOp, LossOf, Released};

/// An `ELECT.*` command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElectCmd {
    /// `ELECT.CAMPAIGN election value ttl_ms [WAIT ms]`: the term (a fencing token) once this
    /// connection leads, nil when `WAIT` ran out. Always a session lock (`KEEPALIVE`).
    Campaign {
        /// The election.
        election: Bytes,
        /// The candidate's value: its token as a lock holder, what `LEADER` and `OBSERVE` show.
        value: Bytes,
        /// The TTL of the leadership's lock, in milliseconds (the fallback should the proxy die).
        ttl_ms: u64,
        /// `WAIT ms`: wait up to this long in line for the leadership.
        wait_ms: Option<u64>,
    },
    /// `ELECT.LEADER election`: `[value, term]` of the leader a quorum holds, or nil.
    Leader {
        /// The election.
        election: Bytes,
    },
    /// `ELECT.RESIGN election value`: 1 when the leadership of `value` was given up, else 0.
    Resign {
        /// The election.
        election: Bytes,
        /// The leader's value.
        value: Bytes,
    },
    /// `ELECT.OBSERVE election [AFTER term TIMEOUT ms]`: without `AFTER` (RESP3), the current
    /// leader, then a push on every change; with it, a long poll.
    Observe {
        /// The election.
        election: Bytes,
        /// `AFTER term TIMEOUT ms`: answer once the leader's term differs from `term` (0: no
        /// leader), or after `ms` with the current leader.
        after: Option<(u64, u64)>,
    },
    /// `ELECT.UNOBSERVE election`: 1 when this connection observed the election, else 0.
    Unobserve {
        /// The election.
        election: Bytes,
    },
}

impl ElectCmd {
    /// The election's name (the user's key: the lock's key is the proxy's own).
    pub fn election(&self) -> &Bytes {
        match self {
            ElectCmd::Campaign { election, .. }
            | ElectCmd::Leader { election }
            | ElectCmd::Resign { election, .. }
            | ElectCmd::Observe { election, .. }
            | ElectCmd::Unobserve { election } => election,
        }
    }

    /// The lower-case name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            ElectCmd::Campaign { .. } => "elect.campaign",
            ElectCmd::Leader { .. } => "elect.leader",
            ElectCmd::Resign { .. } => "elect.resign",
            ElectCmd::Observe { .. } => "elect.observe",
            ElectCmd::Unobserve { .. } => "elect.unobserve",
        }
    }
}

impl Call for ElectCmd {
    /// An election's lock: the election's name.
    fn named_key(key: &Bytes) -> Option<Bytes> {
        super::names::name_of(key)
    }

    fn metered(&self) -> (&'static str, LockOp) {
        let op = match self {
            ElectCmd::Campaign { wait_ms: Some(_), .. } => LockOp::Waiting,
            ElectCmd::Campaign { .. } => LockOp::Acquire,
            ElectCmd::Resign { .. } => LockOp::Release,
            ElectCmd::Leader { .. } | ElectCmd::Observe { .. } | ElectCmd::Unobserve { .. } => LockOp::Other,
        };
        (self.name(), op)
    }

    /// `ELECT.RESIGN`: the leader gives the election's lock back.
    fn releases(&self) -> Option<Released> {
        match self {
            ElectCmd::Resign { election, value } => Some(Released::Lock {
                key: super::names::lock_key(election),
                token: value.clone(),
            }),
            ElectCmd::Campaign { .. } | ElectCmd::Leader { .. } | ElectCmd::Observe { .. } | ElectCmd::Unobserve { .. } => {
                None
            }
        }
    }

    /// Every `ELECT.*` command on an election whose leadership (a session lock) was lost.
    fn loss_of(&self) -> Option<LossOf<'_>> {
        Some(LossOf {
            named: self.election(),
            owns: |lost, named| *lost == super::names::lock_key(named),
        })
    }

    fn keys(&self) -> &[Bytes] {
        std::slice::from_ref(self.election())
    }

    /// Leadership is a session lock.
    fn session_ttl(&self) -> Option<u64> {
        match self {
            ElectCmd::Campaign { ttl_ms, .. } => Some(*ttl_ms),
            ElectCmd::Leader { .. } | ElectCmd::Resign { .. } | ElectCmd::Observe { .. } | ElectCmd::Unobserve { .. } => {
                None
            }
        }
    }

    /// A campaign that waits, and an observation.
    fn waits(&self) -> usize {
        match self {
            ElectCmd::Campaign { wait_ms: Some(_), .. } | ElectCmd::Observe { .. } => 1,
            ElectCmd::Campaign { .. } | ElectCmd::Leader { .. } | ElectCmd::Resign { .. } | ElectCmd::Unobserve { .. } => 0,
        }
    }

    fn written_value(&self) -> Option<&Bytes> {
        match self {
            ElectCmd::Campaign { value, .. } => Some(value),
            ElectCmd::Leader { .. } | ElectCmd::Resign { .. } | ElectCmd::Observe { .. } | ElectCmd::Unobserve { .. } => {
                None
            }
        }
    }
}
