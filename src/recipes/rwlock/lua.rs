//! The scripts the masters run for a read-write lock: a reader's and a writer's acquisition
//! (the fenced acquisition with the lock's conflicts judged first), a reader's write-back, undo,
//! release and extension, the waiting writer's intent, and `RWLOCK.INFO`'s reading.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;

use super::Names;
use crate::keys::EPOCH_KEY;
use crate::lua::{Ordered, ScriptCall};
use crate::wire::sha1_hex;

/// What every acquisition of a read-write lock runs first (docs/recipes-quorum.md, "Read-write
/// locks"). KEYS: the writer's lock key, its fencing counter (the whole lock's), the epoch, the
/// readers' sorted set (token → expiry, Unix ms on this master's clock: a member lives while
/// its expiry is not past, as a key does), the waiting writers' intent (a key with a short
/// TTL); ARGV[1]: the token. Reads the master's clock: `t` (`TIME`), `now` (Unix ms).
macro_rules! rw_lua {
    () => {
        "local t = redis.call('time') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    };
}

/// A reader's acquisition (`rw_lua`'s KEYS; ARGV: token, TTL ms). The token's own
/// conflicts first, nothing written: it holds the write lock here (`{'writes', 0}`) or a live
/// read (`{'reads', 0}`). Refused while a live writer is here (`{its pttl}`) or a waiting
/// writer's intent (`{the intent's pttl}`): the conflict of a pair, or a writer's turn
/// (liveness only). Granted: the token added to the readers with its expiry (`now + ttl`,
/// which names this write for its undo, rule 5a), the set's TTL raised to cover it (never
/// above the TTL asked, so never past `max_ttl_ms`: rule 8a), and the lock's counter bumped
/// (F1): `{{n, expiry}, t}` as [`ACQUIRE`](crate::lua::fence::ACQUIRE)'s. One `MGET` reads the writer and the intent; the
/// readers are not read at all (expired ones are pruned by writers and releases): a read
/// costs two commands more than a lock's grant, `ZADD` and the set's `PEXPIRE`.
pub const ACQUIRE_READ: &str = concat!(
    counter_lua!(),
    rw_lua!(),
    "local wi = redis.call('mget', KEYS[1], KEYS[5]) \
     if wi[1] == ARGV[1] then return {'writes', 0} end \
     if wi[1] then return {redis.call('pttl', KEYS[1])} end \
     if wi[2] then return {math.max(redis.call('pttl', KEYS[5]), 1)} end \
     local ttl = tonumber(ARGV[2]) \
     local expiry = now + ttl \
     if redis.call('zadd', KEYS[4], 'NX', expiry, ARGV[1]) == 0 then \
       if tonumber(redis.call('zscore', KEYS[4], ARGV[1])) >= now then return {'reads', 0} end \
       redis.call('zadd', KEYS[4], expiry, ARGV[1]) \
     end \
     if redis.call('pttl', KEYS[4]) < ttl then redis.call('pexpire', KEYS[4], ttl) end \
     local n, tag = counter() \
     if n == nil then n = 0 elseif n < 0 then n = -1 else n = n + 1 store(tag, n) end \
     return {{n, expiry}, t}"
);

/// A writer's acquisition (`rw_lua`'s KEYS; ARGV: token, TTL ms, intent ms). Prunes the
/// readers whose expiry is past, then the token's own conflicts (`{'writes', 0}`, `{'reads',
/// 0}`, nothing written). Refused while a live writer (`{its pttl}`) or a live reader (`{ms
/// until the last reader here expires}`) is here; a waiting writer (intent ms > 0) then sets
/// the intent (its token, for that long), which makes this master refuse new readers until
/// it expires (renewed by the writer's next try) or is removed (liveness only: an intent
/// never admits anyone). Granted: [`ACQUIRE`](crate::lua::fence::ACQUIRE)'s write, reply and counter bump (F1) on the
/// writer's key, and the intent removed if it is this writer's.
pub const ACQUIRE_WRITE: &str = concat!(
    counter_lua!(),
    rw_lua!(),
    "redis.call('zremrangebyscore', KEYS[4], '-inf', string.format('(%d', now)) \
     local w = redis.call('get', KEYS[1]) \
     if w == ARGV[1] then return {'writes', 0} end \
     if redis.call('zscore', KEYS[4], ARGV[1]) then return {'reads', 0} end \
     local function intend() local ms = tonumber(ARGV[3]) \
       if ms > 0 then redis.call('set', KEYS[5], ARGV[1], 'PX', ms) end end \
     if w then intend() return {redis.call('pttl', KEYS[1])} end \
     local r = redis.call('zrange', KEYS[4], -1, -1, 'WITHSCORES') \
     if r[2] then intend() return {math.max(tonumber(r[2]) - now, 1)} end \
     if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {redis.call('pttl', KEYS[1])} end \
     if redis.call('get', KEYS[5]) == ARGV[1] then redis.call('del', KEYS[5]) end ",
    granted_lua!()
);

/// A reader's write-back (F2, as [`WRITE_BACK`](crate::lua::fence::WRITE_BACK)): KEYS: the writer's key, the lock's counter,
/// the epoch, the readers' set; ARGV: token, fencing token. 1 when the token is a live reader
/// here and this master now vouches for the fencing token, else 0.
pub const WRITE_BACK_READ: &str = concat!(
    counter_lua!(),
    "local t = redis.call('time') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     local s = redis.call('zscore', KEYS[4], ARGV[1]) \
     if not s or tonumber(s) < now then return 0 end \
     local n, tag = counter() \
     if n ~= nil and n < 0 then return 0 end \
     local f = tonumber(ARGV[2]) \
     if n == nil or n < f then store(tag, f) end \
     return 1"
);

static WRITE_BACK_READ_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(WRITE_BACK_READ.as_bytes()));

