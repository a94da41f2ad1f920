//! The lock's commands as the proxy reads them, typed: `SET` in its forms, `SETNX`, `DELEX`,
//! `PEXPIRE`, the key commands forwarded to every master, and the native `LOCK.*`.

use bytes::Bytes;

use crate::command::call::{Call, LockOp, LossOf, Released};

/// `SET key value [NX|XX|IFEQ old] [GET] [EX s|PX ms|EXAT ts|PXAT ms-ts|KEEPTTL]`, and
/// `GETSET key value` (a `SET ... GET`).
#[derive(Clone, Debug, PartialEq)]
pub struct Set {
    /// The key.
    pub key: Bytes,
    /// The value; for a lock, the caller's token (rule 1).
    pub value: Bytes,
    /// When to write.
    pub condition: Condition,
    /// Reply with the old value instead of `OK` (`GET`, `GETSET`).
    pub get: bool,
    /// The expiry asked for.
    pub expiry: Expiry,
}

/// The condition of a `SET`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Always write.
    Always,
    /// `NX`: only if the key does not exist. With no `GET`, this is a lock acquisition.
    Nx,
    /// `XX`: only if the key exists.
    Xx,
    /// `IFEQ old` (Redis 8.4): only if the key holds `old`. An owner-checked extension.
    IfEq(Bytes),
}

/// The expiry of a `SET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// None given: the proxy applies `default_ttl_ms` (NX) or `legacy_ttl_ms`.
    None,
    /// `KEEPTTL`.
    KeepTtl,
    /// A relative TTL in milliseconds (`PX`, or `EX` × 1000).
    Px(u64),
    /// An absolute Unix time in milliseconds (`PXAT`, or `EXAT` × 1000).
    AtMs(u64),
}

/// `DELEX key [IFEQ value | IFNE value]` (Redis 8.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelEx {
    /// The key.
    pub key: Bytes,
    /// The condition, if any.
    pub condition: DelCondition,
}

/// The condition of a `DELEX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DelCondition {
    /// Delete unconditionally.
    Always,
    /// Delete only if the key holds this value: an owner-checked release.
    IfEq(Bytes),
    /// Delete only if the key holds another value.
    IfNe(Bytes),
}

/// A key command sent as is to every master; the replies are combined by the majority rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    /// Which command it is.
    pub kind: ForwardKind,
    /// The command exactly as the client sent it.
    pub args: Vec<Bytes>,
    /// The keys it touches.
    pub keys: Vec<Bytes>,
}

/// The forwarded commands, by name (decided once, when parsed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardKind {
    /// `GET key`.
    Get,
    /// `PTTL key`.
    Pttl,
    /// `TTL key`.
    Ttl,
    /// `LLEN key`.
    Llen,
    /// `EXISTS key...`.
    Exists,
    /// `DEL key...`.
    Del,
    /// `UNLINK key...`.
    Unlink,
    /// `ZREM key member...`.
    Zrem,
}

impl Forward {
    /// Whether it deletes its keys (`DEL`, `UNLINK`): a release, whatever the keys held.
    pub fn deletes(&self) -> bool {
        matches!(self.kind, ForwardKind::Del | ForwardKind::Unlink)
    }

    /// Whether it can free a lock: it deletes its keys, or (`ZREM`) removes a holder from a
    /// sorted set of holders. One that removed something is announced as a release.
    pub fn releases(&self) -> bool {
        self.deletes() || self.kind == ForwardKind::Zrem
    }
}

/// `PEXPIRE`/`EXPIRE key n [NX|XX|GT|LT]`: a TTL change, checked like an extension.
#[derive(Clone, Debug, PartialEq)]
pub struct Expire {
    /// The key.
    pub key: Bytes,
    /// The new TTL in milliseconds (`EXPIRE`'s seconds × 1000); may be ≤ 0 (delete).
    pub ttl_ms: i64,
    /// `NX`, `XX`, `GT` or `LT`, passed on as given.
    pub flag: Option<Bytes>,
}

