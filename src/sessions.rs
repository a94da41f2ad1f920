//! Session locks: a lock that lives as long as the client connection that took it.
//!
//! `LOCK.ACQUIRE key token ttl_ms KEEPALIVE`, and `SET key token NX` without a TTL (a lock
//! its holder means to keep "until I release it"), are kept alive by the proxy: it extends
//! the lock at a third of its TTL, each extension judged by rule 7, for as long as the
//! connection stays open and at most `max_hold_ms`; when the connection closes (`QUIT`,
//! `RESET`, end of stream, idle `timeout`, shutdown) it releases the lock at once. The TTL
//! stays the fallback: should the proxy itself die, the lock expires within one TTL, as any
//! other.
//!
//! A lock whose extension fails (no quorum within the validity left) is lost: the
//! connection is told ([`Lost`]) and tells its client (a RESP3 push, or an error for the next
//! `LOCK.*` command on that key).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep};

use crate::metrics as m;
use crate::proxy::Proxy;

/// A grant that becomes a session lock once its reply reaches the client.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionGrant {
    /// The database.
    pub db: u32,
    /// The lock.
    pub key: Bytes,
    /// The holder's token.
    pub token: Bytes,
    /// The TTL each extension writes (the fallback should the proxy die).
    pub ttl: Duration,
    /// When the grant's own validity ends.
    pub valid_until: Instant,
}

/// A session lock that ended without its holder releasing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    /// The database.
    pub db: u32,
    /// The lock.
    pub key: Bytes,
    /// The holder's token.
    pub token: Bytes,
    /// Why: `not-extended` (no quorum extended it within its validity) or `max-hold`.
    pub reason: &'static str,
}

/// Who holds a session lock, for `LOCK.INFO` and `PROXY LOCKS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The client's id (`CLIENT ID`).
    pub client_id: u64,
    /// The client's name when it took the lock (`CLIENT SETNAME`).
    pub client_name: Option<Bytes>,
    /// The client's address.
    pub client_addr: String,
    /// The token the lock is held with.
    pub token: Bytes,
}

/// The session locks of one connection.
pub struct SessionLocks {
    proxy: Arc<Proxy>,
    held: HashMap<(u32, Bytes), Held>,
    /// Word of locks lost, from their keepers; made with the first session lock (most
    /// connections never take one, and an idle connection should cost little memory).
    lost: Option<(mpsc::UnboundedSender<Lost>, mpsc::UnboundedReceiver<Lost>)>,
    /// This connection's client id and address.
    client: (u64, String),
}

/// One session lock being kept alive.
struct Held {
    token: Bytes,
    keeper: AbortHandle,
}

impl SessionLocks {
    /// No session locks yet for client `client` (id, address).
    pub fn new(proxy: Arc<Proxy>, client: (u64, String)) -> SessionLocks {
        SessionLocks {
            proxy,
            held: HashMap::new(),
            lost: None,
            client,
        }
    }

    /// The next session lock of this connection that was lost (never, while none was taken).
    pub async fn next_lost(&mut self) -> Lost {
        match &mut self.lost {
            Some((_, lost)) => match lost.recv().await {
                Some(lost) => lost,
                // This holds a sender itself: the channel does not close.
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Starts keeping `grant` alive (its reply has just been written to the client, named
    /// `name`).
    pub fn start(&mut self, grant: SessionGrant, name: Option<Bytes>) {
        let owner = Owner {
            client_id: self.client.0,
            client_name: name,
            client_addr: self.client.1.clone(),
            token: grant.token.clone(),
        };
        self.proxy.session_owners.insert((grant.db, grant.key.clone()), owner);
        let (lost, _) = self.lost.get_or_insert_with(mpsc::unbounded_channel);
        let keeper = tokio::spawn(keep_alive(self.proxy.clone(), grant.clone(), lost.clone()));
        let held = Held {
            token: grant.token,
            keeper: keeper.abort_handle(),
        };
        metrics::gauge!(m::SESSION_LOCKS).increment(1.0);
        if let Some(old) = self.held.insert((grant.db, grant.key), held) {
            old.keeper.abort();
            metrics::gauge!(m::SESSION_LOCKS).decrement(1.0);
        }
    }

    /// Stops keeping `key` alive without releasing it: its holder releases (or extends) it
    /// itself now, or it was lost.
    pub fn forget(&mut self, db: u32, key: &Bytes) {
        let id = (db, key.clone());
        if let Some(held) = self.held.remove(&id) {
            held.keeper.abort();
            self.disown(&id);
            metrics::gauge!(m::SESSION_LOCKS).decrement(1.0);
        }
    }

    /// Takes this client's name off the lock `id` in the proxy's list (another client may
    /// hold it by now).
    fn disown(&self, id: &(u32, Bytes)) {
        self.proxy
            .session_owners
            .remove_if(id, |_, owner| owner.client_id == self.client.0);
    }

    /// The connection is closing (or was `RESET`): every session lock is released now, on
    /// every master (rule 6), before this returns (each release bounded by the backend
    /// timeout), so that a shutdown does not leave them to their TTL.
    pub async fn release_all(&mut self) {
        let held: Vec<((u32, Bytes), Held)> = self.held.drain().collect();
        let releases = held.into_iter().map(|((db, key), held)| {
            held.keeper.abort();
            self.disown(&(db, key.clone()));
            metrics::gauge!(m::SESSION_LOCKS).decrement(1.0);
            metrics::counter!(m::SESSION_LOCKS_ENDED_BY_DISCONNECT).increment(1);
            let proxy = self.proxy.clone();
            async move {
                proxy.release_lock(db, key, held.token).await;
            }
        });
        futures_util::future::join_all(releases).await;
    }
}

impl Drop for SessionLocks {
    /// A connection that ended without `release_all` (its task was cancelled): nothing keeps
    /// its locks alive any more, and each expires within its TTL.
    fn drop(&mut self) {
        for held in self.held.values() {
            held.keeper.abort();
        }
    }
}

/// Keeps one session lock alive: an extension at a third of the TTL; after a failed one, a
/// retry at a tenth, while the last validity lasts; then the lock is lost. At `max_hold_ms`
/// it is released and reported lost too (a hung but connected client cannot hold it for ever).
async fn keep_alive(proxy: Arc<Proxy>, grant: SessionGrant, lost: mpsc::UnboundedSender<Lost>) {
    let started = Instant::now();
    let max_hold = Duration::from_millis(proxy.config.max_hold_ms);
    let mut valid_until = grant.valid_until;
    let mut wait = grant.ttl / 3;
    let reason = loop {
        let hold_ends = started + max_hold;
        tokio::select! {
            () = sleep(wait) => {}
            () = tokio::time::sleep_until(hold_ends) => {
                proxy.release_lock(grant.db, grant.key.clone(), grant.token.clone()).await;
                break "max-hold";
            }
        }
        // Rule 7: an extension counts only within its new validity.
        let extended = proxy
            .engine
            .extend_lock(grant.db, grant.key.clone(), grant.token.clone(), grant.ttl)
            .await;
        match extended {
            Some(validity) => {
                valid_until = Instant::now() + validity;
                wait = grant.ttl / 3;
            }
            None if Instant::now() + grant.ttl / 10 < valid_until => wait = grant.ttl / 10,
            None => break "not-extended",
        }
    };
    metrics::counter!(m::SESSION_LOCKS_LOST, "reason" => reason).increment(1);
    let _ = lost.send(Lost {
        db: grant.db,
        key: grant.key,
        token: grant.token,
        reason,
    });
}
