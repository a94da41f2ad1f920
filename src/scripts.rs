//! Lua scripts: the proxy's own (the owner-checked release of rule 1), and the registry of
//! clients' scripts by SHA1, so that `EVALSHA` works on a master that lost its script cache.

use std::sync::LazyLock;

use bytes::Bytes;
use dashmap::DashMap;

use crate::backend::{Backend, BackendError, Request};
use crate::reply::Reply;

/// Rule 1: delete the key only if it still holds the caller's token. The canonical release.
pub const RELEASE: &str =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// The SHA1 of [`RELEASE`].
pub static RELEASE_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(RELEASE.as_bytes()));

/// `DELEX key [IFEQ v | IFNE v]` on a Redis 7 master: ARGV = condition (`IFEQ`, `IFNE` or
/// empty), value.
pub const DELEX: &str = "local v = redis.call('get', KEYS[1]) \
if v == false then return 0 end \
if ARGV[1] == 'IFEQ' and v ~= ARGV[2] then return 0 end \
if ARGV[1] == 'IFNE' and v == ARGV[2] then return 0 end \
return redis.call('del', KEYS[1])";

static DELEX_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(DELEX.as_bytes()));

/// `SET key new IFEQ old PX ms` on a Redis 7 master: ARGV = old, new, ms.
pub const SET_IFEQ: &str = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end \
return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])";

static SET_IFEQ_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(SET_IFEQ.as_bytes()));

/// `WATCH` + `MULTI` ... `EXEC` as one atomic step on a master. KEYS: the watched keys.
/// ARGV[1]: how many; then per watched key `0` (it was absent) or `1` followed by the value
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

static EXEC_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(EXEC.as_bytes()));

/// The lower-case hex SHA1 of a script, as Redis names scripts.
pub fn sha1_hex(body: &[u8]) -> Bytes {
    Bytes::from(sha1_smol::Sha1::from(body).hexdigest())
}

/// A script as the proxy keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    /// The client's source.
    pub body: Bytes,
    /// For a script that sets a TTL: the same script wrapped to also return the smallest
    /// PTTL of its keys (`{result, pttl}`), so the proxy can check the new validity (rule 7).
    pub ttl_probe: Option<(Bytes, Bytes)>,
}

impl Script {
    /// Keeps `body`, and builds its TTL probe when it sets a TTL.
    fn new(body: Bytes) -> Script {
        let ttl_probe = sets_ttl(&body).then(|| {
            let wrapped = ttl_probe(&body);
            (sha1_hex(&wrapped), wrapped)
        });
        Script { body, ttl_probe }
    }
}

/// Whether a script sets a TTL: it calls `PEXPIRE`/`EXPIRE` or passes `PX` to `SET`. That is
/// how the proxy tells extension (and scripted acquisition) scripts from the others.
pub fn sets_ttl(body: &[u8]) -> bool {
    let lower = body.to_ascii_lowercase();
    let has = |needle: &[u8]| lower.windows(needle.len()).any(|w| w == needle);
    has(b"expire") || has(b"\"px\"") || has(b"'px'")
}

/// Wraps a script so it returns `{its result, the smallest pttl of KEYS}`. The client's code
/// starts on the first line, so its error messages keep their line numbers.
fn ttl_probe(body: &[u8]) -> Bytes {
    let mut wrapped = b"local __rp_result = (function() ".to_vec();
    wrapped.extend_from_slice(body);
    wrapped.extend_from_slice(
        b"\nend)()\n\
if __rp_result == nil then __rp_result = false end\n\
local __rp_ttl = -2\n\
for __rp_i, __rp_key in ipairs(KEYS) do\n\
  local t = redis.call('pttl', __rp_key)\n\
  if __rp_i == 1 or t < __rp_ttl then __rp_ttl = t end\n\
end\n\
return {__rp_result, __rp_ttl}\n",
    );
    Bytes::from(wrapped)
}

/// SHA1 → every script a client ran or loaded through this proxy.
#[derive(Debug, Default)]
pub struct Registry {
    scripts: DashMap<Bytes, Script>,
}

impl Registry {
    /// Remembers a script; returns its SHA1.
    pub fn insert(&self, body: Bytes) -> Bytes {
        let sha = sha1_hex(&body);
        if !self.scripts.contains_key(&sha) {
            self.scripts.insert(sha.clone(), Script::new(body));
        }
        sha
    }

    /// The script, if this proxy has seen it.
    pub fn get(&self, sha: &[u8]) -> Option<Script> {
        self.scripts.get(sha).map(|s| s.clone())
    }

    /// Whether this proxy has seen the script.
    pub fn contains(&self, sha: &[u8]) -> bool {
        self.scripts.contains_key(sha)
    }

    /// Forgets every script (`SCRIPT FLUSH`).
    pub fn clear(&self) {
        self.scripts.clear();
    }
}

/// A script run on one master: by SHA1 first, and by source when the master answers
/// `NOSCRIPT` (it restarted, or never saw the script) and the proxy knows the source.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptCall {
    by_sha: Request,
    by_body: Option<Request>,
}

