//! The keyspace of the embedded master: values (strings, hashes, sorted sets) with an optional
//! expiry, per database.
//!
//! This is a plain data structure with no clock inside: every method takes the current time
//! (`now_ms`, Unix milliseconds as the master sees them) so that the caller decides what time it
//! is. That keeps a whole command, or a whole script, on one frozen instant, as Redis does, and
//! lets tests drive expiry with simulated or drifting clocks.
//!
//! Expiry is lazy: an expired key is invisible to every method and is dropped when touched.
//! To keep keys that expire untouched from piling up, each database also sweeps itself after
//! a number of inserts proportional to its size, which keeps the cost amortized O(1).

use std::collections::HashMap;

use bytes::Bytes;

use super::hash::Hash;
use super::zset::ZSet;

/// A database never sweeps more often than every this many inserts, so that small databases
/// don't pay for a full scan on every write.
const MIN_INSERTS_BETWEEN_SWEEPS: usize = 1024;

/// One value and its expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The value, of one of the types this master knows.
    pub value: Data,
    /// When the key expires, in Unix milliseconds; `None` means never.
    pub expires_at: Option<u64>,
}

/// A key's value. Only the types the proxy's own scripts use: strings for locks and counters,
/// hashes for reentrant holds, sorted sets for readers and semaphore permits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    Str(Bytes),
    Hash(Hash),
    ZSet(ZSet),
}

impl Data {
    /// The name `TYPE` answers for it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Data::Str(_) => "string",
            Data::Hash(_) => "hash",
            Data::ZSet(_) => "zset",
        }
    }
}

impl Entry {
    /// A string value.
    pub fn string(value: Bytes, expires_at: Option<u64>) -> Entry {
        Entry {
            value: Data::Str(value),
            expires_at,
        }
    }

    /// Whether the entry is gone at `now_ms`. Like Redis, a key is still alive during the very
    /// millisecond it expires at, and gone after it.
    fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at.is_some_and(|at| now_ms > at)
    }
}

/// How many keys a database holds, for `INFO keyspace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DbStats {
    /// The database number.
    pub db: u32,
    /// Live keys.
    pub keys: usize,
    /// Live keys that have an expiry.
    pub expires: usize,
}

/// All databases of one master.
#[derive(Debug, Default)]
pub struct Store {
    dbs: HashMap<u32, Db>,
}

#[derive(Debug, Default)]
struct Db {
    entries: HashMap<Bytes, Entry>,
    inserts_since_sweep: usize,
    /// How many keys survived the last sweep: the next one waits for at least as many inserts,
    /// so a sweep costs O(1) per insert.
    kept_by_last_sweep: usize,
}

impl Db {
    /// The live entry at `key`, dropping it first if it has expired.
    fn live(&mut self, key: &[u8], now_ms: u64) -> Option<&mut Entry> {
        if self.entries.get(key)?.is_expired(now_ms) {
            self.entries.remove(key);
            return None;
        }
        self.entries.get_mut(key)
    }

    /// Drops expired entries once enough inserts happened since the last sweep.
    fn maybe_sweep(&mut self, now_ms: u64) {
        self.inserts_since_sweep += 1;
        if self.inserts_since_sweep >= self.kept_by_last_sweep.max(MIN_INSERTS_BETWEEN_SWEEPS) {
            self.sweep(now_ms);
        }
    }

    fn sweep(&mut self, now_ms: u64) {
        self.entries.retain(|_, entry| !entry.is_expired(now_ms));
        self.inserts_since_sweep = 0;
        self.kept_by_last_sweep = self.entries.len();
    }
}

impl Store {
    /// An empty keyspace.
    pub fn new() -> Store {
        Store::default()
    }

    /// The live entry at `key`, for reading or changing in place (value or expiry).
    pub fn get_mut(&mut self, db: u32, key: &[u8], now_ms: u64) -> Option<&mut Entry> {
        self.dbs.get_mut(&db)?.live(key, now_ms)
    }

