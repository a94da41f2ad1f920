//! Clients' scripts: the registry by SHA1, so that `EVALSHA` works on a master that lost its
//! script cache, and what the proxy reads in a script's text (whether it sets a TTL, rule 7;
//! whether it counts holders, rule 14). The proxy's own scripts are in [`crate::lua`].

use bytes::Bytes;
use dashmap::DashMap;

use crate::wire::sha1_hex;

/// A script as the proxy keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    /// The client's source.
    pub body: Bytes,
    /// The SHA1 and source of the same script wrapped as a TTL probe (see [`ttl_probe`]): what
    /// the proxy runs when the script declares keys, so that rule 7 judges its reply.
    pub probe: (Bytes, Bytes),
    /// Whether it pushes to lists (its text names `LPUSH`/`RPUSH`): a wake-up signal, so a
    /// client blocked in `BLPOP` on its keys is woken after it ran. Only a wake-up: nothing
    /// about safety rests on it.
    pub pushes: bool,
    /// The counting command its text calls, if any ([`counts`]): such a script is refused.
    pub counts: Option<&'static str>,
    /// Whether its text looks like an extension ([`sets_ttl`]), read once: for the metrics.
    pub sets_ttl: bool,
}

impl Script {
    /// Keeps `body` with its TTL probe; declared keys are capped at `max_ttl_ms` (rule 8a).
    fn new(body: Bytes, max_ttl_ms: u64) -> Script {
        let wrapped = ttl_probe(&body, max_ttl_ms);
        Script {
            probe: (sha1_hex(&wrapped), wrapped),
            pushes: names(&body, b"push"),
            counts: counts(&body),
            sets_ttl: sets_ttl(&body),
            body,
        }
    }
}

/// The commands whose result is a count of holders when a script compares it with a limit:
/// cardinalities of the structures counting locks keep their holders in (sorted sets, sets,
/// lists, streams), and shared counters (`INCR`/`DECR`: a permit count).
///
/// Rule 14: a majority bounds one holder, not k. Pairwise exclusion holds over any two
/// majorities because they share a master; a count does not: with k permits over N masters,
/// k+1 grants of q votes each fit without any master counting more than k holders as long as
/// (k+1)·q ≤ N·k, so a grant needs q > N·k/(k+1) votes, more than a majority for k ≥ 2 (3 holders
/// of a 2-permit semaphore over 5 masters with 3 votes each: 9 votes, 2 per master, none full).
///
/// Not on the list, on purpose: `HINCRBY` (Redisson's reentrant lock counts one holder's own
/// re-entries in its own field: a mutex), `HLEN` (Redisson's read-write lock reads it on
/// release to see whether other readers remain: reader against writer is pairwise), `EXISTS`,
/// `GET`, `PTTL` (a mutex's own checks). A counting lock built only on those is not caught.
pub const COUNTING_COMMANDS: [&str; 10] = [
    "zcard",
    "zcount",
    "zlexcount",
    "scard",
    "llen",
    "xlen",
    "incr",
    "incrby",
    "decr",
    "decrby",
];

/// The first of [`COUNTING_COMMANDS`] a script's text calls (named as a Lua string, quoted
/// with `'` or `"`, in any case, as `redis.call` takes it), if any: such a script's success
/// depends on counting holders, which a majority cannot judge (rule 14). The mutex scripts
/// of the lock libraries (redlock, redsync, python-redis-lock, redis-py's `Lock`, Redisson's
/// reentrant lock) name none of them.
///
/// A script's text is read on the event loop, so in one pass, at each quote, with nothing
/// copied (rule 16: a 16 MiB script once held the loop 3.5 s, read twenty times over).
pub fn counts(body: &[u8]) -> Option<&'static str> {
    let mut found = 0u32;
    for (at, &quote) in body.iter().enumerate() {
        if quote != b'\'' && quote != b'"' {
            continue;
        }
        let after = body.get(at + 1..).unwrap_or_default();
        for (i, name) in COUNTING_COMMANDS.iter().enumerate() {
            let name = name.as_bytes();
            if after.get(..name.len()).is_some_and(|w| w.eq_ignore_ascii_case(name))
                && after.get(name.len()) == Some(&quote)
            {
                found |= 1 << i;
            }
        }
    }
    COUNTING_COMMANDS
        .into_iter()
        .enumerate()
        .find_map(|(i, name)| (found & (1 << i) != 0).then_some(name))
}

/// Whether a script's text looks like an extension (it names `PEXPIRE`/`EXPIRE` or passes
/// `PX` to `SET`). Only for the metrics' latency histograms: rule 7 never depends on it.
pub fn sets_ttl(body: &[u8]) -> bool {
    names(body, b"expire") || names(body, b"\"px\"") || names(body, b"'px'")
}

