//! The lock commands: `SET` in its forms, `SETNX`, `DELEX`, `PEXPIRE`/`EXPIRE`, and the
//! native `LOCK.*` family.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;

use super::command::LockCmd;
use crate::backend::Request;
use crate::command::{Condition, DelCondition, DelEx, Expire, Expiry, Set};
use crate::error::ClientError;
use crate::lua::ScriptCall;
use crate::quorum::{Acquired, Answer, Fenced, Op, combine, combine_or};
use crate::recipes::reentrant::Reentry;
use crate::recipes::reentrant::lua::give_back;
use crate::reply::Reply;
use crate::sessions::SessionGrant;
use crate::waiters::Turn;

use crate::proxy::grants::fenced_reply;
use crate::proxy::wait::Line;
use crate::proxy::{Outcome, Proxy};
use crate::recipes::reentrant::serve::GivenBack;

/// A `SET` without `NX` or `IFEQ` as every master gets it, and how its replies are read: one
/// description for the command on its own ([`Proxy::write`]) and queued in `MULTI`.
pub(crate) struct PlainSet {
    /// `SET key value [XX] [GET] PX ttl`.
    pub args: Vec<Bytes>,
    /// What one master answers when it wrote.
    pub wrote: Wrote,
    /// What a failed write answers: `XX`'s nil ("not written"); for the legacy steal, the
    /// caller's own new value: an old value counts only if a majority held it, else the caller
    /// sees "someone holds it", never a win; for a plain `SET`, an error (Redis's `SET` has no
    /// failure value, and `OK` would be a lie).
    pub failure: Reply,
}

impl PlainSet {
    pub(crate) fn new(key: Bytes, value: Bytes, xx: bool, get: bool, ttl_ms: u64) -> PlainSet {
        let mut args = vec![Bytes::from_static(b"SET"), key, value.clone()];
        if xx {
            args.push(Bytes::from_static(b"XX"));
        }
        if get {
            args.push(Bytes::from_static(b"GET"));
        }
        args.extend([Bytes::from_static(b"PX"), Bytes::from(ttl_ms.to_string())]);
        let (wrote, failure) = match (xx, get) {
            (true, false) => (Wrote::Ok, Reply::Nil),
            (true, true) => (Wrote::OldValue, Reply::Nil),
            (false, true) => (Wrote::AnyValue, Reply::Bulk(value)),
            (false, false) => (
                Wrote::Ok,
                Reply::error("ERR SET not confirmed: no majority of masters wrote it within its TTL"),
            ),
        };
        PlainSet { args, wrote, failure }
    }
}

/// What one master answers when a write succeeded there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// `OK` (`SET`, `SET XX`).
    Ok,
    /// Any old value, or nil (`SET ... GET`: nil is "there was none").
    AnyValue,
    /// An old value (`SET XX GET`).
    OldValue,
    /// 1 (`PEXPIRE`).
    One,
}

impl Wrote {
    pub(crate) fn matches(self, reply: &Reply) -> bool {
        match (self, reply) {
            (Wrote::Ok, Reply::Status(_)) | (Wrote::OldValue, Reply::Bulk(_)) | (Wrote::One, Reply::Int(1)) => true,
            (Wrote::AnyValue, r) => matches!(r, Reply::Bulk(_) | Reply::Nil),
            _ => false,
        }
    }
}

impl Proxy {
    /// `LOCK.ACQUIRE key token ttl_ms WAIT ms [KEEPALIVE]`: the token as soon as this request
    /// gets the lock, nil when `wait` has passed first (or the client went away: `closed`).
    pub async fn acquire_waiting(
        &self,
        db: u32,
        (key, token, ttl_ms, keepalive, reentrant): (Bytes, Bytes, u64, bool, bool),
        wait: Duration,
        closed: tokio::sync::watch::Receiver<bool>,
    ) -> Outcome {
        let line = Line::Lock {
            ttl: Duration::from_millis(ttl_ms),
        };
        let try_once = || self.acquire_native(db, key.clone(), token.clone(), ttl_ms, (keepalive, reentrant));
        self.wait_in_line(db, &key, line, wait, closed, try_once).await
    }

