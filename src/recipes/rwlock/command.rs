//! The read-write lock's commands as the proxy reads them: `RWLOCK.*`, typed.

use crate::recipes::rwlock::Mode;
use bytes::Bytes;

use crate::command::call::{Call, LockOp, LossOf, Released};

/// An `RWLOCK.*` command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RwCmd {
    /// `RWLOCK.READ | RWLOCK.WRITE key token ttl_ms [WAIT ms] [KEEPALIVE]`: the fencing token,
    /// or nil when the lock is held against this mode (after waiting up to `WAIT` ms).
    Acquire {
        /// Read or write.
        mode: Mode,
        /// The lock.
        key: Bytes,
        /// The holder's token (rule 1): it holds the lock in one mode, once.
        token: Bytes,
        /// Milliseconds.
        ttl_ms: u64,
        /// `KEEPALIVE`: the hold is a session lock, kept alive while the connection is open.
        keepalive: bool,
        /// `WAIT ms`: wait up to this long in this proxy's queue for the lock.
        wait_ms: Option<u64>,
    },
    /// `RWLOCK.EXTEND key token ttl_ms`: the validity left in ms, or 0.
    Extend {
        /// The lock.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
        /// The new TTL in milliseconds.
        ttl_ms: u64,
    },
    /// `RWLOCK.RELEASE key token`: 1 if released, else 0.
    Release {
        /// The lock.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
    },
    /// `RWLOCK.INFO key`: its writer, readers, waiters and fencing token.
    Info {
        /// The lock.
        key: Bytes,
    },
}

impl RwCmd {
    /// The lock's key (the user's: its keys on the masters are the proxy's own).
    pub fn key(&self) -> &Bytes {
        match self {
            RwCmd::Acquire { key, .. }
            | RwCmd::Extend { key, .. }
            | RwCmd::Release { key, .. }
            | RwCmd::Info { key } => key,
        }
    }

    /// The lower-case name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            RwCmd::Acquire { mode: Mode::Read, .. } => "rwlock.read",
            RwCmd::Acquire { mode: Mode::Write, .. } => "rwlock.write",
            RwCmd::Extend { .. } => "rwlock.extend",
            RwCmd::Release { .. } => "rwlock.release",
            RwCmd::Info { .. } => "rwlock.info",
        }
    }
}

impl Call for RwCmd {
    /// A writer's key or a reader's hold: the lock's.
    fn named_key(key: &Bytes) -> Option<Bytes> {
        super::names::user_key(key)
    }

    /// A writer's key or a reader's hold: the lock's line.
    fn queue_of(key: &Bytes) -> Option<Bytes> {
        super::names::queue_key(key)
    }

    fn metered(&self) -> (&'static str, LockOp) {
        let op = match self {
            RwCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
            RwCmd::Acquire { .. } => LockOp::Acquire,
            RwCmd::Extend { .. } => LockOp::Extend,
            RwCmd::Release { .. } => LockOp::Release,
            RwCmd::Info { .. } => LockOp::Other,
        };
        (self.name(), op)
    }

    /// `RWLOCK.RELEASE`: the hold it released (a reader's, or the writer's lock) is named in
    /// its outcome.
    fn releases(&self) -> Option<Released> {
        match self {
            RwCmd::Release { token, .. } => Some(Released::Hold { token: token.clone() }),
            RwCmd::Acquire { .. } | RwCmd::Extend { .. } | RwCmd::Info { .. } => None,
        }
    }

    /// Every `RWLOCK.*` command on a lock whose hold (kept as a session lock) was lost.
    fn loss_of(&self) -> Option<LossOf<'_>> {
        Some(LossOf {
            named: self.key(),
            owns: |lost, named| super::names::user_key(lost).as_ref() == Some(named),
        })
    }

    fn keys(&self) -> &[Bytes] {
        std::slice::from_ref(self.key())
    }

    /// `RWLOCK.READ|WRITE ... KEEPALIVE`: the hold is a session lock.
    fn session_ttl(&self) -> Option<u64> {
        match self {
            RwCmd::Acquire {
                ttl_ms,
                keepalive: true,
                ..
            } => Some(*ttl_ms),
            RwCmd::Acquire { .. } | RwCmd::Extend { .. } | RwCmd::Release { .. } | RwCmd::Info { .. } => None,
        }
    }

    fn waits(&self) -> usize {
        match self {
            RwCmd::Acquire { wait_ms: Some(_), .. } => 1,
            RwCmd::Acquire { .. } | RwCmd::Extend { .. } | RwCmd::Release { .. } | RwCmd::Info { .. } => 0,
        }
    }

    fn written_value(&self) -> Option<&Bytes> {
        match self {
            RwCmd::Acquire { token, .. } => Some(token),
            RwCmd::Extend { .. } | RwCmd::Release { .. } | RwCmd::Info { .. } => None,
        }
    }
}
