//! The Lua side of reentrant locks (docs/recipes-quorum.md, "Reentrancy: holds as
//! identifiers"): what each master runs, atomically, when a holder takes its lock again or
//! gives one hold back.
//!
//! Beside the lock key (which holds the holder's token, exactly as for `SET NX PX`), each
//! master may keep a hash `redlock-proxy:holds:<key>`: `owner` (the token), `at` (the lock's
//! expiry, Unix ms on this master's clock, when the hash was last written) and one field per
//! extra hold, named by an identifier the proxy drew for that count-up. The lock's first hold
//! is the lock key itself. The hash counts only while it names the lock's holder and the
//! lock's current expiry: a hash left behind by an earlier lock of the same token (expired,
//! ended by its session, deleted) is ignored and replaced, never applied to a later lock.
//!
//! Rule 14: a master never decides from a count. A hold is an identifier, added or removed
//! by name; a master frees the lock only when it holds no extra identifier.

use std::sync::LazyLock;

use bytes::Bytes;

use crate::lua::{Ordered, ScriptCall};
use crate::wire::sha1_hex;

/// The prefix of the holds hashes.
pub const HOLDS_PREFIX: &str = "redlock-proxy:holds:";

/// `expiry_lua!`'s `expiry(k)` and `near(at, k)` (`crate::lua`) (whether the stamp `at` names key `k`'s
/// current expiry, within 1 ms of its bounds); `live(h, token)`: whether the holds hash `h`
/// belongs to the lock KEYS[1] held by `token` now; `stamp(h)`: records the lock's current
/// expiry in `h` and gives `h` the lock's TTL (rule 8a: it expires with it). A lock without a
/// holds hash runs no hash command (the embedded master has none: there a lock that was never
/// taken again releases and extends as before).
macro_rules! holds_lua {
    () => {
        concat!(
            expiry_lua!(),
            "local function live(h, token) \
               if redis.call('exists', h) == 0 then return false end \
               if redis.call('hget', h, 'owner') ~= token then return false end \
               return near(tonumber(redis.call('hget', h, 'at') or '0'), KEYS[1]) end \
             local function stamp(h) local lo, hi = expiry(KEYS[1]) \
               redis.call('hset', h, 'at', string.format('%d', lo + math.floor((hi - lo) / 2))) \
               redis.call('pexpire', h, redis.call('pttl', KEYS[1])) end \
             local function extras(h) local out = {} \
               for _, f in ipairs(redis.call('hkeys', h)) do if f ~= 'owner' and f ~= 'at' then out[#out+1] = f end end \
               return out end "
        )
    };
}

/// The reentrant acquisition. KEYS: the lock, its fencing counter, the epoch, the holds hash.
/// ARGV: token, TTL ms, the hold's identifier.
///
/// - Held by another token: `{pttl}`, nothing written (a refusal, as [`crate::lua::fence::ACQUIRE`]'s).
/// - Free: taken exactly as [`crate::lua::fence::ACQUIRE`] takes it (the counter bumped, F1);
///   a stale holds hash is deleted. `{{n, expiry}, time}`.
/// - Held by the token: the identifier added to the holds hash, the lock's TTL raised to TTL
///   ms (never lowered: an outer hold keeps the validity it was answered), the counter read,
///   not bumped (the lock's fencing token stays). `{{n, expiry, 'reentered'}, time}`.
pub const REENTER: &str = concat!(
    counter_lua!(),
    holds_lua!(),
    "local v = redis.call('get', KEYS[1]) \
     if v == ARGV[1] then \
       if not live(KEYS[4], ARGV[1]) then redis.call('del', KEYS[4]) end \
       if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[1], ARGV[2]) end \
       redis.call('hset', KEYS[4], 'owner', ARGV[1], ARGV[3], '1') \
       stamp(KEYS[4]) \
       local n = counter() \
       if n == nil then n = 0 elseif n < 0 then n = -1 end \
       local t = redis.call('time') \
       return {{n, t[1] * 1000 + math.floor(t[2] / 1000) + redis.call('pttl', KEYS[1]), 'reentered'}, t} \
     end \
     if v then return {redis.call('pttl', KEYS[1])} end \
     redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
     redis.call('del', KEYS[4]) ",
    granted_lua!()
);

/// Adds the hold `ARGV[2]` where the token `ARGV[1]` holds the lock (the repair of a count-up that
/// met masters where the lock was free: they hold it now, without the new hold). KEYS: the
/// lock, the holds hash. 1 when added, 0 where the token does not hold the lock.
pub const ADD_HOLD: &str = concat!(
    holds_lua!(),
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end \
     if not live(KEYS[2], ARGV[1]) then redis.call('del', KEYS[2]) end \
     redis.call('hset', KEYS[2], 'owner', ARGV[1], ARGV[2], '1') \
     stamp(KEYS[2]) \
     return 1"
);

