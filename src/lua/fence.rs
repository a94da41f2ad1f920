//! The Lua side of fencing: what each master runs, atomically, for the fenced lock commands.
//! The argument for why these steps make tokens monotonic is in `docs/fencing.md`.
//!
//! Per database, each master keeps:
//! - the lock key itself, holding the holder's token, exactly as for `SET NX PX` (so plain
//!   clients and release scripts see nothing new);
//! - a counter per lock, `redlock-proxy:fence:c:<key>`, never expiring, holding
//!   `<run_id> <n>`: the highest fencing token this master has seen for the lock, tagged with
//!   the run of the master process that vouches for it;
//! - an epoch, `redlock-proxy:fence:epoch`, holding `g <run_id>` (genesis: this master has had
//!   every counter since fencing began, so a missing counter means 0) or `r <run_id>`
//!   (rejoined after losing data: a counter counts only once a write-back of this run set it).
//!
//! A counter is *trusted* when it carries the epoch's run id, or is missing under a genesis
//! epoch. A master with no epoch, or with an untrusted counter, still votes on the lock but
//! not on its token.

use std::sync::LazyLock;

use bytes::Bytes;

use crate::keys::{COUNTER_PREFIX, EPOCH_KEY};
use crate::lua::{Ordered, ScriptCall};
use crate::wire::sha1_hex;

/// `trusted(epoch, counter)`: `-1` with no (or a malformed) epoch, `nil` when the counter is
/// not trusted, else its value; and the epoch's run id. `counter()` applies it to KEYS[3] (the
/// epoch) and KEYS[2] (the counter); `store` writes KEYS[2]. Shared by every script below.
macro_rules! counter_lua {
    () => {
        "local function trusted(e, v) \
           if not e then return -1, nil end \
           local kind, tag, base = string.match(e, '^(%a) (%S+) ?(%d*)$') \
           if not kind then return -1, nil end \
           if v then \
             local sep = string.find(v, ' ', 1, true) \
             if sep and string.sub(v, 1, sep - 1) == tag then return tonumber(string.sub(v, sep + 1)), tag end \
           end \
           if kind == 'g' then return tonumber(base) or 0, tag end \
           return nil, tag \
         end \
         local function counter() return trusted(redis.call('get', KEYS[3]), redis.call('get', KEYS[2])) end \
         local function store(tag, n) redis.call('set', KEYS[2], tag .. ' ' .. string.format('%d', n)) end "
    };
}

/// The end of a fenced grant, once the lock key KEYS[1] is written: the counter bump (F1) and
/// the reply `{{n, expiry}, t}` of [`ACQUIRE`]. Shared with [`ACQUIRE_SLOT`], so that a
/// semaphore's slot is fenced exactly as a lock is.
macro_rules! granted_lua {
    () => {
        "local n, tag = counter() \
     if n == nil then n = 0 elseif n < 0 then n = -1 else n = n + 1 store(tag, n) end \
     local t = redis.call('time') \
     local expiry = t[1] * 1000 + math.floor(t[2] / 1000) + redis.call('pttl', KEYS[1]) \
     return {{n, expiry}, t}"
    };
}

/// Acquire with a token. ARGV: holder token, TTL ms. Refused: `{pttl}` of the lock here.
/// Granted: `{{n, expiry}, {seconds, microseconds}}`: the bumped counter `n` (≥ 1; 0 when this
/// master's counter is untrusted, -1 when it has no epoch), the key's expiry in Unix ms on
/// this master's clock, which names this write for its undo (rule 5a, as the plain
/// acquisition's: [`crate::backend::acquire`]), and the clock read after the write (rule 15).
pub const ACQUIRE: &str = concat!(
    counter_lua!(),
    "if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {redis.call('pttl', KEYS[1])} end ",
    granted_lua!()
);

/// A new token for the current holder (`LOCK.FENCE`). ARGV: holder token. Not the holder:
/// nil. Else `{counter, pttl}` with the counter bumped as in [`ACQUIRE`].
pub const BUMP: &str = concat!(
    counter_lua!(),
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end \
     local ttl = redis.call('pttl', KEYS[1]) \
     local n, tag = counter() \
     if n == nil then return {0, ttl} end \
     if n < 0 then return {-1, ttl} end \
     n = n + 1 \
     store(tag, n) \
     return {n, ttl}"
);

/// The write-back: raise the counter to the granted token, if `ARGV[1]` still holds the lock
/// here and the master has an epoch. 1 when this master now vouches for the token, else 0.
/// On a rejoined master this is what makes the counter trusted again: the token written is
/// above every token granted before it.
pub const WRITE_BACK: &str = concat!(
    counter_lua!(),
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end \
     local n, tag = counter() \
     if n ~= nil and n < 0 then return 0 end \
     local t = tonumber(ARGV[2]) \
     if n == nil or n < t then store(tag, t) end \
     return 1"
);

