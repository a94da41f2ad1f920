//! What this proxy believes of its semaphores' slots without asking the masters: which it
//! granted (to which token, valid until when), which the masters' refusals showed held, which
//! an acquisition through this proxy is trying now, and where to look first next time.
//!
//! Beliefs only choose the order in which slots are tried and spare a lookup on release:
//! nothing about safety rests on them. A grant is decided by a majority of masters, slot by
//! slot (rule 14); a stale belief costs one refused attempt, or a lookup on the masters.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// Beliefs per semaphore (database, base name), bounded by expiry: every belief ends at a
/// known instant, and semaphores left with none are swept.
pub struct Ledger {
    inner: Mutex<Inner>,
    /// Where this proxy starts looking in a semaphore it has not granted from yet: derived
    /// from its run id, so that proxies sharing a semaphore start at different slots.
    seed: u32,
}

struct Inner {
    known: HashMap<(u32, Bytes), Known>,
    /// Sweep the expired beliefs once this many semaphores are known.
    sweep_at: usize,
}

#[derive(Default)]
struct Known {
    slots: HashMap<u32, Belief>,
    /// Slots an acquisition through this proxy is trying, until when at the latest: others
    /// through this proxy try other slots rather than race it for the same one.
    claims: HashMap<u32, Instant>,
    /// The slot after the last one granted here.
    hint: Option<u32>,
}

impl Known {
    /// Until when `slot` is believed held or claimed, if it is now.
    fn busy_until(&self, slot: u32, now: Instant) -> Option<Instant> {
        let held = self.slots.get(&slot).map(|b| b.until);
        let claimed = self.claims.get(&slot).copied();
        held.max(claimed).filter(|until| *until > now)
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.claims.is_empty() && self.hint.is_none()
    }
}

/// A slot believed held.
struct Belief {
    until: Instant,
    /// The holder's token, for a grant made here.
    token: Option<Bytes>,
}

/// The fewest semaphores known before a sweep.
const SWEEP_FLOOR: usize = 1024;

impl Ledger {
    /// An empty ledger for the proxy with run id `run_id`.
    pub fn new(run_id: &str) -> Ledger {
        let seed = run_id
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        Ledger {
            inner: Mutex::new(Inner {
                known: HashMap::new(),
                sweep_at: SWEEP_FLOOR,
            }),
            seed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Each critical section leaves the maps consistent before anything can panic.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When every slot of a `permits`-slot semaphore is believed held (or claimed), how long
    /// until the first of them can be free; `None` when some slot may be free now. After a
    /// grant, the next waiter then waits for a release or that time instead of asking the
    /// masters at once: one quorum round per hand-off, as for a lock.
    pub fn all_busy_for(&self, db: u32, base: &Bytes, permits: u32) -> Option<Duration> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.sweep();
        let known = inner.known.get(&(db, base.clone()))?;
        let soonest = (0..permits)
            .map(|slot| known.busy_until(slot, now))
            .try_fold(None::<Instant>, |soonest, until| {
                until.map(|until| Some(soonest.map_or(until, |s| s.min(until))))
            })??;
        Some(soonest - now)
    }

    /// The slot of a `permits`-slot semaphore to try next, none of `tried`, claimed for
    /// `claim` (until [`Ledger::unclaim`]): the first neither believed held nor claimed, from
    /// where this proxy last granted (or its seed). When every untried slot is busy: with
    /// `any`, the one believed to be free soonest (a first attempt asks the masters whatever
    /// this proxy believes), else `None`; `None` once all were tried.
    pub fn candidate(
        &self,
        db: u32,
        base: &Bytes,
        permits: u32,
        tried: &[u32],
        any: bool,
        claim: Duration,
    ) -> Option<u32> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.sweep();
        let known = inner.known.entry((db, base.clone())).or_default();
        let start = known.hint.unwrap_or(self.seed) % permits.max(1);
        let mut soonest: Option<(Instant, u32)> = None;
        let mut free = None;
        for offset in 0..permits {
            let slot = (start + offset) % permits;
            if tried.contains(&slot) {
                continue;
            }
            match known.busy_until(slot, now) {
                None => {
                    free = Some(slot);
                    break;
                }
                Some(until) if soonest.is_none_or(|(s, _)| until < s) => soonest = Some((until, slot)),
                Some(_) => {}
            }
        }
        let slot = free.or_else(|| soonest.filter(|_| any).map(|(_, slot)| slot))?;
        let until = now + claim;
        let claimed = known.claims.entry(slot).or_insert(until);
        *claimed = (*claimed).max(until);
        Some(slot)
    }

    /// The attempt on `slot` is over (whatever came of it): no longer claimed.
    pub fn unclaim(&self, db: u32, base: &Bytes, slot: u32) {
        let mut inner = self.lock();
        if let Some(known) = inner.known.get_mut(&(db, base.clone())) {
            known.claims.remove(&slot);
        }
    }

    /// This proxy granted `slot` to `token`, valid until `until` (its attempt is over: no
    /// longer claimed): looked for elsewhere next.
    pub fn granted(&self, db: u32, base: &Bytes, slot: u32, token: Bytes, until: Instant) {
        let mut inner = self.lock();
        inner.sweep();
        let known = inner.known.entry((db, base.clone())).or_default();
        known.claims.remove(&slot);
        known.hint = Some(slot.wrapping_add(1));
        known.slots.insert(
            slot,
            Belief {
                until,
                token: Some(token),
            },
        );
    }