/// The five keys of a read-write lock's acquisition (see `rw_lua`).
fn rw_keys(names: &super::Names) -> [Bytes; 5] {
    [
        names.writer(),
        names.counter(),
        Bytes::from_static(EPOCH_KEY.as_bytes()),
        names.readers(),
        names.intents(),
    ]
}

/// See [`ACQUIRE_READ`]: `hold` is the reader's hold name ([`super::Names::reader_hold`]).
pub fn acquire_read(db: u32, hold: &Bytes, token: Bytes, ttl_ms: u128) -> ScriptCall {
    let names = super::reader(hold).map_or_else(|| super::Names::of(hold), |(names, _)| names);
    let [w, c, e, r, i] = rw_keys(&names);
    let args = [w, c, e, r, i, token, crate::wire::ttl_text(ttl_ms)];
    // Sent in full, in the connection's order, as a lock's acquisition (`ScriptCall::in_order`).
    static SCRIPT: Ordered = Ordered::new(ACQUIRE_READ, 5);
    ScriptCall::in_order(&SCRIPT, db, args).timed()
}

/// See [`ACQUIRE_WRITE`]: `writer` is the lock's writer key; `intent_ms` 0 leaves no intent
/// (a writer that does not wait).
pub fn acquire_write(db: u32, writer: &Bytes, token: Bytes, ttl_ms: u128, intent_ms: u64) -> ScriptCall {
    let names = super::split(writer).map_or_else(|| super::Names::of(writer), |(names, _)| names);
    let [w, c, e, r, i] = rw_keys(&names);
    let args = [
        w,
        c,
        e,
        r,
        i,
        token,
        crate::wire::ttl_text(ttl_ms),
        crate::wire::number(intent_ms),
    ];
    static SCRIPT: Ordered = Ordered::new(ACQUIRE_WRITE, 5);
    ScriptCall::in_order(&SCRIPT, db, args).timed()
}

/// The write-back of `fence` for the reader whose hold name is `key` (F2), checked in the
/// readers' set ([`WRITE_BACK_READ`]); a key that is no reader's hold as a lock's
/// ([`crate::lua::fence::write_back`]).
pub fn write_back_read(db: u32, key: &Bytes, token: Bytes, fence: u64) -> ScriptCall {
    match super::reader(key) {
        Some((names, _)) => {
            let [w, c, e, r, _] = rw_keys(&names);
            let args = [w, c, e, r, token, Bytes::from(fence.to_string())];
            ScriptCall::own(WRITE_BACK_READ, &WRITE_BACK_READ_SHA, db, 4, &args)
        }
        None => crate::lua::fence::write_back(db, key, token, fence),
    }
}

/// `RWLOCK.INFO` (`rw_keys`' KEYS; read-only): `{writer or nil, its pttl, counter, {reader,
/// ms left, ...}, {intent's writer, ms left} or {}}`, the counter as [`INFO`](crate::lua::fence::INFO)'s (-2 when untrusted or
/// never fenced), the sets read without their expired members.
pub const INFO_RW: &str = concat!(
    counter_lua!(),
    "local t = redis.call('time') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     local readers = {} \
     local e = redis.call('zrangebyscore', KEYS[4], now, '+inf', 'WITHSCORES') \
     for j = 1, #e, 2 do readers[#readers + 1] = e[j] readers[#readers + 1] = tonumber(e[j + 1]) - now end \
     local intent = {} \
     local i = redis.call('get', KEYS[5]) \
     if i then intent = {i, redis.call('pttl', KEYS[5])} end \
     local n = counter() \
     if n == nil or redis.call('exists', KEYS[2]) == 0 then n = -2 end \
     return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]), n, readers, intent}"
);

static INFO_RW_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(INFO_RW.as_bytes()));

/// See [`INFO_RW`].
pub fn info_rw(db: u32, names: &super::Names) -> ScriptCall {
    ScriptCall::own(INFO_RW, &INFO_RW_SHA, db, 5, &rw_keys(names))
}

