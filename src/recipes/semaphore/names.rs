//! Semaphores as k mutex slots: what the proxy keeps for them on the masters (the names of
//! their keys) and in itself (the [`Ledger`](super::Ledger) of what it granted and learned).
//!
//! Rule 14 (docs/safety-rules.md): a majority bounds one holder, not k. A script that counts
//! holders ("accept while fewer than k hold") admits k+1 holders over a majority
//! (docs/recipes-quorum.md, "Counting"). So a k-permit semaphore on `key` is k ordinary locks,
//! its *slots*, each taken by a majority exactly as a lock is (rules 1–9, fencing F1–F5): at
//! most one holder per slot by the conflict claim, so at most k holders, with a mutex's
//! availability. Beside the slots, each master keeps the semaphore's count k (the *permits
//! key*): an acquisition naming another count is refused by a master that holds a live slot of
//! the semaphore, and two counts conflicting is again a pair, decided over two majorities.
//!
//! Every name lives under the proxy's reserved prefix (rule 11: no client command names one)
//! and carries a Redis Cluster hash tag of the user's key, so that all the keys of one
//! semaphore (its slots, their fencing counters, its permits key) hash to one cluster slot:
//! the masters' scripts read the other slots of the semaphore by name.

use bytes::{BufMut, Bytes, BytesMut};

/// The prefix of every semaphore key on the masters (under the reserved `redlock-proxy:`).
pub const PREFIX: &[u8] = b"redlock-proxy:sem:";

/// The most permits a semaphore may have. The masters' scripts read every slot of a semaphore
/// in one `MGET` (its name is computed per slot): bounded so that one acquisition's work on a
/// master stays small.
pub const MAX_PERMITS: u32 = 1024;

/// What ends the permits key's name (never digits: no slot is named so).
const PERMITS: &[u8] = b"permits";

/// The names of one semaphore's keys on the masters. For a user key `K`, all share the base
/// `redlock-proxy:sem:{T}:K:`, where `T` is `K`'s own Redis Cluster hash tag (or `K` itself),
/// so that the semaphore's keys hash to the cluster slot `K` hashes to; when that cannot be
/// written as a tag (`K` empty, or with a `}` outside a tag), the SHA1 of `K` in hex. Slot `i`
/// is the base followed by `i`; the permits key, by `permits`. The base also names the
/// semaphore's wait queue in every proxy, and is how a slot's release finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    base: Bytes,
}

impl Names {
    /// The names of the semaphore on the user's key `key`.
    pub fn of(key: &[u8]) -> Names {
        Names {
            base: crate::keys::tagged_name(PREFIX, key, b":"),
        }
    }

    /// The common start of every name: also the key of the semaphore's wait queue.
    pub fn base(&self) -> &Bytes {
        &self.base
    }

    /// Slot `i`'s lock key.
    pub fn slot(&self, i: u32) -> Bytes {
        self.with(itoa::Buffer::new().format(i).as_bytes())
    }

    /// The key holding the semaphore's count of permits on each master.
    pub fn permits(&self) -> Bytes {
        permits_key(&self.base)
    }

    fn with(&self, suffix: &[u8]) -> Bytes {
        let mut name = BytesMut::with_capacity(self.base.len() + suffix.len());
        name.put_slice(&self.base);
        name.put_slice(suffix);
        name.freeze()
    }
}

/// The permits key of the semaphore whose names start with `base`.
pub fn permits_key(base: &[u8]) -> Bytes {
    Bytes::from([base, PERMITS].concat())
}

/// A slot's key split into its semaphore's base and its index; `None` for any other key.
pub fn split_slot(key: &[u8]) -> Option<(&[u8], u32)> {
    if !key.starts_with(PREFIX) {
        return None;
    }
    let colon = key.iter().rposition(|&b| b == b':')?;
    let (base, index) = key.split_at(colon + 1);
    if index.is_empty() || !index.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let index = std::str::from_utf8(index).ok()?.parse().ok()?;
    Some((base, index))
}

/// The user's key of a semaphore slot's key (to tell a client of a lost permit by the key it
/// named); `None` for any other key.
pub fn user_key(slot_key: &Bytes) -> Option<Bytes> {
    let (base, _) = split_slot(slot_key)?;
    let rest = base.strip_prefix(PREFIX)?.strip_prefix(b"{")?;
    // The tag holds no `}` (see `Names::of`): the first one closes it.
    let close = rest.iter().position(|&b| b == b'}')?;
    let key = rest.get(close + 1..)?.strip_prefix(b":")?.strip_suffix(b":")?;
    Some(slot_key.slice_ref(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster::slot;

    #[test]
    fn every_key_of_a_semaphore_hashes_to_the_users_keys_slot() {
        for key in ["jobs", "app:{tenant-7}:jobs", "{{a}", "a{b"] {
            let names = Names::of(key.as_bytes());
            let wanted = slot(key.as_bytes());
            for i in [0, 1, 17, MAX_PERMITS - 1] {
                assert_eq!(slot(&names.slot(i)), wanted, "{key} slot {i}");
            }
            assert_eq!(slot(&names.permits()), wanted, "{key}");
            // The fencing counter of a slot is named after it: the same cluster slot.
            let counter = [&b"redlock-proxy:fence:c:"[..], &names.slot(3)].concat();
            assert_eq!(slot(&counter), wanted, "{key}");
        }
    }

    #[test]
    fn keys_that_cannot_be_a_tag_still_share_one_slot() {
        for key in ["", "}", "a}b", "{}x}", "x{}y"] {
            let names = Names::of(key.as_bytes());
            let first = slot(&names.slot(0));
            assert!((1..8).all(|i| slot(&names.slot(i)) == first), "{key:?}");
            assert_eq!(slot(&names.permits()), first, "{key:?}");
        }
    }

    #[test]
    fn names_are_reserved_distinct_and_read_back() {
        let names = Names::of(b"a:1");
        let s = names.slot(12);
        assert!(s.starts_with(crate::keys::OWN_PREFIX));
        assert_eq!(&s[..], b"redlock-proxy:sem:{a:1}:a:1:12");
        assert_eq!(split_slot(&s), Some((&names.base()[..], 12)));
        assert_eq!(user_key(&s).as_deref(), Some(&b"a:1"[..]));
        assert_eq!(split_slot(&names.permits()), None, "the permits key is no slot");
        assert_ne!(Names::of(b"a").slot(11), Names::of(b"a:1").slot(1));
        let lock = Bytes::from_static(b"lock:1");
        assert_eq!(user_key(&lock), None);
        for key in ["", "}", "x{y}z", "a}b:3"] {
            let slot = Names::of(key.as_bytes()).slot(2);
            assert_eq!(user_key(&slot).as_deref(), Some(key.as_bytes()), "{key:?}");
        }
    }
}
