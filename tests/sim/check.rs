//! The checker: the grants clients believed they held, and the sweeps that find two of them
//! on the same key at the same time (property 1, mutual exclusion within validity; for
//! read-write locks, a writer's grant overlapping any other).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One grant, as the client that got it sees it: it holds `key` from the moment the reply
/// reached it (`from`) until its validity ends or it starts releasing (`until`). Times are
/// on the simulated monotonic clock, from the start of the run.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The lock.
    pub key: String,
    /// The acquisition's unique token.
    pub token: String,
    /// The proxy (engine) that granted it.
    pub proxy: usize,
    /// When the client learnt it holds the lock.
    pub from: Duration,
    /// When it stops holding it: reply time + validity, or the start of its release.
    pub until: Duration,
}

/// The kind of a grant: which grants of the same key it excludes ([`History::grant`] records a
/// lock's, [`History::hold`] a read-write lock's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// A lock (a semaphore's slot, a key of a set, an election's leadership): no other grant
    /// of the key ([`History::overlaps`]).
    #[default]
    Exclusive,
    /// A read hold: overlaps other readers, never a writer ([`History::rw_overlaps`]).
    Read,
    /// A write hold: no other grant of the lock, read or write.
    Write,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by {} via proxy {} during [{:.3}s, {:.3}s)",
            self.key,
            self.token,
            self.proxy,
            self.from.as_secs_f64(),
            self.until.as_secs_f64()
        )
    }
}

/// A fencing token handed out: for `key`, asked for at `sent`, answered at `answered`.
#[derive(Clone, Debug)]
pub struct Fence {
    /// The lock.
    pub key: String,
    /// The token.
    pub token: u64,
    /// Who got it.
    pub holder: String,
    /// When the acquisition was sent.
    pub sent: Duration,
    /// When its answer reached the client.
    pub answered: Duration,
}

/// Every grant of a run.
#[derive(Debug, Default)]
pub struct History {
    grants: Vec<Grant>,
    /// Each grant's kind, by id.
    kinds: Vec<Kind>,
    fences: Vec<Fence>,
}

impl History {
    /// Records a grant; returns its id, for [`History::end`].
    pub fn grant(&mut self, grant: Grant) -> usize {
        self.hold(grant, Kind::Exclusive)
    }

    /// Records a grant of `kind`; returns its id, for [`History::end`].
    pub fn hold(&mut self, grant: Grant, kind: Kind) -> usize {
        self.grants.push(grant);
        self.kinds.push(kind);
        self.grants.len() - 1
    }

    /// The grants of `kind` (or of any other kind, `!same`) that hold at some instant.
    fn of_kind(&self, same: bool, kind: Kind) -> impl Iterator<Item = (&Grant, Kind)> {
        self.grants
            .iter()
            .zip(self.kinds.iter().copied())
            .filter(move |(g, k)| (*k == kind) == same && g.from < g.until)
    }

    /// The holder of grant `id` gives the lock up at `at` (it starts releasing it): it no
    /// longer believes it holds it, so a later grant to someone else is legitimate.
    pub fn end(&mut self, id: usize, at: Duration) {
        if let Some(grant) = self.grants.get_mut(id) {
            grant.until = grant.until.min(at);
        }
    }

    /// Records a fencing token.
    pub fn fence(&mut self, fence: Fence) {
        self.fences.push(fence);
    }

    /// How many fencing tokens were handed out.
    pub fn fences(&self) -> usize {
        self.fences.len()
    }

    /// Property 5, fencing: a token is above every token of the same lock answered before
    /// its acquisition was sent. Per key, tokens sorted by answer time with a running
    /// maximum; each acquisition is compared with the maximum of those answered before it
    /// was sent.
    pub fn fence_regressions(&self) -> Vec<String> {
        let mut by_key: BTreeMap<&str, Vec<&Fence>> = BTreeMap::new();
        for fence in &self.fences {
            by_key.entry(&fence.key).or_default().push(fence);
        }
        let mut found = Vec::new();
        for fences in by_key.values_mut() {
            let mut answered = fences.clone();
            answered.sort_by_key(|f| f.answered);
            let mut highest: Vec<&Fence> = Vec::with_capacity(answered.len());
            for f in &answered {
                let top = match highest.last() {
                    Some(h) if h.token >= f.token => *h,
                    _ => *f,
                };
                highest.push(top);
            }
            for f in fences.iter() {
                let before = answered.partition_point(|a| a.answered < f.sent);
                if let Some(h) = before.checked_sub(1).map(|i| highest[i])
                    && h.token >= f.token
                {
                    found.push(format!(
                        "{}: token {} to {} (sent at {:.3}s) is not above token {} to {} answered at {:.3}s",
                        f.key,
                        f.token,
                        f.holder,
                        f.sent.as_secs_f64(),
                        h.token,
                        h.holder,
                        h.answered.as_secs_f64()
                    ));
                }
            }
        }
        found
    }

