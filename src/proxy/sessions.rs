//! The proxy's side of session locks: keeping one alive, and releasing one, on the masters.
//!
//! Session state (the table, each connection's locks, what a command does to them) lives in
//! [`crate::sessions`], which does not know the proxy; the proxy is its [`Host`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep};

use super::Proxy;
use crate::config::Config;
use crate::sessions::{Host, Kept, Lost, SessionGrant, SessionTable};

impl Host for Proxy {
    fn config(&self) -> &Config {
        &self.config
    }

    fn table(&self) -> &SessionTable {
        &self.sessions
    }

    fn keep(self: Arc<Self>, grant: SessionGrant, kept: Kept) -> AbortHandle {
        tokio::spawn(keep_alive(self, grant, kept)).abort_handle()
    }

    fn release(&self, db: u32, key: Bytes, token: Bytes) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.release_lock(db, key, token).await;
        })
    }
}

/// Keeps one session lock alive from its grant (rule 16): an extension at a third of the TTL
/// (sooner when the grant left less than two thirds of it valid: the first extension then
/// comes half-way through what is left); after a failed one, a retry at a tenth, while the
/// last validity lasts; then the lock is lost, and told at the latest when that validity ends. A release of it announced by another proxy makes
/// the keeper extend at once, and a quorum that answers that it no longer holds the lock then
/// ends it at once, so that its holder is told at once on every proxy alike (`released`). Each
/// new validity is written to `kept.valid`, which the connection reads when it writes a grant
/// kept before its reply. At `max_hold_ms` it is released and reported lost too (a hung but
/// connected client cannot hold it for ever).
async fn keep_alive(proxy: Arc<Proxy>, grant: SessionGrant, kept: Kept) {
    let started = Instant::now();
    let max_hold = Duration::from_millis(proxy.config.max_hold_ms);
    let mut valid_until = grant.valid_until;
    let mut wait = next_extension(grant.ttl, valid_until, started);
    let reason = loop {
        let hold_ends = started + max_hold;
        let mut checked = false;
        tokio::select! {
            () = sleep(wait) => {}
            () = kept.check.notified() => checked = true,
            () = tokio::time::sleep_until(hold_ends) => {
                kept.valid.set(Instant::now());
                proxy.release_lock(grant.db, grant.key.clone(), grant.token.clone()).await;
                break "max-hold";
            }
        }
        // Rule 7: an extension counts only within its new validity. Rule 16: the loss is told
        // by the end of the last validity, not once an extension that outlived it gives up
        // (up to a backend timeout later, when then its masters are slow rather than down); an
        // extension still under way then may yet extend the keys, which only keeps the lock
        // from others until its TTL.
        let extension = proxy.extend_native(grant.db, grant.key.clone(), grant.token.clone(), grant.ttl);
        let extended = tokio::select! {
            extended = extension => extended,
            () = tokio::time::sleep_until(valid_until) => break "not-extended",
        };
        let now = Instant::now();
        match extended.validity {
            Some(validity) => {
                valid_until = now + validity;
                kept.valid.set(valid_until);
                wait = next_extension(grant.ttl, valid_until, now);
            }
            // After a release announced by another proxy, a quorum that no longer holds the lock
            // ends it at once. Not on a routine extension: the holder's own release, through
            // this connection, may be on its way back (its reply ends the keeping silently), and
            // a report now would tell it a loss of what it released.
            None if checked && refused(&extended.answers, proxy.engine.quorum()) => {
                kept.valid.set(now);
                break crate::sessions::RELEASED;
            }
            // The legacy member answered that another value holds it (the old code took it)
            // or that it may have lost it: told at once, not at the end of the validity.
            None if extended.lost => {
                kept.valid.set(now);
                break "lost-on-legacy";
            }
            None if now + grant.ttl / 10 < valid_until => wait = grant.ttl / 10,
            None => break "not-extended",
        }
    };
    // Counted by the connection when it tells its client (`crate::sessions::SessionLocks::lost`).
    let _ = kept.lost.send(Lost {
        db: grant.db,
        key: grant.key,
        token: grant.token,
        reason,
        id: kept.id,
    });
}

/// Whether a quorum answered that it does not hold the lock for the token (the extension's
/// nil): the lock is gone from a majority, and anyone may be granted it now.
fn refused(answers: &[crate::quorum::Answer], quorum: usize) -> bool {
    answers
        .iter()
        .filter(|a| matches!(a, Ok(crate::reply::Reply::Nil)))
        .count()
        >= quorum
}

/// When the next extension is due, `now`: a third of the TTL, or half of what is left of the
/// validity when that is sooner (a grant that took long to decide, or an extension that
/// answered late), so that a failed attempt still leaves time for retries.
fn next_extension(ttl: Duration, valid_until: Instant, now: Instant) -> Duration {
    (ttl / 3).min(valid_until.saturating_duration_since(now) / 2)
}
