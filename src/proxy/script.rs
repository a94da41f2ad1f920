//! Scripts: `EVAL`/`EVALSHA` (TTL-setting scripts checked for validity, rule 7), `SCRIPT`, and `script_policy`.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::Request;
use crate::command::script::ScriptRef;
use crate::command::{Eval, ScriptCmd};
use crate::config::{Config, ScriptPolicy};
use crate::error::{ClientError, StartError};
use crate::quorum::{self, Answer, Op, combine};
use crate::reply::Reply;
use crate::scripts::{self, Registry, Script, ScriptCall};

use super::{Proxy, not_extended_unless};

impl Proxy {
    /// Whether clients may run the script `sha` (`script_policy`).
    fn script_allowed(&self, sha: &[u8]) -> Result<(), ClientError> {
        match &self.allowed_scripts {
            Some(allowed) if !allowed.contains(sha) => {
                Err(ClientError::NoPermScript(String::from_utf8_lossy(sha).into_owned()))
            }
            _ => Ok(()),
        }
    }

    /// `EVAL`/`EVALSHA`. A script that sets a TTL runs as its TTL probe and counts only
    /// within the new validity (rule 7); any other is combined by the generic rule.
    pub(super) async fn eval(&self, db: u32, e: Eval) -> Reply {
        let sha = match &e.script {
            ScriptRef::Body(body) => scripts::sha1_hex(body),
            ScriptRef::Sha(sha) => sha.clone(),
        };
        if let Err(err) = self.script_allowed(&sha) {
            return err.into();
        }
        let (sha, script) = match e.script {
            ScriptRef::Body(body) => {
                let sha = self.scripts.insert(body);
                let script = self.scripts.get(&sha);
                (sha, script)
            }
            ScriptRef::Sha(sha) => {
                let script = self.scripts.get(&sha);
                (sha, script)
            }
        };
        let reply = match script {
            Some(Script {
                ttl_probe: Some((probe_sha, probe)),
                ..
            }) if e.numkeys > 0 => {
                let call = ScriptCall::new(db, probe_sha, Some(probe), e.numkeys, &e.keys_and_args);
                let ext = self.engine.extend(Op::Script(call), probed_ttl).await;
                let results: Vec<Answer> = ext.answers.into_iter().map(|a| a.map(probed_result)).collect();
                not_extended_unless(combine(&results, self.engine.quorum()), ext.validity.is_some())
            }
            script => {
                let call = ScriptCall::new(db, sha, script.map(|s| s.body), e.numkeys, &e.keys_and_args);
                self.engine.execute(Op::Script(call)).await
            }
        };
        // Clients match this text exactly (redsync even checks the trailing space).
        if reply.is_error_code("NOSCRIPT") {
            return ClientError::NoScript.into();
        }
        reply
    }

    pub(super) async fn script(&self, s: ScriptCmd) -> Reply {
        match s {
            ScriptCmd::Load(body) => {
                if let Err(err) = self.script_allowed(&scripts::sha1_hex(&body)) {
                    return err.into();
                }
                let sha = self.scripts.insert(body.clone());
                // Warm the masters' caches; the proxy keeps the source, so a master that
                // misses it later gets it by EVAL.
                let load = Request::new(
                    0,
                    vec![Bytes::from_static(b"SCRIPT"), Bytes::from_static(b"LOAD"), body],
                );
                self.engine.broadcast(Op::Command(load)).await;
                Reply::Bulk(sha)
            }
            ScriptCmd::Exists(shas) => self.script_exists(shas).await,
            ScriptCmd::Flush => {
                self.scripts.clear();
                let flush = Request::new(0, vec![Bytes::from_static(b"SCRIPT"), Bytes::from_static(b"FLUSH")]);
                self.engine.execute(Op::Command(flush)).await
            }
        }
    }

    /// A script exists if this proxy knows its source, or a quorum of masters has it cached.
    async fn script_exists(&self, shas: Vec<Bytes>) -> Reply {
        let known: Vec<bool> = shas.iter().map(|s| self.scripts.contains(s)).collect();
        let unknown: Vec<Bytes> = shas
            .iter()
            .zip(&known)
            .filter(|(_, k)| !**k)
            .map(|(s, _)| s.clone())
            .collect();
        let mut on_masters = self.exists_on_masters(unknown).await.into_iter();
        let replies = known
            .into_iter()
            .map(|k| Reply::Int(i64::from(k || on_masters.next().unwrap_or(false))))
            .collect();
        Reply::Array(replies)
    }

    /// `SCRIPT EXISTS` on every master, each SHA1 decided by the majority rule.
    async fn exists_on_masters(&self, shas: Vec<Bytes>) -> Vec<bool> {
        if shas.is_empty() {
            return Vec::new();
        }
        let count = shas.len();
        let mut args = vec![Bytes::from_static(b"SCRIPT"), Bytes::from_static(b"EXISTS")];
        args.extend(shas);
        let answers = self.engine.broadcast(Op::Command(Request::new(0, args))).await;
        (0..count)
            .map(|i| {
                let column: Vec<Answer> = answers
                    .iter()
                    .map(|a| match a {
                        Ok(Reply::Array(items)) => Ok(items.get(i).cloned().unwrap_or(Reply::Nil)),
                        other => other.clone(),
                    })
                    .collect();
                quorum::combine(&column, self.engine.quorum()) == Reply::Int(1)
            })
            .collect()
    }
}

/// With `script_policy = "allowlist"`, the SHA1s clients may run: the listed ones and those
/// of `script_files`, whose sources are loaded into `registry` (so `EVALSHA` works at once).
pub(super) fn allowed_scripts(config: &Config, registry: &Registry) -> Result<Option<HashSet<Bytes>>, StartError> {
    if config.script_policy == ScriptPolicy::Any {
        return Ok(None);
    }
    let mut allowed: HashSet<Bytes> = config
        .script_allowlist
        .iter()
        .map(|s| Bytes::from(s.to_ascii_lowercase()))
        .collect();
    for path in &config.script_files {
        let body = std::fs::read(path)
            .map_err(|e| StartError::Config(format!("script_files: cannot read {}: {e}", path.display())))?;
        allowed.insert(registry.insert(Bytes::from(body)));
    }
    Ok(Some(allowed))
}

/// From a TTL probe's `{result, pttl}`: the TTL this master now guarantees, when the
/// script succeeded there (a positive integer or `OK`) and the key expires.
fn probed_ttl(reply: &Reply) -> Option<Duration> {
    match reply {
        Reply::Array(items) => match items.as_slice() {
            [Reply::Int(n), Reply::Int(ttl)] if *n > 0 && *ttl > 0 => Some(Duration::from_millis(*ttl as u64)),
            [Reply::Status(_), Reply::Int(ttl)] if *ttl > 0 => Some(Duration::from_millis(*ttl as u64)),
            _ => None,
        },
        _ => None,
    }
}

/// From a TTL probe's `{result, pttl}`: the script's own result.
fn probed_result(reply: Reply) -> Reply {
    match reply {
        Reply::Array(mut items) if items.len() == 2 => items.swap_remove(0),
        other => other,
    }
}