    /// `SET` without `NX` (an acquisition is [`Proxy::set_nx`]): with `IFEQ`, an owner-checked
    /// extension; else a write sent to every master (with `GET`, the legacy steal). Every form writes a TTL, so
    /// every success is judged by rule 7 and holds only while its validity does (rule 4a).
    pub(crate) async fn set(&self, db: u32, set: Set) -> Outcome {
        let ttl_ms = match self.ttl_of(&set) {
            Ok(ttl) => ttl,
            Err(e) => return Reply::from(e).into(),
        };
        match (set.condition, set.get) {
            (Condition::IfEq(old), false) => {
                let key = [set.key.clone()];
                let op = Op::Script(ScriptCall::set_ifeq(db, set.key, old, set.value, ttl_ms));
                let ttl = Duration::from_millis(ttl_ms);
                let masters = self.engine.extend(op.clone(), |r| (*r == Reply::ok()).then_some(ttl));
                let (ext, legacy) = self.engine.mirrored(&key, &op, masters).await;
                let ext = ext.vetoed(legacy.as_ref(), |r| *r == Reply::ok());
                self.judged(&ext, combine(&ext.answers, self.engine.quorum()), Reply::Nil)
            }
            (Condition::IfEq(_), true) => Reply::from(ClientError::Unsupported(
                "SET with IFEQ and GET is not supported by the proxy".into(),
            ))
            .into(),
            (condition, get) => self.write(db, set.key, set.value, condition, get, ttl_ms).await,
        }
    }

