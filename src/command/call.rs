//! What the rest of the proxy asks of a recipe's typed command: [`Call`], its keys, the session
//! locks and waits it takes, the value it writes, the session lock it releases, the loss it is
//! answered with, how it is metered; and [`Serve`], how it runs. Each recipe answers for its own
//! commands in its folder (`recipes/*/command.rs`, `recipes/*/serve.rs`); [`super::Command`] and
//! [`super::Recipe`] only delegate, so the bounds that read these (permissions, reserved keys,
//! value sizes, session and wait limits) cannot miss a recipe's command, and no file outside a
//! recipe's folder names its commands (docs/development.md, "The recipe pattern").

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

/// What a command does to a lock, for the metrics: which latency histogram times it, and how
/// its reply is counted (`crate::proxy::dispatch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOp {
    /// An acquisition, timed as one.
    Acquire,
    /// An acquisition that waits (`WAIT ms`): each quorum round is timed as an acquisition and
    /// the whole as a wait, apart (`Proxy::acquire_waiting`): timed as a whole in the
    /// acquisition histogram, one wait of seconds would look like a slow quorum.
    Waiting,
    /// A release.
    Release,
    /// An extension.
    Extend,
    /// Anything else (a read).
    Other,
}

/// The session lock a command ends when it succeeds (`crate::sessions::Effect`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// The lock `key` on the masters (the user's key, or the recipe's own name for it), given
    /// back by its holder `token`.
    Lock {
        /// The lock's key on the masters.
        key: Bytes,
        /// The holder's token.
        token: Bytes,
    },
    /// A hold of `token` whose key the reply names (a semaphore's slot, a reader's hold):
    /// known only once it ran (`crate::proxy::Outcome::released_hold`).
    Hold {
        /// The holder's token.
        token: Bytes,
    },
}

/// Which session lock's loss a command is answered with, if its client was not told yet
/// (RESP2 clients have no other way to learn of it): the key the client named, and whether a
/// lost lock's key on the masters is one of that key's.
#[derive(Clone, Copy, Debug)]
pub struct LossOf<'a> {
    /// The key the client named (the error names it).
    pub named: &'a Bytes,
    /// Whether a lost session lock's key on the masters (first) belongs to `named` (second).
    pub owns: fn(&Bytes, &Bytes) -> bool,
}

/// A recipe's command, as the connection, the session bounds and the limits see it. The
/// defaults are the common case: no session lock, no wait, no value written.
pub trait Call {
    /// The keys it names: what permissions, reserved keys, size limits and cluster slots are
    /// judged on.
    fn keys(&self) -> &[Bytes];

    /// When it takes session locks (`KEEPALIVE`, a campaign): the TTL each extension writes.
    fn session_ttl(&self) -> Option<u64> {
        None
    }

    /// How many session locks it takes when granted, if [`Call::session_ttl`] says it takes
    /// any; each counts against the bounds (`crate::sessions::SessionLocks::admit`).
    fn session_locks(&self) -> usize {
        1
    }

    /// How many waits it leaves in the proxy while it runs (`crate::waiting`): one for a
    /// request that waits (`WAIT ms`) or observes.
    fn waits(&self) -> usize {
        0
    }

    /// The value it writes under its key, if it writes one (each master stores a copy:
    /// bounded by `max_value_len`).
    fn written_value(&self) -> Option<&Bytes> {
        None
    }

    /// Its name in lower case and what it does to a lock, for the metrics.
    fn metered(&self) -> (&'static str, LockOp);

    /// The session lock it ends when it succeeds: a release.
    fn releases(&self) -> Option<Released> {
        None
    }

    /// The session lock whose loss it is answered with, if the client was not told of it yet
    /// (a command on a lock the client holds or held).
    fn loss_of(&self) -> Option<LossOf<'_>> {
        None
    }

    /// The key a client named, for one of this recipe's keys on the masters (a lost session
    /// lock is told by it: `lock-lost`); `None` for a key that is not the recipe's own name.
    fn named_key(key: &Bytes) -> Option<Bytes>
    where
        Self: Sized,
    {
        let _ = key;
        None
    }

    /// The waiting line a release of this recipe's key on the masters is announced and queued
    /// under, when that is not the key itself (a semaphore's slot: its semaphore).
    fn queue_of(key: &Bytes) -> Option<Bytes>
    where
        Self: Sized,
    {
        let _ = key;
        None
    }
}

/// How a recipe's command runs, on the proxy `H` that serves it, as `Out` (a future of the
/// outcome): implemented in the recipe's `serve.rs`. Generic so that the command layer, where
/// [`super::Recipe`] is, does not know the proxy.
pub trait Serve<H: ?Sized, Out> {
    /// The command's work on `host` in database `db`, metered as `metered` ([`Call::metered`]);
    /// `closed` turns true when the client's connection ends (a wait stops then).
    fn serve(self, host: &Arc<H>, db: u32, closed: &watch::Sender<bool>, metered: (&'static str, LockOp)) -> Out;
}
