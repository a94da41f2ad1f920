//! The proxy's own scripts on plain keys: the owner-checked release (rule 1), the undo that
//! names one write (rule 5a), `DELEX` and `SET ... IFEQ` for masters older than Redis 8, and a
//! transaction's `EXEC` as one step.

use std::sync::LazyLock;

use bytes::Bytes;

use crate::wire::sha1_hex;

/// Rule 1: delete the key only if it still holds the caller's token. The canonical release.
pub const RELEASE: &str =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// The SHA1 of [`RELEASE`].
pub static RELEASE_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(RELEASE.as_bytes()));

/// Rule 5a: undoes one acquisition attempt on one master, and nothing else. The attempt's
/// write is named by the token *and* the expiry it gave the key, read in its own transaction
/// (or script), in Unix milliseconds on this master's clock (`ARGV[2]`; see
/// [`crate::backend::acquire`]): the key is deleted only if it holds the token and expires
/// then, within the millisecond either reading may have rounded (the expiry read here exactly,
/// or bracketed by two clock readings: `expiry_lua!` in `crate::lua`). A key written again after
/// the attempt's expired expires later: not this attempt's, kept, whatever its value. Where the
/// attempt's write shared a transaction with others, its expiry is known between two readings
/// (`ARGV[3]` the earliest, `ARGV[2]` the latest), and the key's must fall within them.
/// KEYS: the lock; ARGV: token, expiry (the latest), and the earliest where it differs.
pub const UNDO: &str = concat!(
    expiry_lua!(),
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end \
     if not near(tonumber(ARGV[2]), KEYS[1], tonumber(ARGV[3])) then return 0 end \
     return redis.call('del', KEYS[1])"
);

/// The SHA1 of [`UNDO`].
pub(crate) static UNDO_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(UNDO.as_bytes()));

/// `DELEX key [IFEQ v | IFNE v]` on a Redis 7 master: ARGV = condition (`IFEQ`, `IFNE` or
/// empty), value.
pub const DELEX: &str = "local v = redis.call('get', KEYS[1]) \
if v == false then return 0 end \
if ARGV[1] == 'IFEQ' and v ~= ARGV[2] then return 0 end \
if ARGV[1] == 'IFNE' and v == ARGV[2] then return 0 end \
return redis.call('del', KEYS[1])";

pub(crate) static DELEX_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(DELEX.as_bytes()));

/// `SET key new IFEQ old PX ms` on a Redis 7 master: ARGV = old, new, ms.
pub const SET_IFEQ: &str = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end \
return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])";

pub(crate) static SET_IFEQ_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(SET_IFEQ.as_bytes()));

/// `WATCH` + `MULTI` ... `EXEC` as one atomic step on a master. KEYS: the watched keys.
/// `ARGV[1]`: how many; then per watched key `0` (it was absent) or `1` followed by the value
/// it held at `WATCH`; then each queued command as its argument count and arguments.
/// Returns false (nil: the transaction is aborted) when a watched key changed.
pub const EXEC: &str = "local w = tonumber(ARGV[1]) \
for i = 1, w do \
  local have = redis.call('get', KEYS[i]) \
  if have == false then have = '0' else have = '1' .. have end \
  if have ~= ARGV[1 + i] then return false end \
end \
local results = {} \
local at = 2 + w \
while at <= #ARGV do \
  local argc = tonumber(ARGV[at]) \
  local cmd = {} \
  for j = 1, argc do cmd[j] = ARGV[at + j] end \
  results[#results + 1] = redis.pcall(unpack(cmd)) \
  at = at + argc + 1 \
end \
return results";

pub(crate) static EXEC_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(EXEC.as_bytes()));