    /// `SET key token NX [GET] [PX ttl]`: the lock acquisition, the hot path. Its own function
    /// (not an arm of [`Proxy::set`]) so that its future is only as large as an acquisition
    /// needs.
    pub(crate) fn set_nx(&self, db: u32, set: Set) -> impl Future<Output = Outcome> + '_ {
        let ttl_ms = self.ttl_of(&set);
        let Set {
            key,
            value: token,
            expiry,
            get,
            ..
        } = set;
        // A lock taken without a TTL is meant to be held until it is released: a session lock
        // (`Command::session_ttl` decides the same), with or without `GET`.
        let lifetime = match expiry {
            Expiry::None => Lifetime::Session,
            Expiry::KeepTtl | Expiry::Px(_) | Expiry::AtMs(_) => Lifetime::Ttl,
        };
        let shape = if get { Shape::SetGet } else { Shape::Set };
        // An `async` block, not an `async fn`, which would hold `set` twice.
        async move {
            match ttl_ms {
                Ok(ttl_ms) => self.grant(db, key, token, ttl_ms, lifetime, shape).await,
                Err(e) => Reply::from(e).into(),
            }
        }
    }

    /// Every acquisition in `SET`'s and `SETNX`'s syntax goes through here: one grant path,
    /// one set of rules. Granted, the reply holds while the validity does (rule 4a) and a
    /// stale one is undone (rule 5a); a lock meant to live until released becomes a session
    /// lock once its reply is written.
    async fn grant(&self, db: u32, key: Bytes, token: Bytes, ttl_ms: u64, lifetime: Lifetime, shape: Shape) -> Outcome {
        match self.acquire(db, key.clone(), token.clone(), ttl_ms).await {
            Acquired::Yes { validity, undo } => {
                let granted = Outcome::until(shape.granted(), validity, shape.stale(), Some(undo));
                match lifetime {
                    Lifetime::Session => granted.with_session(SessionGrant {
                        db,
                        key,
                        token,
                        ttl: Duration::from_millis(ttl_ms),
                        valid_until: Instant::now() + validity,
                    }),
                    Lifetime::Ttl => granted,
                }
            }
            // Rule 12: `SET NX GET`'s nil means "you got it", so a refusal never answers nil:
            // the value a quorum holds (or the old code's, on the legacy member), or an error
            // when no value is held by a quorum.
            Acquired::No { .. } if shape == Shape::SetGet => match self.read_value(db, &key).await {
                held @ (Reply::Bulk(_) | Reply::Error(_)) => held.into(),
                Reply::Status(_)
                | Reply::Int(_)
                | Reply::Nil
                | Reply::NilArray
                | Reply::Array(_)
                | Reply::Map(_)
                | Reply::Set(_)
                | Reply::Double(_)
                | Reply::Bool(_)
                | Reply::Push(_) => not_acquired_no_value().into(),
            },
            // Rule 9: "not acquired" is answered as Redis answers it.
            Acquired::No { .. } => shape.stale().into(),
            Acquired::NoQuorum(e) => Reply::from(e).into(),
        }
    }

    /// `SET` without `NX`/`IFEQ` (and `GETSET`): sent to every master, and a success only if a
    /// quorum wrote within the validity of the TTL it wrote (rule 7a).
    async fn write(&self, db: u32, key: Bytes, value: Bytes, condition: Condition, get: bool, ttl_ms: u64) -> Outcome {
        let keys = [key.clone()];
        let PlainSet { args, wrote, failure } = PlainSet::new(key, value, condition == Condition::Xx, get, ttl_ms);
        let ttl = Duration::from_millis(ttl_ms);
        let op = Op::Command(Request::new(db, args));
        let masters = self.engine.extend(op.clone(), |r| wrote.matches(r).then_some(ttl));
        let (ext, legacy) = self.engine.mirrored(&keys, &op, masters).await;
        let ext = ext.vetoed(legacy.as_ref(), |r| wrote.matches(r));
        let q = self.engine.quorum();
        let combined = if get {
            let combined = combine_or(&ext.answers, q, failure.clone());
            match &legacy {
                Some(Ok(old)) => crate::proxy::legacy::steal(combined, old, &failure),
                Some(Err(_)) | None => combined,
            }
        } else {
            combine(&ext.answers, q)
        };
        self.judged(&ext, combined, failure)
    }

    /// The TTL a `SET` writes with: its own, or `default_ttl_ms` for a lock taken without one,
    /// or `legacy_ttl_ms` for other writes without one. Never above `max_ttl_ms`, so every
    /// key the proxy writes expires within it.
    pub(crate) fn ttl_of(&self, set: &Set) -> Result<u64, ClientError> {
        let ttl = match set.expiry {
            Expiry::Px(ms) => ms,
            Expiry::AtMs(at) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                match at.checked_sub(now) {
                    Some(ttl) if ttl > 0 => ttl,
                    _ => return Err(ClientError::InvalidExpire("set".into())),
                }
            }
            Expiry::None if set.condition == Condition::Xx || set.condition == Condition::Always => {
                self.config.legacy_ttl_ms
            }
            Expiry::None => self.config.default_ttl_ms,
            Expiry::KeepTtl => {
                return Err(ClientError::Unsupported(
                    "KEEPTTL is not supported by the proxy: every key it writes carries a TTL of at most max_ttl_ms"
                        .into(),
                ));
            }
        };
        self.check_ttl(ttl)
    }

    /// Takes a lock through the engine and counts the outcome.
    fn acquire(&self, db: u32, key: Bytes, token: Bytes, ttl_ms: u64) -> impl Future<Output = Acquired> + '_ {
        let ttl = Duration::from_millis(ttl_ms);
        self.engine
            .acquire(db, key, token, ttl)
            .inspect(|outcome| match outcome {
                Acquired::Yes { .. } => self.count_acquisition(true),
                Acquired::No { .. } => self.count_acquisition(false),
                Acquired::NoQuorum(_) => {}
            })
    }

    /// `LOCK.EXTEND`: the validity left, in ms, once a quorum extended the lock; 0 when it
    /// could not.
    pub(crate) async fn extend_cmd(&self, db: u32, key: Bytes, token: Bytes, ttl_ms: u64) -> Outcome {
        if let Err(e) = self.check_ttl(ttl_ms) {
            return Reply::from(e).into();
        }
        let ttl = Duration::from_millis(ttl_ms);
        match self.extend_native(db, key, token, ttl).await.validity {
            // Rule 4a: the figure is what is left when the reply is written.
            Some(validity) => Outcome::remaining(Reply::Int(validity.as_millis().max(1) as i64)),
            None => Reply::Int(0).into(),
        }
    }

    /// `LOCK.INFO`: the holder, the validity left, the fencing token, the waiters, the session
    /// and the extra holds.
    pub(crate) async fn lock_info(&self, db: u32, key: Bytes) -> Outcome {
        // A bridged key: what the legacy member holds (the old code's lock, when the masters
        // hold none), read beside the masters.
        let (info, legacy) =
            futures_util::future::join(self.lock_info_with_holds(db, &key), self.legacy_holder(db, &key)).await;
        match info {
            Ok((info, holds)) => {
                // The old code's lock: held on the legacy member, by no quorum of masters.
                let by_old_code = match (&info.holder, &legacy) {
                    (None, Some(Reply::Map(fields))) => fields.first().map(|(_, value)| value.clone()),
                    _ => None,
                };
                let held_by = match (&info.holder, &by_old_code) {
                    (Some(_), _) => Reply::bulk("masters"),
                    (None, Some(_)) => Reply::bulk("legacy"),
                    (None, None) => Reply::Nil,
                };
                let mut fields = vec![
                    (
                        Reply::Bulk(Bytes::from_static(b"holder")),
                        info.holder.map(Reply::Bulk).or(by_old_code).unwrap_or(Reply::Nil),
                    ),
                    (
                        Reply::Bulk(Bytes::from_static(b"validity_ms")),
                        Reply::Int(info.validity.as_millis() as i64),
                    ),
                    (
                        Reply::Bulk(Bytes::from_static(b"fencing_token")),
                        info.last_token.map_or(Reply::Nil, |t| Reply::Int(t as i64)),
                    ),
                    (
                        Reply::bulk("waiting"),
                        Reply::Int(self.waiters.waiting(db, &key) as i64),
                    ),
                    (
                        Reply::bulk("proxies_waiting"),
                        Reply::Int(self.waiters.proxies_waiting(db, &key) as i64),
                    ),
                    (Reply::bulk("session"), self.session_of(db, &key)),
                    (
                        Reply::bulk("holds"),
                        Reply::Int(i64::try_from(holds).unwrap_or(i64::MAX)),
                    ),
                ];
                // Only on a bridged key: where it is held (`masters`, or `legacy` for the old
                // code's lock) and what the legacy member holds.
                if let Some(legacy) = legacy {
                    fields.push((Reply::bulk("held_by"), held_by));
                    fields.push((Reply::bulk("legacy"), legacy));
                }
                Outcome::remaining(Reply::Map(fields))
            }
            Err(e) => Reply::from(e).into(),
        }
    }

    /// Rules 1 and 6: gives back one hold of `token` on `key`, on every master, as
    /// `LOCK.RELEASE` does: the lock's release (1 when a quorum released it) unless the token
    /// holds it more than once. A release gives the next turn for the lock (`crate::waiters`). When
    /// somebody is known to wait, the announcement for the other proxies rides on the release
    /// itself on every master that is up (no request of its own), so that a paused master
    /// does not swallow it; other proxies act on it once a quorum of masters announced it
    /// (a head then finds the lock gone from a quorum rather than racing the release). When
    /// nobody is known to wait, no hand-off is under way, and a `PUBLISH` on one master after
    /// the release tells any proxy whose waiters were not announced yet.
    pub async fn release_lock(&self, db: u32, key: Bytes, token: Bytes) -> GivenBack {
        // A read-write lock's hold (a session's writer key or reader's hold name).
        if key.starts_with(crate::recipes::rwlock::PREFIX) {
            let reply = Box::pin(self.release_hold_named(db, &key, token)).await;
            let freed = reply == Reply::Int(1);
            return GivenBack { reply, freed };
        }
        // One hold, as `LOCK.RELEASE` gives it back: a lock the same token holds again through
        // another connection (`REENTRANT`) stays held for that hold. Without extra holds this
        // is the whole release.
        self.release_hold(db, key, token).await
    }

    /// The first round of giving back one hold (`crate::recipes::reentrant::lua::GIVE_BACK`
    /// on every master): the combined reply (1 when a quorum released the lock, which then
    /// gives the next turn) and every master's answer.
    pub(crate) async fn release_by(&self, db: u32, key: Bytes, token: Bytes) -> (Reply, Vec<Answer>) {
        let chosen = Instant::now();
        // A semaphore slot's release gives the turn in its semaphore's queue.
        let turn = self.waiters.choose(db, &crate::proxy::wait::queue_key(&key));
        // Nobody known to wait: the plain release, then a `PUBLISH` (no announcement built,
        // no announcing master taken from the rotation for nothing).
        let announcement = match turn {
            Turn::Anyone => None,
            Turn::Here | Turn::To(_) => self.release_announcement(db, &key, &turn),
        };
        let Some((on, channel, message)) = announcement else {
            let answers = self.engine.release_with(give_back(db, &key, token.clone(), None)).await;
            let released = combine(&answers, self.engine.quorum());
            self.release_on_legacy(db, &key, token, &released).await;
            if released == Reply::Int(1) {
                self.permit_released(db, &key);
                self.announce_release(db, &key);
            }
            return (released, answers);
        };
        let announcing = give_back(db, &key, token.clone(), Some((channel, message)));
        let answers = self
            .engine
            .release_announcing(give_back(db, &key, token.clone(), None), &on, announcing)
            .await;
        let released = combine(&answers, self.engine.quorum());
        self.release_on_legacy(db, &key, token, &released).await;
        if released == Reply::Int(1) {
            self.permit_released(db, &key);
            if matches!(turn, Turn::To(_)) {
                self.permit_handed_over(db, &key);
            }
            self.released(db, &key, &turn, chosen);
        }
        (released, answers)
    }

    /// For `LOCK.INFO`: the client holding `key` as a session lock through this proxy (a map:
    /// `client_id`, `client_name`, `client_addr`, `token`), or nil.
    fn session_of(&self, db: u32, key: &Bytes) -> Reply {
        let Some(owner) = self.sessions.owners.get(&(db, key.clone())) else {
            return Reply::Nil;
        };
        Reply::Map(vec![
            (Reply::bulk("client_id"), Reply::Int(owner.client_id as i64)),
            (
                Reply::bulk("client_name"),
                owner.client_name.clone().map_or(Reply::Nil, Reply::Bulk),
            ),
            (
                Reply::bulk("client_addr"),
                Reply::Bulk(Bytes::from(owner.client_addr.clone())),
            ),
            (Reply::bulk("token"), Reply::Bulk(owner.token.clone())),
        ])
    }

    /// `LOCK.ACQUIRE` (without waiting): the outcome, and after a refusal when the lock can be
    /// free at the latest, as the refusing masters told (for a waiting request).
    #[allow(clippy::manual_async_fn, reason = "an `async fn` would hold its arguments twice")]
    pub(crate) fn acquire_native(
        &self,
        db: u32,
        key: Bytes,
        token: Bytes,
        ttl_ms: u64,
        (keepalive, reentrant): (bool, bool),
    ) -> impl Future<Output = (Outcome, Option<Duration>)> + '_ {
        // An `async` block, not an `async fn`: this future is in every `LOCK.ACQUIRE`'s.
        async move {
            if let Err(e) = self.check_ttl(ttl_ms).and_then(|ttl| self.check_validity(ttl)) {
                return (Reply::from(e).into(), None);
            }
            let ttl = Duration::from_millis(ttl_ms);
            let fenced = if reentrant {
                // Boxed: the rarer path stays out of every acquisition's future.
                match Box::pin(self.engine.acquire_reentrant(db, key.clone(), token.clone(), ttl)).await {
                    Reentry::Lock(fenced) => fenced,
                    Reentry::NotConfirmed { placed, quorum } => {
                        return (
                            crate::recipes::reentrant::serve::not_placed(placed, quorum).into(),
                            None,
                        );
                    }
                }
            } else {
                self.engine.acquire_fenced(db, key.clone(), token.clone(), ttl).await
            };
            let (session, free_in) = match &fenced {
                Fenced::Yes { validity, .. } => {
                    self.count_acquisition(true);
                    let grant = keepalive.then(|| SessionGrant {
                        db,
                        key,
                        token,
                        ttl,
                        valid_until: Instant::now() + *validity,
                    });
                    (grant, None)
                }
                Fenced::No { free_in } => {
                    self.count_acquisition(false);
                    (None, *free_in)
                }
                Fenced::NoQuorum(_) | Fenced::Unfenced(_) => (None, None),
            };
            let outcome = fenced_reply(fenced);
            let outcome = match session {
                Some(grant) => outcome.with_session(grant),
                None => outcome,
            };
            (outcome, free_in)
        }
    }

    /// `SETNX`: the legacy acquisition, decided like `SET NX` with `legacy_ttl_ms`; 1 or 0. Not
    /// a session lock: the legacy pattern reads its expiry from the value and steals a stale
    /// lock with `GETSET`, which needs the lock to expire (docs/migrating-from-setnx.md).
    pub(crate) async fn setnx(&self, db: u32, key: Bytes, value: Bytes) -> Outcome {
        let ttl_ms = self.config.legacy_ttl_ms;
        self.grant(db, key, value, ttl_ms, Lifetime::Ttl, Shape::SetNx).await
    }

    /// `DELEX`: an atomic compare-and-delete on each master, replies combined.
    pub(crate) async fn delex(&self, db: u32, d: DelEx) -> Reply {
        let (condition, value) = match d.condition {
            DelCondition::Always => ("", Bytes::new()),
            DelCondition::IfEq(v) => ("IFEQ", v),
            DelCondition::IfNe(v) => ("IFNE", v),
        };
        let key = d.key.clone();
        let op = Op::Script(ScriptCall::delex(db, d.key, condition, value));
        let (deleted, _) = self
            .engine
            .mirrored(std::slice::from_ref(&key), &op, self.engine.execute(op.clone()))
            .await;
        if deleted == Reply::Int(1) {
            self.announce_release(db, &key);
        }
        deleted
    }

    /// `PEXPIRE`/`EXPIRE`: counts only if a quorum set it within the new validity (rule 7).
    pub(crate) async fn expire(&self, db: u32, e: Expire) -> Outcome {
        let ttl_ms = match u64::try_from(e.ttl_ms) {
            Ok(ttl) if ttl > 0 => match self.check_ttl(ttl) {
                Ok(ttl) => ttl,
                Err(err) => return Reply::from(err).into(),
            },
            // Zero or negative: Redis deletes the key; no validity to check.
            _ => 0,
        };
        let keys = [e.key.clone()];
        let mut args = vec![Bytes::from_static(b"PEXPIRE"), e.key, Bytes::from(e.ttl_ms.to_string())];
        args.extend(e.flag);
        let op = Op::Command(Request::new(db, args));
        if ttl_ms == 0 {
            return self
                .engine
                .mirrored(&keys, &op, self.engine.execute(op.clone()))
                .await
                .0
                .into();
        }
        let masters = self.engine.extend(op.clone(), |r| {
            (*r == Reply::Int(1)).then_some(Duration::from_millis(ttl_ms))
        });
        let (ext, legacy) = self.engine.mirrored(&keys, &op, masters).await;
        let ext = ext.vetoed(legacy.as_ref(), |r| *r == Reply::Int(1));
        self.judged(&ext, combine(&ext.answers, self.engine.quorum()), Reply::Int(0))
    }
}

