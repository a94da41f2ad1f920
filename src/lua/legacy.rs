//! What the legacy member runs (docs/migrating-from-setnx.md, "Rolling over without a stop"):
//! the single Redis that old code still locks on during a rollout. Each script touches only the
//! lock keys it is given, and leaves each in the form old code reads: the value the client
//! wrote, with a TTL, exactly as a single-instance `SET key value NX PX ttl` would.
//!
//! They are loaded on every connection to the legacy server and sent by SHA1, with the source
//! sent instead on `NOSCRIPT` (a server that restarted or flushed its scripts). Unlike a
//! master's acquisition, a take re-sent that way cannot land behind the holder's release: the
//! grant waits for the legacy server's answer (its veto), so no holder exists before the
//! re-sent take has answered; an answer after the deadline is undone as it comes (rule 5a).
//! The same holds for an extension, which its keepalive waits for.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;

use crate::lua::ScriptCall;
use crate::wire::sha1_hex;

/// Takes every key of `KEYS` for `ARGV[1]` (the token) for `ARGV[2]` ms, or none of them.
/// `ARGV[3]` is `1` for a reentrant acquisition, which may find its own token there.
///
/// - A key held by another value, or by any value when the acquisition is not reentrant:
///   nothing written, `{0, pttl}` (that key's PTTL: -1 when the old code wrote it without
///   one, as the `SETNX` pattern does). An equal value is not this acquisition's: old code
///   writing the same timestamp holds its own lock (rule 5a), and `SET NX` refuses it.
/// - Otherwise each key is written (`SET NX PX`), or, for a reentrant hold taken again where
///   the key holds its token, kept with the longer TTL; `{1, e1, e2, ...}`: per key, the
///   expiry this attempt wrote (Unix ms on this server's clock, which names the write for the
///   undo, rule 5a: [`crate::lua::own::UNDO`]), or 0 where it wrote nothing new.
///
/// `redis.replicate_commands()` first: a server older than Redis 5 refuses a write after the
/// clock reading otherwise (a no-op from 5 on).
pub const TAKE: &str = concat!(
    "if redis.replicate_commands then redis.replicate_commands() end ",
    expiry_lua!(),
    "local ttl = tonumber(ARGV[2]) \
     for _, k in ipairs(KEYS) do \
       local v = redis.call('get', k) \
       if v and (v ~= ARGV[1] or ARGV[3] ~= '1') then return {0, redis.call('pttl', k)} end \
     end \
     local wrote = {} \
     for i, k in ipairs(KEYS) do \
       if redis.call('set', k, ARGV[1], 'nx', 'px', ttl) then wrote[i] = true \
       elseif redis.call('pttl', k) < ttl then redis.call('pexpire', k, ttl) end \
     end \
     local out = {1} \
     for i, k in ipairs(KEYS) do \
       if wrote[i] then local lo = expiry(k) out[#out + 1] = lo else out[#out + 1] = 0 end \
     end \
     return out"
);

/// Extends `KEYS[1]` for `ARGV[1]` (the token) to `ARGV[2]` ms: 1 when it held the token; 2 when
/// the key was gone and is written again (rule 17: the holder's lock is valid on a majority of
/// masters, so it heals here); 0 when another value holds it (the old code took it: the
/// holder's lock is lost).
pub const EXTEND: &str = "local v = redis.call('get', KEYS[1]) \
     if v == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end \
     if v == false then redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2]) return 2 end \
     return 0";

/// Reads `KEYS[1]`: `{value, pttl}`, or `{}` when the key is absent. A key of another type
/// answers `WRONGTYPE`, which the caller reports as it is.
pub const READ: &str = "local v = redis.call('get', KEYS[1]) \
     if v == false then return {} end \
     return {v, redis.call('pttl', KEYS[1])}";

static TAKE_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(TAKE.as_bytes()));
static EXTEND_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(EXTEND.as_bytes()));
static READ_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(READ.as_bytes()));

/// The scripts loaded on every connection to the legacy server.
pub const PRELOADED: [&str; 5] = [crate::lua::own::UNDO, crate::lua::own::RELEASE, TAKE, EXTEND, READ];

/// [`TAKE`] of `keys` for `token`.
pub fn take(db: u32, keys: &[Bytes], token: Bytes, ttl: Duration, reenter: bool) -> ScriptCall {
    let mut args = keys.to_vec();
    args.extend([
        token,
        millis(ttl),
        Bytes::from_static(if reenter { b"1" } else { b"0" }),
    ]);
    ScriptCall::own(TAKE, &TAKE_SHA, db, keys.len(), &args)
}

/// [`EXTEND`] of `key` for `token`.
pub fn extend(db: u32, key: Bytes, token: Bytes, ttl: Duration) -> ScriptCall {
    ScriptCall::own(EXTEND, &EXTEND_SHA, db, 1, &[key, token, millis(ttl)])
}

/// [`READ`] of `key`: answered also by a quarantined legacy server, which votes on nothing
/// but can say what it holds (`PROXY LEGACY`, `LOCK.INFO`).
pub fn read(db: u32, key: Bytes) -> ScriptCall {
    ScriptCall::own(READ, &READ_SHA, db, 1, &[key]).inspecting()
}

fn millis(ttl: Duration) -> Bytes {
    Bytes::from(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).to_string())
}
