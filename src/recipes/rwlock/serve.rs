//! The read-write lock commands, `RWLOCK.*`: a read hold (any number of readers) or the write
//! hold (one writer, no reader) of a key, each taken by a majority as a fenced lock is
//! (`crate::recipes::rwlock`, `crate::recipes::rwlock::Mode`), released, extended, kept alive (`KEEPALIVE`),
//! waited for (`WAIT`) and fenced through the lock paths.
//!
//! Rule 14: reader–writer and writer–writer conflicts are pairs, decided over two majorities;
//! readers are never counted. Writers are not starved by a stream of readers: readers and
//! writers wait in one first-come-first-served queue per lock in each proxy (a reader behind a
//! waiting writer waits for its turn), and a waiting writer refused because readers hold
//! leaves an intent on the refusing masters that turns new readers away, from any proxy or
//! client, until it is granted, gives up, or the intent expires (liveness only: an intent
//! never lets anyone in).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::command::RwCmd;
use crate::error::ClientError;
use crate::proxy::grants::fenced_reply;
use crate::proxy::wait::Line;
use crate::proxy::{Outcome, Proxy};
use crate::quorum::Fenced;
use crate::recipes::rwlock::{Hold, Names};
use crate::recipes::rwlock::{Mode, RwTaken};
use crate::reply::Reply;
use crate::sessions::SessionGrant;
use crate::waiters::Turn;

/// The least a waiting writer's intent lives: its renewals (one try each) stay rare.
const INTENT_MIN: Duration = Duration::from_millis(200);

/// The most a waiting writer's intent lives: how long readers may be turned away by a writer
/// whose proxy died while it waited.
const INTENT_MAX: Duration = Duration::from_secs(2);

/// One acquisition of a hold: what it asks for.
struct Asked {
    db: u32,
    mode: Mode,
    key: Bytes,
    names: Names,
    token: Bytes,
    ttl_ms: u64,
    keepalive: bool,
}

impl Proxy {
    /// `RWLOCK.EXTEND`, `RWLOCK.RELEASE`, `RWLOCK.INFO`, and an acquisition without `WAIT`.
    pub(crate) async fn rw_cmd(&self, db: u32, command: RwCmd) -> Outcome {
        match command {
            RwCmd::Acquire {
                mode,
                key,
                token,
                ttl_ms,
                keepalive,
                ..
            } => {
                Box::pin(self.acquire_hold(db, mode, key, token, ttl_ms, keepalive, Duration::ZERO))
                    .await
                    .0
            }
            RwCmd::Release { key, token } => self.release_rw_hold(db, &key, token).await,
            RwCmd::Extend { key, token, ttl_ms } => self.extend_hold(db, &key, token, ttl_ms).await,
            RwCmd::Info { key } => self.hold_info(db, &key).await,
        }
    }

