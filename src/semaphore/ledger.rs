//! What this proxy believes of its semaphores' slots without asking the masters: which it
//! granted (to which token, valid until when), which the masters' refusals showed held, and
//! where to look first next time.
//!
//! Beliefs only choose the order in which slots are tried and spare a lookup on release:
//! nothing about safety rests on them. A grant is decided by a majority of masters, slot by
//! slot (rule 14); a stale belief costs one refused attempt, or a lookup on the masters.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

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
    /// The slot after the last one granted here.
    hint: Option<u32>,
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

    /// The slot of a `permits`-slot semaphore to try next, none of `tried`: the first not
    /// believed held, from where this proxy last granted (or its seed); when every untried
    /// slot is believed held, the one believed to be free soonest; `None` once all were tried.
    pub fn candidate(&self, db: u32, base: &Bytes, permits: u32, tried: &[u32]) -> Option<u32> {
        let now = Instant::now();
        let inner = self.lock();
        let known = inner.known.get(&(db, base.clone()));
        let start = known.and_then(|k| k.hint).unwrap_or(self.seed) % permits.max(1);
        let held_until = |slot: u32| {
            known
                .and_then(|k| k.slots.get(&slot))
                .map(|b| b.until)
                .filter(|until| *until > now)
        };
        let mut soonest: Option<(Instant, u32)> = None;
        for offset in 0..permits {
            let slot = (start + offset) % permits;
            if tried.contains(&slot) {
                continue;
            }
            match held_until(slot) {
                None => return Some(slot),
                Some(until) if soonest.is_none_or(|(s, _)| until < s) => soonest = Some((until, slot)),
                Some(_) => {}
            }
        }
        soonest.map(|(_, slot)| slot)
    }

    /// Whether `slot` is believed held now.
    pub fn believed_held(&self, db: u32, base: &Bytes, slot: u32) -> bool {
        let now = Instant::now();
        let inner = self.lock();
        inner
            .known
            .get(&(db, base.clone()))
            .and_then(|known| known.slots.get(&slot))
            .is_some_and(|belief| belief.until > now)
    }

    /// This proxy granted `slot` to `token`, valid until `until`: looked for elsewhere next.
    pub fn granted(&self, db: u32, base: &Bytes, slot: u32, token: Bytes, until: Instant) {
        let mut inner = self.lock();
        inner.sweep();
        let known = inner.known.entry((db, base.clone())).or_default();
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
            if known.slots.is_empty() && known.hint.is_none() {
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
            !known.slots.is_empty()
        });
        self.sweep_at = (self.known.len() * 2).max(SWEEP_FLOOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn base(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_candidate_is_the_first_slot_not_believed_held() {
        let ledger = Ledger::new("");
        let b = base("s:");
        let later = Instant::now() + Duration::from_secs(1);
        assert_eq!(ledger.candidate(0, &b, 3, &[]), Some(0));
        ledger.granted(0, &b, 0, base("t0"), later);
        assert_eq!(ledger.candidate(0, &b, 3, &[]), Some(1), "after the last grant");
        ledger.learned(0, &b, [(1, later), (2, later - Duration::from_millis(500))], []);
        assert_eq!(
            ledger.candidate(0, &b, 3, &[]),
            Some(2),
            "all believed held: the one free soonest"
        );
        assert_eq!(ledger.candidate(0, &b, 3, &[0, 1, 2]), None, "all tried");
        ledger.learned(0, &b, [], [1]);
        assert_eq!(ledger.candidate(0, &b, 3, &[]), Some(1), "shown free");
        assert_eq!(ledger.slot_of(0, &b, b"t0"), Some(0));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(ledger.slot_of(0, &b, b"t0"), None, "a belief ends with its validity");
        assert_eq!(ledger.candidate(0, &b, 3, &[1]), Some(2));
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
}
