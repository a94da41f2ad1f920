//! Scripts: `EVAL`/`EVALSHA` (TTL-setting scripts checked for validity, rule 7; counting
//! scripts refused, rule 14), `SCRIPT`, and `script_policy`.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::Request;
use crate::command::script::ScriptRef;
use crate::command::{Eval, ScriptCmd};
use crate::config::{Config, ScriptPolicy};
use crate::error::{ClientError, StartError};
use crate::lua::ScriptCall;
use crate::quorum::{Answer, Op, combine};
use crate::reply::Reply;
use crate::scripts::{self, Registry, Script};
use crate::wire::sha1_hex;

use super::{Outcome, Proxy};

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

    /// `EVAL`/`EVALSHA`. A script that declares keys runs as its TTL probe and is judged by
    /// rule 7 on what it left behind, whatever its text (rule 7a): its combined result
    /// stands while the TTL a quorum of masters guarantees its keys is valid (rule 4a), and
    /// where that fails the proxy, which cannot know the script's own failure values,
    /// answers an error rather than a guess. A script that declares no key runs as it is.
    ///
    /// An `async` block, not an `async fn`, which would hold `e` twice: `EVALSHA` is every
    /// lock cycle's release, and its future is boxed per command.
    #[allow(clippy::manual_async_fn, reason = "an `async fn` would hold its arguments twice")]
    pub(crate) fn eval(&self, db: u32, e: Eval) -> impl Future<Output = Outcome> + '_ {
        async move {
            let sha = match &e.script {
                ScriptRef::Body(body) => sha1_hex(body),
                ScriptRef::Sha(sha) => sha.clone(),
            };
            if let Err(err) = self.script_allowed(&sha) {
                return Reply::from(err).into();
            }
            let script = match &e.script {
                ScriptRef::Body(body) => self.scripts.get(&self.scripts.insert(body.clone())),
                ScriptRef::Sha(sha) => self.scripts.get(sha),
            };
            // Rule 14: never answer success for a counting script by majority. (A script whose
            // source the proxy never saw, run by SHA without keys, cannot be read.)
            if let Some(counting) = script.as_ref().and_then(|s| s.counts) {
                return Reply::from(ClientError::CountingScript(counting)).into();
            }
            let outcome = match script {
                Some(script) if e.numkeys > 0 => self.eval_probed(db, script, &e).await,
                // The proxy never saw this script's source: it cannot probe it, so the client is
                // asked for it (every client library then loads or sends it).
                None if e.numkeys > 0 => Reply::from(ClientError::NoScript).into(),
                script => {
                    let call = ScriptCall::new(db, sha, script.map(|s| s.body), e.numkeys, &e.keys_and_args);
                    Outcome::plain(self.engine.execute(Op::Script(call)).await)
                }
            };
            // Clients match this text exactly (redsync even checks the trailing space).
            if outcome.reply.is_error_code("NOSCRIPT") {
                return Reply::from(ClientError::NoScript).into();
            }
            outcome
        }
    }

    /// Runs a script with declared keys as its probe and judges the result (rules 7a, 8a).
    async fn eval_probed(&self, db: u32, script: Script, e: &Eval) -> Outcome {
        if let Some(refused) = self.half_bridged(e.keys()) {
            return refused.into();
        }
        let pushes = script.pushes;
        let (probe_sha, probe) = script.probe;
        let op = Op::Script(ScriptCall::new(db, probe_sha, Some(probe), e.numkeys, &e.keys_and_args));
        let masters = self.engine.probe(op.clone(), probed_ttl, |r| probed_result(r.clone()));
        // On bridged keys the script runs on the legacy member too, where it has the meaning
        // the old code's server gives it (`crate::quorum::Legacy`).
        let (ext, legacy) = self.engine.mirrored(e.keys(), &op, masters).await;
        let q = self.engine.quorum();
        let probes: Vec<&Reply> = ext.answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        let results: Vec<Answer> = ext.answers.iter().cloned().map(|a| a.map(probed_result)).collect();
        let reply = combine(&results, q);
        if reply.is_error() {
            return reply.into();
        }
        if pushes {
            // A wake-up signal list may have been filled: its sleepers wake.
            for key in e.keys() {
                self.announce_signal(db, key);
            }
        }
        // Rule 8a: a declared key left without a TTL, or above max_ttl_ms, was capped; a
        // success that relied on it did not happen as the script meant it.
        if probes.iter().any(|p| probed_capped(p)) {
            return Reply::error(CAPPED).into();
        }
        // Keys that exist on fewer than a quorum: no write left a lock on a majority, so
        // there is no validity to judge (a release, a read of a free key).
        let with_keys = probes.iter().filter(|p| probed_ttl(p).is_some()).count();
        // A success stands only where the legacy member agrees: the same result, and its
        // keys left with a TTL there too.
        if let (Some(answer), Some(_)) = (&legacy, ext.validity)
            && !answer
                .as_ref()
                .is_ok_and(|l| probed_result(l.clone()) == reply && probed_ttl(l).is_some())
        {
            return Reply::error(LEGACY_WITHHELD).into();
        }
        match ext.validity {
            Some(validity) => Outcome::until(reply, validity, Reply::error(WITHHELD), None),
            None if with_keys >= q => Reply::error(WITHHELD).into(),
            None => {
                // The script's keys are gone from a quorum: if it was a release, waiters may
                // take the lock now.
                for key in e.keys() {
                    self.announce_release(db, key);
                }
                Outcome::plain(reply).freed()
            }
        }
    }

    pub(crate) async fn script(&self, s: ScriptCmd) -> Reply {
        match s {
            ScriptCmd::Load(body) => {
                if let Err(err) = self.script_allowed(&sha1_hex(&body)) {
                    return err.into();
                }
                if let Some(counting) = scripts::counts(&body) {
                    return ClientError::CountingScript(counting).into();
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
            ScriptCmd::Exists(shas) => self.script_exists(shas),
            ScriptCmd::Flush => {
                self.scripts.clear();
                let flush = Request::new(0, vec![Bytes::from_static(b"SCRIPT"), Bytes::from_static(b"FLUSH")]);
                self.engine.execute(Op::Command(flush)).await
            }
        }
    }

    /// A script exists if this proxy knows its source: only then can it run it with declared
    /// keys (it must wrap it as a TTL probe, rule 7a); a script cached on the masters alone
    /// would answer `NOSCRIPT` to such an `EVALSHA`.
    fn script_exists(&self, shas: Vec<Bytes>) -> Reply {
        Reply::Array(
            shas.iter()
                .map(|s| Reply::Int(i64::from(self.scripts.contains(s))))
                .collect(),
        )
    }
}

/// With `script_policy = "allowlist"`, the SHA1s clients may run: the listed ones and those
/// of `script_files`, whose sources are loaded into `registry` (so `EVALSHA` works at once).
pub(crate) fn allowed_scripts(config: &Config, registry: &Registry) -> Result<Option<HashSet<Bytes>>, StartError> {
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

/// Rule 7 withheld a script's result: its keys do not stay valid on a majority.
const WITHHELD: &str = "ERR script result withheld: its keys are not held by a majority of masters for longer than the elapsed time and clock drift (rule 7)";

/// The legacy member did not confirm a script's result on a bridged key.
const LEGACY_WITHHELD: &str = "ERR script result withheld: the legacy member did not give the same result with its keys held (the old code may hold them there; see PROXY LEGACY)";

/// Rule 8a capped a key the script left without a TTL or above `max_ttl_ms`.
const CAPPED: &str = "ERR script left a declared key with no TTL or a TTL above max_ttl_ms: the key was capped to max_ttl_ms and the script's result is withheld";

/// From a TTL probe's `{result, ttl, capped}`: the smallest TTL among the script's keys that
/// exist on this master, if any does.
fn probed_ttl(reply: &Reply) -> Option<Duration> {
    match reply {
        Reply::Array(items) => match items.as_slice() {
            [_, Reply::Int(ttl), _] if *ttl >= 0 => Some(Duration::from_millis(*ttl as u64)),
            _ => None,
        },
        _ => None,
    }
}

/// From a TTL probe's reply: whether it capped a key (rule 8a).
fn probed_capped(reply: &Reply) -> bool {
    matches!(reply, Reply::Array(items) if matches!(items.as_slice(), [_, _, Reply::Int(1)]))
}

/// From a TTL probe's reply: the script's own result.
fn probed_result(reply: Reply) -> Reply {
    match reply {
        Reply::Array(mut items) if items.len() == 3 => items.swap_remove(0),
        other => other,
    }
}