    /// What the masters' answers to a refused attempt showed: `held` slots, each until when,
    /// and slots that may be `free` on a quorum (beliefs about them are dropped).
    pub fn learned(
        &self,
        db: u32,
        base: &Bytes,
        held: impl IntoIterator<Item = (u32, Instant)>,
        free: impl IntoIterator<Item = u32>,
    ) {
        let mut inner = self.lock();
        inner.sweep();
        let known = inner.known.entry((db, base.clone())).or_default();
        for slot in free {
            known.slots.remove(&slot);
        }
        for (slot, until) in held {
            let belief = known.slots.entry(slot).or_insert(Belief { until, token: None });
            belief.until = until;
        }
    }

    /// The slot this proxy granted to `token`, while that grant is believed valid.
    pub fn slot_of(&self, db: u32, base: &Bytes, token: &[u8]) -> Option<u32> {
        let now = Instant::now();
        let inner = self.lock();
        let known = inner.known.get(&(db, base.clone()))?;
        known
            .slots
            .iter()
            .find(|(_, b)| b.until > now && b.token.as_deref() == Some(token))
            .map(|(slot, _)| *slot)
    }

    /// `slot`'s grant to `token` was extended: believed until `until`.
    pub fn extended(&self, db: u32, base: &Bytes, slot: u32, token: &Bytes, until: Instant) {
        let mut inner = self.lock();
        let known = inner.known.entry((db, base.clone())).or_default();
        known.slots.insert(
            slot,
            Belief {
                until,
                token: Some(token.clone()),
            },
        );
    }

    /// `slot` was released (here, or as another proxy announced): believed free.
    pub fn released(&self, db: u32, base: &Bytes, slot: u32) {
        let mut inner = self.lock();
        let id = (db, base.clone());
        if let Some(known) = inner.known.get_mut(&id) {
            known.slots.remove(&slot);
            if known.is_empty() {
                inner.known.remove(&id);
            }
        }
    }

    /// How many semaphores this proxy holds beliefs about (for tests of the bound).
    pub fn len(&self) -> usize {
        self.lock().known.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Forgets expired beliefs, and semaphores left with none, once enough are known:
    /// amortised over the insertions that grew the map.
    fn sweep(&mut self) {
        if self.known.len() < self.sweep_at {
            return;
        }
        let now = Instant::now();
        self.known.retain(|_, known| {
            known.slots.retain(|_, b| b.until > now);
            known.claims.retain(|_, until| *until > now);
            !known.slots.is_empty() || !known.claims.is_empty()
        });
        self.sweep_at = (self.known.len() * 2).max(SWEEP_FLOOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_candidate_is_the_first_slot_neither_held_nor_tried_now() {
        let ledger = Ledger::new("");
        let b = base("s:");
        let later = Instant::now() + Duration::from_secs(1);
        let claim = Duration::from_millis(50);
        let next = |tried: &[u32], any: bool| ledger.candidate(0, &b, 3, tried, any, claim);
        assert_eq!(next(&[], true), Some(0));
        assert_eq!(next(&[], true), Some(1), "slot 0 is being tried: another slot");
        ledger.unclaim(0, &b, 1);
        ledger.granted(0, &b, 0, base("t0"), later);
        ledger.unclaim(0, &b, 0);
        assert_eq!(next(&[], true), Some(1), "after the last grant");
        ledger.unclaim(0, &b, 1);
        ledger.learned(0, &b, [(1, later), (2, later - Duration::from_millis(500))], []);
        assert_eq!(next(&[], false), None, "all believed held, after a refusal");
        assert_eq!(next(&[], true), Some(2), "all believed held: the one free soonest");
        ledger.unclaim(0, &b, 2);
        assert_eq!(next(&[0, 1, 2], true), None, "all tried");
        ledger.learned(0, &b, [], [1]);
        assert_eq!(next(&[], false), Some(1), "shown free");
        ledger.unclaim(0, &b, 1);
        assert_eq!(ledger.slot_of(0, &b, b"t0"), Some(0));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(ledger.slot_of(0, &b, b"t0"), None, "a belief ends with its validity");
        assert_eq!(next(&[1], false), Some(2));
        assert_eq!(
            next(&[1], false),
            Some(0),
            "a claim ends by itself too, for a lost attempt"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn beliefs_are_bounded_by_their_expiry() {
        let ledger = Ledger::new("seed");
        let soon = Instant::now() + Duration::from_millis(10);
        for i in 0..SWEEP_FLOOR {
            ledger.granted(0, &base(&format!("s{i}:")), 0, base("t"), soon);
        }
        tokio::time::advance(Duration::from_millis(20)).await;
        ledger.granted(0, &base("last:"), 0, base("t"), soon + Duration::from_secs(1));
        assert_eq!(ledger.len(), 1, "the expired were swept");
        ledger.released(0, &base("last:"), 0);
        ledger.released(0, &base("never:"), 0);
        assert_eq!(ledger.len(), 1, "a semaphore granted from keeps its hint");
    }

    #[tokio::test(start_paused = true)]
    async fn all_busy_only_when_every_slot_is_believed_held() {
        let ledger = Ledger::new("seed");
        let b = base("s:");
        let now = Instant::now();
        assert_eq!(ledger.all_busy_for(0, &b, 2), None, "nothing known: may be free");
        ledger.granted(0, &b, 0, base("t0"), now + Duration::from_millis(300));
        assert_eq!(ledger.all_busy_for(0, &b, 2), None, "slot 1 may be free");
        ledger.granted(0, &b, 1, base("t1"), now + Duration::from_millis(100));
        assert_eq!(
            ledger.all_busy_for(0, &b, 2),
            Some(Duration::from_millis(100)),
            "the soonest belief"
        );
        ledger.released(0, &b, 1);
        assert_eq!(ledger.all_busy_for(0, &b, 2), None, "a release frees it");
        ledger.granted(0, &b, 1, base("t1"), now + Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(ledger.all_busy_for(0, &b, 2), None, "a belief ends with its validity");
    }
}
