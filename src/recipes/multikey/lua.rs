//! The Lua side of several locks at once (`LOCK.ACQUIREALL`, docs/recipes-quorum.md, "Several
//! locks at once"): what each master runs, atomically, to take a whole set of locks or none.
//!
//! Each key of the set is an ordinary fenced lock afterwards: the lock key holds the holder's
//! token exactly as `SET NX PX` writes it, and its fencing counter is the key's own
//! (`redlock-proxy:fence:c:<key>`, [`crate::lua::fence`]), bumped as a single lock's
//! acquisition bumps it (F1 of docs/fencing.md, per key).

use std::sync::LazyLock;

use bytes::Bytes;

use crate::lua::ScriptCall;
use crate::wire::sha1_hex;

/// The most keys one request may name: each is a key and a counter of one script, and the
/// whole set is read and written in one script per master.
pub const MAX_KEYS: usize = 64;

/// Takes every lock of the set, or none. KEYS: the fencing epoch, then for each lock its key
/// and its counter (pairs). ARGV: holder token, TTL ms.
///
/// The pairs are taken in one order, the keys' byte order, sorted here (whatever order the
/// proxy sent them in); two equal keys are an error before anything is written.
///
/// - A key of the set is held (by anyone, the token too): `{pttl}`, nothing written, with
///   the PTTL of the held key that lives longest here (-1 when one has no TTL): when the
///   whole set can be free here at the latest. The shape of a single lock's refusal.
/// - All free: each key set to the token with the TTL, each counter bumped as
///   [`crate::lua::fence::ACQUIRE`] bumps it; `{{'all', expiry, n1, ..., nk}, time}`: the
///   keys' expiry in Unix ms on this master's clock (the same for all: one TTL, one script),
///   which names this write for its undo (rule 5a), and each key's counter in the order of
///   KEYS (≥ 1; 0 when untrusted, -1 without an epoch, F3).
pub const ACQUIRE_ALL: &str = concat!(
    counter_lua!(),
    "local order = {} \
     for i = 2, #KEYS, 2 do order[#order+1] = i end \
     table.sort(order, function(a, b) return KEYS[a] < KEYS[b] end) \
     for j = 2, #order do \
       if KEYS[order[j]] == KEYS[order[j-1]] then return redis.error_reply('ERR duplicate key in one request') end \
     end \
     local worst = nil \
     for _, i in ipairs(order) do \
       if redis.call('exists', KEYS[i]) == 1 then \
         local p = redis.call('pttl', KEYS[i]) \
         if p < 0 or worst == -1 then worst = -1 elseif worst == nil or p > worst then worst = p end \
       end \
     end \
     if worst ~= nil then return {worst} end \
     for _, i in ipairs(order) do redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) end \
     local e = redis.call('get', KEYS[1]) \
     local t = redis.call('time') \
     local out = {'all', t[1] * 1000 + math.floor(t[2] / 1000) + redis.call('pttl', KEYS[order[1]])} \
     for i = 2, #KEYS, 2 do \
       local n, tag = trusted(e, redis.call('get', KEYS[i+1])) \
       if n == nil then n = 0 elseif n < 0 then n = -1 else \
         n = n + 1 redis.call('set', KEYS[i+1], tag .. ' ' .. string.format('%d', n)) end \
       out[#out+1] = n \
     end \
     return {out, t}"
);

/// Rule 5a for a set: deletes each key of KEYS that holds the token `ARGV[1]` and expires at
/// `ARGV[2]` (Unix ms on this master's clock, as the attempt's grant read it here, within 1 ms),
/// and no other: a key another acquisition wrote, even with an equal token, expires at another
/// moment. Returns how many it deleted.
pub const UNDO_ALL: &str = "local t = redis.call('time') \
local now = t[1] * 1000 + math.floor(t[2] / 1000) \
local n = 0 \
for _, k in ipairs(KEYS) do \
  if redis.call('get', k) == ARGV[1] and math.abs(now + redis.call('pttl', k) - tonumber(ARGV[2])) <= 1 then \
    n = n + redis.call('del', k) \
  end \
end \
return n";

static UNDO_ALL_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(UNDO_ALL.as_bytes()));

/// See [`ACQUIRE_ALL`]: the set `keys` (sorted, no two equal: the proxy's checks), sent in
/// full and in the connection's order, as every acquisition (`ScriptCall::in_order`).
pub fn acquire_all(db: u32, keys: &[Bytes], token: Bytes, ttl_ms: u128) -> ScriptCall {
    let mut args = Vec::with_capacity(3 + 2 * keys.len());
    args.push(Bytes::from_static(crate::keys::EPOCH_KEY.as_bytes()));
    for key in keys {
        args.push(key.clone());
        args.push(Bytes::from([crate::keys::COUNTER_PREFIX.as_bytes(), key].concat()));
    }
    let numkeys = args.len();
    args.extend([token, crate::wire::ttl_text(ttl_ms)]);
    ScriptCall::eval_in_order(ACQUIRE_ALL, db, numkeys, args).timed()
}

/// See [`UNDO_ALL`]: a cleanup request, as a single lock's undo.
pub fn undo_all(db: u32, keys: &[Bytes], token: Bytes, expiry: i64) -> ScriptCall {
    let mut args = keys.to_vec();
    args.extend([token, crate::wire::number(expiry)]);
    ScriptCall::own(UNDO_ALL, &UNDO_ALL_SHA, db, keys.len(), &args).cleanup()
}
