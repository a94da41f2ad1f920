//! What the rest of the proxy asks of a recipe's typed command ([`Call`]): its keys, the
//! session locks and waits it takes, the value it writes. Each recipe answers for its own
//! commands in its folder (`recipes/*/command.rs`); [`super::Command`] only delegates, so the
//! bounds that read these (permissions, reserved keys, value sizes, session and wait limits)
//! cannot miss a recipe's command.

use bytes::Bytes;

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
}
