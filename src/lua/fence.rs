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
