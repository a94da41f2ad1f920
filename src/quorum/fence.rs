//! Fencing tokens: every grant of a lock gets a number strictly greater than every token
//! handed out before it for that lock, whichever majorities decided them.
//!
//! The rules, each argued in `docs/fencing.md`:
//! - F1. A token is the maximum of the counters a quorum of masters bumped, atomically with
//!   granting (or, for `LOCK.FENCE`, while holding) the lock.
//! - F2. Before the token is answered, a quorum holds it: either a quorum of the bumps
//!   returned it (the counters agreed), or it is written back (each master raises its
//!   counter to it), and the write-back counts against the validity time. Any later quorum
//!   intersects that one, so its maximum is higher.
//! - F3. Only *trusted* counters count towards F1 and F2: a master that lost its data (no
//!   epoch, or an epoch of another run) votes on the lock but not on tokens, until a
//!   write-back of a newer token makes its counter for that lock trusted again.
//! - F4. A database where no master has an epoch is new: all masters get a genesis epoch
//!   (a missing counter means the genesis time in µs). Where some have one, a master
//!   without gets a rejoin epoch.
//! - F5. A rejoined master is repaired: every counter a quorum of the others vouches for is
//!   copied to it (their maximum); once all are, it is promoted to a genesis epoch.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{Acquisition, Answer, Engine, Extension, Grant, NoQuorum, Op, Taken, Undo, Unfenced, quorum_th_largest};
use crate::backend::{Backend, Request};
use crate::clock::Clock;
use crate::lua::ScriptCall;
use crate::lua::fence as lua;
use crate::reply::Reply;

/// When each master of each database was last repaired (F5), on the engine's clock; and the
/// databases where a fenced operation met a master that could not vouch for its counter.
#[derive(Debug, Default)]
pub(crate) struct Repairs {
    last: Mutex<HashMap<(u32, usize), Duration>>,
    wanted: Mutex<HashSet<u32>>,
    /// Databases without counters whose genesis (F4) waits for members out of sight: which.
    genesis_waits: Mutex<HashMap<u32, Vec<usize>>>,
}

impl Repairs {
    /// Notes that a master of `db` could not vouch for its counter (F3): the database wants
    /// [`Engine::recover`].
    pub(crate) fn want(&self, db: u32) {
        let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        wanted.insert(db);
    }
}

/// What a fenced acquisition (or `LOCK.FENCE`) came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Fenced {
    /// Granted (or still held), with this token, valid for `validity`.
    Yes {
        /// The fencing token.
        token: u64,
        /// Rule 4's validity left after the write-back.
        validity: Duration,
        /// For an acquisition: takes the grant back (rule 4a). `LOCK.FENCE` took nothing.
        undo: Option<Undo>,
    },
    /// Held by someone else (acquire), not held by the caller (fence), or not valid in time.
    No {
        /// For a refused acquisition: when the lock can be free at the latest (see
        /// [`super::Acquired::No`]).
        free_in: Option<Duration>,
    },
    /// Fewer than a quorum of masters answered.
    NoQuorum(NoQuorum),
    /// A quorum answered, but fewer than a quorum had trusted counters (F3).
    Unfenced(Unfenced),
}

/// What `LOCK.INFO` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The token a quorum holds, if any.
    pub holder: Option<Bytes>,
    /// The validity a quorum still guarantees the holder (zero without one).
    pub validity: Duration,
    /// The highest trusted counter among the masters that answered: the last token issued
    /// (or a higher number a refused attempt bumped), if any.
    pub last_token: Option<u64>,
}

/// The fenced acquisition script: `SET NX` and a counter bump, atomically (F1). The lock of
/// `LOCK.ACQUIRE`; every other fenced recipe's acquisition is this one with more checked first.
#[derive(Clone, Copy, Debug)]
pub struct FencedLock;

impl Acquisition for FencedLock {
    type Refusal = std::convert::Infallible;

    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        Op::Script(lua::acquire(db, key, token.clone(), ttl.as_millis()))
    }
}