    /// `RWLOCK.READ` / `RWLOCK.WRITE` without waiting: the fencing token while the hold is
    /// valid when the reply is written (rule 4a: past it, nil and undone), nil when refused, an
    /// error when the token holds the lock already; and after a refusal when the refusing
    /// masters said it can be free (for a waiting request). A writer with an `intent` leaves
    /// one where readers refuse it.
    #[allow(
        clippy::too_many_arguments,
        reason = "one acquisition's request, as the client sent it"
    )]
    async fn acquire_hold(
        &self,
        db: u32,
        mode: Mode,
        key: Bytes,
        token: Bytes,
        ttl_ms: u64,
        keepalive: bool,
        intent: Duration,
    ) -> (Outcome, Option<Duration>) {
        if let Err(e) = self.check_ttl(ttl_ms).and_then(|ttl| self.check_validity(ttl)) {
            return (Reply::from(e).into(), None);
        }
        let asked = Asked {
            db,
            mode,
            names: Names::of(&key),
            key,
            token,
            ttl_ms,
            keepalive,
        };
        let ttl = Duration::from_millis(ttl_ms);
        let taken = self
            .engine
            .acquire_rw(db, &asked.names, mode, asked.token.clone(), ttl, intent)
            .await;
        match taken {
            RwTaken::Holds(held) => (Reply::from(already_holds(&asked, held)).into(), None),
            RwTaken::Lock(fenced @ Fenced::Yes { .. }) => {
                self.count_acquisition(true);
                if mode == Mode::Read {
                    self.readers_may_enter(db, &asked.names, &asked.token);
                }
                (self.hold_granted(asked, fenced), None)
            }
            RwTaken::Lock(Fenced::No { free_in }) => {
                self.count_acquisition(false);
                (Reply::Nil.into(), free_in)
            }
            RwTaken::Lock(undecided) => (fenced_reply(undecided), None),
        }
    }

    /// A reader was granted: readers waiting in other proxies may enter too (a turn given to
    /// one proxy lets one queue in; readers share). Told, as a release is, to anyone, only when
    /// another proxy announced waiters: one `PUBLISH`, and its heads try once each.
    fn readers_may_enter(&self, db: u32, names: &Names, token: &Bytes) {
        if self.waiters.proxies_waiting(db, names.base()) == 0 {
            return;
        }
        // To anyone, but on every master that is up: somebody is known to wait.
        let on = self.announcers(true);
        if !on.is_empty() {
            let (channel, message) = self.release_message(db, &names.reader_hold(token), &Turn::Anyone, on.len() > 1);
            self.publish_all(&on, &channel, &message);
        }
    }

    /// A hold granted: the fencing token (rule 4a), and with `KEEPALIVE` a session lock of the
    /// hold (a reader's under its hold name, a writer's under the writer key).
    fn hold_granted(&self, asked: Asked, fenced: Fenced) -> Outcome {
        let valid_until = match &fenced {
            Fenced::Yes { validity, .. } => Instant::now() + *validity,
            Fenced::No { .. } | Fenced::NoQuorum(_) | Fenced::Unfenced(_) => Instant::now(),
        };
        let outcome = fenced_reply(fenced);
        if !asked.keepalive {
            return outcome;
        }
        let key = match asked.mode {
            Mode::Read => asked.names.reader_hold(&asked.token),
            Mode::Write => asked.names.writer(),
        };
        outcome.with_session(SessionGrant {
            db: asked.db,
            key,
            token: asked.token,
            ttl: Duration::from_millis(asked.ttl_ms),
            valid_until,
        })
    }

    /// `RWLOCK.READ | WRITE ... WAIT ms`: waits in this proxy's one queue for the lock (readers
    /// and writers, first come first served), woken by a release through any proxy or when
    /// the holders the refusal showed can have expired. After a read grant the next in line
    /// tries at once (readers share); after a write grant it waits for the writer's release. A
    /// writer refused leaves its intent on the refusing masters and tries again at least every
    /// half intent, which renews it; it is forgotten everywhere when the writer gives up.
    pub async fn acquire_hold_waiting(
        &self,
        db: u32,
        (mode, key, token, ttl_ms, keepalive): (Mode, Bytes, Bytes, u64, bool),
        wait: Duration,
        closed: watch::Receiver<bool>,
    ) -> Outcome {
        let names = Names::of(&key);
        let ttl = Duration::from_millis(ttl_ms);
        let (line, intent) = match mode {
            Mode::Read => (Line::Shared, Duration::ZERO),
            Mode::Write => (
                Line::Lock { ttl },
                ttl.clamp(INTENT_MIN, INTENT_MAX)
                    .min(Duration::from_millis(self.config.max_ttl_ms)),
            ),
        };
        let refused = AtomicBool::new(false);
        let try_once = || {
            let (key, token, refused) = (key.clone(), token.clone(), &refused);
            async move {
                let (outcome, free_in) = self.acquire_hold(db, mode, key, token, ttl_ms, keepalive, intent).await;
                if outcome.reply == Reply::Nil && mode == Mode::Write {
                    refused.store(true, Ordering::Relaxed);
                    // Back before the intent runs out, to renew it.
                    return (outcome, Some(free_in.map_or(intent / 2, |at| at.min(intent / 2))));
                }
                (outcome, free_in)
            }
        };
        let outcome = self.wait_in_line(db, names.base(), line, wait, closed, try_once).await;
        if refused.load(Ordering::Relaxed) && !matches!(outcome.reply, Reply::Int(_)) {
            // Gave up (the wait ran out, the client left, an error): its intent goes, its own only.
            self.engine.forget_intent(db, &names, token);
        }
        outcome
    }

    /// `RWLOCK.RELEASE`: whatever hold `token` has, released on every master (rules 1, 6); 1
    /// when a quorum released it, and the lock's waiters are given their turn (announced to
    /// every proxy, as a lock's release is).
    async fn release_rw_hold(&self, db: u32, key: &Bytes, token: Bytes) -> Outcome {
        let names = Names::of(key);
        match self.release_names(db, &names, token).await {
            Ok(Some(name)) => Outcome::from(Reply::Int(1)).released_hold(Some(name)),
            Ok(None) => Reply::Int(0).into(),
            Err(e) => e.into(),
        }
    }

    /// A hold's release by the name a session keeps it under (the writer key or a reader's
    /// hold name): what `Proxy::release_lock` does for such a name.
    pub(crate) async fn release_hold_named(&self, db: u32, name: &Bytes, token: Bytes) -> Reply {
        let Some((names, _)) = crate::recipes::rwlock::split(name) else {
            return Reply::Int(0);
        };
        match self.release_names(db, &names, token).await {
            Ok(Some(_)) => Reply::Int(1),
            Ok(None) => Reply::Int(0),
            Err(e) => e,
        }
    }

    /// Releases `token`'s hold of the lock `names`: the name of the hold released (then
    /// announced), `None` when no quorum released one, or the error to answer. As a lock's
    /// release (`Proxy::release_lock`): when somebody is known to wait, the announcement for
    /// the other proxies rides on the release itself on every master that is up, published
    /// there where no writer holds the lock afterwards (no request of its own); when nobody
    /// is, the plain release, then a `PUBLISH`.
    async fn release_names(&self, db: u32, names: &Names, token: Bytes) -> Result<Option<Bytes>, Reply> {
        let chosen = Instant::now();
        let turn = self.waiters.choose(db, names.base());
        // The announcement names the writer key: the lock (its queue, `queue_key`), whichever
        // hold goes.
        let announcement = match turn {
            Turn::Anyone => None,
            Turn::Here | Turn::To(_) => self.release_announcement(db, &names.writer(), &turn),
        };
        let carried = announcement.is_some();
        let released = match announcement {
            None => self.engine.release_rw(db, names, token).await,
            Some((on, channel, message)) => {
                self.engine
                    .release_rw_announcing(db, names, token, &on, (channel, message))
                    .await
            }
        };
        let name = match released.map_err(Reply::from)? {
            Some(Hold::Writer) => names.writer(),
            Some(Hold::Reader(token)) => names.reader_hold(&token),
            None => return Ok(None),
        };
        if carried {
            self.released(db, &name, &turn, chosen);
        } else {
            self.announce_release(db, &name);
        }
        Ok(Some(name))
    }

    /// `RWLOCK.EXTEND`: whichever hold `token` has, extended on every master (rule 7): the
    /// validity a quorum guarantees when the reply is written (rule 4a), or 0.
    async fn extend_hold(&self, db: u32, key: &Bytes, token: Bytes, ttl_ms: u64) -> Outcome {
        if let Err(e) = self.check_ttl(ttl_ms) {
            return Reply::from(e).into();
        }
        let ttl = Duration::from_millis(ttl_ms);
        // The writer key stands for the lock: its extension extends either hold.
        match self
            .engine
            .extend_held(db, Names::of(key).writer(), token, ttl)
            .await
            .validity
        {
            Some(validity) => {
                let ms = i64::try_from(validity.as_millis()).unwrap_or(i64::MAX).max(1);
                Outcome::remaining(Reply::Int(ms))
            }
            None => Reply::Int(0).into(),
        }
    }

    /// `RWLOCK.INFO`: `writer` (the token a quorum holds the write with, or nil), `readers`
    /// (the tokens a quorum holds live reads for), `writer_waiting` (writers whose intent some
    /// master holds), `waiting` (requests waiting here), `proxies_waiting` (other proxies that
    /// announced waiters), `fencing_token` (the highest counter the answering masters vouch
    /// for, or nil).
    async fn hold_info(&self, db: u32, key: &Bytes) -> Outcome {
        let names = Names::of(key);
        let info = match self.engine.rw_info(db, &names).await {
            Ok(info) => info,
            Err(e) => return Reply::from(e).into(),
        };
        let count = |n: usize| Reply::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let base = names.base();
        Reply::Map(vec![
            (Reply::bulk("writer"), info.writer.map_or(Reply::Nil, Reply::Bulk)),
            (
                Reply::bulk("readers"),
                Reply::Array(info.readers.into_iter().map(Reply::Bulk).collect()),
            ),
            (Reply::bulk("writer_waiting"), count(info.writers_waiting)),
            (Reply::bulk("waiting"), count(self.waiters.waiting(db, base))),
            (
                Reply::bulk("proxies_waiting"),
                count(self.waiters.proxies_waiting(db, base)),
            ),
            (
                Reply::bulk("fencing_token"),
                info.last_token
                    .map_or(Reply::Nil, |t| Reply::Int(i64::try_from(t).unwrap_or(i64::MAX))),
            ),
        ])
        .into()
    }
}

