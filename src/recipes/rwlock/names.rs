//! Read-write locks: many readers or one writer (docs/recipes-quorum.md, "Read-write locks").
//! What the proxy keeps for them on the masters: the names of their keys, and how the proxy
//! tells those names apart where a lock's key travels (sessions, undo, release, extension).
//!
//! Rule 14: a majority bounds pairs, not counts. Reader–writer and writer–writer are pairs
//! that conflict; each master refuses a writer while it holds a live reader or another writer,
//! and a reader while it holds a live writer, so two majorities decide them as they decide a
//! mutex. Readers are never counted: any number may hold.
//!
//! Per read-write lock on user key `K`, every master keeps, under `redlock-proxy:rw:{T}:K:`
//! (`T` being `K`'s Redis Cluster hash tag, as a semaphore's: `crate::recipes::semaphore::Names`):
//! - `w`: the writer, an ordinary fenced lock key (its token, with its TTL), so that its
//!   release, extension, keepalive and undo are a lock's;
//! - `r`: the readers, a sorted set of token → expiry (Unix ms on that master's clock, read
//!   by `TIME` in the script that wrote it), pruned on every call, its own `PEXPIRE` kept at
//!   its latest expiry (rule 8a: nothing outlives `max_ttl_ms`);
//! - `i`: the intent of the latest waiting writer, a key holding its token with a short TTL
//!   (liveness only: an intent only ever makes a master refuse a new reader);
//! - one fencing counter for the whole lock, the writer key's (`redlock-proxy:fence:c:` + the
//!   writer key), bumped by every grant, read or write (F1–F5 unchanged).
//!
//! A reader's hold has a name of its own inside the proxy, never a key on the masters:
//! `...:r.<token in hex>`. It is what a session keeps alive, what an undo or a release names,
//! and it maps back to the readers' set and the token ([`split`]).

use bytes::{BufMut, Bytes, BytesMut};

/// The prefix of every read-write lock key on the masters (under the reserved `redlock-proxy:`).
pub const PREFIX: &[u8] = b"redlock-proxy:rw:";

/// What ends a reader's hold name before its token in hex.
const READER: &[u8] = b"r.";

/// The names of one read-write lock's keys. All share the base `redlock-proxy:rw:{T}:K:`, so
/// that they hash to the cluster slot `K` hashes to; the base also names the lock's wait
/// queue in every proxy (readers and writers wait in one queue, first come first served).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    base: Bytes,
}

impl Names {
    /// The names of the read-write lock on the user's key `key`.
    pub fn of(key: &[u8]) -> Names {
        Names {
            base: crate::keys::tagged_name(PREFIX, key, b":"),
        }
    }

    /// The names whose base is `base` (as [`split`] found it).
    fn from_base(base: Bytes) -> Names {
        Names { base }
    }

    /// The common start of every name: also the key of the lock's wait queue.
    pub fn base(&self) -> &Bytes {
        &self.base
    }

    /// The writer's lock key.
    pub fn writer(&self) -> Bytes {
        self.with(b"w")
    }

    /// The readers' sorted set.
    pub fn readers(&self) -> Bytes {
        self.with(b"r")
    }

    /// The latest waiting writer's intent.
    pub fn intents(&self) -> Bytes {
        self.with(b"i")
    }

    /// The fencing counter of the whole lock: the writer key's.
    pub fn counter(&self) -> Bytes {
        Bytes::from([crate::keys::COUNTER_PREFIX.as_bytes(), &self.writer()].concat())
    }

    /// The name of `token`'s read hold (inside the proxy only).
    pub fn reader_hold(&self, token: &[u8]) -> Bytes {
        let mut name = BytesMut::with_capacity(self.base.len() + READER.len() + token.len() * 2);
        name.put_slice(&self.base);
        name.put_slice(READER);
        for b in token {
            name.put_slice(&HEX[usize::from(*b)]);
        }
        name.freeze()
    }

    fn with(&self, suffix: &[u8]) -> Bytes {
        Bytes::from([&self.base[..], suffix].concat())
    }
}

/// Every byte's two lower-case hex digits.
const HEX: [[u8; 2]; 256] = {
    let digits = b"0123456789abcdef";
    let mut table = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = [digits[i >> 4], digits[i & 15]];
        i += 1;
    }
    table
};

/// What a name of a read-write lock names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The writer's lock key.
    Writer,
    /// A reader's hold, with its token.
    Reader(Bytes),
}