    /// The semaphores' bound: every instant at which more than `k` grants of keys in one
    /// group (`group` of a key: its semaphore; `None` for a key of no semaphore) are held,
    /// as the grants then holding (at most 20 reported). Grants are half-open intervals; an
    /// empty one (released the instant it was granted) holds at no instant, and is left out
    /// (its end would sort before its start and leave it counted for ever).
    pub fn more_than(&self, k: usize, group: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let mut by_group: BTreeMap<String, Vec<&Grant>> = BTreeMap::new();
        for g in self.grants.iter().filter(|g| g.from < g.until) {
            if let Some(name) = group(&g.key) {
                by_group.entry(name).or_default().push(g);
            }
        }
        let mut found = Vec::new();
        for (name, grants) in by_group {
            // Ends sort before starts at the same instant: touching grants do not overlap.
            let mut events: Vec<(Duration, bool, usize)> = Vec::new();
            for (i, g) in grants.iter().enumerate() {
                events.push((g.from, true, i));
                events.push((g.until, false, i));
            }
            events.sort_by_key(|(at, start, _)| (*at, *start));
            let mut holding: Vec<usize> = Vec::new();
            for (_, start, i) in events {
                if !start {
                    holding.retain(|h| *h != i);
                    continue;
                }
                holding.push(i);
                if holding.len() > k && found.len() < 20 {
                    let held: Vec<String> = holding.iter().map(|h| grants[*h].to_string()).collect();
                    found.push(format!("{name}: more than {k} holders: {}", held.join("; ")));
                }
            }
        }
        found
    }

    /// How many grants there were.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// The grants, in the order they were made.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Property 1: every grant that starts while an earlier grant of the same key is still
    /// held, described with the grant it overlaps. A sweep per key over grants sorted by
    /// start, keeping the one that reaches furthest so far.
    pub fn overlaps(&self) -> Vec<String> {
        let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
        for (grant, _) in self.of_kind(true, Kind::Exclusive) {
            by_key.entry(&grant.key).or_default().push(grant);
        }
        let mut found = Vec::new();
        for grants in by_key.values_mut() {
            grants.sort_by_key(|g| (g.from, g.until));
            let mut furthest: Option<&Grant> = None;
            for &grant in grants.iter() {
                match furthest {
                    Some(held) if grant.from < held.until => {
                        found.push(format!("{grant} overlaps {held}"));
                        if grant.until > held.until {
                            furthest = Some(grant);
                        }
                    }
                    _ => furthest = Some(grant),
                }
            }
        }
        found
    }
}

impl History {
    /// Read-write locks: every grant that starts while an earlier grant of the same lock is
    /// held, when either of the two is a writer's (readers may overlap readers), described
    /// with the grant it overlaps. A sweep per lock over grants sorted by start, keeping the
    /// grant that reaches furthest so far (a writer is checked against it) and the writer
    /// that does (a reader is checked against it).
    pub fn rw_overlaps(&self) -> Vec<String> {
        let mut by_key: BTreeMap<&str, Vec<(&Grant, Kind)>> = BTreeMap::new();
        for (grant, kind) in self.of_kind(false, Kind::Exclusive) {
            by_key.entry(&grant.key).or_default().push((grant, kind));
        }
        let mut found = Vec::new();
        for grants in by_key.values_mut() {
            grants.sort_by_key(|(g, _)| (g.from, g.until));
            let mut furthest: Option<(&Grant, Kind)> = None;
            let mut furthest_writer: Option<(&Grant, Kind)> = None;
            for &(grant, kind) in grants.iter() {
                let rival = match kind {
                    Kind::Write => furthest,
                    _ => furthest_writer,
                };
                if let Some((held, held_kind)) = rival.filter(|(held, _)| grant.from < held.until) {
                    found.push(format!("{kind:?} {grant} overlaps {held_kind:?} {held}"));
                }
                if furthest.is_none_or(|(held, _)| grant.until > held.until) {
                    furthest = Some((grant, kind));
                }
                if kind == Kind::Write && furthest_writer.is_none_or(|(held, _)| grant.until > held.until) {
                    furthest_writer = Some((grant, kind));
                }
            }
        }
        found
    }
}

/// FNV-1a, to fingerprint a run: two runs of one seed must produce the same history.
pub fn fingerprint(history: &History, ops: u64) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
        }
    };
    feed(&ops.to_le_bytes());
    for g in history.grants() {
        feed(g.key.as_bytes());
        feed(g.token.as_bytes());
        feed(&g.from.as_nanos().to_le_bytes());
        feed(&g.until.as_nanos().to_le_bytes());
    }
    hash
}

