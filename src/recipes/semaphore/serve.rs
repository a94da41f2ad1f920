//! The semaphore commands, `SEM.*`: a permit of a k-permit semaphore is one of its k slots,
//! each an ordinary fenced lock on a reserved key (`crate::recipes::semaphore`), taken, released,
//! extended, kept alive (`KEEPALIVE`), waited for (`WAIT`) and fenced through the lock paths.
//!
//! Rule 14: a majority bounds one holder per slot, so k slots bound k holders; no count of
//! holders is ever judged. Which slot to try is the proxy's choice, and only a matter of cost:
//! the first slot it does not believe held (`crate::recipes::semaphore::Ledger`), then, after a refusal,
//! a slot the refusing masters' reports show can be free on a quorum, each attempt a whole
//! acquisition with its own validity (rule 4), all within the TTL of the request (rule 9).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::command::SemCmd;
use crate::error::ClientError;
use crate::proxy::grants::fenced_reply;
use crate::proxy::wait::Line;
use crate::proxy::{Outcome, Proxy};
use crate::quorum::{Fenced, Undo};
use crate::recipes::semaphore::Names;
use crate::recipes::semaphore::{HeldPermit, Refusal, SlotTaken};
use crate::reply::Reply;
use crate::sessions::SessionGrant;

/// One acquisition of a permit: what it asks for.
struct Asked {
    db: u32,
    key: Bytes,
    names: Names,
    token: Bytes,
    permits: u32,
    ttl_ms: u64,
    keepalive: bool,
}

/// A slot granted, as the engine answered it.
struct Granted {
    slot: u32,
    fence: u64,
    validity: Duration,
    undo: Option<Undo>,
}

