//! The scripts the masters run for a semaphore: taking one slot (the fenced acquisition with
//! the semaphore's conflicts checked first), and reading which slot a token holds and who holds
//! which.

use std::sync::LazyLock;

use bytes::Bytes;

use crate::lua::{Ordered, ScriptCall};
use crate::wire::sha1_hex;

/// Takes slot `ARGV[5]` of a semaphore of `ARGV[3]` permits (docs/recipes-quorum.md, "k mutex
/// slots"): [`ACQUIRE`](crate::lua::fence::ACQUIRE) on the slot's key, with two conflicts checked first, each a pair that
/// two majorities decide (rule 14: nothing here counts holders). KEYS: the slot, its counter,
/// the epoch, the semaphore's permits key. ARGV: token, TTL ms, permits, the base name of the
/// slots (slot `j` is the base followed by `j`; same hash tag, so the same cluster slot), the
/// slot's index.
///
/// - Another count: the permits key holds another number and a slot below it is live here:
///   `{'permits', n}`, nothing written. (With no live slot the old count is stale: this
///   acquisition's count replaces it when it writes.)
/// - The token already holds slot `j` here: `{'holds', j}`, nothing written: a token holds
///   one slot of a semaphore at most.
/// - The slot is held: `{pttl, j1, pttl1, j2, pttl2, ...}`, the slot's PTTL and every live
///   slot of the semaphore here with its PTTL (an odd length: never read as a grant or as a
///   clock reading), for the proxy to choose the next slot and to time a waiter's next try.
/// - Granted: as [`ACQUIRE`](crate::lua::fence::ACQUIRE), the permits key set to this count when it held another.
///
/// One `MGET` reads every slot: a free slot costs one command more than a lock's grant.
pub const ACQUIRE_SLOT: &str = concat!(
    counter_lua!(),
    "local k = tonumber(ARGV[3]) \
     local function slots(a, b) local t = {} for j = a, b do t[#t+1] = ARGV[4]..j end return redis.call('mget', unpack(t)) end \
     local live = slots(0, k-1) \
     local m = redis.call('get', KEYS[4]) \
     if m and m ~= ARGV[3] then \
       local n, held = tonumber(m) or 0, false \
       for j = 1, math.min(k, n) do held = held or live[j] end \
       if not held and n > k then for _, v in ipairs(slots(k, n-1)) do held = held or v end end \
       if held then return {'permits', n} end \
     end \
     for j = 1, k do if live[j] == ARGV[1] then return {'holds', j-1} end end \
     if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
       local out = {redis.call('pttl', KEYS[1])} \
       for j = 1, k do if live[j] then out[#out+1] = j-1 out[#out+1] = redis.call('pttl', ARGV[4]..(j-1)) end end \
       return out \
     end \
     if m ~= ARGV[3] then redis.call('set', KEYS[4], ARGV[3]) end ",
    granted_lua!()
);

/// See [`ACQUIRE_SLOT`]: the semaphore slot whose key is `key` (a name made by
/// [`crate::recipes::semaphore::Names::slot`]: the semaphore's base name followed by the slot's index),
/// for a semaphore of `permits`. A key that is no slot's (never made) is taken as a semaphore
/// based on itself with an empty index: its script finds no slot of it live, and takes `key`.
pub fn acquire_slot(db: u32, key: &Bytes, token: Bytes, ttl_ms: u128, permits: u32) -> ScriptCall {
    let base = super::split_slot(key).map_or(&key[..], |(base, _)| base);
    let (names_base, index) = (key.slice_ref(base), key.slice(base.len()..));
    let permits_key = super::permits_key(base);
    let [key, counter, epoch] = crate::lua::fence::keys(key);
    let args = [
        key,
        counter,
        epoch,
        permits_key,
        token,
        crate::wire::ttl_text(ttl_ms),
        crate::wire::number(permits),
        names_base,
        index,
    ];
    // Sent in full, in the connection's order, as a lock's acquisition (`ScriptCall::in_order`).
    static SCRIPT: Ordered = Ordered::new(ACQUIRE_SLOT, 4);
    ScriptCall::in_order(&SCRIPT, db, args).timed()
}

/// The slot `ARGV[2]` holds among the semaphore's slots named `ARGV[1]` + index, as many as
/// its permits key (`KEYS[1]`) says; -1 when none. Read-only.
pub(crate) const FIND: &str = "local k = tonumber(redis.call('get', KEYS[1])) or 0 \
if k < 1 then return -1 end \
local names = {} for j = 0, k - 1 do names[#names + 1] = ARGV[1] .. j end \
local live = redis.call('mget', unpack(names)) \
for j = 1, k do if live[j] == ARGV[2] then return j - 1 end end \
return -1";

pub(crate) static FIND_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(FIND.as_bytes()));

/// The semaphore's count (`KEYS[1]`) and each live slot as `j, token, pttl`: `{k, j1, v1,
/// pttl1, ...}`, or `{-1}` when the count was never written here. Read-only.
pub(crate) const INFO: &str = "local k = tonumber(redis.call('get', KEYS[1])) \
if not k then return {-1} end \
local out = {k} \
for j = 0, k - 1 do \
  local v = redis.call('get', ARGV[1] .. j) \
  if v then out[#out + 1] = j out[#out + 1] = v out[#out + 1] = redis.call('pttl', ARGV[1] .. j) end \
end \
return out";

pub(crate) static INFO_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(INFO.as_bytes()));
