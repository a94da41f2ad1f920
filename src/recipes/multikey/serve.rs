//! Several locks at once as the client sees them: `LOCK.ACQUIREALL` (every key or none, each
//! with its fencing token, waiting in the first key's queue) and `LOCK.RELEASEALL`. The
//! argument is in docs/recipes-quorum.md ("Several locks at once").

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::command::LockAllCmd;
use crate::proxy::wait::Line;
use crate::proxy::{Outcome, Proxy};
use crate::quorum::combine;
use crate::recipes::multikey::{AllFenced, SetAnnouncement};
use crate::recipes::reentrant::serve::GivenBack;
use crate::reply::Reply;
use crate::sessions::SessionGrant;
use crate::waiters::Turn;

impl Proxy {
    /// `LOCK.ACQUIREALL` without waiting: the outcome, and after a refusal when the whole set
    /// can be free at the latest, as the refusing masters told (for a waiting request).
    pub(crate) async fn acquire_all(
        &self,
        db: u32,
        token: Bytes,
        ttl_ms: u64,
        keys: &[Bytes],
        keepalive: bool,
    ) -> (Outcome, Option<Duration>) {
        if let Err(e) = self.check_ttl(ttl_ms).and_then(|ttl| self.check_validity(ttl)) {
            return (Reply::from(e).into(), None);
        }
        let ttl = Duration::from_millis(ttl_ms);
        // One order for every request: overlapping sets meet their keys in the same order (the
        // script sorts them too, and the queue waited in is the first key's).
        let sorted = sorted(keys);
        match self.engine.acquire_all(db, sorted.clone(), token.clone(), ttl).await {
            AllFenced::Yes { tokens, validity, undo } => {
                self.count_acquisition(true);
                // Each token answered beside its own key, in the order the client gave.
                let reply = Reply::Array(
                    keys.iter()
                        .map(|key| {
                            let at = sorted.binary_search(key).ok();
                            let fence = at.and_then(|at| tokens.get(at)).copied().unwrap_or(0);
                            Reply::Int(i64::try_from(fence).unwrap_or(i64::MAX))
                        })
                        .collect(),
                );
                // Rule 4a: the tokens hold while the whole set does; past it, nil and undone.
                let outcome = Outcome::until(reply, validity, Reply::Nil, Some(undo));
                if !keepalive {
                    return (outcome, None);
                }
                let valid_until = Instant::now() + validity;
                let grants = keys
                    .iter()
                    .map(|key| SessionGrant {
                        db,
                        key: key.clone(),
                        token: token.clone(),
                        ttl,
                        valid_until,
                    })
                    .collect();
                (outcome.with_sessions(grants), None)
            }
            AllFenced::No { free_in } => {
                self.count_acquisition(false);
                (Reply::Nil.into(), free_in)
            }
            AllFenced::NoQuorum(e) => (Reply::from(e).into(), None),
            AllFenced::Unfenced(e) => (Reply::from(e).into(), None),
        }
    }

    /// `LOCK.ACQUIREALL ... WAIT ms`: waits in this proxy's queue of the set's first key
    /// (sorted), woken by a release of any of its keys through any proxy, and tries the whole
    /// set at the head. Nothing is held while waiting (a refused try is undone), so waiting
    /// requests never hold a key another one waits for.
    pub async fn acquire_all_waiting(
        &self,
        db: u32,
        (token, ttl_ms, keys, keepalive): (Bytes, u64, Vec<Bytes>, bool),
        wait: Duration,
        closed: watch::Receiver<bool>,
    ) -> Outcome {
        let sorted = sorted(&keys);
        let Some((queue, others)) = sorted.split_first() else {
            return Reply::error("ERR internal: no keys").into();
        };
        let line = Line::Lock {
            ttl: Duration::from_millis(ttl_ms),
        };
        let try_once = || self.acquire_all(db, token.clone(), ttl_ms, &keys, keepalive);
        self.wait_in_line_waking(db, queue, others, line, wait, closed, try_once)
            .await
    }

