//! What every recipe's serving shares: the bounds on a TTL (`max_ttl_ms`, and rule 4's validity
//! left after the drift allowance), the `INFO` counts of acquisitions, rule 7's reading of a
//! write, and how a fenced outcome and the engine's errors read as replies.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::ClientError;
use crate::quorum::{Extension, Fenced, NoQuorum, Unfenced};
use crate::reply::Reply;

use super::{Outcome, Proxy};

impl Proxy {
    /// Rule 7 for a write with a known failure value: `reply` (the masters' replies combined)
    /// while the TTL a quorum guarantees is valid, and `failure` when it is not, or once it
    /// runs out before the reply is written (rule 4a). An error reply stays an error.
    pub(crate) fn judged(&self, ext: &Extension, reply: Reply, failure: Reply) -> Outcome {
        match ext.validity {
            _ if reply.is_error() => reply.into(),
            Some(validity) => Outcome::until(reply, validity, failure, None),
            None => failure.into(),
        }
    }

    /// A TTL within `max_ttl_ms`, so that every key the proxy writes expires within it.
    pub(crate) fn check_ttl(&self, ttl_ms: u64) -> Result<u64, ClientError> {
        if ttl_ms > self.config.max_ttl_ms {
            return Err(ClientError::TtlTooLong {
                ttl_ms,
                max_ttl_ms: self.config.max_ttl_ms,
            });
        }
        Ok(ttl_ms)
    }

    /// Rule 4 for a native acquisition: a TTL no longer than its own drift allowance can never
    /// leave a validity, so every attempt would be granted and undone (and a `WAIT` would try
    /// again at once, for as long as it waits): refused instead.
    pub(crate) fn check_validity(&self, ttl_ms: u64) -> Result<u64, ClientError> {
        let ttl = Duration::from_millis(ttl_ms);
        let drift = crate::quorum::drift(ttl, self.config.drift_factor);
        if drift >= ttl {
            return Err(ClientError::Unsupported(format!(
                "a lock of {ttl_ms} ms has no validity after the clock drift allowance ({} ms): use a longer TTL",
                drift.as_millis()
            )));
        }
        Ok(ttl_ms)
    }

    /// Counts a decided acquisition for `INFO`: granted, or refused (held, or not in time).
    pub(crate) fn count_acquisition(&self, granted: bool) {
        let counter = if granted {
            &self.stats.acquired
        } else {
            &self.stats.contended
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A fenced outcome as the client sees it: the token (while the lock is valid: rule 4a; a
/// grant past it is undone), nil, or why none could be given.
pub(crate) fn fenced_reply(fenced: Fenced) -> Outcome {
    match fenced {
        Fenced::Yes { token, validity, undo } => {
            let token = Reply::Int(i64::try_from(token).unwrap_or(i64::MAX));
            Outcome::until(token, validity, Reply::Nil, undo)
        }
        Fenced::No { .. } => Reply::Nil.into(),
        Fenced::NoQuorum(e) => Reply::from(e).into(),
        Fenced::Unfenced(e) => Reply::from(e).into(),
    }
}

/// The quorum layer's errors as a client sees them: `-NOQUORUM ...`, in their own text.
/// Converted here, where the engine's outcomes become replies, so that the quorum layer owns
/// its errors without depending on the client side.
impl From<NoQuorum> for Reply {
    fn from(e: NoQuorum) -> Reply {
        Reply::error(e.to_string())
    }
}

impl From<Unfenced> for Reply {
    fn from(e: Unfenced) -> Reply {
        Reply::error(e.to_string())
    }
}
