//! A semaphore's slots on the masters (docs/recipes-quorum.md, "k mutex slots"): taking one
//! slot, exactly as a fenced lock is taken (rules 1–9, F1–F5), and reading what the masters
//! hold of a semaphore: the slot a token holds, and who holds which.
//!
//! Rule 14: a majority bounds one holder, so nothing here decides by counting holders. Each
//! slot is a mutex; the only other thing a master judges is a conflict of pairs (a live slot
//! taken under another count of permits, a token taking a second slot), which two majorities
//! decide as they decide a mutex.

use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backend;
use crate::clock::Clock;
use crate::lua::ScriptCall;
use crate::quorum::{
    Acquisition, Answer, Attempt, Engine, Fenced, NoQuorum, Op, Recoverable, Vote, fenced_vote, quorum_th_largest,
};
use crate::recipes::semaphore::Names;
use crate::recipes::semaphore::lua;
use crate::reply::Reply;

/// What taking one slot came to.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotTaken {
    /// As a lock's fenced acquisition comes to: granted with its slot's fencing token,
    /// not valid in time, or undecided (`NoQuorum`, `Unfenced`).
    Lock(Fenced),
    /// Refused, with what the refusing masters told of the semaphore.
    Refused(Box<Refusal>),
}

/// What the masters' answers to a refused slot told of its semaphore.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// A count of permits other than the one asked for, under which some master holds a
    /// live slot of the semaphore.
    pub permits: Option<u32>,
    /// A slot a quorum of masters holds for the same token. A copy on fewer masters is no
    /// conflict to tell: an earlier attempt of the same token, undone while a master was out
    /// of reach, can leave one until its TTL, and the acquisition is then a refusal (nil), as
    /// it is for a true holder whose slot reached fewer of the answering masters (every master
    /// of its quorum refuses, so no second slot can be granted to it).
    pub holds: Option<u32>,
    /// The masters that reported the token holding each slot (to decide [`Refusal::holds`]).
    holds_seen: Vec<u32>,
    /// The slots some master reported live, each with how many masters did and when it can
    /// be free on a quorum at the latest (`None`: the answers cannot tell).
    pub held: Vec<HeldSlot>,
    /// How many masters reported their live slots.
    pub reporters: usize,
    /// Masters in all, and the quorum.
    masters: (usize, usize),
}

/// A slot reported live by some master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldSlot {
    /// Its index.
    pub slot: u32,
    /// How many masters reported it live.
    pub masters: usize,
    /// When a quorum of masters can have it free, from now.
    pub free_in: Option<Duration>,
}

/// Whether a master's answer to a slot's acquisition is a refusal (see
/// [`super::lua::ACQUIRE_SLOT`]): `{pttl, j, pttl_j, ...}` (odd length, integers),
/// or a conflict, `{'permits', n}` or `{'holds', j}`.
pub(crate) fn refused(answer: &[Reply]) -> bool {
    match answer {
        [Reply::Bulk(what), Reply::Int(_)] => &what[..] == b"permits" || &what[..] == b"holds",
        [Reply::Int(_), rest @ ..] => rest.len() % 2 == 0 && rest.iter().all(|r| matches!(r, Reply::Int(_))),
        _ => false,
    }
}

/// A semaphore slot's fenced acquisition ([`lua::ACQUIRE_SLOT`]): the fenced script on the
/// slot's key, with the semaphore's conflicts checked first, for a semaphore of `permits`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    /// The semaphore's count of permits.
    pub(crate) permits: u32,
}

impl Acquisition for Slot {
    /// Boxed: the rare path of a rarer kind, kept out of every acquisition's future.
    type Refusal = Box<Refusal>;

    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        Op::Script(lua::acquire_slot(db, key, token.clone(), ttl.as_millis(), self.permits))
    }

    /// A slot's refusals are [`refused`]'s; anything else reads as the fenced acquisition's.
    fn vote(&self, reply: &Reply) -> Option<Vote> {
        match reply {
            Reply::Array(answer) if refused(answer) => Some(Vote::Refused),
            reply @ Reply::Status(_)
            | reply @ Reply::Error(_)
            | reply @ Reply::Int(_)
            | reply @ Reply::Bulk(_)
            | reply @ Reply::Nil
            | reply @ Reply::NilArray
            | reply @ Reply::Array(_)
            | reply @ Reply::Map(_)
            | reply @ Reply::Set(_)
            | reply @ Reply::Double(_)
            | reply @ Reply::Bool(_)
            | reply @ Reply::Push(_) => fenced_vote(reply),
        }
    }

    fn refusal(&self, answers: &[Answer], quorum: usize) -> Option<Box<Refusal>> {
        Some(Box::new(Refusal::of(answers, quorum, self.permits)))
    }
}

