//! What clients leave waiting in the proxy, bounded per user and in all (issue: registrations
//! without a proxy-wide bound).
//!
//! Each request that waits (`... WAIT ms`, each key of a `BLPOP`, an `ELECT.OBSERVE ... AFTER`
//! long poll) and each election a connection observes holds memory in the proxy (a queue
//! entry, a sleeper, a task, a reader) for as long as it waits or observes. They are counted
//! together, since they share that memory: at most `max_waiting_per_user` for one user (all
//! connections of the default user count as one) and `max_waiting` in all. Past a bound the
//! request is refused before anything is registered. A [`Waiting`] is given back when it is
//! dropped: when the request is answered, the observation ends, or the connection goes,
//! however it goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use crate::error::ClientError;

/// The counts of what waits, per user and in all.
#[derive(Debug)]
pub struct WaitingTable {
    per_user: usize,
    total_limit: usize,
    by_user: DashMap<String, usize>,
    total: AtomicUsize,
}

/// `n` waits of one user, counted until dropped.
#[derive(Debug)]
pub struct Waiting {
    table: Arc<WaitingTable>,
    user: String,
    n: usize,
}

impl WaitingTable {
    /// Bounds: `per_user` for one user, `total` in all.
    pub fn new(per_user: usize, total: usize) -> WaitingTable {
        WaitingTable {
            per_user,
            total_limit: total,
            by_user: DashMap::new(),
            total: AtomicUsize::new(0),
        }
    }

    /// What waits now, in all.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Counts `n` more waits for `user`, or refuses them whole when that would pass a bound.
    pub fn take(self: &Arc<Self>, user: &str, n: usize) -> Result<Waiting, ClientError> {
        let too_many = |what: &str, limit: usize| {
            Err(ClientError::Unsupported(format!(
                "too many requests waiting or observing: {what} ({limit}) reached"
            )))
        };
        // The user's count is changed under its map entry's lock: two connections of one
        // user cannot both pass the bound.
        let mut mine = self.by_user.entry(user.to_owned()).or_default();
        if *mine + n > self.per_user {
            let held = *mine;
            drop(mine);
            self.by_user.remove_if(user, |_, count| *count == 0);
            return too_many("max_waiting_per_user", self.per_user.max(held));
        }
        let total = self.total.fetch_add(n, Ordering::Relaxed);
        if total + n > self.total_limit {
            self.total.fetch_sub(n, Ordering::Relaxed);
            let held = *mine;
            drop(mine);
            if held == 0 {
                self.by_user.remove_if(user, |_, count| *count == 0);
            }
            return too_many("max_waiting", self.total_limit);
        }
        *mine += n;
        Ok(Waiting {
            table: self.clone(),
            user: user.to_owned(),
            n,
        })
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        self.table.total.fetch_sub(self.n, Ordering::Relaxed);
        self.table.by_user.remove_if_mut(&self.user, |_, count| {
            *count = count.saturating_sub(self.n);
            *count == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_bounded_per_user_and_in_all_and_given_back_when_dropped() {
        let table = Arc::new(WaitingTable::new(3, 5));
        let a = table.take("a", 2).unwrap();
        assert!(table.take("a", 2).is_err(), "past the user's bound");
        let a2 = table.take("a", 1).unwrap();
        let b = table.take("b", 2).unwrap();
        let refused = table.take("c", 1).unwrap_err();
        assert!(format!("{refused}").contains("max_waiting"), "{refused}");
        assert_eq!(table.total(), 5);
        drop(a);
        assert_eq!(table.total(), 3);
        let c = table.take("c", 1).unwrap();
        drop((a2, b, c));
        assert_eq!(table.total(), 0);
        assert!(table.by_user.is_empty(), "no user kept at zero");
    }
}
