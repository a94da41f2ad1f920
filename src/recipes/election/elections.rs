//! Leader election: what a proxy keeps for it while it runs (who watches which election's
//! leader); its keys on the masters are in `names.rs`.
//!
//! Leadership of an election is a session lock on one reserved key, taken by the fenced
//! acquisition (rules 1–9, fencing F1–F5): one leader at a time by the conflict claim of
//! docs/recipes-quorum.md, and its term, the fencing token of its grant, higher than every
//! earlier term of the election. The leader's value is the lock's token.
//!
//! Observers of an election (`ELECT.OBSERVE`) do not read the masters themselves: this proxy
//! keeps one reader per election watched ([`WatchedElection`]) that reads the leader from a quorum
//! when it may have changed (a grant or a release through any proxy, announced on the
//! masters; or the lease of the leader last read running out, which is how the death of a
//! leader's proxy is seen) and hands each reading to every observer of the election here.
//! Each reading is numbered: observers compare numbers, never guess which of two is newer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use crate::reply::Reply;

/// A leader as observers are told of it: its value and term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The leader's value.
    pub value: Bytes,
    /// Its term (fencing token).
    pub term: u64,
}

/// One reading of an election's leader from a quorum.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// Readings of one election are numbered from 1 in the order they were taken (0: none yet).
    pub seq: u64,
    /// The leader a quorum held (none: nobody a quorum vouches for), or why no quorum answered.
    pub leader: Result<Option<Seen>, String>,
}

impl Reading {
    /// `[value, term]` or nil; an error when no quorum answered.
    pub fn reply(&self) -> Reply {
        match &self.leader {
            Ok(leader) => leader_reply(leader.as_ref()),
            Err(e) => Reply::error(e.clone()),
        }
    }

    /// The term, 0 for "no leader" (as `AFTER` names it); `None` when no quorum answered.
    pub fn term(&self) -> Option<u64> {
        match &self.leader {
            Ok(leader) => Some(leader.as_ref().map_or(0, |l| l.term)),
            Err(_) => None,
        }
    }
}

/// `[value, term]`, or nil.
pub fn leader_reply(leader: Option<&Seen>) -> Reply {
    match leader {
        Some(l) => Reply::Array(vec![
            Reply::Bulk(l.value.clone()),
            Reply::Int(i64::try_from(l.term).unwrap_or(i64::MAX)),
        ]),
        None => Reply::Nil,
    }
}

/// One election watched through this proxy: its readings, and the signal that asks for a new
/// one.
pub struct WatchedElection {
    /// The last reading, sent to every observer.
    pub readings: watch::Sender<Reading>,
    /// Asks the reader for a new reading (stored when it is busy: a change during a read is
    /// read again after it).
    pub wake: Notify,
}

/// Every election watched through this proxy, by database and lock key.
#[derive(Default)]
pub struct Elections {
    watched: Mutex<HashMap<(u32, Bytes), Arc<WatchedElection>>>,
}

impl Elections {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u32, Bytes), Arc<WatchedElection>>> {
        // Each critical section is one insert, lookup or removal.
        self.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Watches the election of lock `key`: its readings, and `Some` of it when nobody watched
    /// it here before (the caller starts its reader). Asks for a new reading either way.
    pub fn watch(&self, db: u32, key: &Bytes) -> (watch::Receiver<Reading>, Option<Arc<WatchedElection>>) {
        let mut watched = self.lock();
        if let Some(w) = watched.get(&(db, key.clone())) {
            w.wake.notify_one();
            return (w.readings.subscribe(), None);
        }
        let (readings, rx) = watch::channel(Reading {
            seq: 0,
            leader: Ok(None),
        });
        let w = Arc::new(WatchedElection {
            readings,
            wake: Notify::new(),
        });
        watched.insert((db, key.clone()), w.clone());
        (rx, Some(w))
    }

    /// The leader of `key`'s election may have changed: its reader, if it is watched here,
    /// reads it again. Any other key: nothing (one prefix test).
    pub fn changed(&self, db: u32, key: &Bytes) {
        if !key.starts_with(super::names::PREFIX) {
            return;
        }
        if let Some(w) = self.lock().get(&(db, key.clone())) {
            w.wake.notify_one();
        }
    }

    /// The reader of `key`'s election ends if nobody watches it any more: `true` when it was
    /// forgotten (decided under the map's lock, so that a new observer either finds it still
    /// read or starts a new reader).
    pub fn unwatched(&self, db: u32, key: &Bytes) -> bool {
        let mut watched = self.lock();
        let gone = watched
            .get(&(db, key.clone()))
            .is_none_or(|w| w.readings.receiver_count() == 0);
        if gone {
            watched.remove(&(db, key.clone()));
        }
        gone
    }

    /// How many elections are watched here.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no election is watched here.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}