/// Gives one hold back, first round. KEYS: the lock, the holds hash. ARGV: token, and
/// optionally a channel and a message to publish where the lock is free afterwards (the
/// release announcement of `crate::proxy::wait`: free here but held by the caller elsewhere
/// is the rare lock that never reached this master, announced all the same; held by another
/// token, not announced).
///
/// - Not held by the token here: 0.
/// - Held with extra holds: `{'holds', id...}`, nothing written (the proxy chooses which one
///   goes, [`DROP_HOLD`]).
/// - Held with none: the lock released (deleted), 1.
pub const GIVE_BACK: &str = concat!(
    holds_lua!(),
    "local v = redis.call('get', KEYS[1]) local n = 0 \
     if v == ARGV[1] then \
       if live(KEYS[2], ARGV[1]) then \
         local ids = extras(KEYS[2]) \
         if #ids > 0 then table.insert(ids, 1, 'holds') return ids end \
       end \
       redis.call('del', KEYS[1], KEYS[2]) n = 1 v = false \
     end \
     if ARGV[2] and not v then redis.call('publish', ARGV[2], ARGV[3]) end \
     return n"
);

/// [`GIVE_BACK`]'s first round for a whole set, in one step per master (`LOCK.RELEASEALL`).
/// KEYS: for each lock, the lock and its holds hash (pairs). ARGV: token, and optionally a
/// channel and then one message per lock, in the order of KEYS, each published where its
/// lock is free afterwards (the release announcement, as [`GIVE_BACK`]'s).
///
/// One answer per lock, in the order of KEYS, each [`GIVE_BACK`]'s for that lock alone: 0 (not
/// held by the token here), `{'holds', id...}` (extra holds, nothing written for that lock:
/// the proxy's second round for that lock, [`DROP_HOLD`]), or 1 (released). Each lock is
/// judged on its own key and hash (rule 5a): nothing written for one lock depends on another.
pub const GIVE_BACK_ALL: &str = concat!(
    expiry_lua!(),
    "local function live(k, h, token) \
       if redis.call('exists', h) == 0 then return false end \
       if redis.call('hget', h, 'owner') ~= token then return false end \
       return near(tonumber(redis.call('hget', h, 'at') or '0'), k) end \
     local function extras(h) local out = {} \
       for _, f in ipairs(redis.call('hkeys', h)) do if f ~= 'owner' and f ~= 'at' then out[#out+1] = f end end \
       return out end \
     local out = {} \
     for i = 1, #KEYS, 2 do \
       local k, h, j = KEYS[i], KEYS[i + 1], #out + 1 \
       local v = redis.call('get', k) local n = 0 local held = nil \
       if v == ARGV[1] then \
         if live(k, h, ARGV[1]) then \
           local ids = extras(h) \
           if #ids > 0 then table.insert(ids, 1, 'holds') held = ids end \
         end \
         if not held then redis.call('del', k, h) n = 1 v = false end \
       end \
       if ARGV[2] and not v then redis.call('publish', ARGV[2], ARGV[2 + j]) end \
       out[j] = held or n \
     end \
     return out"
);

/// Removes the hold `ARGV[2]` of token `ARGV[1]`, never the lock itself. KEYS: the lock, the
/// holds hash. Always 1: the hold is not here afterwards. Also the undo of a count-up (rule
/// 5a: it removes exactly the identifier that count-up drew).
pub const DROP_HOLD: &str = concat!(
    holds_lua!(),
    "if redis.call('get', KEYS[1]) == ARGV[1] and live(KEYS[2], ARGV[1]) then \
       redis.call('hdel', KEYS[2], ARGV[2]) \
       if #extras(KEYS[2]) == 0 then redis.call('del', KEYS[2]) end \
     end \
     return 1"
);

/// `LOCK.EXTEND` and a session's keepalive: `SET key token PX ttl` where the token holds the
/// lock, its holds hash carried along (so that no extra hold outlives, or is outlived by, its
/// lock). KEYS: the lock, the holds hash. ARGV: token, TTL ms. `OK`, or nil.
pub const EXTEND: &str = concat!(
    holds_lua!(),
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end \
     local held = live(KEYS[2], ARGV[1]) \
     local ok = redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
     if held then stamp(KEYS[2]) end \
     return ok"
);