impl Recoverable for SlotTaken {
    fn unfenced(&self) -> bool {
        matches!(self, SlotTaken::Lock(fenced) if fenced.unfenced())
    }
}

impl Refusal {
    /// Digests the answers to a refused slot of a semaphore of `permits`, decided by a
    /// quorum of `quorum` masters.
    pub(crate) fn of(answers: &[Answer], quorum: usize, permits: u32) -> Refusal {
        let mut refusal = Refusal {
            permits: None,
            holds: None,
            holds_seen: Vec::new(),
            held: Vec::new(),
            reporters: 0,
            masters: (answers.len(), quorum),
        };
        // Per master that reported: its live slots with their PTTLs.
        let mut reports: Vec<Option<Vec<(u32, i64)>>> = Vec::with_capacity(answers.len());
        for answer in answers {
            let report = match answer {
                Ok(Reply::Array(parts)) => refusal.read(parts, permits),
                _ => None,
            };
            reports.push(report);
        }
        refusal.holds = refusal
            .holds_seen
            .iter()
            .copied()
            .find(|slot| refusal.holds_seen.iter().filter(|s| *s == slot).count() >= quorum);
        refusal.reporters = reports.iter().flatten().count();
        let mut slots: Vec<u32> = reports.iter().flatten().flatten().map(|(slot, _)| *slot).collect();
        slots.sort_unstable();
        slots.dedup();
        refusal.held = slots
            .into_iter()
            .map(|slot| held_slot(slot, &reports, quorum))
            .collect();
        refusal
    }

    /// One master's refusal: notes a conflict, and returns its report of live slots.
    fn read(&mut self, parts: &[Reply], permits: u32) -> Option<Vec<(u32, i64)>> {
        match parts {
            [Reply::Bulk(what), Reply::Int(n)] => {
                let n = u32::try_from(*n).ok();
                match &what[..] {
                    b"permits" => self.permits = self.permits.or(n),
                    b"holds" => self.holds_seen.extend(n),
                    _ => {}
                }
                None
            }
            [Reply::Int(_), rest @ ..] if rest.len() % 2 == 0 => Some(
                rest.chunks(2)
                    .filter_map(|pair| match pair {
                        [Reply::Int(slot), Reply::Int(pttl)] => Some((u32::try_from(*slot).ok()?, *pttl)),
                        _ => None,
                    })
                    .filter(|(slot, _)| *slot < permits)
                    .collect(),
            ),
            _ => None,
        }
    }

    /// Whether `slot` can be free on a quorum now, as far as the answers tell: fewer masters
    /// reported it live than would block every quorum.
    pub fn may_be_free(&self, slot: u32) -> bool {
        let (n, q) = self.masters;
        let live = self.held.iter().find(|h| h.slot == slot).map_or(0, |h| h.masters);
        live <= n - q
    }
}

/// `slot`'s entry in a refusal: a master that reported it live holds it for its PTTL, one that
/// reported without it has it free now, one that did not report cannot tell; a quorum has it
/// free at the quorum-th smallest of those times.
fn held_slot(slot: u32, reports: &[Option<Vec<(u32, i64)>>], quorum: usize) -> HeldSlot {
    let mut masters = 0;
    let mut times: Vec<Option<Duration>> = reports
        .iter()
        .map(|report| {
            let report = report.as_ref()?;
            match report.iter().find(|(s, _)| *s == slot) {
                Some((_, pttl)) => {
                    masters += 1;
                    // A PTTL of 0 is still there for up to a millisecond; -1 (no TTL) never
                    // frees by itself.
                    u64::try_from(*pttl).ok().map(|ms| Duration::from_millis(ms.max(1)))
                }
                None => Some(Duration::ZERO),
            }
        })
        .collect();
    times.sort_by_key(|t| t.unwrap_or(Duration::MAX));
    let free_in = quorum.checked_sub(1).and_then(|i| times.get(i).copied().flatten());
    HeldSlot { slot, masters, free_in }
}