    /// `LOCK.RELEASEALL`: each key released as `LOCK.RELEASE` releases it (one hold given
    /// back; the next turn of its queue given), all at once; how many a quorum released. A
    /// session lock of the token on a released key ends silently (the holder's own release,
    /// rule 13). A key whose hold could not be given back on a quorum makes the reply that
    /// error, with the count, so that no failure reads as a plain count.
    pub(crate) async fn release_all(&self, db: u32, token: Bytes, keys: Vec<Bytes>) -> Reply {
        let replies = if self.clustered {
            // A cluster member runs no script across two slots: each key by its own release.
            futures_util::future::join_all(keys.iter().map(|key| self.release_hold(db, key.clone(), token.clone())))
                .await
        } else {
            self.give_back_all(db, &token, &keys).await
        };
        let mut released = 0;
        for (key, given) in keys.iter().zip(&replies) {
            if given.reply == Reply::Int(1) {
                released += 1;
            }
            // The last hold: the lock is free, and a session lock of the token on it ends.
            if given.freed {
                self.sessions
                    .changed_elsewhere(db, key, |held| *held == token, "deleted");
            }
        }
        match replies.iter().map(|given| &given.reply).find(|r| r.is_error()) {
            Some(Reply::Error(e)) => {
                let text = String::from_utf8_lossy(e);
                let why = text.strip_prefix("NOQUORUM ").unwrap_or(&text);
                Reply::error(format!(
                    "NOQUORUM {released} of {} keys released; another: {why}",
                    keys.len()
                ))
            }
            _ => Reply::Int(released),
        }
    }

    /// Every key of `keys` given back as [`Proxy::release_hold`] gives it back, the first
    /// round for the whole set in one script per master (rules 1, 6), a key with extra holds
    /// then taking its own second round. When somebody is known to wait for any of the keys,
    /// the announcements of the keys freed ride on that script on every master that is up (no
    /// request of their own), as a lock's release's (`Proxy::release_lock`); when nobody is,
    /// the plain script, then a `PUBLISH` per key released. Each key's reply, in the order of
    /// `keys`.
    async fn give_back_all(&self, db: u32, token: &Bytes, keys: &[Bytes]) -> Vec<GivenBack> {
        let chosen = Instant::now();
        let turns: Vec<Turn> = keys.iter().map(|key| self.waiters.choose(db, key)).collect();
        let waited_for = turns.iter().any(|turn| !matches!(turn, Turn::Anyone));
        let on = if waited_for { self.announcers(true) } else { Vec::new() };
        let announced = (!on.is_empty()).then(|| {
            let mut channel = Bytes::new();
            let messages = keys
                .iter()
                .zip(&turns)
                .map(|(key, turn)| {
                    let (on_channel, message) = self.release_message(db, key, turn, on.len() > 1);
                    channel = on_channel;
                    message
                })
                .collect();
            SetAnnouncement { on, channel, messages }
        });
        let carried = announced.is_some();
        let per_key = self.engine.give_back_all(db, keys, token.clone(), announced).await;
        let q = self.engine.quorum();
        let rounds = keys
            .iter()
            .zip(turns)
            .zip(per_key)
            .map(|((key, turn), answers)| async move {
                let first = combine(&answers, q);
                self.release_on_legacy(db, key, token.clone(), &first).await;
                if first == Reply::Int(1) {
                    if carried {
                        self.released(db, key, &turn, chosen);
                    } else {
                        self.announce_release(db, key);
                    }
                    return GivenBack {
                        reply: first,
                        freed: true,
                    };
                }
                GivenBack {
                    reply: self.second_round(db, key, token.clone(), first, &answers).await,
                    freed: false,
                }
            });
        futures_util::future::join_all(rounds).await
    }
}

/// The keys in their one order (bytes).
fn sorted(keys: &[Bytes]) -> Vec<Bytes> {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    sorted
}

impl crate::command::Serve<Proxy, futures_util::future::BoxFuture<'static, Outcome>> for LockAllCmd {
    /// Serves `LOCK.ACQUIREALL` and `LOCK.RELEASEALL`: the command's future, metered as `name` of `kind`
    /// ([`Proxy::execute`] dispatches here, through `Recipe::serve`).
    fn serve(
        self,
        proxy: &Arc<Proxy>,
        db: u32,
        closed: &tokio::sync::watch::Sender<bool>,
        (name, kind): (&'static str, crate::command::LockOp),
    ) -> futures_util::future::BoxFuture<'static, Outcome> {
        let (p, command) = (proxy.clone(), self);
        match command {
            LockAllCmd::Acquire {
                token,
                ttl_ms,
                keys,
                keepalive,
                wait_ms: Some(wait),
                ..
            } => {
                let closed = closed.subscribe();
                proxy.metered_fenced((name, kind), db, async move {
                    p.acquire_all_waiting(
                        db,
                        (token, ttl_ms, keys, keepalive),
                        Duration::from_millis(wait),
                        closed,
                    )
                    .await
                })
            }
            LockAllCmd::Acquire {
                token,
                ttl_ms,
                keys,
                keepalive,
                wait_ms: None,
            } => proxy.metered_fenced((name, kind), db, async move {
                // F5: each key is fenced as a lock is, and may meet a master that cannot vouch.
                let (outcome, _) = p.acquire_all(db, token, ttl_ms, &keys, keepalive).await;
                outcome
            }),
            LockAllCmd::Release { token, keys } => {
                proxy.metered(name, kind, async move { p.release_all(db, token, keys).await.into() })
            }
        }
    }
}
