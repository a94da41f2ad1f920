//! Reentrant locks (docs/recipes-quorum.md, "Reentrancy: holds as identifiers"): a holder
//! that takes its lock again adds a hold, named by an identifier drawn for that count-up, and
//! each release gives one hold back; the lock is freed where no extra hold is left.
//!
//! Rule 14: nothing here is a count kept per master. A count drifts when masters miss
//! different changes; an identifier added to a quorum stays on every master of that quorum
//! until a release names it, so the lock stays held by a quorum while its holder believes it
//! holds at least one hold (the argument is in the docs).

use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backend;
use crate::clock::Clock;
use crate::lua::ScriptCall;
use crate::quorum::{
    Acquisition, Answer, Attempt, Engine, Extension, Fenced, Lock, NoQuorum, Op, Recoverable, Vote, fenced_vote,
};
use crate::recipes::reentrant::lua;
use crate::reply::Reply;

/// What a reentrant acquisition came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Reentry {
    /// As a fenced acquisition comes to: granted (a first hold, or one more) with the
    /// lock's fencing token, held elsewhere, or undecided.
    Lock(Fenced),
    /// The token held the lock on some masters, but the new hold could not be placed on a
    /// quorum within the validity: not counted up, and undone.
    NotConfirmed {
        /// Masters that took the hold.
        placed: usize,
        /// The quorum.
        quorum: usize,
    },
}

/// A reentrant acquisition ([`lua::REENTER`]): the fenced script where the lock is free, the
/// hold `id` added where the token holds it already.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reentrant {
    /// The identifier drawn for this count-up.
    pub(crate) id: u64,
}

impl Acquisition for Reentrant {
    type Refusal = std::convert::Infallible;

    /// A count-up finds its own token holding the lock.
    fn reenters(&self) -> bool {
        true
    }

    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        Op::Script(lua::reenter(db, key, token.clone(), ttl.as_millis(), self.id))
    }

    /// As the fenced acquisition's, and a count-up where the token held the lock: it holds it
    /// for us now, with its counter as it was (the lock's token, not bumped).
    fn vote(&self, reply: &Reply) -> Option<Vote> {
        match reply {
            Reply::Array(answer) => match answer.as_slice() {
                [Reply::Int(n), Reply::Int(expiry), Reply::Bulk(_)] if *expiry > 0 => Some(Vote::Granted {
                    fence: u64::try_from(*n).ok().filter(|n| *n > 0),
                    expiry: *expiry,
                }),
                _ => fenced_vote(reply),
            },
            Reply::Status(_)
            | Reply::Error(_)
            | Reply::Int(_)
            | Reply::Bulk(_)
            | Reply::Nil
            | Reply::NilArray
            | Reply::Map(_)
            | Reply::Set(_)
            | Reply::Double(_)
            | Reply::Bool(_)
            | Reply::Push(_) => None,
        }
    }

    /// Rule 5a: where the token held the lock already, the hold this count-up added (never
    /// the lock, which an earlier acquisition wrote); elsewhere the lock key it wrote.
    fn undo(&self, (db, key, token): &Lock, answer: &Answer) -> Option<ScriptCall> {
        if reentered(answer) {
            return Some(lua::drop_hold(*db, key, token.clone(), lua::hold_name(self.id)));
        }
        let expiry = self.written(answer)?;
        Some(ScriptCall::undo(*db, key.clone(), token.clone(), expiry))
    }
}

impl Recoverable for Reentry {
    fn unfenced(&self) -> bool {
        matches!(self, Reentry::Lock(fenced) if fenced.unfenced())
    }
}

/// What `LOCK.INFO` tells of a lock's holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holds {
    /// Extra holds of the holder that a quorum of the answering masters keeps (the lock's
    /// own hold not counted).
    pub extra: usize,
}

/// Whether `answer` is a reentrant count-up's "the token held the lock here" (see
/// [`lua::REENTER`]).
pub(crate) fn reentered(answer: &Answer) -> bool {
    matches!(answer, Ok(Reply::Array(parts))
        if matches!(parts.as_slice(), [Reply::Int(_), Reply::Int(_), Reply::Bulk(tag)] if &tag[..] == b"reentered"))
}