/// A `LOCK.*` command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockCmd {
    /// `LOCK.ACQUIRE key token ttl_ms [WAIT ms] [KEEPALIVE] [REENTRANT]`: the fencing token, or nil when
    /// held (after waiting up to `WAIT` ms for it).
    Acquire {
        /// The lock.
        key: Bytes,
        /// The holder's token (rule 1).
        token: Bytes,
        /// Milliseconds.
        ttl_ms: u64,
        /// `KEEPALIVE`: a session lock, kept alive while the connection is open
        /// (`crate::sessions`).
        keepalive: bool,
        /// `WAIT ms`: wait up to this long in this proxy's queue for the lock
        /// (`crate::waiters`).
        wait_ms: Option<u64>,
        /// `REENTRANT`: a token that holds the lock already adds a hold (answered with the
        /// lock's fencing token) instead of being refused; each `LOCK.RELEASE` gives one back.
        reentrant: bool,
    },
    /// `LOCK.EXTEND key token ttl_ms`: the validity left in ms, or 0.
    Extend {
        /// The lock.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
        /// The new TTL in milliseconds.
        ttl_ms: u64,
    },
    /// `LOCK.RELEASE key token`: 1 if released, else 0.
    Release {
        /// The lock.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
    },
    /// `LOCK.INFO key`: holder, validity, last fencing token.
    Info {
        /// The lock.
        key: Bytes,
    },
    /// `LOCK.FENCE key token`: a fencing token for a lock taken with `SET NX PX`.
    Fence {
        /// The lock.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
    },
}

impl LockCmd {
    /// The lock's key.
    pub fn key(&self) -> &Bytes {
        match self {
            LockCmd::Acquire { key, .. }
            | LockCmd::Extend { key, .. }
            | LockCmd::Release { key, .. }
            | LockCmd::Info { key }
            | LockCmd::Fence { key, .. } => key,
        }
    }

    /// The lower-case name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            LockCmd::Acquire { .. } => "lock.acquire",
            LockCmd::Extend { .. } => "lock.extend",
            LockCmd::Release { .. } => "lock.release",
            LockCmd::Info { .. } => "lock.info",
            LockCmd::Fence { .. } => "lock.fence",
        }
    }
}

impl Call for LockCmd {
    fn metered(&self) -> (&'static str, LockOp) {
        let op = match self {
            LockCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
            LockCmd::Acquire { .. } => LockOp::Acquire,
            LockCmd::Extend { .. } => LockOp::Extend,
            LockCmd::Release { .. } => LockOp::Release,
            LockCmd::Info { .. } | LockCmd::Fence { .. } => LockOp::Other,
        };
        (self.name(), op)
    }

    fn releases(&self) -> Option<Released> {
        match self {
            LockCmd::Release { key, token } => Some(Released::Lock {
                key: key.clone(),
                token: token.clone(),
            }),
            LockCmd::Acquire { .. } | LockCmd::Extend { .. } | LockCmd::Info { .. } | LockCmd::Fence { .. } => None,
        }
    }

    /// Every `LOCK.*` command on a lock: the lock's key is the one the client named.
    fn loss_of(&self) -> Option<LossOf<'_>> {
        Some(LossOf {
            named: self.key(),
            owns: |lost, named| lost == named,
        })
    }

    fn keys(&self) -> &[Bytes] {
        std::slice::from_ref(self.key())
    }

    /// `LOCK.ACQUIRE ... KEEPALIVE`: a session lock.
    fn session_ttl(&self) -> Option<u64> {
        match self {
            LockCmd::Acquire {
                ttl_ms,
                keepalive: true,
                ..
            } => Some(*ttl_ms),
            LockCmd::Acquire { .. }
            | LockCmd::Extend { .. }
            | LockCmd::Release { .. }
            | LockCmd::Info { .. }
            | LockCmd::Fence { .. } => None,
        }
    }

    fn waits(&self) -> usize {
        match self {
            LockCmd::Acquire { wait_ms: Some(_), .. } => 1,
            LockCmd::Acquire { .. }
            | LockCmd::Extend { .. }
            | LockCmd::Release { .. }
            | LockCmd::Info { .. }
            | LockCmd::Fence { .. } => 0,
        }
    }

    fn written_value(&self) -> Option<&Bytes> {
        match self {
            LockCmd::Acquire { token, .. } | LockCmd::Fence { token, .. } => Some(token),
            LockCmd::Extend { .. } | LockCmd::Release { .. } | LockCmd::Info { .. } => None,
        }
    }
}
