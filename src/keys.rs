//! The names the proxy keeps on the masters for itself: its reserved prefix (rule 11), and
//! names that hash to the cluster slot of the user's key they belong to.

/// Rule 11: the prefix of every key the proxy keeps on the masters for itself (fencing
/// counters and epochs). No client command, `WATCH` or script `KEYS` may
/// name a key under it.
pub const OWN_PREFIX: &[u8] = b"redlock-proxy:";

/// Redis Cluster's hash tag of a key: the bytes between the first `{` and the first `}` after
/// it, when not empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// A name of the proxy's own under `prefix` for the user's key `key`, followed by `end`:
/// `<prefix>{T}:<key><end>`, where `T` is `key`'s own hash tag (or `key` itself), so that the
/// name hashes to the cluster slot `key` hashes to and a recipe's keys share one slot (its
/// scripts name them together). When `T` cannot be written as a tag (`key` empty, or with a
/// `}` outside a tag), the SHA1 of `key` in hex.
pub fn tagged_name(prefix: &[u8], key: &[u8], end: &[u8]) -> bytes::Bytes {
    let sha;
    let tag = match hash_tag(key) {
        Some(tag) => tag,
        None if !key.is_empty() && !key.contains(&b'}') => key,
        None => {
            sha = crate::wire::sha1_hex(key);
            &sha[..]
        }
    };
    [prefix, b"{", tag, b"}:", key, end].concat().into()
}

/// The epoch key of a database.
pub const EPOCH_KEY: &str = "redlock-proxy:fence:epoch";

/// The prefix of the counter keys.
pub const COUNTER_PREFIX: &str = "redlock-proxy:fence:c:";