/// The extra holds a master reported in a first round of [`lua::GIVE_BACK`], if any.
pub fn reported_holds(answer: &Answer) -> Option<Vec<Bytes>> {
    let Ok(Reply::Array(parts)) = answer else {
        return None;
    };
    let (Reply::Bulk(tag), ids) = parts.split_first()? else {
        return None;
    };
    if &tag[..] != b"holds" {
        return None;
    }
    Some(
        ids.iter()
            .filter_map(|id| match id {
                Reply::Bulk(id) => Some(id.clone()),
                Reply::Status(_)
                | Reply::Error(_)
                | Reply::Int(_)
                | Reply::Nil
                | Reply::NilArray
                | Reply::Array(_)
                | Reply::Map(_)
                | Reply::Set(_)
                | Reply::Double(_)
                | Reply::Bool(_)
                | Reply::Push(_) => None,
            })
            .collect(),
    )
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// `LOCK.ACQUIRE ... REENTRANT`: the lock taken (its first hold), or, where `token`
    /// holds it already, one more hold placed on a quorum. As [`Engine::acquire_fenced`],
    /// masters that cannot vouch for their counters are recovered (F4, F5) after a failure,
    /// and it is tried once more (with the same identifier: the first attempt was undone).
    pub async fn acquire_reentrant(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration) -> Reentry {
        let id = rand::random::<u64>();
        let (key, token) = (&key, &token);
        self.recovering(db, move || self.try_reentrant(db, key, token, ttl, id))
            .await
    }

    async fn try_reentrant(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration, id: u64) -> Reentry {
        let grant = match self.take_fenced(Reentrant { id }, db, key, token, ttl).await {
            Attempt::Granted(grant) => grant,
            Attempt::Refused(never) => match never {},
            Attempt::Failed(fenced) => return Reentry::Lock(fenced),
        };
        let undo = &grant.undo;
        let q = self.quorum();
        let reentered: Vec<usize> = (0..undo.answers.len())
            .filter(|&i| undo.answers[i].as_ref().is_some_and(reentered))
            .collect();
        // No master of this quorum held the lock for the token: a first hold (any quorum
        // meets the one a live hold is on). A quorum that did: the hold is on a quorum, one
        // round trip. Some: the masters where the lock was free hold it now without the new
        // hold, which is placed there before the answer (the repair round).
        let repaired = if reentered.is_empty() || reentered.len() >= q {
            Vec::new()
        } else {
            let others: Vec<usize> = (0..self.backends.len()).filter(|i| !reentered.contains(i)).collect();
            match self.place_hold(db, key, token, id, &others, q - reentered.len()).await {
                Ok(()) => others,
                Err(placed) => {
                    self.undo(undo).await;
                    self.drop_hold_on(db, key, token, id, &others).await;
                    return Reentry::NotConfirmed {
                        placed: reentered.len() + placed,
                        quorum: q,
                    };
                }
            }
        };
        let fenced = self.fenced_grant(db, key, token, ttl, grant).await;
        if !matches!(fenced, Fenced::Yes { .. }) && !repaired.is_empty() {
            self.drop_hold_on(db, key, token, id, &repaired).await;
        }
        Reentry::Lock(fenced)
    }

    /// The repair round of a count-up: hold `id` added on the masters `targets` where the
    /// token holds the lock; `Ok` once `needed` of them did, else how many did.
    async fn place_hold(
        &self,
        db: u32,
        key: &Bytes,
        token: &Bytes,
        id: u64,
        targets: &[usize],
        needed: usize,
    ) -> Result<(), usize> {
        let placed = |answers: &[Option<Answer>]| {
            answers
                .iter()
                .flatten()
                .filter(|a| matches!(a, Ok(Reply::Int(1))))
                .count()
        };
        let op = Op::Script(lua::add_hold(db, key, token.clone(), id));
        let answers: Vec<Option<Answer>> = self
            .gather_from(targets, &op, |answers| placed(answers) >= needed)
            .await
            .into_iter()
            .map(Some)
            .collect();
        let n = placed(&answers);
        if n >= needed { Ok(()) } else { Err(n) }
    }

    /// Rule 5a for a repair round that did not lead to a grant: hold `id` (this count-up's
    /// own identifier) removed from `targets`.
    async fn drop_hold_on(&self, db: u32, key: &Bytes, token: &Bytes, id: u64, targets: &[usize]) {
        let op = Op::Script(lua::drop_hold(db, key, token.clone(), lua::hold_name(id)));
        self.broadcast_to(targets, op).await;
    }

    /// A release's second round: the hold `hold` of `token` removed on every master (rule 6),
    /// never the lock itself. `Ok` once a quorum answered that it is gone there (the hold is
    /// then on no quorum), else how many did.
    pub async fn drop_hold(&self, db: u32, key: &Bytes, token: Bytes, hold: Bytes) -> Result<(), NoQuorum> {
        let q = self.quorum();
        let gone = |answers: &[Option<Answer>]| {
            answers
                .iter()
                .flatten()
                .filter(|a| matches!(a, Ok(Reply::Int(1))))
                .count()
        };
        let op = Op::Script(lua::drop_hold(db, key, token, hold));
        let answers = self.gather(&op, |answers| gone(answers) >= q).await;
        let partial: Vec<Option<Answer>> = answers.iter().cloned().map(Some).collect();
        if gone(&partial) >= q {
            Ok(())
        } else {
            Err(NoQuorum::of(&answers, |r| matches!(r, Reply::Int(1))))
        }
    }

    /// `LOCK.EXTEND` and a session's keepalive with the lock's holds carried along
    /// ([`lua::EXTEND`]): the validity a quorum now guarantees, if positive (rule 7).
    pub async fn extend_with_holds(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration) -> Extension {
        let call = lua::extend(
            db,
            &key,
            token.clone(),
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        );
        let ext = self
            .extend(Op::Script(call), |r| (*r == Reply::ok()).then_some(ttl))
            .await;
        if ext.validity.is_some() {
            self.heal(db, &key, &token, ttl, &ext.answers);
        }
        ext
    }

    /// Rule 17: a long-lived lock heals. Called only after a quorum extended the lock within
    /// its new validity: the holder's keys are then valid on a majority, so nobody else can be
    /// granted the lock, and writing it where it is missing (`SET key token NX PX ttl`) gives
    /// it to nobody new. It goes to every voting master that answered "not held here" (a
    /// master that rejoined after a quarantine or a restart, or one that missed the grant) or
    /// whose answer the extension did not wait for (behind the extension on its connection:
    /// where that extended the lock, `NX` finds it and writes nothing). A master that lacked
    /// the lock holds it again, so a minority failure never takes the lock: at every moment
    /// of its life, not only at its grant. `NX` never overwrites another token's key, and the
    /// TTL keeps rule 8a.
    pub(crate) fn heal(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration, answers: &[Answer]) {
        let lacking = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Ok(Reply::Nil) | Err(crate::backend::BackendError::Pending)))
            .map(|(i, _)| i);
        let ttl_ms = crate::wire::ttl_text(ttl.as_millis());
        let set = [&b"SET"[..], key, token, b"NX", b"PX", &ttl_ms].map(Bytes::copy_from_slice);
        let op = Op::Command(crate::backend::Request::new(db, set.to_vec()));
        // Sent, not awaited (rule 4a): the extension's validity was figured when its quorum
        // answered, and its caller counts it from now; waiting here for a slow or paused
        // master would make that figure late.
        for i in lacking {
            self.send_to(i, op.clone());
        }
    }

    /// The holds of `holder` on `key` for `LOCK.INFO`: the extra holds a quorum of the
    /// answering masters keep.
    pub async fn holds(&self, db: u32, key: &Bytes, holder: &Bytes) -> Result<Holds, NoQuorum> {
        let answers = self.broadcast(Op::Script(lua::holds(db, key))).await;
        let rows: Vec<&[Reply]> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Array(parts)) => Some(parts.as_slice()),
                _ => None,
            })
            .collect();
        let q = self.quorum();
        if rows.len() < q {
            return Err(NoQuorum::of(&answers, |r| matches!(r, Reply::Array(_))));
        }
        let mut ids: Vec<&Bytes> = rows
            .iter()
            .filter(|row| matches!(row.first(), Some(Reply::Bulk(v)) if v == holder))
            .flat_map(|row| row.iter().skip(1))
            .filter_map(|id| match id {
                Reply::Bulk(id) => Some(id),
                Reply::Status(_)
                | Reply::Error(_)
                | Reply::Int(_)
                | Reply::Nil
                | Reply::NilArray
                | Reply::Array(_)
                | Reply::Map(_)
                | Reply::Set(_)
                | Reply::Double(_)
                | Reply::Bool(_)
                | Reply::Push(_) => None,
            })
            .collect();
        ids.sort_unstable();
        let extra = ids.chunk_by(|a, b| a == b).filter(|same| same.len() >= q).count();
        Ok(Holds { extra })
    }
}

/// Which hold a release gives back, from what the first round's masters reported: the one
/// most masters keep (then the highest name), so that, with every master answering, it is a
/// hold a quorum keeps. Any choice is safe (each release removes at most one hold a quorum
/// keeps); this one frees the lock soonest.
pub fn chosen_hold(reports: &[Vec<Bytes>]) -> Option<Bytes> {
    let mut ids: Vec<&Bytes> = reports.iter().flatten().collect();
    ids.sort_unstable();
    ids.chunk_by(|a, b| a == b)
        .max_by(|a, b| a.len().cmp(&b.len()).then(a[0].cmp(b[0])))
        .map(|same| same[0].clone())
}