/// `LOCK.INFO`'s holds: `{value, id...}` (the lock's value or nil, and the extra holds of the
/// holder here). KEYS: the lock, the holds hash. Read-only.
pub const HOLDS: &str = concat!(
    holds_lua!(),
    "local v = redis.call('get', KEYS[1]) \
     local out = {v} \
     if v and live(KEYS[2], v) then for _, id in ipairs(extras(KEYS[2])) do out[#out+1] = id end end \
     return out"
);

static ADD_HOLD_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(ADD_HOLD.as_bytes()));
static GIVE_BACK_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(GIVE_BACK.as_bytes()));
static GIVE_BACK_ALL_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(GIVE_BACK_ALL.as_bytes()));
static DROP_HOLD_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(DROP_HOLD.as_bytes()));
static EXTEND_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(EXTEND.as_bytes()));
static HOLDS_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(HOLDS.as_bytes()));

/// The holds hash of the lock `key`: `redlock-proxy:holds:{T}:key`, in the cluster slot of
/// `key` (`T` is its hash tag, or itself), so that a Redis Cluster member runs the scripts
/// that name both (every `LOCK.RELEASE`) on one shard.
pub fn holds_key(key: &[u8]) -> Bytes {
    crate::keys::tagged_name(HOLDS_PREFIX.as_bytes(), key, b"")
}

/// The name of a hold: its identifier in hex.
pub fn hold_name(id: u64) -> Bytes {
    Bytes::from(format!("{id:016x}"))
}

/// See [`REENTER`].
pub fn reenter(db: u32, key: &Bytes, token: Bytes, ttl_ms: u128, id: u64) -> ScriptCall {
    let counter = Bytes::from([crate::keys::COUNTER_PREFIX.as_bytes(), key].concat());
    let args = [
        key.clone(),
        counter,
        Bytes::from_static(crate::keys::EPOCH_KEY.as_bytes()),
        holds_key(key),
        token,
        crate::wire::ttl_text(ttl_ms),
        hold_name(id),
    ];
    // Sent in full, in the connection's order, as every acquisition (`ScriptCall::in_order`).
    static SCRIPT: Ordered = Ordered::new(REENTER, 4);
    ScriptCall::in_order(&SCRIPT, db, args).timed()
}

/// See [`ADD_HOLD`].
pub fn add_hold(db: u32, key: &Bytes, token: Bytes, id: u64) -> ScriptCall {
    let args = [key.clone(), holds_key(key), token, hold_name(id)];
    ScriptCall::own(ADD_HOLD, &ADD_HOLD_SHA, db, 2, &args)
}

/// See [`GIVE_BACK`]; with `announce`, the channel and message to publish.
pub fn give_back(db: u32, key: &Bytes, token: Bytes, announce: Option<(Bytes, Bytes)>) -> ScriptCall {
    let mut args = vec![key.clone(), holds_key(key), token];
    if let Some((channel, message)) = announce {
        args.extend([channel, message]);
    }
    ScriptCall::own(GIVE_BACK, &GIVE_BACK_SHA, db, 2, &args).cleanup()
}

/// See [`GIVE_BACK_ALL`]: `keys` given back at once; with `announce`, the channel and one
/// message per key.
pub fn give_back_all(db: u32, keys: &[Bytes], token: Bytes, announce: Option<(Bytes, Vec<Bytes>)>) -> ScriptCall {
    let mut args = Vec::with_capacity(2 * keys.len() + 2 + keys.len());
    for key in keys {
        args.extend([key.clone(), holds_key(key)]);
    }
    let numkeys = args.len();
    args.push(token);
    if let Some((channel, messages)) = announce {
        args.push(channel);
        args.extend(messages);
    }
    ScriptCall::own(GIVE_BACK_ALL, &GIVE_BACK_ALL_SHA, db, numkeys, &args).cleanup()
}

/// See [`DROP_HOLD`]; `hold` as [`hold_name`] made it.
pub fn drop_hold(db: u32, key: &Bytes, token: Bytes, hold: Bytes) -> ScriptCall {
    let args = [key.clone(), holds_key(key), token, hold];
    ScriptCall::own(DROP_HOLD, &DROP_HOLD_SHA, db, 2, &args).cleanup()
}

/// See [`EXTEND`].
pub fn extend(db: u32, key: &Bytes, token: Bytes, ttl_ms: u64) -> ScriptCall {
    let args = [key.clone(), holds_key(key), token, Bytes::from(ttl_ms.to_string())];
    ScriptCall::own(EXTEND, &EXTEND_SHA, db, 2, &args)
}

/// See [`HOLDS`].
pub fn holds(db: u32, key: &Bytes) -> ScriptCall {
    ScriptCall::own(HOLDS, &HOLDS_SHA, db, 2, &[key.clone(), holds_key(key)])
}
