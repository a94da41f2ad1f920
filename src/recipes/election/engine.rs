//! Reading an election's leader from a quorum (`ELECT.LEADER`, `ELECT.OBSERVE`).
//!
//! The leader is the holder of the election's lock, its term the fencing token its grant was
//! answered with. Where a master holds the leader's entry, its counter moved only with that
//! grant: a bump (F1, atomic with taking the lock there) and the grant's write-back (F2, only
//! where the caller holds it); nothing moves it since (another attempt bumps only where the
//! lock is free, and no client can name the reserved key to fence it). By F2, before the
//! token was answered a quorum of the masters holding the grant had their counters at the
//! token. So the term is the counter that a quorum of the holder's masters show. The other
//! masters holding it may show anything: a master whose write landed after the grant was
//! decided (it was paused) bumped its own counter, which attempts refused elsewhere may have
//! raised past the term while the lock was free there; a lock healed onto a master (rule 17)
//! keeps that master's counter. Such a counter neither vetoes nor sets the term.
//!
//! Why the named term is safe:
//! - one value at most: two values each shown by a quorum of the masters would need two
//!   disjoint quorums of N;
//! - it is above every term answered before the grant and below every term after: the quorum
//!   showing it intersects the quorum that vouched for any earlier token (F2), whose counter
//!   its bump then passed, and any later token comes from a quorum of bumps that intersects it,
//!   each bump above it (`docs/fencing.md`, "Why tokens increase"). So no two leaderships share
//!   a term and terms never go back;
//! - once the grant is answered (and for as long as a quorum holds it) it is the answered
//!   token: a quorum shows exactly that (F2), and nothing changes a holder's counter.
//!
//! Before the answer it is the answered token too, except in one case: when the grant's first
//! quorum of bumps disagreed, its token (their largest) is written back (F2), and until the
//! write-back lands a quorum of the holder's masters can show one lower value (those bumps and
//! masters whose write landed after them agreeing on it). The leader is then named, for that
//! round trip, with a term above every earlier term and below every later one, but not the one
//! its campaign is answered. A holder whose masters show no counter in a quorum (a grant still
//! in its write-back, or being undone, or masters lost) is no leader: the read answers none.

use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backend;
use crate::clock::Clock;
use crate::quorum::{Engine, NoQuorum, drift, quorum_th_largest};

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
/// term (the trusted counter a quorum of its masters show: see the module's comment), and the
/// quorum-th largest of their PTTLs.
fn decide(rows: &[(Option<Bytes>, i64, i64)], q: usize) -> Option<(Bytes, u64, u64)> {
    let holder = rows
        .iter()
        .filter_map(|(v, _, _)| v.as_ref())
        .find(|v| rows.iter().filter(|(o, _, _)| o.as_ref() == Some(*v)).count() >= q)?;
    let holding: Vec<(u64, Option<u64>)> = rows
        .iter()
        .filter(|(v, _, _)| v.as_ref() == Some(holder))
        .map(|(_, ttl, n)| {
            (
                u64::try_from(*ttl).unwrap_or(0),
                u64::try_from(*n).ok().filter(|n| *n > 0),
            )
        })
        .collect();
    // A counter above the term (a late write's own bump, a healed master's) does not veto it,
    // and an untrusted one vouches for nothing.
    let term = holding
        .iter()
        .filter_map(|(_, n)| *n)
        .find(|t| holding.iter().filter(|(_, n)| *n == Some(*t)).count() >= q)?;
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

    /// Issue 36, item 9, with its counters: N granted on masters 0-3 at ...852 while master 4
    /// was paused; N's write landed on master 4 when it resumed, and bumped its counter (which
    /// two refused rivals had raised while the lock was free there) to ...853. N is held on all
    /// five and four vouch for ...852: N leads in that term (the highest counter, vouched by one
    /// master, named nobody for N's whole term).
    #[test]
    fn a_holders_higher_counter_does_not_veto_the_term_a_quorum_shows() {
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let t: i64 = 1_795_329_818_922_852;
        let term = t as u64;
        let mut rows = vec![row(Some("N"), 29_000, t); 4];
        rows.push(row(Some("N"), 29_900, t + 1));
        assert_eq!(decide(&rows, 3), Some((b("N"), term, 29_000)));
        // On exactly a quorum, a fourth holder higher still, the fifth free.
        let rows = [
            row(Some("N"), 900, t),
            row(Some("N"), 800, t),
            row(Some("N"), 700, t),
            row(Some("N"), 950, t + 3),
            row(None, -2, t + 1),
        ];
        assert_eq!(decide(&rows, 3), Some((b("N"), term, 800)));
        // A healed master (rule 17) lagging below the term, and an untrusted one: no matter.
        let rows = [
            row(Some("N"), 900, t),
            row(Some("N"), 900, t),
            row(Some("N"), 900, t),
            row(Some("N"), 900, t - 40),
            row(Some("N"), 900, -2),
        ];
        assert_eq!(decide(&rows, 3), Some((b("N"), term, 900)));
        // A write-back under way, the holders split two and two: nobody yet.
        let rows = [
            row(Some("N"), 900, t),
            row(Some("N"), 900, t),
            row(Some("N"), 900, t + 1),
            row(Some("N"), 900, t + 1),
            row(None, -2, t),
        ];
        assert_eq!(decide(&rows, 3), None);
        // A quorum of holders, but only two vouch for any one counter: nobody.
        let rows = [
            row(Some("N"), 900, t),
            row(Some("N"), 900, t),
            row(Some("N"), 900, -2),
            row(None, -2, t),
            row(None, -2, t),
        ];
        assert_eq!(decide(&rows, 3), None);
    }
}