/// `LOCK.INFO`: `{value or nil, pttl, counter}` with the counter as in [`ACQUIRE`]; -2 when
/// untrusted, or when the lock was never fenced here (a genesis base is not a token).
pub const INFO: &str = concat!(
    counter_lua!(),
    "local n = counter() \
     if n == nil or redis.call('exists', KEYS[2]) == 0 then n = -2 end \
     return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]), n}"
);

/// Repair, reading: `KEYS[1]` is the epoch, the others counters. For each counter: its trusted
/// value, -1 (no epoch) or -2 (not trusted).
pub const READ: &str = concat!(
    counter_lua!(),
    "local e = redis.call('get', KEYS[1]) \
     local out = {} \
     for i = 2, #KEYS do \
       local n = trusted(e, redis.call('get', KEYS[i])) \
       if n == nil then n = -2 end \
       out[#out + 1] = n \
     end \
     return out"
);

/// Repair, writing on a rejoined master: `KEYS[1]` is the epoch, the others counters; `ARGV[1]`
/// the epoch the repair started from (nothing is done if it changed: the master restarted
/// again), then one value per counter, then a genesis base or `''`. Raises each counter to
/// its value; with a base, promotes the epoch to a genesis (every counter repaired).
pub const REPAIR: &str = concat!(
    counter_lua!(),
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end \
     local tag = string.match(ARGV[1], '^%a (%S+)') \
     for i = 2, #KEYS do \
       local t = tonumber(ARGV[i]) \
       local n = trusted(ARGV[1], redis.call('get', KEYS[i])) \
       if n == nil or n < t then redis.call('set', KEYS[i], tag .. ' ' .. string.format('%d', t)) end \
     end \
     local base = ARGV[#KEYS + 1] \
     if base ~= '' then redis.call('set', KEYS[1], 'g ' .. tag .. ' ' .. base) end \
     return 1"
);

/// Gives a master with no epoch one. `KEYS[1]`: the epoch key; ARGV: the kind (`g` or `r`),
/// the master's run id, and for a genesis ` <base>`. Never replaces an existing epoch.
pub const SET_EPOCH: &str = "return redis.call('set', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ARGV[3], 'NX')";

/// Run on every new connection (by the backend, which knows the master's run id, `ARGV[1]`):
/// an epoch of another run means the master restarted and restored its data from a snapshot,
/// which may be older than the last write-backs; its counters are then no longer trusted.
/// Returns 0 (no epoch), 1 (current) or 2 (demoted to a rejoin).
pub const CHECK_EPOCH: &str = "local e = redis.call('get', KEYS[1]) \
if not e then return 0 end \
if string.match(e, '^%a (%S+)') == ARGV[1] then return 1 end \
redis.call('set', KEYS[1], 'r ' .. ARGV[1]) \
return 2";

static BUMP_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(BUMP.as_bytes()));
static WRITE_BACK_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(WRITE_BACK.as_bytes()));
static INFO_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(INFO.as_bytes()));
static SET_EPOCH_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(SET_EPOCH.as_bytes()));
static READ_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(READ.as_bytes()));
static REPAIR_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(REPAIR.as_bytes()));

/// The lock key, its counter and the epoch key.
pub(crate) fn keys(key: &Bytes) -> [Bytes; 3] {
    let counter = [COUNTER_PREFIX.as_bytes(), key].concat();
    [
        key.clone(),
        Bytes::from(counter),
        Bytes::from_static(EPOCH_KEY.as_bytes()),
    ]
}

fn with_args(key: &Bytes, args: impl IntoIterator<Item = Bytes>) -> Vec<Bytes> {
    let mut all = keys(key).to_vec();
    all.extend(args);
    all
}

/// See [`ACQUIRE`].
pub fn acquire(db: u32, key: &Bytes, token: Bytes, ttl_ms: u128) -> ScriptCall {
    let [key, counter, epoch] = keys(key);
    let args = [key, counter, epoch, token, crate::wire::ttl_text(ttl_ms)];
    // Sent in full, in the connection's order (see `ScriptCall::in_order`).
    static SCRIPT: Ordered = Ordered::new(ACQUIRE, 3);
    ScriptCall::in_order(&SCRIPT, db, args).timed()
}

/// See [`BUMP`].
pub fn bump(db: u32, key: &Bytes, token: Bytes) -> ScriptCall {
    ScriptCall::own(BUMP, &BUMP_SHA, db, 3, &with_args(key, [token]))
}

/// See [`WRITE_BACK`].
pub fn write_back(db: u32, key: &Bytes, token: Bytes, fence: u64) -> ScriptCall {
    ScriptCall::own(
        WRITE_BACK,
        &WRITE_BACK_SHA,
        db,
        3,
        &with_args(key, [token, Bytes::from(fence.to_string())]),
    )
}

/// See [`INFO`].
pub fn info(db: u32, key: &Bytes) -> ScriptCall {
    ScriptCall::own(INFO, &INFO_SHA, db, 3, &keys(key))
}