    /// Whether `key` exists and has not expired.
    pub fn contains(&mut self, db: u32, key: &[u8], now_ms: u64) -> bool {
        self.get_mut(db, key, now_ms).is_some()
    }

    /// Stores `entry` at `key`, replacing any previous value and expiry.
    pub fn insert(&mut self, db: u32, key: Bytes, entry: Entry, now_ms: u64) {
        let db = self.dbs.entry(db).or_default();
        db.entries.insert(key, entry);
        db.maybe_sweep(now_ms);
    }

    /// Removes `key`, returning its entry if it was alive.
    pub fn remove(&mut self, db: u32, key: &[u8], now_ms: u64) -> Option<Entry> {
        let entries = &mut self.dbs.get_mut(&db)?.entries;
        entries.remove(key).filter(|entry| !entry.is_expired(now_ms))
    }

    /// The number of live keys in `db`; sweeps the database, since it has to look at every key.
    pub fn len(&mut self, db: u32, now_ms: u64) -> usize {
        self.dbs.get_mut(&db).map_or(0, |db| {
            db.sweep(now_ms);
            db.entries.len()
        })
    }

    /// The live keys of `db` that match the glob `pattern`, sorted.
    pub fn keys(&mut self, db: u32, pattern: &[u8], now_ms: u64) -> Vec<Bytes> {
        let Some(db) = self.dbs.get_mut(&db) else {
            return Vec::new();
        };
        db.sweep(now_ms);
        // The pattern is read once for every key, not once per key (rule 16, `crate::glob`).
        let longest = db.entries.keys().map(|k| k.len()).max().unwrap_or(0);
        let pattern = crate::glob::Pattern::new(pattern, longest);
        let mut keys: Vec<Bytes> = db.entries.keys().filter(|k| pattern.matches(k)).cloned().collect();
        keys.sort();
        keys
    }

    /// Empties one database.
    pub fn flush_db(&mut self, db: u32) {
        self.dbs.remove(&db);
    }

    /// Empties every database.
    pub fn flush_all(&mut self) {
        self.dbs.clear();
    }

    /// Keeps, in every database, only the live keys for which `keep` is true, and returns how
    /// many live keys were dropped. Expired keys go too, without being counted or shown to
    /// `keep`: they are gone already. For a replica promoted in place of a master: it holds
    /// the master's keys except the writes it had not received yet.
    pub fn retain(&mut self, now_ms: u64, mut keep: impl FnMut(&[u8]) -> bool) -> usize {
        let mut dropped = 0;
        for db in self.dbs.values_mut() {
            db.entries.retain(|key, entry| {
                if entry.is_expired(now_ms) {
                    return false;
                }
                let kept = keep(key);
                dropped += usize::from(!kept);
                kept
            });
            db.inserts_since_sweep = 0;
            db.kept_by_last_sweep = db.entries.len();
        }
        dropped
    }