/// A name made here split into its lock's names and what it holds; `None` for any other key
/// (and for the readers' set and the intent, which no hold names).
pub fn split(name: &[u8]) -> Option<(Names, Hold)> {
    if !name.starts_with(PREFIX) {
        return None;
    }
    // The suffix holds no `:` (hex digits only): the last one ends the base.
    let colon = name.iter().rposition(|&b| b == b':')?;
    let (base, suffix) = name.split_at(colon + 1);
    let hold = match suffix {
        b"w" => Hold::Writer,
        _ => Hold::Reader(unhex(suffix.strip_prefix(READER)?)?),
    };
    Some((Names::from_base(Bytes::copy_from_slice(base)), hold))
}

/// A reader's hold name split into its lock's names and token; `None` for any other key. The
/// one test every path a lock's key takes makes (undo, write-back, extension, release).
pub fn reader(name: &[u8]) -> Option<(Names, Bytes)> {
    if !name.starts_with(PREFIX) {
        return None;
    }
    match split(name)? {
        (names, Hold::Reader(token)) => Some((names, token)),
        _ => None,
    }
}

fn unhex(hex: &[u8]) -> Option<Bytes> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
    hex.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Option<Vec<u8>>>()
        .map(Bytes::from)
}

/// The key a release of `name` is announced and queued under: the lock's base for a writer's
/// key or a reader's hold; `None` for any other key.
pub fn queue_key(name: &Bytes) -> Option<Bytes> {
    split(name).map(|(names, _)| names.base)
}

/// `name` as a page anyone who reaches the status listener may show: a reader's hold name
/// carries its token, so it is shown as its lock's readers' set; any other name as it is.
pub fn public_name(name: &Bytes) -> Bytes {
    match reader(name) {
        Some((names, _)) => names.readers(),
        None => name.clone(),
    }
}

/// The user's key of a writer's key or a reader's hold (to tell a client of a lost hold by the
/// key it named); `None` for any other key.
pub fn user_key(name: &Bytes) -> Option<Bytes> {
    let (names, _) = split(name)?;
    let rest = names.base.strip_prefix(PREFIX)?.strip_prefix(b"{")?;
    // The tag holds no `}` (see `Names::of`): the first one closes it.
    let close = rest.iter().position(|&b| b == b'}')?;
    let key = rest.get(close + 1..)?.strip_prefix(b":")?.strip_suffix(b":")?;
    Some(Bytes::copy_from_slice(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster::slot;

    #[test]
    fn every_key_of_a_lock_hashes_to_the_users_keys_slot() {
        for key in ["doc", "app:{tenant-7}:doc", "{{a}", "a{b", "", "}", "x{}y"] {
            let names = Names::of(key.as_bytes());
            let wanted = slot(&names.writer());
            if crate::keys::hash_tag(key.as_bytes()).is_some() {
                assert_eq!(wanted, slot(key.as_bytes()), "{key}");
            }
            for other in [names.readers(), names.intents(), names.counter()] {
                assert_eq!(slot(&other), wanted, "{key}");
            }
        }
    }

    #[test]
    fn holds_are_read_back_and_nothing_else_is_one() {
        for key in ["a:1", "", "}", "x{y}z", "a}b:3", "r.00"] {
            let names = Names::of(key.as_bytes());
            for token in ["t", "", "a:b:c", "\u{0}\u{ff}"] {
                let hold = names.reader_hold(token.as_bytes());
                assert!(hold.starts_with(crate::keys::OWN_PREFIX));
                assert_eq!(
                    reader(&hold),
                    Some((names.clone(), Bytes::copy_from_slice(token.as_bytes())))
                );
                assert_eq!(queue_key(&hold).as_ref(), Some(names.base()));
                assert_eq!(user_key(&hold).as_deref(), Some(key.as_bytes()), "{key:?}");
            }
            let writer = names.writer();
            assert_eq!(split(&writer), Some((names.clone(), Hold::Writer)));
            assert_eq!(reader(&writer), None);
            assert_eq!(user_key(&writer).as_deref(), Some(key.as_bytes()));
            assert_eq!(public_name(&names.reader_hold(b"secret")), names.readers());
            assert_eq!(public_name(&writer), writer);
            assert_eq!(split(&names.readers()), None);
            assert_eq!(split(&names.intents()), None);
        }
        assert_eq!(split(b"lock:1"), None);
        assert_eq!(split(b"redlock-proxy:sem:{a}:a:0"), None);
        assert_eq!(reader(b"redlock-proxy:rw:{a}:a:r.0g"), None, "not hex");
    }
}