/// See [`SET_EPOCH`]: a genesis with its base, or a rejoin (`None`).
pub fn set_epoch(db: u32, genesis: Option<u64>, run_id: &str) -> ScriptCall {
    let (kind, base) = match genesis {
        Some(base) => (Bytes::from_static(b"g"), Bytes::from(format!(" {base}"))),
        None => (Bytes::from_static(b"r"), Bytes::new()),
    };
    let args = [
        Bytes::from_static(EPOCH_KEY.as_bytes()),
        kind,
        Bytes::from(run_id.to_owned()),
        base,
    ];
    ScriptCall::own(SET_EPOCH, &SET_EPOCH_SHA, db, 1, &args)
}

/// See [`READ`]: the trusted values of these counter keys.
pub fn read(db: u32, counters: &[Bytes]) -> ScriptCall {
    let mut keys = vec![Bytes::from_static(EPOCH_KEY.as_bytes())];
    keys.extend_from_slice(counters);
    ScriptCall::own(READ, &READ_SHA, db, keys.len(), &keys)
}

/// See [`REPAIR`].
pub fn repair(db: u32, epoch: &Bytes, counters: &[(Bytes, u64)], promote: Option<u64>) -> ScriptCall {
    let mut args = vec![Bytes::from_static(EPOCH_KEY.as_bytes())];
    args.extend(counters.iter().map(|(key, _)| key.clone()));
    let numkeys = args.len();
    args.push(epoch.clone());
    args.extend(counters.iter().map(|(_, value)| Bytes::from(value.to_string())));
    args.push(promote.map_or_else(Bytes::new, |base| Bytes::from(base.to_string())));
    ScriptCall::own(REPAIR, &REPAIR_SHA, db, numkeys, &args)
}

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
/// (F1): `{{n, expiry}, t}` as [`ACQUIRE`]'s. One `MGET` reads the writer and the intent; the
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
/// never admits anyone). Granted: [`ACQUIRE`]'s write, reply and counter bump (F1) on the
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

/// A reader's write-back (F2, as [`WRITE_BACK`]): KEYS: the writer's key, the lock's counter,
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
fn rw_keys(names: &crate::recipes::rwlock::Names) -> [Bytes; 5] {
    [
        names.writer(),
        names.counter(),
        Bytes::from_static(EPOCH_KEY.as_bytes()),
        names.readers(),
        names.intents(),
    ]
}

/// See [`ACQUIRE_READ`]: `hold` is the reader's hold name ([`crate::recipes::rwlock::Names::reader_hold`]).
pub fn acquire_read(db: u32, hold: &Bytes, token: Bytes, ttl_ms: u128) -> ScriptCall {
    let names = crate::recipes::rwlock::reader(hold)
        .map_or_else(|| crate::recipes::rwlock::Names::of(hold), |(names, _)| names);
    let [w, c, e, r, i] = rw_keys(&names);
    let args = [w, c, e, r, i, token, crate::wire::ttl_text(ttl_ms)];
    // Sent in full, in the connection's order, as a lock's acquisition (`ScriptCall::in_order`).
    static SCRIPT: Ordered = Ordered::new(ACQUIRE_READ, 5);
    ScriptCall::in_order(&SCRIPT, db, args).timed()
}

/// See [`ACQUIRE_WRITE`]: `writer` is the lock's writer key; `intent_ms` 0 leaves no intent
/// (a writer that does not wait).
pub fn acquire_write(db: u32, writer: &Bytes, token: Bytes, ttl_ms: u128, intent_ms: u64) -> ScriptCall {
    let names = crate::recipes::rwlock::split(writer)
        .map_or_else(|| crate::recipes::rwlock::Names::of(writer), |(names, _)| names);
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

/// The write-back of `fence` for the holder of `key` (F2): a reader's hold checked in the
/// readers' set ([`WRITE_BACK_READ`]), any other key as a lock's ([`WRITE_BACK`]).
pub fn write_back_of(db: u32, key: &Bytes, token: Bytes, fence: u64) -> ScriptCall {
    match crate::recipes::rwlock::reader(key) {
        Some((names, _)) => {
            let [w, c, e, r, _] = rw_keys(&names);
            let args = [w, c, e, r, token, Bytes::from(fence.to_string())];
            ScriptCall::own(WRITE_BACK_READ, &WRITE_BACK_READ_SHA, db, 4, &args)
        }
        None => write_back(db, key, token, fence),
    }
}

/// `RWLOCK.INFO` (`rw_keys`' KEYS; read-only): `{writer or nil, its pttl, counter, {reader,
/// ms left, ...}, {intent's writer, ms left} or {}}`, the counter as [`INFO`]'s (-2 when untrusted or
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
pub fn info_rw(db: u32, names: &crate::recipes::rwlock::Names) -> ScriptCall {
    ScriptCall::own(INFO_RW, &INFO_RW_SHA, db, 5, &rw_keys(names))
}