/// What one fenced attempt came to, read once for every recipe ([`Engine::take_fenced`]).
#[derive(Debug)]
pub enum Attempt<R> {
    /// A quorum granted with trusted counters in time: the recipe vouches for the token
    /// (F2, most by [`Engine::fenced_grant`]) or undoes it.
    Granted(Grant),
    /// Refused, and the masters told the recipe why ([`Acquisition::refusal`]).
    Refused(R),
    /// Not taken: held with nothing more to tell (`No`), no quorum, or no quorum of trusted
    /// counters (`Unfenced`: [`Engine::recovering`] tries again after a recovery).
    Failed(Fenced),
}

/// An outcome that can say it failed for want of trusted counters (F3): the one case in which
/// a fenced acquisition recovers the masters and tries once more.
pub trait Recoverable {
    /// Whether this outcome is `Unfenced`.
    fn unfenced(&self) -> bool;
}

impl Recoverable for Fenced {
    fn unfenced(&self) -> bool {
        matches!(self, Fenced::Unfenced(_))
    }
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// `LOCK.ACQUIRE`: takes the lock and returns its fencing token (F1, F2).
    ///
    /// An `async` block, not an `async fn` (which would hold its arguments twice), with the
    /// rare paths boxed apart: this future is in every `LOCK.ACQUIRE`'s, which the client's
    /// connection boxes, and small blocks stay on the allocator's fast path.
    #[allow(clippy::manual_async_fn, reason = "an `async fn` would hold its arguments twice")]
    pub fn acquire_fenced(
        &self,
        db: u32,
        key: Bytes,
        token: Bytes,
        ttl: Duration,
    ) -> impl Future<Output = Fenced> + '_ {
        async move {
            let (key, token) = (&key, &token);
            self.recovering(db, move || async move {
                match self.take_fenced(FencedLock, db, key, token, ttl).await {
                    Attempt::Granted(grant) => self.fenced_grant(db, key, token, ttl, grant).await,
                    Attempt::Refused(never) => match never {},
                    Attempt::Failed(fenced) => fenced,
                }
            })
            .await
        }
    }

    /// F4, F5 for every fenced acquisition: `attempt` once, and when it failed for want of
    /// trusted counters, the masters without an epoch get one, rejoined ones are repaired
    /// ([`Engine::recover`]), and it is tried once more. Only after a failure: after a grant,
    /// the time this takes would be spent out of the validity already answered (rule 4); a
    /// master that cannot vouch simply does not vote on tokens until then.
    pub async fn recovering<T: Recoverable, F: Future<Output = T>>(&self, db: u32, attempt: impl Fn() -> F) -> T {
        let first = attempt().await;
        if !first.unfenced() {
            return first;
        }
        // Boxed: the rare path, kept out of every acquisition's future.
        Box::pin(async {
            self.recover(db).await;
            attempt().await
        })
        .await
    }

    /// One fenced attempt of `kind` (rules 3–5a, F1, F3), read the same way for every recipe:
    /// a grant with a quorum of trusted counters, the recipe's refusal, or the lock's failure.
    pub async fn take_fenced<A: Acquisition>(
        &self,
        kind: A,
        db: u32,
        key: &Bytes,
        token: &Bytes,
        ttl: Duration,
    ) -> Attempt<A::Refusal> {
        match self.take(Arc::new(kind), db, key.clone(), token.clone(), ttl).await {
            Taken::Yes(grant) => Attempt::Granted(grant),
            Taken::No {
                refusal: Some(refusal), ..
            } => Attempt::Refused(refusal),
            Taken::No { free_in, .. } => Attempt::Failed(Fenced::No { free_in }),
            Taken::NoQuorum(e) => Attempt::Failed(Fenced::NoQuorum(e)),
            Taken::Unfenced { trusted, total } => Attempt::Failed(self.unfenced(db, trusted, total)),
        }
    }

    /// F2 for an attempt a quorum granted with its trusted `fences` (its clock started at
    /// `start`): the token once a quorum vouches for it within the validity, else the attempt
    /// undone. A lock's and a semaphore slot's grants end here alike.
    pub async fn fenced_grant(
        &self,
        db: u32,
        key: &Bytes,
        token: &Bytes,
        ttl: Duration,
        Grant {
            fences, start, undo, ..
        }: Grant,
    ) -> Fenced {
        // F2: the write-back round trip only when the counters disagree (boxed: the rare path).
        let fenced = match self.agreed(ttl, &fences, start) {
            Some(fenced) => fenced,
            None => {
                let call = |fence| undo.kind.write_back_call(db, key, token.clone(), fence);
                Box::pin(self.write_back(db, &call, ttl, &fences, start)).await
            }
        };
        match fenced {
            Fenced::Yes { token, validity, .. } => Fenced::Yes {
                token,
                validity,
                undo: Some(undo),
            },
            fenced => {
                // Rules 5 and 5a: a lock without its token is not granted; undo this attempt
                // (and only it).
                Box::pin(self.undo(&undo)).await;
                fenced
            }
        }
    }

    /// `LOCK.FENCE`: a new token for the holder of `key` (a client that took it with plain
    /// `SET NX PX`). Each call bumps: the token is above every token issued before it.
    pub async fn fence(&self, db: u32, key: Bytes, token: Bytes) -> Fenced {
        let start = self.clock.now();
        let q = self.quorum();
        let bumped = |a: &Answer| match a {
            Ok(Reply::Array(items)) => match items.as_slice() {
                [Reply::Int(n), Reply::Int(ttl)] => Some((*n, *ttl)),
                _ => None,
            },
            _ => None,
        };
        let trusted = |answers: &[Option<Answer>]| {
            answers
                .iter()
                .flatten()
                .filter(|a| bumped(a).is_some_and(|(n, _)| n > 0))
                .count()
        };
        let answers = self
            .gather(&Op::Script(lua::bump(db, &key, token.clone())), |answers| {
                trusted(answers) >= q
            })
            .await;
        let bumps: Vec<(i64, i64)> = answers.iter().filter_map(bumped).collect();
        if bumps.iter().any(|(n, _)| *n <= 0) {
            self.repairs.want(db);
        }
        // A vote is a bump or nil (not the holder there); an error reply is a failure (5a).
        let votes = |r: &Reply| matches!(r, Reply::Array(_) | Reply::Nil);
        let answered = answers.iter().filter(|a| a.as_ref().is_ok_and(votes)).count();
        if answered < q {
            return Fenced::NoQuorum(NoQuorum::of(&answers, votes));
        }
        if bumps.len() < q {
            // Not held by the caller on a quorum.
            return Fenced::No { free_in: None };
        }
        let trusted: Vec<(u64, u64)> = bumps
            .iter()
            .filter_map(|&(n, ttl)| Some((u64::try_from(n).ok().filter(|n| *n > 0)?, u64::try_from(ttl).ok()?)))
            .collect();
        if trusted.len() < q {
            self.recover(db).await;
            return self.unfenced(db, trusted.len(), answers.len());
        }
        // The TTL a quorum of holders still has (the quorum-th largest), as the lock's TTL
        // from `start` for rule 4.
        let Some(ttl) = quorum_th_largest(trusted.iter().map(|(_, ttl)| *ttl).collect(), q) else {
            return Fenced::No { free_in: None };
        };
        let ttl = Duration::from_millis(ttl);
        let fences: Vec<u64> = trusted.iter().map(|(n, _)| *n).collect();
        // A failed fence leaves the lock with its holder: it only got no token.
        let call = |fence| lua::write_back(db, &key, token.clone(), fence);
        self.write_back(db, &call, ttl, &fences, start).await
    }

    /// F2 by the bumps themselves: when a quorum of trusted counters equals the token already
    /// (each bump ran before this answer, as a write-back would have), the outcome without a
    /// write-back; `None` when the counters disagree and the write-back must run.
    fn agreed(&self, ttl: Duration, fences: &[u64], start: Duration) -> Option<Fenced> {
        let fence = fences.iter().copied().max().unwrap_or(0);
        if fences.iter().filter(|&&f| f == fence).count() < self.quorum() {
            return None;
        }
        Some(match self.validity(ttl, self.clock.now() - start) {
            Some(validity) => Fenced::Yes {
                token: fence,
                validity,
                undo: None,
            },
            None => Fenced::No { free_in: None },
        })
    }

    /// F2: makes sure a quorum vouches for the token (the largest of `fences`, F1) before it
    /// is answered, within the validity of `ttl` counted from `start`. When a quorum of the
    /// bumps already returned the token itself, those masters hold it now and nothing is
    /// written (one round trip: the usual case, since counters move together while every
    /// master takes part). Otherwise the token is written back to the masters holding the
    /// lock, and answered once a quorum raised their counters to it.
    ///
    /// `call` is the write-back of a fencing token on one master: the fenced lock's
    /// ([`lua::write_back`]) or the one the acquisition names ([`Acquisition::write_back`]).
    pub(crate) async fn write_back(
        &self,
        db: u32,
        call: &(dyn Fn(u64) -> ScriptCall + Sync),
        ttl: Duration,
        fences: &[u64],
        start: Duration,
    ) -> Fenced {
        if let Some(fenced) = self.agreed(ttl, fences, start) {
            return fenced;
        }
        metrics::counter!(crate::metrics::FENCE_WRITE_BACKS).increment(1);
        let q = self.quorum();
        let fence = fences.iter().copied().max().unwrap_or(0);
        let written = |answers: &[Option<Answer>]| {
            answers
                .iter()
                .flatten()
                .filter(|a| matches!(a, Ok(Reply::Int(1))))
                .count()
        };
        let op = Op::Script(call(fence));
        let answers: Vec<Option<Answer>> = self
            .gather(&op, |answers| written(answers) >= q)
            .await
            .into_iter()
            .map(Some)
            .collect();
        let vouched = written(&answers);
        // Rule 4 over both round trips: the token is only worth something while the lock is.
        let validity = self.validity(ttl, self.clock.now() - start);
        match validity {
            Some(validity) if vouched >= q => Fenced::Yes {
                token: fence,
                validity,
                undo: None,
            },
            _ => {
                let votes = |r: &Reply| matches!(r, Reply::Int(_));
                let answered = answers.iter().flatten().filter(|a| a.as_ref().is_ok_and(votes)).count();
                if answered < q {
                    Fenced::NoQuorum(NoQuorum::of(answers.iter().flatten(), votes))
                } else if validity.is_none() {
                    Fenced::No { free_in: None }
                } else {
                    self.unfenced(db, vouched, answers.len())
                }
            }
        }
    }

    /// Every master's `(value, pttl, counter)` of the lock `key` (the info script's answer),
    /// for `LOCK.INFO` and an election's leader; `NoQuorum` when fewer than a quorum answered.
    pub(crate) async fn info_rows(&self, db: u32, key: &Bytes) -> Result<Vec<(Option<Bytes>, i64, i64)>, NoQuorum> {
        let answers = self.broadcast(Op::Script(lua::info(db, key))).await;
        let rows: Vec<(Option<Bytes>, i64, i64)> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Array(items)) => match items.as_slice() {
                    [value, Reply::Int(ttl), Reply::Int(n)] => {
                        let value = match value {
                            Reply::Bulk(v) => Some(v.clone()),
                            _ => None,
                        };
                        Some((value, *ttl, *n))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        if rows.len() < self.quorum() {
            return Err(NoQuorum::of(&answers, |r| matches!(r, Reply::Array(_))));
        }
        Ok(rows)
    }

    /// `LOCK.INFO`: the holder a quorum agrees on, the validity a quorum still guarantees
    /// it, and the highest trusted counter.
    pub async fn lock_info(&self, db: u32, key: Bytes) -> Result<LockInfo, NoQuorum> {
        let start = self.clock.now();
        let rows = self.info_rows(db, &key).await?;
        let q = self.quorum();
        let holder = rows
            .iter()
            .filter_map(|(v, _, _)| v.clone())
            .find(|v| rows.iter().filter(|(o, _, _)| o.as_ref() == Some(v)).count() >= q);
        let validity = holder.as_ref().map_or(Duration::ZERO, |holder| {
            let ttls = rows
                .iter()
                .filter(|(v, _, _)| v.as_ref() == Some(holder))
                .filter_map(|(_, ttl, _)| u64::try_from(*ttl).ok());
            quorum_th_largest(ttls.collect(), q)
                .and_then(|ms| self.validity(Duration::from_millis(ms), self.clock.now() - start))
                .unwrap_or(Duration::ZERO)
        });
        let last_token = rows
            .iter()
            .filter_map(|(_, _, n)| u64::try_from(*n).ok())
            .filter(|n| *n > 0)
            .max();
        Ok(LockInfo {
            holder,
            validity,
            last_token,
        })
    }

    /// `LOCK.EXTEND` of a lock: the validity a quorum now guarantees the holder, if it is
    /// positive. The owner-checked extension is `SET key token IFEQ token PX ttl` on each
    /// master. (A read-write lock's hold is extended in its own keys:
    /// [`Engine::extend_held`](crate::recipes::rwlock::engine).)
    pub async fn extend_lock(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration) -> Extension {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let call = ScriptCall::set_ifeq(db, key, token.clone(), token, ttl_ms);
        self.extend(Op::Script(call), |r| (*r == Reply::ok()).then_some(ttl))
            .await
    }

    /// The refusal of a grant with too few trusted counters, saying what it waits for.
    pub(crate) fn unfenced(&self, db: u32, trusted: usize, total: usize) -> Fenced {
        let waits = self.repairs.genesis_waits.lock().unwrap_or_else(|e| e.into_inner());
        Fenced::Unfenced(Unfenced {
            trusted,
            total,
            genesis_waits_for: waits.get(&db).cloned().unwrap_or_default(),
        })
    }

    /// Whether a fenced operation in `db` met a master that could not vouch for its counter
    /// since the last call: the caller should run [`Engine::recover`] in the background.
    pub fn recovery_wanted(&self, db: u32) -> bool {
        let mut wanted = self.repairs.wanted.lock().unwrap_or_else(|e| e.into_inner());
        wanted.remove(&db)
    }

    /// F4 and F5: epochs for the masters of `db` without one, then a repair of every
    /// rejoined master. Each master is repaired at most once a second.
    pub async fn recover(&self, db: u32) {
        for (i, epoch) in self.assign_epochs(db).await {
            let now = self.clock.now();
            {
                let mut last = self.repairs.last.lock().unwrap_or_else(|e| e.into_inner());
                if last.get(&(db, i)).is_some_and(|&at| now < at + REPAIR_INTERVAL) {
                    continue;
                }
                last.insert((db, i), now);
            }
            self.repair(db, i, epoch).await;
        }
    }

    /// F4 cannot start `db`'s counters while `members` are out of sight: said once (and
    /// again when the members change), since every fenced command runs into it.
    fn genesis_waits(&self, db: u32, members: Vec<usize>) {
        let mut waits = self.repairs.genesis_waits.lock().unwrap_or_else(|e| e.into_inner());
        if waits.get(&db) == Some(&members) {
            return;
        }
        tracing::warn!(
            db,
            members = ?members,
            "fencing cannot start in this database: no master that answered has fencing counters yet, and \
             members {members:?} did not answer; a new database's counters start only when every master answers, \
             since one out of sight may hold counters from before (docs/fencing.md, F4). LOCK.ACQUIRE and \
             LOCK.FENCE answer NOQUORUM fencing until they answer; SET NX locks are not affected"
        );
        waits.insert(db, members);
    }

    /// F4: gives every master of `db` without an epoch one: genesis when every master
    /// answered and none has one (a new database), rejoin when some other master has one.
    /// When no master that answered has one but some did not answer, nothing is decided:
    /// a master out of sight may have the epoch. Returns the rejoined masters and their
    /// epochs.
    async fn assign_epochs(&self, db: u32) -> Vec<(usize, Bytes)> {
        // Asked of quarantined masters too (item 8a of the issue: after lifting 2 of 3 new
        // masters, the third, answering but quarantined, kept every fenced command waiting
        // until its quarantine ended): a master that answers says whether it holds an epoch,
        // and one without an epoch holds no counters from before, quarantined or not. A
        // genesis then sets the epochs of the masters that vote; a quarantined one gets a
        // rejoin epoch and its repair (F5) once it votes again.
        let get = Op::Command(
            Request::new(
                db,
                vec![
                    Bytes::from_static(b"GET"),
                    Bytes::from_static(crate::keys::EPOCH_KEY.as_bytes()),
                ],
            )
            .inspecting(),
        );
        let answers = self.broadcast(get).await;
        let mut rejoined: Vec<(usize, Bytes)> = answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Ok(Reply::Bulk(e)) if e.starts_with(b"r ") => Some((i, e.clone())),
                _ => None,
            })
            .collect();
        let missing: Vec<usize> = (0..answers.len())
            .filter(|&i| matches!(answers[i], Ok(Reply::Nil)))
            .collect();
        let have = answers.iter().filter(|a| matches!(a, Ok(Reply::Bulk(_)))).count();
        // Masters that did not say whether they have an epoch (no answer, or an error).
        let out_of_sight: Vec<usize> = (0..answers.len())
            .filter(|&i| !matches!(answers[i], Ok(Reply::Nil | Reply::Bulk(_))))
            .collect();
        if have == 0 && !missing.is_empty() && !out_of_sight.is_empty() {
            self.genesis_waits(db, out_of_sight);
            return rejoined;
        }
        if missing.is_empty() {
            return rejoined;
        }
        // Every master answered and none has an epoch: a new database, or every master lost
        // its data. Counters then start at the Unix time in microseconds, so that even after
        // such a loss new tokens are above the old ones, as long as the clock of the proxy
        // that sees it has not gone back (`docs/fencing.md`, F4).
        let genesis = (have == 0).then(unix_micros);
        let calls = missing.into_iter().filter_map(|i| {
            let backend = self.backends.get(i)?.clone();
            let run_id = backend.run_id()?;
            let call = lua::set_epoch(db, genesis, &run_id);
            let timeout = self.settings.backend_timeout;
            let epoch = Bytes::from(format!("r {run_id}"));
            Some(async move { (i, epoch, super::bounded(timeout, call.run(&backend)).await) })
        });
        let results = futures_util::future::join_all(calls).await;
        if genesis.is_some() {
            self.repairs
                .genesis_waits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&db);
        }
        // Logged by the call that set them: two fenced commands meeting a new database at
        // once both try (`SET NX`), and only one sets each.
        let assigned = results
            .iter()
            .filter(|(_, _, r)| matches!(r, Ok(Reply::Status(_))))
            .count();
        if assigned > 0 {
            tracing::info!(
                db,
                genesis = genesis.is_some(),
                masters = assigned,
                "fencing epochs assigned"
            );
        }
        if genesis.is_none() {
            rejoined.extend(
                results
                    .into_iter()
                    .filter(|(_, _, r)| matches!(r, Ok(Reply::Status(_))))
                    .map(|(i, epoch, _)| (i, epoch)),
            );
        }
        rejoined
    }

    /// F5: copies to the rejoined master `i` (epoch `epoch`) every counter of `db` that a
    /// quorum of the other masters vouches for (their maximum), and, when every other master
    /// answered and every counter could be copied, promotes it to a genesis epoch: it then
    /// vouches for every lock again, including locks not fenced yet.
    async fn repair(&self, db: u32, i: usize, epoch: Bytes) {
        let q = self.quorum();
        let others: Vec<usize> = (0..self.backends.len()).filter(|&j| j != i).collect();
        let scans = futures_util::future::join_all(others.iter().map(|&j| self.scan_counters(db, j))).await;
        let answered = scans.iter().filter(|s| s.is_some()).count();
        if answered < q {
            return;
        }
        let mut keys: Vec<Bytes> = scans.into_iter().flatten().flatten().collect();
        keys.sort_unstable();
        keys.dedup();
        let mut complete = answered == others.len();
        let mut copied = 0;
        for chunk in keys.chunks(REPAIR_CHUNK) {
            let reads = self.broadcast_to(&others, Op::Script(lua::read(db, chunk))).await;
            let values: Vec<(Bytes, u64)> = chunk
                .iter()
                .enumerate()
                .filter_map(|(k, key)| {
                    let vouched: Vec<u64> = reads
                        .iter()
                        .filter_map(|(_, a)| match a {
                            Ok(Reply::Array(items)) => match items.get(k) {
                                Some(Reply::Int(n)) => u64::try_from(*n).ok(),
                                _ => None,
                            },
                            _ => None,
                        })
                        .collect();
                    let max = vouched.iter().copied().max().filter(|_| vouched.len() >= q);
                    Some((key.clone(), max?))
                })
                .collect();
            complete &= values.len() == chunk.len();
            if !self.write_repair(i, lua::repair(db, &epoch, &values, None)).await {
                return;
            }
            copied += values.len();
        }
        let promoted = complete
            && self
                .write_repair(i, lua::repair(db, &epoch, &[], Some(unix_micros())))
                .await;
        tracing::info!(
            db,
            backend = i,
            counters = copied,
            promoted,
            "fencing counters repaired"
        );
    }

    /// Runs a repair script on master `i`; whether it applied (the epoch had not changed).
    async fn write_repair(&self, i: usize, call: crate::lua::ScriptCall) -> bool {
        let Some(backend) = self.backends.get(i) else {
            return false;
        };
        let answer = super::bounded(self.settings.backend_timeout, call.run(backend)).await;
        matches!(answer, Ok(Reply::Int(1)))
    }

    /// Every fencing counter key of `db` on master `j` (a full `SCAN`), or `None` when it did
    /// not answer throughout.
    async fn scan_counters(&self, db: u32, j: usize) -> Option<Vec<Bytes>> {
        let backend = self.backends.get(j)?;
        let pattern = Bytes::from(format!("{}*", crate::keys::COUNTER_PREFIX));
        let mut cursor = Bytes::from_static(b"0");
        let mut keys = Vec::new();
        loop {
            let scan = Request::new(
                db,
                vec![
                    Bytes::from_static(b"SCAN"),
                    cursor,
                    Bytes::from_static(b"MATCH"),
                    pattern.clone(),
                    Bytes::from_static(b"COUNT"),
                    Bytes::from_static(b"1000"),
                ],
            );
            let reply = super::bounded(
                self.settings.backend_timeout,
                crate::backend::call(backend, &scan, None),
            )
            .await;
            let Ok(Reply::Array(mut items)) = reply else {
                return None;
            };
            let (Some(Reply::Array(batch)), Some(Reply::Bulk(next))) = (items.pop(), items.pop()) else {
                return None;
            };
            keys.extend(batch.into_iter().filter_map(|k| match k {
                Reply::Bulk(k) => Some(k),
                _ => None,
            }));
            if next.as_ref() == b"0" {
                return Some(keys);
            }
            cursor = next;
        }
    }
}