impl ScriptCall {
    /// `EVALSHA sha numkeys keys_and_args...`, falling back to `EVAL body ...` when `body` is known.
    pub fn new(db: u32, sha: Bytes, body: Option<Bytes>, numkeys: usize, keys_and_args: &[Bytes]) -> ScriptCall {
        let request = |name: &'static str, script: Bytes| {
            let mut args = Vec::with_capacity(keys_and_args.len() + 3);
            args.push(Bytes::from_static(name.as_bytes()));
            args.push(script);
            args.push(Bytes::from(numkeys.to_string()));
            args.extend_from_slice(keys_and_args);
            Request::new(db, args)
        };
        ScriptCall {
            by_sha: request("EVALSHA", sha),
            by_body: body.map(|b| request("EVAL", b)),
        }
    }

    /// Rule 1's release of `key` if it still holds `token`: a cleanup request, sent also to
    /// masters marked down (see [`Request::cleanup`]).
    pub fn release(db: u32, key: Bytes, token: Bytes) -> ScriptCall {
        let mut call = Self::own(RELEASE, &RELEASE_SHA, db, 1, &[key, token]);
        call.by_sha.cleanup = true;
        if let Some(by_body) = &mut call.by_body {
            by_body.cleanup = true;
        }
        call
    }

    /// `DELEX key [condition value]`.
    pub fn delex(db: u32, key: Bytes, condition: &'static str, value: Bytes) -> ScriptCall {
        Self::own(
            DELEX,
            &DELEX_SHA,
            db,
            1,
            &[key, Bytes::from_static(condition.as_bytes()), value],
        )
    }

    /// `SET key new IFEQ old PX ttl_ms`.
    pub fn set_ifeq(db: u32, key: Bytes, old: Bytes, new: Bytes, ttl_ms: u64) -> ScriptCall {
        Self::own(
            SET_IFEQ,
            &SET_IFEQ_SHA,
            db,
            1,
            &[key, old, new, Bytes::from(ttl_ms.to_string())],
        )
    }

    /// A transaction: `watched` keys with the value each held at `WATCH` (`None`: absent),
    /// then the queued commands, as one atomic script.
    pub fn exec(db: u32, watched: &[(Bytes, Option<Bytes>)], queued: &[Vec<Bytes>]) -> ScriptCall {
        let mut keys_and_args: Vec<Bytes> = watched.iter().map(|(k, _)| k.clone()).collect();
        keys_and_args.push(Bytes::from(watched.len().to_string()));
        for (_, value) in watched {
            keys_and_args.push(match value {
                None => Bytes::from_static(b"0"),
                Some(v) => Bytes::from([&b"1"[..], v].concat()),
            });
        }
        for command in queued {
            keys_and_args.push(Bytes::from(command.len().to_string()));
            keys_and_args.extend(command.iter().cloned());
        }
        Self::own(EXEC, &EXEC_SHA, db, watched.len(), &keys_and_args)
    }

    /// One of the proxy's own scripts.
    pub(crate) fn own(
        body: &'static str,
        sha: &LazyLock<Bytes>,
        db: u32,
        numkeys: usize,
        keys_and_args: &[Bytes],
    ) -> ScriptCall {
        let body = Bytes::from_static(body.as_bytes());
        ScriptCall::new(db, (**sha).clone(), Some(body), numkeys, keys_and_args)
    }

    /// Runs the script on one master.
    pub async fn run<B: Backend>(&self, backend: &B) -> Result<Reply, BackendError> {
        let reply = backend.call(&self.by_sha).await?;
        match &self.by_body {
            Some(eval) if reply.is_error_code("NOSCRIPT") => backend.call(eval).await,
            _ => Ok(reply),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_setting_scripts_are_recognised() {
        // redis-py extend, redsync touch, node-redlock acquire: probed.
        assert!(sets_ttl(b"redis.call('pexpire', KEYS[1], newttl)"));
        assert!(sets_ttl(b"return redis.call(\"PEXPIRE\", KEYS[1], ARGV[2])"));
        assert!(sets_ttl(b"redis.call(\"set\", key, ARGV[1], \"PX\", ARGV[2])"));
        // Releases and pttl readers: combined by the generic rule.
        assert!(!sets_ttl(RELEASE.as_bytes()));
        assert!(!sets_ttl(b"return redis.call('pttl', KEYS[1])"));
    }

    #[test]
    fn probe_keeps_the_first_line() {
        let probe = ttl_probe(b"return 1");
        assert!(probe.starts_with(b"local __rp_result = (function() return 1\nend)()"));
    }

    #[test]
    fn sha1_matches_redis() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this SHA1.
        assert_eq!(&sha1_hex(b"return 1")[..], b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
    }

    #[test]
    fn registry_round_trip() {
        let r = Registry::default();
        let sha = r.insert(Bytes::from_static(b"return 1"));
        assert!(r.contains(&sha));
        assert_eq!(r.get(&sha).map(|s| s.body), Some(Bytes::from_static(b"return 1")));
        r.clear();
        assert!(!r.contains(&sha));
    }
}