/// What `SEM.INFO` reports from the masters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreInfo {
    /// The count of permits a quorum of masters keeps, if any.
    pub permits: Option<u32>,
    /// The slots a quorum holds for one token with validity left.
    pub held: Vec<HeldPermit>,
}

/// A slot a quorum holds for one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPermit {
    pub slot: u32,
    pub token: Bytes,
    /// What a quorum guarantees it from the start of the `SEM.INFO` request (rule 4: the
    /// quorum-th largest PTTL, less the time spent and the drift): a holder counts it from
    /// when it sent the request.
    pub validity: Duration,
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// Takes the semaphore slot `key` (a [`Names::slot`]) for `token`, for a semaphore of
    /// `permits`: the fenced acquisition of a lock (F1–F5, rules 3–5a), whose masters also
    /// refuse a conflict of the semaphore. As [`Engine::acquire_fenced`], masters that cannot
    /// vouch for their counters are recovered (F4, F5) after a failure, and it is tried once
    /// more.
    pub async fn acquire_slot(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration, permits: u32) -> SlotTaken {
        let (key, token) = (&key, &token);
        self.recovering(db, move || async move {
            match self.take_fenced(Slot { permits }, db, key, token, ttl).await {
                Attempt::Granted(grant) => SlotTaken::Lock(self.fenced_grant(db, key, token, ttl, grant).await),
                Attempt::Refused(refusal) => SlotTaken::Refused(refusal),
                Attempt::Failed(fenced) => SlotTaken::Lock(fenced),
            }
        })
        .await
    }

    /// The slots of the semaphore `names` where some master holds `token`, the slot most
    /// masters hold it in first (a token takes one slot at most, so there is one, unless an
    /// attempt left a stray copy); `NoQuorum` when fewer than a quorum answered.
    pub async fn find_slots(&self, db: u32, names: &Names, token: Bytes) -> Result<Vec<u32>, NoQuorum> {
        let args = [names.permits(), names.base().clone(), token];
        let answers = self
            .broadcast(Op::Script(ScriptCall::own(lua::FIND, &lua::FIND_SHA, db, 1, &args)))
            .await;
        let found: Vec<i64> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Int(j)) => Some(*j),
                _ => None,
            })
            .collect();
        if found.len() < self.quorum() {
            return Err(NoQuorum::of(&answers, |r| matches!(r, Reply::Int(_))));
        }
        let mut slots: Vec<(usize, u32)> = Vec::new();
        for slot in found.iter().filter_map(|j| u32::try_from(*j).ok()) {
            match slots.iter_mut().find(|(_, s)| *s == slot) {
                Some((count, _)) => *count += 1,
                None => slots.push((1, slot)),
            }
        }
        slots.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(slots.into_iter().map(|(_, slot)| slot).collect())
    }

    /// `SEM.INFO`: the count a quorum keeps, and the slots a quorum holds for one token with
    /// validity left (rule 4 on the quorum-th largest PTTL, from before the request).
    pub async fn semaphore_info(&self, db: u32, names: &Names) -> Result<SemaphoreInfo, NoQuorum> {
        let start = self.clock.now();
        let args = [names.permits(), names.base().clone()];
        let answers = self
            .broadcast(Op::Script(ScriptCall::own(lua::INFO, &lua::INFO_SHA, db, 1, &args)))
            .await;
        let q = self.quorum();
        let rows: Vec<InfoRow> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Array(parts)) => InfoRow::read(parts),
                _ => None,
            })
            .collect();
        if rows.len() < q {
            return Err(NoQuorum::of(&answers, |r| matches!(r, Reply::Array(_))));
        }
        let permits = rows
            .iter()
            .map(|row| row.permits)
            .find(|k| *k > 0 && rows.iter().filter(|row| row.permits == *k).count() >= q)
            .and_then(|k| u32::try_from(k).ok());
        let elapsed = self.clock.now() - start;
        let held = (0..permits.unwrap_or(0))
            .filter_map(|slot| {
                let copies: Vec<&LiveSlot> = rows
                    .iter()
                    .flat_map(|row| row.live.iter())
                    .filter(|live| live.slot == i64::from(slot))
                    .collect();
                copies.iter().find_map(|copy| {
                    let ttls = copies
                        .iter()
                        .filter(|other| other.holder == copy.holder)
                        .filter_map(|other| u64::try_from(other.pttl).ok());
                    let validity = quorum_th_largest(ttls.collect(), q)
                        .and_then(|ms| self.validity(Duration::from_millis(ms), elapsed))?;
                    Some(HeldPermit {
                        slot,
                        token: copy.holder.clone(),
                        validity,
                    })
                })
            })
            .collect();
        Ok(SemaphoreInfo { permits, held })
    }
}