/// Whether `body` holds `needle` (lower case), in any case: one pass, nothing copied.
fn names(body: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    body.iter().enumerate().any(|(at, b)| {
        b.to_ascii_lowercase() == first
            && body
                .get(at..at + needle.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(needle))
    })
}

/// Wraps a script so it returns `{its result, ttl, capped}` (rules 7a and 8a), whatever
/// its text:
/// - `ttl`: the smallest PTTL among its declared keys that exist after it ran (-2 when none
///   does: keys that do not exist take no part);
/// - `capped`: 1 when a declared key was left without a TTL or with one above `max_ttl_ms`;
///   the wrapper then sets it to `max_ttl_ms`, so every key expires within it (rule 8a).
///
/// The client's code runs as a vararg function (`...` works as at top level), its first line
/// stays on the first line (or the second, after a `#!lua` shebang, which must stay first),
/// so error messages keep their line numbers. A script declared `no-writes` is not capped: it
/// cannot have written.
pub fn ttl_probe(body: &[u8], max_ttl_ms: u64) -> Bytes {
    let (shebang, code) = match body.strip_prefix(b"#!") {
        Some(_) => match body.iter().position(|&b| b == b'\n') {
            Some(end) => body.split_at(end + 1),
            None => (body, &b""[..]),
        },
        None => (&b""[..], body),
    };
    let read_only = shebang.windows(9).any(|w| w == b"no-writes");
    let mut wrapped = shebang.to_vec();
    if !shebang.is_empty() && !shebang.ends_with(b"\n") {
        wrapped.push(b'\n');
    }
    wrapped.extend_from_slice(b"local __rp_result = (function(...) ");
    wrapped.extend_from_slice(code);
    let cap = if read_only {
        "if t == -1 then t = -2 end".to_owned()
    } else {
        format!(
            "if t == -1 or t > {max_ttl_ms} then redis.call('pexpire', __rp_key, {max_ttl_ms}) t = {max_ttl_ms} __rp_capped = 1 end"
        )
    };
    wrapped.extend_from_slice(
        format!(
            "\nend)(...)\n\
if __rp_result == nil then __rp_result = false end\n\
local __rp_ttl, __rp_capped = -2, 0\n\
for _, __rp_key in ipairs(KEYS) do\n\
  local t = redis.call('pttl', __rp_key)\n\
  {cap}\n\
  if t >= 0 and (__rp_ttl < 0 or t < __rp_ttl) then __rp_ttl = t end\n\
end\n\
return {{__rp_result, __rp_ttl, __rp_capped}}\n"
        )
        .as_bytes(),
    );
    Bytes::from(wrapped)
}

/// SHA1 → every script a client ran or loaded through this proxy.
#[derive(Debug)]
pub struct Registry {
    scripts: DashMap<Bytes, Script>,
    /// Rule 8a: the longest TTL a script may leave on a declared key.
    max_ttl_ms: u64,
}

impl Registry {
    /// An empty registry whose probes cap declared keys at `max_ttl_ms`.
    pub fn new(max_ttl_ms: u64) -> Registry {
        Registry {
            scripts: DashMap::new(),
            max_ttl_ms,
        }
    }