/// The error for a token that holds the lock already (`held`), saying why it gets no second
/// hold.
fn already_holds(asked: &Asked, held: Mode) -> ClientError {
    let hint = match (held, asked.mode) {
        (Mode::Read, Mode::Write) => {
            "a read lock is not upgraded to a write lock: the writer would wait for every reader to leave, itself \
             included, for ever. Release the read lock (RWLOCK.RELEASE) and take the write lock with a new token"
        }
        (Mode::Write, Mode::Read) => {
            "a write lock is not downgraded to a read lock. Release it (RWLOCK.RELEASE) first, or read under the \
             write lock you hold"
        }
        _ => "one release would end both holds. Release it (RWLOCK.RELEASE) or use a new token for each acquisition",
    };
    ClientError::AlreadyHoldsRw {
        key: String::from_utf8_lossy(&asked.key).into_owned(),
        held: match held {
            Mode::Read => "read",
            Mode::Write => "write",
        },
        hint,
    }
}

impl crate::command::Serve<Proxy, futures_util::future::BoxFuture<'static, Outcome>> for RwCmd {
    /// Serves `RWLOCK.*`: the command's future, metered as `name` of `kind`
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
            RwCmd::Acquire {
                mode,
                key,
                token,
                ttl_ms,
                keepalive,
                wait_ms: Some(wait),
                ..
            } => {
                let closed = closed.subscribe();
                proxy.metered_fenced((name, kind), db, async move {
                    p.acquire_hold_waiting(
                        db,
                        (mode, key, token, ttl_ms, keepalive),
                        Duration::from_millis(wait),
                        closed,
                    )
                    .await
                })
            }
            r @ RwCmd::Acquire { .. }
            | r @ RwCmd::Extend { .. }
            | r @ RwCmd::Release { .. }
            | r @ RwCmd::Info { .. } => {
                // F5: a hold is fenced as a lock is, and may meet a master that cannot vouch.
                let fenced = matches!(r, RwCmd::Acquire { .. });
                let run = async move { p.rw_cmd(db, r).await };
                if fenced {
                    proxy.metered_fenced((name, kind), db, run)
                } else {
                    proxy.metered(name, kind, run)
                }
            }
        }
    }
}