/// F3 on every new master connection, before any request: an epoch of an earlier run of the
/// master (restored from a snapshot that may be older than the write-backs it acknowledged) is
/// demoted to a rejoin ([`lua::CHECK_EPOCH`]).
pub struct EpochCheck;

impl crate::backend::redis::Greeting for EpochCheck {
    fn command(&self, run_id: &str) -> Vec<Bytes> {
        vec![
            Bytes::from_static(b"EVAL"),
            Bytes::from_static(lua::CHECK_EPOCH.as_bytes()),
            Bytes::from_static(b"1"),
            Bytes::from_static(crate::keys::EPOCH_KEY.as_bytes()),
            Bytes::copy_from_slice(run_id.as_bytes()),
        ]
    }

    fn accept(&self, reply: Reply, backend: &str, db: u32) -> Result<(), String> {
        match reply {
            Reply::Int(2) => {
                tracing::warn!(
                    backend,
                    db,
                    "fencing counters are from an earlier run of this master: not trusted until rewritten"
                );
                Ok(())
            }
            Reply::Int(_) => Ok(()),
            other => Err(format!("fencing epoch check: unexpected reply {other:?}")),
        }
    }
}

/// How often one master of one database may be repaired.
const REPAIR_INTERVAL: Duration = Duration::from_secs(1);

/// Counters read and written per script call during a repair.
const REPAIR_CHUNK: usize = 256;

/// Microseconds since the Unix epoch, by the wall clock.
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
