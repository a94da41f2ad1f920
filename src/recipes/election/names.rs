//! An election's keys on the masters: its lock (the leader's key), under the reserved prefix, in
//! the cluster slot of the election's name.

use bytes::Bytes;

/// The prefix of every election's lock on the masters (under the reserved `redlock-proxy:`).
pub const PREFIX: &[u8] = b"redlock-proxy:elect:";

/// The lock key of election `name`: `redlock-proxy:elect:{T}:name`, where `T` is `name`'s own
/// Redis Cluster hash tag (or `name` itself; the SHA1 of `name` when neither can be a tag), so
/// that the lock and its fencing counter hash to the cluster slot `name` hashes to.
pub fn lock_key(name: &[u8]) -> Bytes {
    crate::keys::tagged_name(PREFIX, name, b"")
}

/// The election's name of an election's lock key; `None` for any other key.
pub fn name_of(key: &Bytes) -> Option<Bytes> {
    let rest = key.strip_prefix(PREFIX)?.strip_prefix(b"{")?;
    // The tag holds no `}` (see `lock_key`): the first one closes it.
    let close = rest.iter().position(|&b| b == b'}')?;
    let name = rest.get(close + 1..)?.strip_prefix(b":")?;
    Some(key.slice_ref(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster::slot;

    #[test]
    fn an_elections_lock_and_counter_hash_to_its_names_slot_and_name_back() {
        for name in ["leader", "app:{tenant-7}:leader", "{{a}", "a{b", "", "}", "x y"] {
            let key = lock_key(name.as_bytes());
            assert!(key.starts_with(crate::keys::OWN_PREFIX), "rule 11");
            assert_eq!(name_of(&key).as_deref(), Some(name.as_bytes()), "{name:?}");
            let counter = [&b"redlock-proxy:fence:c:"[..], &key].concat();
            assert_eq!(slot(&counter), slot(&key), "{name:?}");
            if !name.is_empty() && !name.contains('}') || name.contains("{tenant-7}") {
                assert_eq!(slot(&key), slot(name.as_bytes()), "{name:?}");
            }
        }
        assert_eq!(name_of(&Bytes::from_static(b"redlock-proxy:sem:{a}:a:0")), None);
    }
}