/// How long a granted lock lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lifetime {
    /// Its TTL.
    Ttl,
    /// While its connection is open (`crate::sessions`).
    Session,
}

/// Which command's replies an acquisition answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `SET ... NX`: `OK`, or nil.
    Set,
    /// `SET ... NX GET`: nil ("you got it"), or the value held.
    SetGet,
    /// `SETNX`: 1 or 0.
    SetNx,
}

impl Shape {
    /// The reply of a grant.
    fn granted(self) -> Reply {
        match self {
            Shape::Set => Reply::ok(),
            Shape::SetGet => Reply::Nil,
            Shape::SetNx => Reply::Int(1),
        }
    }

    /// The reply of a refusal, or of a grant whose validity ran out before it was written.
    fn stale(self) -> Reply {
        match self {
            Shape::Set => Reply::Nil,
            Shape::SetGet => not_acquired_no_value(),
            Shape::SetNx => Reply::Int(0),
        }
    }
}

/// Rule 12: a refused `SET NX GET` when no value is held by a quorum. Nil would read as "you
/// got it"; an error cannot be mistaken for success.
fn not_acquired_no_value() -> Reply {
    Reply::error("ERR not acquired: the key is held, but no single value is held by a majority of masters")
}

impl crate::command::Serve<Proxy, futures_util::future::BoxFuture<'static, Outcome>> for LockCmd {
    /// Serves `LOCK.*`: the command's future, metered as `name` of `kind`
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
            LockCmd::Acquire {
                key,
                token,
                ttl_ms,
                keepalive,
                reentrant,
                wait_ms: Some(wait),
                ..
            } => {
                let closed = closed.subscribe();
                proxy.metered_fenced((name, kind), db, async move {
                    p.acquire_waiting(
                        db,
                        (key, token, ttl_ms, keepalive, reentrant),
                        Duration::from_millis(wait),
                        closed,
                    )
                    .await
                })
            }
            // Each command its own future, boxed at its own size (`Proxy::execute`).
            LockCmd::Acquire {
                key,
                token,
                ttl_ms,
                keepalive,
                wait_ms: None,
                reentrant,
            } => proxy.metered_fenced((name, kind), db, async move {
                let (outcome, _) = p.acquire_native(db, key, token, ttl_ms, (keepalive, reentrant)).await;
                outcome
            }),
            // Only LOCK.FENCE, of the rest, can meet a master that cannot vouch for its counter (F5).
            LockCmd::Fence { key, token } => proxy.metered_fenced((name, kind), db, async move {
                fenced_reply(p.engine.fence(db, key, token).await)
            }),
            LockCmd::Extend { key, token, ttl_ms } => {
                proxy.metered(name, kind, async move { p.extend_cmd(db, key, token, ttl_ms).await })
            }
            LockCmd::Release { key, token } => {
                proxy.metered(
                    name,
                    kind,
                    async move { p.release_hold(db, key, token).await.outcome() },
                )
            }
            LockCmd::Info { key } => proxy.metered(name, kind, async move { p.lock_info(db, key).await }),
        }
    }
}