/// One master's answer to [`INFO`].
struct InfoRow {
    /// Its count of permits (-1: none).
    permits: i64,
    /// Its live slots.
    live: Vec<LiveSlot>,
}

/// A slot live on one master.
struct LiveSlot {
    slot: i64,
    holder: Bytes,
    pttl: i64,
}

impl InfoRow {
    fn read(parts: &[Reply]) -> Option<InfoRow> {
        let (Reply::Int(permits), rest) = parts.split_first()? else {
            return None;
        };
        let live = rest
            .chunks(3)
            .filter_map(|row| match row {
                [Reply::Int(slot), Reply::Bulk(holder), Reply::Int(pttl)] => Some(LiveSlot {
                    slot: *slot,
                    holder: holder.clone(),
                    pttl: *pttl,
                }),
                _ => None,
            })
            .collect();
        Some(InfoRow {
            permits: *permits,
            live,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;

    fn ints(values: &[i64]) -> Answer {
        Ok(Reply::Array(values.iter().map(|v| Reply::Int(*v)).collect()))
    }

    #[test]
    fn refusals_are_told_from_grants_and_clock_readings() {
        let slot = Slot { permits: 3 };
        let vote = |values: &[i64]| slot.vote(&ints(values).unwrap());
        assert_eq!(vote(&[120]), Some(crate::quorum::Vote::Refused));
        assert_eq!(vote(&[120, 0, 120, 2, 40]), Some(crate::quorum::Vote::Refused));
        assert!(matches!(
            vote(&[7, 1_700_000_000_000]),
            Some(crate::quorum::Vote::Granted { .. })
        ));
        let conflict = Reply::Array(vec![Reply::bulk("permits"), Reply::Int(2)]);
        assert_eq!(slot.vote(&conflict), Some(crate::quorum::Vote::Refused));
        // A refusal's report is never two elements: `split_time` would read `{j, pttl}` as a
        // clock reading.
        assert_eq!(
            crate::backend::split_time(ints(&[120, 0, 120]).unwrap()).1,
            None,
            "a report is not a clock reading"
        );
    }

    /// The scripts themselves, on in-process masters (the embedded master's Lua): slots up
    /// to the count, the semaphore's conflicts, and what the masters are asked of it.
    #[tokio::test]
    async fn slots_their_conflicts_and_what_the_masters_tell() {
        use crate::backend::embedded::EmbeddedBackend;
        use crate::clock::TokioClock;
        use std::sync::Arc;
        let masters = (0..3)
            .map(|i| EmbeddedBackend::new(format!("m{i}"), Arc::new(TokioClock::new())))
            .collect();
        let settings = crate::quorum::Settings {
            backend_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
        };
        let engine = Engine::new(masters, TokioClock::new(), settings);
        let names = Names::of(b"sem");
        let ttl = Duration::from_secs(10);
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let take =
            |slot: u32, token: &str, permits: u32| engine.acquire_slot(0, names.slot(slot), b(token), ttl, permits);
        let granted = |t: &SlotTaken| match t {
            SlotTaken::Lock(Fenced::Yes { token, .. }) => Some(*token),
            _ => None,
        };
        let refusal = |t: SlotTaken| match t {
            SlotTaken::Refused(r) => r,
            other => panic!("not refused: {other:?}"),
        };
        let first = granted(&take(0, "a", 2).await).expect("slot 0");
        assert!(granted(&take(1, "b", 2).await).is_some(), "slot 1");
        let held = refusal(take(0, "c", 2).await);
        assert_eq!((held.permits, held.holds, held.reporters), (None, None, 3));
        assert!(
            !held.may_be_free(0) && !held.may_be_free(1),
            "both slots live everywhere"
        );
        assert_eq!(refusal(take(1, "a", 2).await).holds, Some(0), "a token holds one slot");
        assert_eq!(refusal(take(2, "d", 3).await).permits, Some(2), "the count is fixed");
        assert_eq!(engine.find_slots(0, &names, b("b")).await, Ok(vec![1]));
        assert_eq!(engine.find_slots(0, &names, b("z")).await, Ok(vec![]));
        let info = engine.semaphore_info(0, &names).await.expect("quorum");
        let held = |info: &SemaphoreInfo| -> Vec<(u32, Bytes)> {
            info.held.iter().map(|h| (h.slot, h.token.clone())).collect()
        };
        assert_eq!((info.permits, held(&info)), (Some(2), vec![(0, b("a")), (1, b("b"))]));
        assert!(info.held.iter().all(|h| h.validity > Duration::ZERO), "{info:?}");
        // Once no slot is live, another count may be taken.
        for (slot, token) in [(0, "a"), (1, "b")] {
            let released = engine.release(0, names.slot(slot), b(token)).await;
            assert!(released.iter().all(|r| *r == Ok(Reply::Int(1))), "{released:?}");
        }
        let again = granted(&take(0, "e", 3).await).expect("slot 0 under a new count");
        assert!(again > first, "the slot's fencing token rises: {again} > {first}");
        let info = engine.semaphore_info(0, &names).await.expect("quorum");
        assert_eq!((info.permits, held(&info)), (Some(3), vec![(0, b("e"))]));
    }

    #[test]
    fn a_refusal_tells_which_slots_can_be_free_and_when() {
        // Five masters, quorum 3, a semaphore of 3: slot 0 live on 4 masters, slot 1 on one,
        // slot 2 on none that reported; one master did not answer.
        let answers = vec![
            ints(&[300, 0, 300, 1, 50]),
            ints(&[200, 0, 200]),
            ints(&[250, 0, 250]),
            ints(&[100, 0, 100]),
            Err(BackendError::Timeout),
        ];
        let refusal = Refusal::of(&answers, 3, 3);
        assert_eq!(refusal.reporters, 4);
        assert_eq!(refusal.permits, None);
        assert!(!refusal.may_be_free(0), "live on 4 of 5: no quorum is free");
        assert!(refusal.may_be_free(1) && refusal.may_be_free(2));
        let zero = refusal.held.iter().find(|h| h.slot == 0).unwrap();
        assert_eq!(
            zero.free_in,
            Some(Duration::from_millis(250)),
            "the third smallest of 100, 200, 250, 300"
        );
        let one = refusal.held.iter().find(|h| h.slot == 1).unwrap();
        assert_eq!((one.masters, one.free_in), (1, Some(Duration::ZERO)));
        let conflict = vec![
            Ok(Reply::Array(vec![Reply::bulk("permits"), Reply::Int(2)])),
            Ok(Reply::Array(vec![Reply::bulk("holds"), Reply::Int(1)])),
            ints(&[10, 5, 10]),
        ];
        let refusal = Refusal::of(&conflict, 2, 3);
        assert_eq!((refusal.permits, refusal.holds), (Some(2), None));
        assert!(refusal.held.is_empty(), "a slot beyond the count asked for is ignored");
        let holds = |j: i64| Ok(Reply::Array(vec![Reply::bulk("holds"), Reply::Int(j)]));
        let stale = [holds(1), ints(&[10]), ints(&[10])];
        assert_eq!(
            Refusal::of(&stale, 2, 3).holds,
            None,
            "one master's copy (a stale attempt's) is a refusal, not an error"
        );
        let held = [holds(1), holds(1), ints(&[10])];
        assert_eq!(Refusal::of(&held, 2, 3).holds, Some(1), "a quorum's is told");
    }
}