    /// Counts of the non-empty databases, by database number.
    pub fn stats(&mut self, now_ms: u64) -> Vec<DbStats> {
        let mut stats: Vec<DbStats> = self
            .dbs
            .iter_mut()
            .map(|(&number, db)| {
                db.sweep(now_ms);
                DbStats {
                    db: number,
                    keys: db.entries.len(),
                    expires: db.entries.values().filter(|e| e.expires_at.is_some()).count(),
                }
            })
            .filter(|stats| stats.keys > 0)
            .collect();
        stats.sort_by_key(|stats| stats.db);
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persistent(value: &'static str) -> Entry {
        Entry::string(Bytes::from_static(value.as_bytes()), None)
    }

    fn value(store: &mut Store, db: u32, key: &[u8], now_ms: u64) -> Option<Bytes> {
        store.get_mut(db, key, now_ms).and_then(|entry| match &entry.value {
            Data::Str(value) => Some(value.clone()),
            _ => None,
        })
    }

    fn expiring(value: &'static str, at: u64) -> Entry {
        Entry::string(Bytes::from_static(value.as_bytes()), Some(at))
    }

    #[test]
    fn set_get_remove() {
        let mut store = Store::new();
        store.insert(0, Bytes::from("k"), persistent("v"), 0);
        assert_eq!(value(&mut store, 0, b"k", 0), Some(Bytes::from("v")));
        assert!(store.contains(0, b"k", 0));
        assert_eq!(store.remove(0, b"k", 0), Some(persistent("v")));
        assert_eq!(store.remove(0, b"k", 0), None);
        assert_eq!(store.len(0, 0), 0);
    }

    #[test]
    fn key_lives_through_its_expiry_millisecond() {
        let mut store = Store::new();
        store.insert(0, Bytes::from("k"), expiring("v", 100), 0);
        assert!(store.contains(0, b"k", 99));
        assert!(store.contains(0, b"k", 100));
        assert!(!store.contains(0, b"k", 101));
        // Touching it dropped it for good, even if time could go back.
        assert!(!store.contains(0, b"k", 50));
    }

    #[test]
    fn expired_key_is_not_reported_as_removed() {
        let mut store = Store::new();
        store.insert(0, Bytes::from("k"), expiring("v", 10), 0);
        assert_eq!(store.remove(0, b"k", 11), None);
    }

    #[test]
    fn databases_are_separate() {
        let mut store = Store::new();
        store.insert(0, Bytes::from("k"), persistent("zero"), 0);
        store.insert(3, Bytes::from("k"), persistent("three"), 0);
        assert_eq!(value(&mut store, 3, b"k", 0), Some(Bytes::from("three")));
        assert!(!store.contains(1, b"k", 0));
        store.flush_db(0);
        assert!(!store.contains(0, b"k", 0));
        assert!(store.contains(3, b"k", 0));
        store.flush_all();
        assert!(!store.contains(3, b"k", 0));
    }

    #[test]
    fn len_and_stats_ignore_expired_keys() {
        let mut store = Store::new();
        store.insert(0, Bytes::from("a"), persistent("1"), 0);
        store.insert(0, Bytes::from("b"), expiring("2", 50), 0);
        store.insert(0, Bytes::from("c"), expiring("3", 500), 0);
        store.insert(2, Bytes::from("d"), expiring("4", 50), 0);
        assert_eq!(store.len(0, 0), 3);
        assert_eq!(store.len(0, 100), 2);
        assert_eq!(
            store.stats(100),
            vec![DbStats {
                db: 0,
                keys: 2,
                expires: 1
            }]
        );
    }

    #[test]
    fn retain_keeps_only_the_chosen_live_keys_of_every_database() {
        let mut store = Store::new();
        store.insert(0, Bytes::from("keep"), persistent("1"), 0);
        store.insert(0, Bytes::from("lose"), persistent("2"), 0);
        store.insert(0, Bytes::from("expired"), expiring("3", 50), 0);
        store.insert(4, Bytes::from("lose"), expiring("4", 500), 0);
        store.insert(4, Bytes::from("keep-too"), expiring("5", 500), 0);
        let mut shown = Vec::new();
        let dropped = store.retain(100, |key| {
            shown.push(key.to_vec());
            key.starts_with(b"keep")
        });
        assert_eq!(dropped, 2, "the expired key is not counted");
        assert!(!shown.contains(&b"expired".to_vec()), "expired keys are not offered");
        assert_eq!(store.keys(0, b"*", 100), vec![Bytes::from("keep")]);
        assert_eq!(store.keys(4, b"*", 100), vec![Bytes::from("keep-too")]);
    }

    #[test]
    fn untouched_expired_keys_are_swept() {
        let mut store = Store::new();
        for i in 0..MIN_INSERTS_BETWEEN_SWEEPS {
            store.insert(0, Bytes::from(format!("old{i}")), expiring("v", 10), 0);
        }
        // Writes long after the old keys expired eventually sweep them out of memory.
        for i in 0..MIN_INSERTS_BETWEEN_SWEEPS {
            store.insert(0, Bytes::from(format!("new{i}")), persistent(""), 20);
        }
        let held = store.dbs.get(&0).map_or(0, |db| db.entries.len());
        assert!(held < 2 * MIN_INSERTS_BETWEEN_SWEEPS, "held {held}");
    }
}
