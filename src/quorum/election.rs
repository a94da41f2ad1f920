//! Reading an election's leader from a quorum (`ELECT.LEADER`, `ELECT.OBSERVE`).
//!
//! The leader is the holder of the election's lock, its term the fencing token its grant was
//! answered with. By F2 (`docs/fencing.md`), before that token was answered a quorum of the
//! masters holding the grant had raised their counters to it; no master holding the leader's
//! entry has a higher counter (a refused attempt bumps nothing where the lock is held, and no
//! client can name the reserved key to fence it). So a holder a quorum agrees on, with a
//! quorum of those masters agreeing on the highest trusted counter among them, is a leader
//! whose grant was decided, and that counter is its term. A holder without such a quorum of
//! counters (a grant still in its write-back, or one being undone) is no leader yet: the read
//! answers none, never a term that was not the grant's.

use std::time::Duration;

use bytes::Bytes;

use super::{Engine, NoQuorum, drift, quorum_th_largest};
use crate::backend::Backend;
use crate::clock::Clock;

/// A leader as a quorum holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's value (its lock token).
    pub value: Bytes,
    /// Its term: the fencing token of its grant.
    pub term: u64,
    /// From the read's start, when fewer than a quorum of masters can still hold its entry
    /// unless it is extended (the quorum-th largest PTTL plus the clock drift allowance): when
    /// to look again for a leader whose keepalive stopped without a release (its proxy died).
    pub recheck_in: Duration,
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// The leader of the election whose lock is `key`, if a quorum holds one whose term a
    /// quorum vouches for; `NoQuorum` when fewer than a quorum answered.
    pub async fn leader(&self, db: u32, key: Bytes) -> Result<Option<Leader>, NoQuorum> {
        let rows = self.info_rows(db, &key).await?;
        let q = self.quorum();
        Ok(decide(&rows, q).map(|(value, term, pttl)| {
            let pttl = Duration::from_millis(pttl);
            Leader {
                value,
                term,
                recheck_in: pttl + drift(pttl, self.settings.drift_factor),
            }
        }))
    }
}

/// From each master's `(holder, pttl, trusted counter)`: the holder a quorum agrees on, the
/// term a quorum of its masters vouches for, and the quorum-th largest of their PTTLs.
fn decide(rows: &[(Option<Bytes>, i64, i64)], q: usize) -> Option<(Bytes, u64, u64)> {
    let holder = rows
        .iter()
        .filter_map(|(v, _, _)| v.as_ref())
        .find(|v| rows.iter().filter(|(o, _, _)| o.as_ref() == Some(*v)).count() >= q)?;
    let holding: Vec<(u64, i64)> = rows
        .iter()
        .filter(|(v, _, _)| v.as_ref() == Some(holder))
        .map(|(_, ttl, n)| (u64::try_from(*ttl).unwrap_or(0), *n))
        .collect();
    let term = holding.iter().filter_map(|(_, n)| u64::try_from(*n).ok()).max()?;
    let vouched = holding
        .iter()
        .filter(|(_, n)| u64::try_from(*n).ok() == Some(term))
        .count();
    if term == 0 || vouched < q {
        return None;
    }
    let pttl = quorum_th_largest(holding.iter().map(|(ttl, _)| *ttl).collect(), q)?;
    Some((holder.clone(), term, pttl.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(v: Option<&str>, ttl: i64, n: i64) -> (Option<Bytes>, i64, i64) {
        (v.map(|v| Bytes::copy_from_slice(v.as_bytes())), ttl, n)
    }

    #[test]
    fn a_leader_needs_a_quorum_of_holders_and_of_counters_at_its_term() {
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        // Agreed: the term is the counter a quorum of holders has.
        let rows = [row(Some("a"), 900, 7), row(Some("a"), 800, 7), row(None, -2, 8)];
        assert_eq!(decide(&rows, 2), Some((b("a"), 7, 800)));
        // A grant still in its write-back: counters 6 and 7 on the holders, no term vouched.
        let rows = [row(Some("a"), 900, 6), row(Some("a"), 900, 7), row(None, -2, 5)];
        assert_eq!(decide(&rows, 2), None);
        // Two holders on a minority each: no leader.
        let rows = [row(Some("a"), 900, 7), row(Some("b"), 900, 8), row(None, -2, 5)];
        assert_eq!(decide(&rows, 2), None);
        // Untrusted counters do not vouch.
        let rows = [row(Some("a"), 900, -2), row(Some("a"), 900, 7), row(Some("a"), 900, -2)];
        assert_eq!(decide(&rows, 2), None);
        // A counter bumped by a refused attempt elsewhere does not count: only holders'.
        let rows = [row(Some("a"), 900, 7), row(Some("a"), 900, 7), row(None, -2, 9)];
        assert_eq!(decide(&rows, 2), Some((b("a"), 7, 900)));
    }
}