    /// Remembers a script; returns its SHA1.
    pub fn insert(&self, body: Bytes) -> Bytes {
        let sha = sha1_hex(&body);
        if !self.scripts.contains_key(&sha) {
            self.scripts.insert(sha.clone(), Script::new(body, self.max_ttl_ms));
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The readings of a script's text as they were: the text lowered, then searched once per
    /// name and quote.
    fn counts_as_before(body: &[u8]) -> Option<&'static str> {
        let lower = body.to_ascii_lowercase();
        COUNTING_COMMANDS.into_iter().find(|name| {
            [b'\'', b'"'].iter().any(|&quote| {
                let mut quoted = vec![quote];
                quoted.extend_from_slice(name.as_bytes());
                quoted.push(quote);
                lower.windows(quoted.len()).any(|w| w == quoted.as_slice())
            })
        })
    }

    fn sets_ttl_as_before(body: &[u8]) -> bool {
        let lower = body.to_ascii_lowercase();
        let has = |needle: &[u8]| lower.windows(needle.len()).any(|w| w == needle);
        has(b"expire") || has(b"\"px\"") || has(b"'px'")
    }

    proptest! {
        /// Read in one pass, a script's text says what it said read twenty times over.
        #[test]
        fn one_pass_readings_mean_what_they_meant(
            words in proptest::collection::vec(
                prop::sample::select(vec![
                    "'", "\"", "zcard", "ZCard", "incr", "INCRBY", "decr", "llen", "xlen", "scard",
                    "zcount", "zlex", "count", "expire", "EXPIRE", "px", "PX", "push", "PUSH", " ", "e", "x",
                ]),
                0..12,
            )
        ) {
            let body = words.concat();
            prop_assert_eq!(counts(body.as_bytes()), counts_as_before(body.as_bytes()));
            prop_assert_eq!(sets_ttl(body.as_bytes()), sets_ttl_as_before(body.as_bytes()));
            let pushes = body.to_ascii_lowercase().contains("push");
            prop_assert_eq!(names(body.as_bytes(), b"push"), pushes);
        }
    }

    #[test]
    fn ttl_setting_scripts_are_recognised() {
        // redis-py extend, redsync touch, node-redlock acquire: probed.
        assert!(sets_ttl(b"redis.call('pexpire', KEYS[1], newttl)"));
        assert!(sets_ttl(b"return redis.call(\"PEXPIRE\", KEYS[1], ARGV[2])"));
        assert!(sets_ttl(b"redis.call(\"set\", key, ARGV[1], \"PX\", ARGV[2])"));
        // Releases and pttl readers: combined by the generic rule.
        assert!(!sets_ttl(crate::lua::own::RELEASE.as_bytes()));
        assert!(!sets_ttl(b"return redis.call('pttl', KEYS[1])"));
    }

    /// Scripts as lock libraries send them: mutexes pass, counting semaphores are caught.
    #[test]
    fn counting_scripts_are_told_from_mutexes() {
        let mutexes: [&[u8]; 6] = [
            // redlock / redsync / redis-py Lock release
            br#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#,
            // redis-py Lock extend
            b"local token = redis.call('get', KEYS[1]) if not token or token ~= ARGV[1] then return 0 end \
              local expiration = redis.call('pttl', KEYS[1]) if not expiration then expiration = 0 end \
              if expiration < 0 then return 0 end redis.call('pexpire', KEYS[1], expiration + ARGV[2]) return 1",
            // python-redis-lock release: its signal list is filled, never counted
            br#"if redis.call("get", KEYS[1]) ~= ARGV[1] then return 1 else redis.call("del", KEYS[2]) redis.call("lpush", KEYS[2], 1) redis.call("pexpire", KEYS[2], ARGV[2]) redis.call("del", KEYS[1]) return 0 end"#,
            // Redisson reentrant lock: HINCRBY counts one holder's re-entries
            b"if (redis.call('exists', KEYS[1]) == 0) then redis.call('hincrby', KEYS[1], ARGV[2], 1); \
              redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
              if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); \
              redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);",
            // a variable that merely contains a command's name
            b"local llen = 1 local incr = redis.call('get', KEYS[1]) return llen",
            crate::lua::own::EXEC.as_bytes(),
        ];
        for body in mutexes {
            assert_eq!(counts(body), None, "{}", String::from_utf8_lossy(body));
        }
        let semaphore = b"redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[3]) \
            if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then redis.call('zadd', KEYS[1], ARGV[4], ARGV[2]) return 1 end return 0";
        assert_eq!(counts(semaphore), Some("zcard"));
        assert_eq!(
            counts(
                br#"if redis.call("scard", KEYS[1]) < 2 then return redis.call("sadd", KEYS[1], ARGV[1]) end return 0"#
            ),
            Some("scard")
        );
        assert_eq!(counts(b"local v = redis.call('get', KEYS[1]) if tonumber(v) > 0 then return redis.call('decrby', KEYS[1], 1) end"), Some("decrby"));
        assert_eq!(counts(b"return redis.call('Incr', KEYS[1])"), Some("incr"));
        assert!(Script::new(Bytes::from_static(semaphore), 1000).counts.is_some());
    }

    #[test]
    fn probe_keeps_the_first_line() {
        let probe = ttl_probe(b"return 1", 1000);
        assert!(probe.starts_with(b"local __rp_result = (function(...) return 1\nend)(...)"));
        let probe = ttl_probe(b"#!lua flags=no-writes\nreturn 1", 1000);
        assert!(probe.starts_with(b"#!lua flags=no-writes\nlocal __rp_result = (function(...) return 1\n"));
        assert!(
            !probe.windows(7).any(|w| w == b"pexpire"),
            "a no-writes script is not capped"
        );
    }

    #[test]
    fn registry_round_trip() {
        let r = Registry::new(1000);
        let sha = r.insert(Bytes::from_static(b"return 1"));
        assert!(r.contains(&sha));
        assert_eq!(r.get(&sha).map(|s| s.body), Some(Bytes::from_static(b"return 1")));
        r.clear();
        assert!(!r.contains(&sha));
    }
}
