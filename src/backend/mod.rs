//! The masters the proxy fans out to, behind one trait.
//!
//! [`Backend`] is the seam that keeps the quorum engine free of sockets: real Redis masters
//! ([`redis::RedisBackend`]) and the in-process store ([`embedded::EmbeddedBackend`], for trying
//! the proxy out and for tests) implement it the same way.

pub mod embedded;
pub mod health;
mod pipeline;
pub mod redis;
pub mod subscriber;

use std::future::Future;
use std::sync::OnceLock;

use bytes::Bytes;

use crate::reply::Reply;

/// One command for one master: the database it runs in, and its arguments, name first.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The logical database (`SELECT n`) the command runs in.
    pub db: u32,
    /// The command name followed by its arguments, exactly as sent to Redis.
    pub args: Vec<Bytes>,
    /// An owner-checked delete (rules 5 and 6: undo, release). Sent even to a master marked
    /// down, over its connection if one is still open: a master that was only slow or paused
    /// executes it after the `SET` it follows, instead of keeping a partial lock until its TTL.
    pub cleanup: bool,
    /// The RESP encoding, made once and shared by every master the request goes to.
    encoded: OnceLock<Bytes>,
}

impl Request {
    /// A request for database `db`.
    pub fn new(db: u32, args: Vec<Bytes>) -> Request {
        Request {
            db,
            args,
            cleanup: false,
            encoded: OnceLock::new(),
        }
    }

    /// The request as a RESP array of bulk strings.
    pub fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| pipeline::encode(self.args.iter().map(|a| &a[..])))
            .clone()
    }
}

/// Why a master gave no reply. A reply that *is* an error (`-WRONGTYPE ...`) is not a
/// `BackendError`: the master answered, and the answer is a [`Reply::Error`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// No reply within the per-backend timeout.
    #[error("timed out")]
    Timeout,
    /// The master is known to be unreachable; it was not tried (no timeout was spent).
    #[error("down")]
    Down,
    /// The master restarted recently and takes no part in any quorum yet (rule 8).
    #[error("quarantined")]
    Quarantined {
        /// How long until it votes again.
        remaining: std::time::Duration,
    },
    /// Not answered yet when the outcome was already decided (the request still completes).
    #[error("pending")]
    Pending,
    /// The connection failed while the request was in flight.
    #[error("connection error: {0}")]
    Io(String),
}

/// A Redis master as the quorum engine sees it.
pub trait Backend: Send + Sync + 'static {
    /// A short name for logs and `INFO` (e.g. `127.0.0.1:6379`).
    fn name(&self) -> &str;

    /// Sends one command and waits for its reply. Implementations do not apply the
    /// per-request timeout themselves: the quorum engine bounds every call.
    fn call(&self, request: &Request) -> impl Future<Output = Result<Reply, BackendError>> + Send;

    /// The master process's `run_id` as last seen, if known: fencing epochs are tied to it.
    fn run_id(&self) -> Option<String> {
        None
    }
}

/// The masters a running proxy uses: real ones, or embedded ones for trying it out.
/// An enum rather than a trait object keeps the request path free of boxing.
pub enum AnyBackend {
    /// A real Redis master.
    Redis(Box<redis::RedisBackend>),
    /// An in-process master.
    Embedded(embedded::EmbeddedBackend),
}

impl AnyBackend {
    /// The master's state, for `INFO` and metrics.
    pub fn state(&self) -> health::State {
        match self {
            AnyBackend::Redis(r) => r.health().state(),
            AnyBackend::Embedded(_) => health::State::Up,
        }
    }

    /// The master's health, for a real master.
    pub fn health(&self) -> Option<&health::Health> {
        match self {
            AnyBackend::Redis(r) => Some(r.health()),
            AnyBackend::Embedded(_) => None,
        }
    }

    /// `redis` or `embedded`, for `INFO`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyBackend::Redis(_) => "redis",
            AnyBackend::Embedded(_) => "embedded",
        }
    }
}

impl Backend for AnyBackend {
    fn name(&self) -> &str {
        match self {
            AnyBackend::Redis(b) => b.name(),
            AnyBackend::Embedded(b) => b.name(),
        }
    }

    async fn call(&self, request: &Request) -> Result<Reply, BackendError> {
        match self {
            AnyBackend::Redis(b) => b.call(request).await,
            AnyBackend::Embedded(b) => b.call(request).await,
        }
    }

    fn run_id(&self) -> Option<String> {
        match self {
            AnyBackend::Redis(r) => r.health().run_id(),
            AnyBackend::Embedded(e) => Some(e.run_id()),
        }
    }
}
