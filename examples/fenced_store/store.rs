//! A tiny fenced resource: a key-value store that remembers, per key, the highest fencing
//! token any write carried, and rejects a write whose token is lower. A client paused past
//! its lock's validity (GC, swap, a stalled VM) wakes up believing it still holds the lock;
//! its late write carries an old token and is refused, so it cannot overwrite what the next
//! holder wrote.

use std::collections::HashMap;

/// Why a write was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Stale {
    /// The token the write carried.
    pub token: u64,
    /// The highest token the store has seen for the key.
    pub highest: u64,
}

/// The store. `fenced = false` turns the check off, to show what happens without it.
#[derive(Debug, Default)]
pub struct FencedStore {
    fenced: bool,
    data: HashMap<String, (String, u64)>,
}

impl FencedStore {
    /// A store that checks tokens.
    pub fn new() -> FencedStore {
        FencedStore {
            fenced: true,
            data: HashMap::new(),
        }
    }

    /// A store that accepts every write (what a resource without fencing does).
    pub fn unfenced() -> FencedStore {
        FencedStore::default()
    }

    /// Writes `value` under `key` on behalf of the holder of fencing token `token`.
    pub fn write(&mut self, key: &str, value: &str, token: u64) -> Result<(), Stale> {
        let highest = self.data.get(key).map_or(0, |(_, t)| *t);
        if self.fenced && token < highest {
            return Err(Stale { token, highest });
        }
        self.data.insert(key.to_owned(), (value.to_owned(), token.max(highest)));
        Ok(())
    }

    /// The value under `key`.
    pub fn read(&self, key: &str) -> Option<&str> {
        self.data.get(key).map(|(v, _)| v.as_str())
    }
}
