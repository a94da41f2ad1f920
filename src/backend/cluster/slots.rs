//! Redis Cluster's hash slots: a key's slot (CRC16 of its hash tag), the one slot of a
//! command's keys, and the slot map (which shard master serves each slot), read from
//! `CLUSTER SLOTS`.

use std::sync::Arc;

use crate::backend::locate::Addr;
use crate::backend::redis::RedisBackend;
use crate::reply::Reply;

/// Redis Cluster's number of hash slots.
pub const SLOTS: usize = 16384;

/// What Redis Cluster answers a command whose keys are in different slots.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// Redis Cluster's hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key
/// when it has none, modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    crc16(crate::keys::hash_tag(key).unwrap_or(key)) % SLOTS as u16
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The one slot all `keys` hash to: `Ok(None)` for no keys, an error when they differ.
pub fn common_slot<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Option<u16>, &'static str> {
    let mut common = None;
    for key in keys {
        let s = slot(key);
        match common {
            Some(c) if c != s => return Err(CROSSSLOT),
            _ => common = Some(s),
        }
    }
    Ok(common)
}

/// One shard: its master and the slot ranges it serves.
pub(super) struct Shard {
    pub(super) addr: Addr,
    pub(super) node: Arc<RedisBackend>,
    pub(super) ranges: Vec<(u16, u16)>,
}

/// The slot map: which shard serves each slot.
#[derive(Default)]
pub(super) struct Map {
    pub(super) shards: Vec<Shard>,
    /// Per slot, the index of its shard in `shards`; `None` for a slot no master serves.
    pub(super) slots: Vec<Option<u16>>,
    /// 0 before the first map; one more for each map read since.
    pub(super) generation: u64,
}

impl Map {
    pub(super) fn shard(&self, slot: u16) -> Option<&Shard> {
        let index = (*self.slots.get(usize::from(slot))?)?;
        self.shards.get(usize::from(index))
    }

    pub(super) fn node_at(&self, addr: &Addr) -> Option<&Arc<RedisBackend>> {
        self.shards.iter().find(|s| s.addr == *addr).map(|s| &s.node)
    }
}

/// `CLUSTER SLOTS`: `[start, end, [host, port, id, ...], replicas...]` per range. An empty
/// host is the node that was asked.
pub(super) fn parse_slots(reply: &Reply, asked: &Addr) -> Result<Vec<(u16, u16, Addr)>, String> {
    let Reply::Array(ranges) = reply else {
        return Err(format!("CLUSTER SLOTS: unexpected reply {reply:?}"));
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let parsed = match range {
            Reply::Array(items) => match items.as_slice() {
                [Reply::Int(start), Reply::Int(end), Reply::Array(master), ..] => {
                    let addr = match master.as_slice() {
                        [Reply::Bulk(host), Reply::Int(port), ..] => {
                            let host = String::from_utf8_lossy(host);
                            let host = if host.is_empty() || host == "?" {
                                asked.host.clone()
                            } else {
                                host.into_owned()
                            };
                            u16::try_from(*port).ok().map(|port| Addr { host, port })
                        }
                        _ => None,
                    };
                    match (u16::try_from(*start), u16::try_from(*end), addr) {
                        (Ok(start), Ok(end), Some(addr)) if start <= end && usize::from(end) < SLOTS => {
                            Some((start, end, addr))
                        }
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        };
        out.push(parsed.ok_or_else(|| format!("CLUSTER SLOTS: unreadable range {range:?}"))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn slot_maps() {
        let asked = Addr::parse("10.0.0.9:7000").expect("addr");
        let reply = Reply::Array(vec![Reply::Array(vec![
            Reply::Int(0),
            Reply::Int(5460),
            Reply::Array(vec![Reply::Bulk(Bytes::from("")), Reply::Int(7001)]),
        ])]);
        let ranges = parse_slots(&reply, &asked).expect("parsed");
        assert_eq!(ranges, vec![(0, 5460, Addr::parse("10.0.0.9:7001").expect("addr"))]);
        assert!(parse_slots(&Reply::Nil, &asked).is_err());
    }
}