impl Proxy {
    /// `SEM.ACQUIRE` without waiting: `[slot, fencing token]`, or nil when no slot could be
    /// taken within the request's TTL; and, after a refusal, when the soonest slot the
    /// refusing masters showed held can be free (for a waiting request).
    pub(crate) async fn acquire_permit(
        &self,
        db: u32,
        key: Bytes,
        token: Bytes,
        permits: u32,
        ttl_ms: u64,
        keepalive: bool,
    ) -> (Outcome, Option<Duration>) {
        if let Err(e) = self.check_ttl(ttl_ms).and_then(|ttl| self.check_validity(ttl)) {
            return (Reply::from(e).into(), None);
        }
        let asked = Asked {
            db,
            names: Names::of(&key),
            key,
            token,
            permits,
            ttl_ms,
            keepalive,
        };
        let ttl = Duration::from_millis(ttl_ms);
        // Rule 9: no request is held past its TTL; each attempt is valid on its own (rule 4).
        let deadline = Instant::now() + ttl;
        let mut tried: Vec<u32> = Vec::new();
        let mut free_in = None;
        // A slot being tried here is claimed for the longest an attempt takes.
        let claim = self.config.backend_timeout().min(ttl) * 2;
        let base = asked.names.base();
        // The first attempt asks the masters whatever this proxy believes; after a refusal,
        // only a slot that can be free (its reports are the freshest view).
        let mut next = self.semaphores.candidate(db, base, permits, &tried, true, claim);
        while let Some(slot) = next {
            tried.push(slot);
            let taken = self
                .engine
                .acquire_slot(db, asked.names.slot(slot), asked.token.clone(), ttl, permits)
                .await;
            if !matches!(taken, SlotTaken::Lock(Fenced::Yes { .. })) {
                self.semaphores.unclaim(db, base, slot);
            }
            match taken {
                SlotTaken::Lock(Fenced::Yes { token, validity, undo }) => {
                    let granted = Granted {
                        slot,
                        fence: token,
                        validity,
                        undo,
                    };
                    return (self.permit_granted(asked, granted), None);
                }
                // Granted but not valid in time (a slow write-back): undone; the next slot.
                SlotTaken::Lock(Fenced::No { .. }) => {}
                SlotTaken::Lock(undecided) => return (fenced_reply(undecided), None),
                SlotTaken::Refused(refusal) => {
                    if let Some(conflict) = conflict(&asked, &refusal) {
                        return (Reply::from(conflict).into(), None);
                    }
                    free_in = self.learn(&asked, &refusal);
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            next = self.semaphores.candidate(db, base, permits, &tried, false, claim);
        }
        self.count_acquisition(false);
        (Reply::Nil.into(), free_in)
    }

    /// `SEM.ACQUIRE ... WAIT ms`: waits in this proxy's queue for the semaphore (first come,
    /// first served), woken by a release of any of its slots through any proxy or when the
    /// soonest held slot can have expired.
    pub async fn acquire_permit_waiting(
        &self,
        db: u32,
        (key, token, permits, ttl_ms, keepalive): (Bytes, Bytes, u32, u64, bool),
        wait: Duration,
        closed: watch::Receiver<bool>,
    ) -> Outcome {
        let queue = Names::of(&key).base().clone();
        let try_once = || Box::pin(self.acquire_permit(db, key.clone(), token.clone(), permits, ttl_ms, keepalive));
        self.wait_in_line(db, &queue, Line::Permits { permits }, wait, closed, try_once)
            .await
    }

    /// A slot granted (its claim ends with the grant): the reply `[slot, fencing token]` while
    /// the grant is valid when written (rule 4a: past it, nil and undone), a session lock of the
    /// slot with `KEEPALIVE`.
    fn permit_granted(&self, asked: Asked, granted: Granted) -> Outcome {
        self.count_acquisition(true);
        let now = Instant::now();
        // A session permit is believed held as long as a session lock can be.
        let believed = if asked.keepalive {
            Duration::from_millis(self.config.max_hold_ms)
        } else {
            granted.validity
        };
        self.semaphores.granted(
            asked.db,
            asked.names.base(),
            granted.slot,
            asked.token.clone(),
            now + believed,
        );
        let reply = Reply::Array(vec![
            Reply::Int(i64::from(granted.slot)),
            Reply::Int(i64::try_from(granted.fence).unwrap_or(i64::MAX)),
        ]);
        let outcome = Outcome::until(reply, granted.validity, Reply::Nil, granted.undo);
        if !asked.keepalive {
            return outcome;
        }
        outcome.with_session(SessionGrant {
            db: asked.db,
            key: asked.names.slot(granted.slot),
            token: asked.token,
            ttl: Duration::from_millis(asked.ttl_ms),
            valid_until: now + granted.validity,
        })
    }

    /// Notes what a refusal showed: slots that cannot be free on a quorum now, believed held
    /// until they can be; slots that can, believed free. Returns when the soonest of the
    /// former can be free.
    fn learn(&self, asked: &Asked, refusal: &Refusal) -> Option<Duration> {
        let now = Instant::now();
        let fallback = Duration::from_millis(asked.ttl_ms);
        let blocked: Vec<(u32, Option<Duration>)> = refusal
            .held
            .iter()
            .filter(|h| !refusal.may_be_free(h.slot))
            .map(|h| (h.slot, h.free_in))
            .collect();
        let free = (0..asked.permits).filter(|slot| refusal.may_be_free(*slot));
        // With fewer than a quorum of reports, a slot nobody reported says little.
        let free: Vec<u32> = if refusal.reporters >= self.engine.quorum() {
            free.collect()
        } else {
            Vec::new()
        };
        self.semaphores.learned(
            asked.db,
            asked.names.base(),
            blocked.iter().map(|(slot, at)| (*slot, now + at.unwrap_or(fallback))),
            free,
        );
        blocked.iter().filter_map(|(_, at)| *at).min()
    }

    /// `SEM.RELEASE`: the slot `token` holds is released as a lock is (rules 1, 6: on every
    /// master, its waiters given their turn); 1 when a quorum released it. The slot is the one
    /// this proxy granted to the token, or, when it did not (or no longer holds it there),
    /// the one the masters say the token holds.
    async fn release_permit(&self, db: u32, key: &Bytes, token: Bytes) -> Outcome {
        let names = Names::of(key);
        if let Some(slot) = self.semaphores.slot_of(db, names.base(), &token) {
            let slot_key = names.slot(slot);
            match self.release_lock(db, slot_key.clone(), token.clone()).await.reply {
                Reply::Int(1) => return Outcome::from(Reply::Int(1)).released_hold(Some(slot_key)),
                error @ Reply::Error(_) => return error.into(),
                // Not held there any more: believed free, and the masters asked.
                Reply::Status(_)
                | Reply::Int(_)
                | Reply::Bulk(_)
                | Reply::Nil
                | Reply::NilArray
                | Reply::Array(_)
                | Reply::Map(_)
                | Reply::Set(_)
                | Reply::Double(_)
                | Reply::Bool(_)
                | Reply::Push(_) => self.semaphores.released(db, names.base(), slot),
            }
        }
        let slots = match self.engine.find_slots(db, &names, token.clone()).await {
            Ok(slots) => slots,
            Err(e) => return Reply::from(e).into(),
        };
        let mut answer = Outcome::from(Reply::Int(0));
        for slot in slots {
            let slot_key = names.slot(slot);
            match self.release_lock(db, slot_key.clone(), token.clone()).await.reply {
                Reply::Int(1) => answer = Outcome::from(Reply::Int(1)).released_hold(Some(slot_key)),
                error @ Reply::Error(_) if answer.reply == Reply::Int(0) => answer = error.into(),
                Reply::Status(_)
                | Reply::Error(_)
                | Reply::Int(_)
                | Reply::Bulk(_)
                | Reply::Nil
                | Reply::NilArray
                | Reply::Array(_)
                | Reply::Map(_)
                | Reply::Set(_)
                | Reply::Double(_)
                | Reply::Bool(_)
                | Reply::Push(_) => {}
            }
        }
        answer
    }

    /// `SEM.EXTEND`: the slot `token` holds (as [`Proxy::release_permit`] finds it) extended as
    /// a lock is (rule 7): the validity a quorum guarantees when the reply is written, or 0.
    async fn extend_permit(&self, db: u32, key: &Bytes, token: Bytes, ttl_ms: u64) -> Outcome {
        if let Err(e) = self.check_ttl(ttl_ms) {
            return Reply::from(e).into();
        }
        let names = Names::of(key);
        let ttl = Duration::from_millis(ttl_ms);
        let known = self.semaphores.slot_of(db, names.base(), &token);
        if let Some(slot) = known
            && let Some(extended) = self.extend_slot(db, &names, slot, &token, ttl).await
        {
            return extended;
        }
        let slots = match self.engine.find_slots(db, &names, token.clone()).await {
            Ok(slots) => slots,
            Err(e) => return Reply::from(e).into(),
        };
        for slot in slots.into_iter().filter(|slot| Some(*slot) != known) {
            if let Some(extended) = self.extend_slot(db, &names, slot, &token, ttl).await {
                return extended;
            }
        }
        Reply::Int(0).into()
    }

    /// Extends slot `slot` held by `token`: the validity figure (rule 4a: what is left when
    /// written), or `None` when no quorum extended it.
    async fn extend_slot(&self, db: u32, names: &Names, slot: u32, token: &Bytes, ttl: Duration) -> Option<Outcome> {
        let validity = self
            .engine
            .extend_lock(db, names.slot(slot), token.clone(), ttl)
            .await
            .validity?;
        self.semaphores
            .extended(db, names.base(), slot, token, Instant::now() + validity);
        let ms = i64::try_from(validity.as_millis()).unwrap_or(i64::MAX).max(1);
        Some(Outcome::remaining(Reply::Int(ms)))
    }

    /// `SEM.INFO`: `permits` (the count a quorum of masters keeps, nil before any grant),
    /// `holders` (slots a quorum holds for one token with validity left), `free_slots` (the
    /// others), `tokens` (each held slot's holder, as `LOCK.INFO` shows a lock's `holder`),
    /// `validity_ms` (each held slot's validity, what is left when the reply is written, rule
    /// 4a, as `LOCK.INFO`'s: a session permit's holder confirms its hold with it), `waiting` (requests waiting for a permit here), `proxies_waiting` (other proxies that
    /// announced waiters).
    async fn permit_info(&self, db: u32, key: &Bytes) -> Outcome {
        let names = Names::of(key);
        let info = match self.engine.semaphore_info(db, &names).await {
            Ok(info) => info,
            Err(e) => return Reply::from(e).into(),
        };
        let free: Vec<Reply> = (0..info.permits.unwrap_or(0))
            .filter(|slot| !info.held.iter().any(|held| held.slot == *slot))
            .map(|slot| Reply::Int(i64::from(slot)))
            .collect();
        let by_slot = |f: &dyn Fn(&HeldPermit) -> Reply| {
            let rows = info.held.iter().map(|h| (Reply::Int(i64::from(h.slot)), f(h)));
            Reply::Map(rows.collect())
        };
        let tokens = by_slot(&|h| Reply::Bulk(h.token.clone()));
        let validity = by_slot(&|h| Reply::Int(i64::try_from(h.validity.as_millis()).unwrap_or(i64::MAX)));
        let count = |n: usize| Reply::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let base = names.base();
        let reply = Reply::Map(vec![
            (
                Reply::bulk("permits"),
                info.permits.map_or(Reply::Nil, |n| Reply::Int(i64::from(n))),
            ),
            (Reply::bulk("holders"), count(info.held.len())),
            (Reply::bulk("free_slots"), Reply::Array(free)),
            (Reply::bulk("tokens"), tokens),
            (Reply::bulk("validity_ms"), validity),
            (Reply::bulk("waiting"), count(self.waiters.waiting(db, base))),
            (
                Reply::bulk("proxies_waiting"),
                count(self.waiters.proxies_waiting(db, base)),
            ),
        ]);
        // Rule 4a: each slot's figure is reduced by the time the reply waits to be written.
        Outcome::remaining(reply)
    }

    /// The semaphore slot `key` was released (through this proxy, or as another announced):
    /// believed free. Any other key: nothing.
    pub(crate) fn permit_released(&self, db: u32, key: &Bytes) {
        if let Some((base, slot)) = crate::recipes::semaphore::split_slot(key) {
            self.semaphores.released(db, &key.slice_ref(base), slot);
        }
    }

    /// The semaphore slot `key` was released with the turn given to another proxy (this one's
    /// release, or another's announcement naming the next proxy): that proxy's head is taking
    /// it, and no grant through it is announced. Believed held for one backend timeout (a
    /// hand-off's round), so that after a grant here the next in line waits for a release
    /// rather than trying a slot that is being taken elsewhere (one refused round per
    /// hand-off). Liveness only: a belief orders tries and never grants; a stale one delays
    /// this proxy's next try at most that long (a release announced meanwhile ends it), and a
    /// refusal replaces it with what the masters hold.
    pub(crate) fn permit_handed_over(&self, db: u32, key: &Bytes) {
        if let Some((base, slot)) = crate::recipes::semaphore::split_slot(key) {
            let until = Instant::now() + self.config.backend_timeout();
            self.semaphores.learned(db, &key.slice_ref(base), [(slot, until)], []);
        }
    }
}

/// The semaphore's conflicts a refusal reported, as the client's error: another count of
/// permits held live on some master, or the token holding a slot already.
fn conflict(asked: &Asked, refusal: &Refusal) -> Option<ClientError> {
    let key = || String::from_utf8_lossy(&asked.key).into_owned();
    if let Some(held) = refusal.permits {
        return Some(ClientError::PermitsMismatch {
            key: key(),
            held,
            asked: asked.permits,
        });
    }
    refusal.holds.map(|slot| ClientError::AlreadyHolds { key: key(), slot })
}

impl crate::command::Serve<Proxy, futures_util::future::BoxFuture<'static, Outcome>> for SemCmd {
    /// Serves `SEM.*`: the command's future, metered as `name` of `kind`
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
            SemCmd::Acquire {
                key,
                token,
                permits,
                ttl_ms,
                keepalive,
                wait_ms: Some(wait),
                ..
            } => {
                let closed = closed.subscribe();
                proxy.metered_fenced((name, kind), db, async move {
                    p.acquire_permit_waiting(
                        db,
                        (key, token, permits, ttl_ms, keepalive),
                        Duration::from_millis(wait),
                        closed,
                    )
                    .await
                })
            }
            SemCmd::Acquire {
                key,
                token,
                permits,
                ttl_ms,
                keepalive,
                wait_ms: None,
            } => proxy.metered_fenced((name, kind), db, async move {
                // F5: a slot is fenced as a lock is, and may meet a master that cannot vouch.
                let (outcome, _) = p.acquire_permit(db, key, token, permits, ttl_ms, keepalive).await;
                outcome
            }),
            SemCmd::Release { key, token } => {
                proxy.metered(name, kind, async move { p.release_permit(db, &key, token).await })
            }
            SemCmd::Extend { key, token, ttl_ms } => {
                proxy.metered(
                    name,
                    kind,
                    async move { p.extend_permit(db, &key, token, ttl_ms).await },
                )
            }
            SemCmd::Info { key } => proxy.metered(name, kind, async move { p.permit_info(db, &key).await }),
        }
    }
}