/// Undoes one reader's attempt (rule 5a): removes `ARGV[1]` from the readers' set `KEYS[1]`
/// only where its expiry is `ARGV[2]`, the one this attempt wrote (an entry of the same token
/// another attempt wrote, or an extension rewrote, is not this attempt's).
const UNDO_READ: &str = "local s = redis.call('zscore', KEYS[1], ARGV[1]) \
if s and tonumber(s) == tonumber(ARGV[2]) then return redis.call('zrem', KEYS[1], ARGV[1]) end \
return 0";

static UNDO_READ_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(UNDO_READ.as_bytes()));

/// Releases `ARGV[1]`'s hold (rules 1, 6): KEYS: the writer's key, the readers' set. `{w, r}`:
/// 1 where it held the write (deleted), 1 where it was a live reader (removed; a reader whose
/// entry expired is removed too, and answers 0, as a lock's release of an expired key). A
/// reader's release also prunes the readers whose expiry is past (a reader's acquisition
/// does not read the set, so that it costs little). With ARGV[2] and ARGV[3], the release
/// announcement (channel, message) of `crate::proxy::wait` is published here where no writer
/// holds the lock afterwards, in the same step (as [`crate::recipes::reentrant::lua::GIVE_BACK`]
/// announces: a writer of another token holds it, nothing is announced).
const RELEASE_RW: &str = "local t = redis.call('time') \
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
local w = 0 \
if redis.call('get', KEYS[1]) == ARGV[1] then w = redis.call('del', KEYS[1]) end \
local r = 0 \
local s = redis.call('zscore', KEYS[2], ARGV[1]) \
if s then redis.call('zrem', KEYS[2], ARGV[1]) if tonumber(s) >= now then r = 1 end \
  redis.call('zremrangebyscore', KEYS[2], '-inf', string.format('(%d', now)) end \
if ARGV[2] and redis.call('exists', KEYS[1]) == 0 then redis.call('publish', ARGV[2], ARGV[3]) end \
return {w, r}";

static RELEASE_RW_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(RELEASE_RW.as_bytes()));

/// Extends `ARGV[1]`'s hold to `ARGV[2]` ms (rule 7 judges it): KEYS: the writer's key, the
/// readers' set. 1 where the token holds the write (its TTL set) or is a live reader (its
/// expiry moved to now + ttl, the set's TTL raised to cover it, never above the TTL asked:
/// rule 8a); else 0, nothing written (an expired reader is not brought back).
const EXTEND_RW: &str = "local t = redis.call('time') \
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
local ttl = tonumber(ARGV[2]) \
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ttl) end \
local s = redis.call('zscore', KEYS[2], ARGV[1]) \
if not s or tonumber(s) < now then return 0 end \
redis.call('zadd', KEYS[2], 'XX', now + ttl, ARGV[1]) \
if redis.call('pttl', KEYS[2]) < ttl then redis.call('pexpire', KEYS[2], ttl) end \
return 1";

static EXTEND_RW_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(EXTEND_RW.as_bytes()));

/// Removes the intent `KEYS[1]` if it is the waiting writer `ARGV[1]`'s, its own only (rule
/// 5a's spirit; an intent is liveness only).
pub(crate) const FORGET_INTENT: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

pub(crate) static FORGET_INTENT_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(FORGET_INTENT.as_bytes()));

/// The undo of a reader's attempt on one master (see [`UNDO_READ`]); `hold` is the reader's
/// hold name.
pub(crate) fn undo_read(db: u32, hold: &Bytes, token: Bytes, expiry: i64) -> ScriptCall {
    let readers = crate::recipes::rwlock::reader(hold)
        .map_or_else(|| Names::of(hold), |(names, _)| names)
        .readers();
    let mut call = ScriptCall::own(
        UNDO_READ,
        &UNDO_READ_SHA,
        db,
        1,
        &[readers, token, crate::wire::number(expiry)],
    );
    call.mark_cleanup();
    call
}

/// See [`EXTEND_RW`]: the extension of the hold `key` names (a writer's key or a reader's
/// hold).
pub(crate) fn extend_rw(db: u32, names: &Names, token: Bytes, ttl: Duration) -> ScriptCall {
    let args = [
        names.writer(),
        names.readers(),
        token,
        crate::wire::ttl_text(ttl.as_millis()),
    ];
    ScriptCall::own(EXTEND_RW, &EXTEND_RW_SHA, db, 2, &args)
}

/// See [`RELEASE_RW`]: the release of `token`'s hold of the lock `names`; with `announce`,
/// the channel and message to publish where no writer holds it afterwards.
pub(crate) fn release_rw_call(db: u32, names: &Names, token: Bytes, announce: Option<(Bytes, Bytes)>) -> ScriptCall {
    let mut args = vec![names.writer(), names.readers(), token];
    if let Some((channel, message)) = announce {
        args.extend([channel, message]);
    }
    ScriptCall::own(RELEASE_RW, &RELEASE_RW_SHA, db, 2, &args)
}
