//! The semaphore's commands as the proxy reads them: `SEM.*`, typed.

use bytes::Bytes;

use crate::command::call::{Call, LockOp, LossOf, Released};

/// A `SEM.*` command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SemCmd {
    /// `SEM.ACQUIRE key token permits ttl_ms [WAIT ms] [KEEPALIVE]`: `[slot, fencing token]`,
    /// or nil when no permit is free (after waiting up to `WAIT` ms for one).
    Acquire {
        /// The semaphore.
        key: Bytes,
        /// The holder's token (rule 1): it holds one slot of the semaphore at most.
        token: Bytes,
        /// The semaphore's count of permits, 1 to [`MAX_PERMITS`](super::MAX_PERMITS).
        permits: u32,
        /// Milliseconds.
        ttl_ms: u64,
        /// `KEEPALIVE`: the permit is a session lock, kept alive while the connection is open.
        keepalive: bool,
        /// `WAIT ms`: wait up to this long in this proxy's queue for the semaphore.
        wait_ms: Option<u64>,
    },
    /// `SEM.EXTEND key token ttl_ms`: the validity left in ms, or 0.
    Extend {
        /// The semaphore.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
        /// The new TTL in milliseconds.
        ttl_ms: u64,
    },
    /// `SEM.RELEASE key token`: 1 if released, else 0.
    Release {
        /// The semaphore.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
    },
    /// `SEM.INFO key`: its permits, holders, free slots and waiters.
    Info {
        /// The semaphore.
        key: Bytes,
    },
}

impl SemCmd {
    /// The semaphore's key (the user's: its slots' keys are the proxy's own).
    pub fn key(&self) -> &Bytes {
        match self {
            SemCmd::Acquire { key, .. }
            | SemCmd::Extend { key, .. }
            | SemCmd::Release { key, .. }
            | SemCmd::Info { key } => key,
        }
    }

    /// The lower-case name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            SemCmd::Acquire { .. } => "sem.acquire",
            SemCmd::Extend { .. } => "sem.extend",
            SemCmd::Release { .. } => "sem.release",
            SemCmd::Info { .. } => "sem.info",
        }
    }
}

impl Call for SemCmd {
    /// A slot's key: its semaphore's.
    fn named_key(key: &Bytes) -> Option<Bytes> {
        super::names::user_key(key)
    }

    /// A slot's key: its semaphore's line (its waiters wait for any slot).
    fn queue_of(key: &Bytes) -> Option<Bytes> {
        super::names::split_slot(key).map(|(base, _)| key.slice_ref(base))
    }

    fn metered(&self) -> (&'static str, LockOp) {
        let op = match self {
            SemCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
            SemCmd::Acquire { .. } => LockOp::Acquire,
            SemCmd::Extend { .. } => LockOp::Extend,
            SemCmd::Release { .. } => LockOp::Release,
            SemCmd::Info { .. } => LockOp::Other,
        };
        (self.name(), op)
    }

    /// `SEM.RELEASE`: the slot it released is named in its outcome.
    fn releases(&self) -> Option<Released> {
        match self {
            SemCmd::Release { token, .. } => Some(Released::Hold { token: token.clone() }),
            SemCmd::Acquire { .. } | SemCmd::Extend { .. } | SemCmd::Info { .. } => None,
        }
    }

    /// Every `SEM.*` command on a semaphore whose permit (a slot kept as a session lock) was
    /// lost.
    fn loss_of(&self) -> Option<LossOf<'_>> {
        Some(LossOf {
            named: self.key(),
            owns: |lost, named| super::names::user_key(lost).as_ref() == Some(named),
        })
    }

    fn keys(&self) -> &[Bytes] {
        std::slice::from_ref(self.key())
    }

    /// A permit of `SEM.ACQUIRE ... KEEPALIVE`: its slot is a session lock.
    fn session_ttl(&self) -> Option<u64> {
        match self {
            SemCmd::Acquire {
                ttl_ms,
                keepalive: true,
                ..
            } => Some(*ttl_ms),
            SemCmd::Acquire { .. } | SemCmd::Extend { .. } | SemCmd::Release { .. } | SemCmd::Info { .. } => None,
        }
    }

    fn waits(&self) -> usize {
        match self {
            SemCmd::Acquire { wait_ms: Some(_), .. } => 1,
            SemCmd::Acquire { .. } | SemCmd::Extend { .. } | SemCmd::Release { .. } | SemCmd::Info { .. } => 0,
        }
    }

    fn written_value(&self) -> Option<&Bytes> {
        match self {
            SemCmd::Acquire { token, .. } => Some(token),
            SemCmd::Extend { .. } | SemCmd::Release { .. } | SemCmd::Info { .. } => None,
        }
    }
}
