//! `LOCK.ACQUIREALL` and `LOCK.RELEASEALL` as the proxy reads them, typed.

use bytes::Bytes;

use crate::command::call::{Call, LockOp};

/// A command on several locks at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockAllCmd {
    /// `LOCK.ACQUIREALL`: every key taken, an array of fencing tokens in the order given, or
    /// nil and none taken.
    Acquire {
        /// The holder's token, the same for every key (rule 1).
        token: Bytes,
        /// Milliseconds.
        ttl_ms: u64,
        /// The keys, in the order given (at least one, at most [`MAX_KEYS`](super::lua::MAX_KEYS), no two equal).
        keys: Vec<Bytes>,
        /// `KEEPALIVE`: each key a session lock of the connection.
        keepalive: bool,
        /// `WAIT ms`: wait up to this long in this proxy's queue of the first key (sorted).
        wait_ms: Option<u64>,
    },
    /// `LOCK.RELEASEALL`: how many of the keys a quorum released.
    Release {
        /// The holder's token.
        token: Bytes,
        /// The keys.
        keys: Vec<Bytes>,
    },
}

impl LockAllCmd {
    /// The keys named.
    pub fn keys(&self) -> &[Bytes] {
        match self {
            LockAllCmd::Acquire { keys, .. } | LockAllCmd::Release { keys, .. } => keys,
        }
    }

    /// The lower-case name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            LockAllCmd::Acquire { .. } => "lock.acquireall",
            LockAllCmd::Release { .. } => "lock.releaseall",
        }
    }
}

impl Call for LockAllCmd {
    fn metered(&self) -> (&'static str, LockOp) {
        let op = match self {
            LockAllCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
            LockAllCmd::Acquire { .. } => LockOp::Acquire,
            LockAllCmd::Release { .. } => LockOp::Release,
        };
        (self.name(), op)
    }

    fn keys(&self) -> &[Bytes] {
        LockAllCmd::keys(self)
    }

    /// `LOCK.ACQUIREALL ... KEEPALIVE`: each key of the set is a session lock.
    fn session_ttl(&self) -> Option<u64> {
        match self {
            LockAllCmd::Acquire {
                ttl_ms,
                keepalive: true,
                ..
            } => Some(*ttl_ms),
            LockAllCmd::Acquire { .. } | LockAllCmd::Release { .. } => None,
        }
    }

    /// One per key of the set.
    fn session_locks(&self) -> usize {
        match self {
            LockAllCmd::Acquire { keys, .. } => keys.len(),
            LockAllCmd::Release { .. } => 1,
        }
    }

    fn waits(&self) -> usize {
        match self {
            LockAllCmd::Acquire { wait_ms: Some(_), .. } => 1,
            LockAllCmd::Acquire { .. } | LockAllCmd::Release { .. } => 0,
        }
    }

    fn written_value(&self) -> Option<&Bytes> {
        match self {
            LockAllCmd::Acquire { token, .. } => Some(token),
            LockAllCmd::Release { .. } => None,
        }
    }
}