/// Fails the test on any overlap or fencing token regression, showing the first three of each.
#[allow(dead_code, reason = "the simulation reports its violations itself")]
pub fn assert_safe((overlaps, regressions): (Vec<String>, Vec<String>)) {
    assert!(
        overlaps.is_empty(),
        "overlapping grants: {:?}",
        &overlaps[..overlaps.len().min(3)]
    );
    assert!(
        regressions.is_empty(),
        "fencing tokens regressed: {:?}",
        &regressions[..regressions.len().min(3)]
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(key: &str, token: &str, from: u64, until: u64) -> Grant {
        Grant {
            key: key.into(),
            token: token.into(),
            proxy: 0,
            from: Duration::from_millis(from),
            until: Duration::from_millis(until),
        }
    }

    #[test]
    fn a_writer_overlapping_a_reader_or_a_writer_is_found_and_readers_share() {
        let mut h = History::default();
        h.hold(grant("rw", "r1", 0, 100), Kind::Read);
        h.hold(grant("rw", "r2", 50, 150), Kind::Read); // readers share
        h.hold(grant("rw", "w1", 150, 200), Kind::Write); // after both readers
        h.hold(grant("rw", "r3", 200, 300), Kind::Read); // after the writer
        h.hold(grant("other", "w2", 0, 300), Kind::Write); // another lock
        h.grant(grant("rw", "lock", 0, 300)); // a plain lock of the same name: not a hold
        assert!(h.rw_overlaps().is_empty(), "{:?}", h.rw_overlaps());
        assert_eq!(h.overlaps().len(), 0, "holds are not checked as locks");
        h.hold(grant("rw", "w3", 250, 260), Kind::Write); // inside reader r3
        let found = h.rw_overlaps();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("w3") && found[0].contains("r3"), "{found:?}");
        h.hold(grant("rw", "r4", 190, 195), Kind::Read); // inside writer w1
        let found = h.rw_overlaps();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|f| f.contains("r4") && f.contains("w1")), "{found:?}");
        h.hold(grant("rw", "w4", 10, 20), Kind::Write); // inside r1, starting before r2
        assert_eq!(h.rw_overlaps().len(), 3, "{:?}", h.rw_overlaps());
    }

    #[test]
    fn overlaps_are_found_and_touching_or_released_grants_are_not() {
        let mut h = History::default();
        h.grant(grant("a", "t1", 0, 100));
        h.grant(grant("a", "t2", 100, 200)); // starts as t1 ends: fine
        h.grant(grant("b", "t3", 50, 150)); // another key: fine
        let early = h.grant(grant("a", "t4", 250, 400));
        h.end(early, Duration::from_millis(260)); // released at 260
        h.grant(grant("a", "t5", 260, 300)); // after the release: fine
        assert!(h.overlaps().is_empty(), "{:?}", h.overlaps());
        h.grant(grant("a", "t6", 10, 20)); // inside t1
        h.grant(grant("a", "t7", 299, 500)); // inside t5
        let found = h.overlaps();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("t6") && found[0].contains("t1"), "{found:?}");
        assert!(found[1].contains("t7") && found[1].contains("t5"), "{found:?}");
    }

    #[test]
    fn more_than_k_holders_of_a_group_are_found() {
        let mut h = History::default();
        let group = |key: &str| key.split_once('#').map(|(g, _)| g.to_owned());
        h.grant(grant("s#0", "t1", 0, 100));
        h.grant(grant("s#1", "t2", 50, 150));
        h.grant(grant("s#0", "t3", 100, 200)); // t1 ended as it began: two at most
        h.grant(grant("lock", "t4", 60, 90)); // no group
        assert!(h.more_than(2, group).is_empty(), "{:?}", h.more_than(2, group));
        assert_eq!(h.more_than(1, group).len(), 2, "two instants with two holders");
        h.grant(grant("s#3", "empty", 110, 110)); // released as granted: held at no instant
        assert!(h.more_than(2, group).is_empty(), "{:?}", h.more_than(2, group));
        h.grant(grant("s#2", "t5", 120, 130));
        let found = h.more_than(2, group);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("t2") && found[0].contains("t3") && found[0].contains("t5"),
            "{found:?}"
        );
    }

    fn fence(key: &str, token: u64, sent: u64, answered: u64) -> Fence {
        Fence {
            key: key.into(),
            token,
            holder: format!("c{token}"),
            sent: Duration::from_millis(sent),
            answered: Duration::from_millis(answered),
        }
    }

    #[test]
    fn a_token_not_above_an_earlier_answer_is_found() {
        let mut h = History::default();
        h.fence(fence("a", 1, 0, 10));
        h.fence(fence("a", 5, 20, 30));
        h.fence(fence("a", 3, 25, 40)); // sent before 5 was answered: concurrent, fine
        h.fence(fence("b", 2, 50, 60)); // another key
        assert!(h.fence_regressions().is_empty(), "{:?}", h.fence_regressions());
        h.fence(fence("a", 4, 45, 50)); // sent after 5 was answered
        let found = h.fence_regressions();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("token 4") && found[0].contains("token 5"),
            "{found:?}"
        );
    }

    #[test]
    fn a_long_grant_is_remembered_past_shorter_ones() {
        let mut h = History::default();
        h.grant(grant("a", "long", 0, 1_000));
        h.grant(grant("a", "short", 100, 200));
        h.grant(grant("a", "late", 500, 600));
        assert_eq!(h.overlaps().len(), 2, "{:?}", h.overlaps());
    }
}
