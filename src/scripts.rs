//! Lua scripts: the proxy's own (the owner-checked release of rule 1), and the registry of
//! clients' scripts by SHA1, so that `EVALSHA` works on a master that lost its script cache.

use std::sync::LazyLock;

use bytes::Bytes;
use dashmap::DashMap;

use crate::backend::{Backend, BackendError, Request};
use crate::reply::Reply;

/// Rule 1: delete the key only if it still holds the caller's token. The canonical release.
pub const RELEASE: &str = "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// The SHA1 of [`RELEASE`].
pub static RELEASE_SHA: LazyLock<Bytes> = LazyLock::new(|| sha1_hex(RELEASE.as_bytes()));

/// The lower-case hex SHA1 of a script, as Redis names scripts.
pub fn sha1_hex(body: &[u8]) -> Bytes {
    Bytes::from(sha1_smol::Sha1::from(body).hexdigest())
}

/// SHA1 → source of every script a client ran or loaded through this proxy.
#[derive(Debug, Default)]
pub struct Registry {
    scripts: DashMap<Bytes, Bytes>,
}

impl Registry {
    /// Remembers a script; returns its SHA1.
    pub fn insert(&self, body: Bytes) -> Bytes {
        let sha = sha1_hex(&body);
        self.scripts.entry(sha.clone()).or_insert(body);
        sha
    }

    /// The source of a script, if this proxy has seen it.
    pub fn get(&self, sha: &[u8]) -> Option<Bytes> {
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
    pub fn new(
        db: u32,
        sha: Bytes,
        body: Option<Bytes>,
        numkeys: usize,
        keys_and_args: &[Bytes],
    ) -> ScriptCall {
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

    /// Rule 1's release of `key` if it still holds `token`.
    pub fn release(db: u32, key: Bytes, token: Bytes) -> ScriptCall {
        let body = Bytes::from_static(RELEASE.as_bytes());
        ScriptCall::new(db, RELEASE_SHA.clone(), Some(body), 1, &[key, token])
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
    fn sha1_matches_redis() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this SHA1.
        assert_eq!(
            &sha1_hex(b"return 1")[..],
            b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn registry_round_trip() {
        let r = Registry::default();
        let sha = r.insert(Bytes::from_static(b"return 1"));
        assert!(r.contains(&sha));
        assert_eq!(r.get(&sha).as_deref(), Some(&b"return 1"[..]));
        r.clear();
        assert!(!r.contains(&sha));
    }
}
