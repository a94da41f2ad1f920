//! The proxy's shared state: the quorum engine, the waiting lines, the session table, each
//! recipe's own state, the client scripts and the counters every connection shares.
//!
//! What it does with them is in files of their own: start-up (`start.rs`), dispatch of every
//! command that needs the masters (`dispatch.rs`), the operator's commands (`admin.rs`), the
//! masters' gauges (`export.rs`), scripts (`script.rs`), `WATCH`/`EXEC` (`transaction.rs`),
//! waiting in line and the announcements between proxies (`wait.rs`), keeping session locks
//! alive (`sessions.rs`), replies settled when written ([`outcome`]) and `INFO` ([`info`]). Each
//! recipe serves its own commands (`crate::recipes::*::serve`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;

use crate::auth::Access;
use crate::backend::{AnyBackend, Request};
use crate::clock::TokioClock;
use crate::config::Config;
use crate::error::ClientError;
use crate::quorum::Engine;
use crate::scripts::Registry;
use crate::sessions::SessionTable;
use crate::waiters::{Signals, Waiters};
use dashmap::DashMap;

mod admin;
pub(crate) mod dispatch;
mod export;
pub(crate) mod grants;
pub mod info;
pub mod legacy;
pub mod outcome;
mod script;
mod sessions;
mod start;
mod transaction;
pub(crate) mod wait;

pub use outcome::Outcome;
pub use transaction::Queued;

/// One key's lock in this proxy: its session lock's holder, if any, and how many requests
/// wait for it here.
#[derive(Clone, Debug)]
pub struct LockEntry {
    /// The database.
    pub db: u32,
    /// The key.
    pub key: Bytes,
    /// Who holds it as a session lock (none: only a wait queue, the lock held elsewhere or
    /// by a plain `SET NX`).
    pub holder: Option<crate::sessions::Owner>,
    /// Requests waiting for it in this proxy.
    pub waiting: usize,
}

/// Counters shown in `INFO`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Locks granted.
    pub acquired: AtomicU64,
    /// Acquisitions refused because the lock is held (or not granted in time).
    pub contended: AtomicU64,
    /// Requests answered `-NOQUORUM`.
    pub noquorum: AtomicU64,
    /// Commands processed.
    pub commands: AtomicU64,
    /// Connections accepted since start.
    pub connections: AtomicU64,
    /// Clients connected now.
    pub clients: AtomicUsize,
    /// Wrong credentials given to `AUTH` / `HELLO AUTH`.
    pub auth_failures: AtomicU64,
}

/// Everything connections share.
pub struct Proxy {
    /// The effective configuration.
    pub config: Config,
    /// The quorum engine over the masters.
    pub engine: Engine<AnyBackend, TokioClock>,
    /// Scripts seen by SHA1.
    pub scripts: Registry,
    /// Passwords and users.
    pub access: Access,
    /// With `script_policy = "allowlist"`: the SHA1s clients may run.
    pub(crate) allowed_scripts: Option<HashSet<Bytes>>,
    /// Counters for `INFO`.
    pub stats: Stats,
    /// Requests waiting for locks (`LOCK.ACQUIRE ... WAIT`), per key, first come first served.
    pub waiters: Arc<Waiters>,
    /// What clients leave waiting or observing, bounded per user and in all.
    pub waiting: Arc<crate::waiting::WaitingTable>,
    /// Clients blocked in `BLPOP` on signal lists.
    pub signals: Arc<Signals>,
    /// Every session lock of this proxy: who holds it, and the counts its bounds check.
    pub sessions: SessionTable,
    /// What this proxy believes of its semaphores' slots (which to try first, which slot a
    /// token was granted): never what a grant rests on.
    pub semaphores: crate::recipes::semaphore::Ledger,
    /// The elections whose leader is observed through this proxy, each with its reader.
    pub elections: crate::recipes::election::Elections,
    /// Every connected client by id, with the signal that closes it (`CLIENT KILL ID`,
    /// shutdown).
    pub clients: DashMap<u64, Arc<crate::stop::Stop>>,
    /// Whether a member is a Redis Cluster: then every command's keys (a transaction's
    /// too) must hash to one slot, as in Redis Cluster itself.
    pub(crate) clustered: bool,
    /// Whether releases are announced on the masters for other proxies (real masters only:
    /// embedded ones serve this proxy alone).
    pub(crate) announces: bool,
    /// Release announcements made, to take the masters in turn.
    pub(crate) announcements: AtomicUsize,
    /// Release announcements published on several masters, numbered by this count.
    pub(crate) released_count: AtomicU64,
    /// The numbered release announcements heard lately, each acted on once.
    pub(crate) heard: std::sync::Mutex<wait::Heard>,
    /// This process's run id (40 hex chars, like Redis's).
    pub run_id: String,
    /// When the proxy started.
    pub started: Instant,
    pub(crate) next_client_id: AtomicU64,
    /// What the legacy member's watch last found (`PROXY LEGACY`).
    pub legacy_watch: legacy::Watch,
}

impl Proxy {
    /// The one hash slot of `keys` (`None` for no keys); `CROSSSLOT` when they differ and a
    /// member is a Redis Cluster. Checked before anything is sent, so that no member runs
    /// what a cluster member must refuse.
    pub fn hash_slot_of<'a>(&self, keys: impl IntoIterator<Item = &'a Bytes>) -> Result<Option<u16>, ClientError> {
        if !self.clustered {
            return Ok(None);
        }
        crate::backend::cluster::common_slot(keys.into_iter().map(|k| &k[..])).map_err(|_| ClientError::CrossSlot)
    }

    /// A fresh client id for `CLIENT ID` and `HELLO`.
    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    /// After a fenced command: when it met a master that could not vouch for its fencing
    /// counter, repairs the database in the background (`docs/fencing.md`, F5).
    pub fn recover_fencing(self: &Arc<Self>, db: u32) {
        if self.engine.recovery_wanted(db) {
            let proxy = self.clone();
            tokio::spawn(async move { proxy.engine.recover(db).await });
        }
    }
}

pub(crate) fn request<const N: usize>(db: u32, args: [&[u8]; N]) -> Request {
    Request::new(db, args.iter().map(|a| Bytes::copy_from_slice(a)).collect())
}
