//! The proxy's side of the legacy member (`crate::quorum::Legacy`; docs/migrating-from-setnx.md,
//! "Rolling over without a stop"): releases and reads of bridged keys, the legacy steal's
//! reply, and the watch behind `PROXY LEGACY` that tells an operator when the bridge can go.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::backend::{Backend, Request};
use crate::lua::ScriptCall;
use crate::quorum::Op;
use crate::reply::Reply;

use super::{Proxy, request};

/// How often the watch reads the legacy server.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The most bridged keys one watch round reads (the report says when there were more, `+`):
/// a legacy server that also holds other data is read a bounded amount per second.
const WATCH_KEYS: usize = 1_000;

/// How many of the old code's locks `PROXY LEGACY` names.
const NAMED: usize = 10;

/// What the watch last found on the legacy server.
#[derive(Debug, Default)]
pub struct LegacyReport {
    /// When the last round ended.
    pub read_at: Option<Instant>,
    /// Locks on bridged keys that a majority of masters holds with the same value: the
    /// proxy's clients'.
    pub proxy_locks: usize,
    /// Locks on bridged keys that the masters do not hold: the old code's. `(db, key, pttl)`
    /// of the first few.
    pub old_code_locks: Vec<(u32, Bytes, i64)>,
    /// How many old-code locks in all.
    pub old_code_count: usize,
    /// Whether the round stopped at its bound (`WATCH_KEYS`).
    pub truncated: bool,
    /// When the watch last found a lock of the old code's.
    pub old_code_seen_at: Option<Instant>,
    /// Why the last round could not read the server, if it could not.
    pub error: Option<String>,
    /// The locks this round found there and not on the masters, `(db, key, value)`: the old
    /// code's only once the next round finds the same again. A proxy client's lock can be
    /// there alone for a few milliseconds (its copy there is written just after the masters'
    /// and released just after them), never for a whole round.
    pub candidates: std::collections::HashSet<(u32, Bytes, Bytes)>,
}

/// The watch's shared report.
pub type Watch = Arc<Mutex<LegacyReport>>;

/// Rule 10 over the bridge: the reply of a legacy steal (`GETSET`, `SET ... GET`) given the
/// masters' combined old value and the legacy server's. The legacy server ran the same
/// `GETSET` atomically, so of two clients racing for one stale value only one saw it there:
/// - both agree: that old value;
/// - the masters held nothing (nil from a majority) but the legacy server held a value: the
///   old code's lock, which only the legacy server ever held: its old value decides;
/// - otherwise: `failure` (the caller's own value: "someone holds it", never a win).
pub(crate) fn steal(masters: Reply, legacy: &Reply, failure: &Reply) -> Reply {
    match (&masters, legacy) {
        (m, l) if m == l => masters,
        (Reply::Nil, Reply::Bulk(_)) => legacy.clone(),
        _ if masters.is_error() => masters,
        _ => failure.clone(),
    }
}

impl Proxy {
    /// Rules 1 and 6 on the legacy member: a release of `key` by `token` deletes it there too
    /// where it still holds the token (whatever the masters said: the holder gives the lock up),
    /// unless the masters' reply says the token still holds it more than once (a reentrant
    /// hold given back: `{'holds', ...}`).
    pub(crate) async fn release_on_legacy(&self, db: u32, key: &Bytes, token: Bytes, masters: &Reply) {
        if !self.engine.bridged(key) || matches!(masters, Reply::Array(_)) {
            return;
        }
        // Bounded by the backend timeout; a failure leaves the key to its TTL, as on a master.
        let _ = self
            .engine
            .on_legacy(&Op::Script(ScriptCall::release(db, key.clone(), token)))
            .await;
    }

    /// `GET key`: the value a quorum holds; on a bridged key that no quorum holds, the legacy
    /// server's (the old code's lock, which the proxy's clients must see to run the `SETNX`
    /// pattern's staleness check on it).
    pub(crate) async fn read_value(&self, db: u32, key: &Bytes) -> Reply {
        let held = self.engine.execute(Op::Command(request(db, [&b"GET"[..], key]))).await;
        if held != Reply::Nil || !self.engine.bridged(key) {
            return held;
        }
        match self.engine.legacy_read(db, key).await {
            Ok(Some((value, _))) => Reply::Bulk(value),
            Ok(None) => Reply::Nil,
            Err(why) => Reply::from(why),
        }
    }

    /// For a script or a transaction: refused when some of its keys are bridged and some not
    /// (it would run on the legacy server as one step, touching it beyond the bridged keys).
    pub(crate) fn half_bridged(&self, keys: &[Bytes]) -> Option<Reply> {
        let bridged = keys.iter().filter(|k| self.engine.bridged(k)).count();
        (bridged > 0 && bridged < keys.len()).then(|| {
            Reply::error(
                "ERR a script or transaction naming keys both bridged to the legacy member and not bridged cannot \
                 run while legacy_backend is set (the legacy server must not be touched beyond the bridged keys)",
            )
        })
    }

    /// `LOCK.INFO`'s view of the legacy member for a bridged key: `{value, pttl_ms}` as the
    /// legacy server holds it (nil when absent), or the reason it could not be read.
    pub(crate) async fn legacy_holder(&self, db: u32, key: &Bytes) -> Option<Reply> {
        if !self.engine.bridged(key) {
            return None;
        }
        Some(match self.engine.legacy_read(db, key).await {
            Ok(Some((value, pttl))) => Reply::Map(vec![
                (Reply::bulk("value"), Reply::Bulk(value)),
                (Reply::bulk("pttl_ms"), Reply::Int(pttl)),
            ]),
            Ok(None) => Reply::Nil,
            Err(why) => Reply::error(why.to_string()),
        })
    }

    /// `PROXY LEGACY`: the legacy member, its state, and what the watch last found there: the
    /// old code's locks still held, and when one was last seen. The bridge can go once no old
    /// instance runs and none has held a lock for longer than the old code's longest TTL.
    pub(crate) fn legacy_lines(&self) -> Vec<String> {
        let Some(legacy) = self.engine.legacy() else {
            return vec!["legacy member: none (legacy_backend is not set)".to_owned()];
        };
        let report = self
            .legacy_watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ago = |at: Option<Instant>| at.map_or("never".to_owned(), |at| format!("{}", at.elapsed().as_secs()));
        let mut lines = vec![
            format!(
                "legacy member: {} state={} keys={}",
                legacy.backend().name(),
                legacy.backend().state().name(),
                self.config.legacy_keys.join(",")
            ),
            format!(
                "old_code_locks_held={}{} proxy_locks_held={} old_code_lock_seen_s_ago={} legacy_refusals={} read_s_ago={}",
                report.old_code_count,
                if report.truncated { "+" } else { "" },
                report.proxy_locks,
                ago(report.old_code_seen_at),
                legacy.refusals(),
                ago(report.read_at),
            ),
        ];
        if let Some(error) = &report.error {
            lines.push(format!("last read failed: {error}"));
        }
        for (db, key, pttl) in &report.old_code_locks {
            lines.push(format!(
                "old code holds db={db} key={} pttl_ms={pttl}",
                String::from_utf8_lossy(key)
            ));
        }
        lines
    }

    /// Starts the watch of the legacy member, if there is one: a round every second, until the
    /// proxy is gone.
    pub(crate) fn watch_legacy(self: &Arc<Self>) {
        if self.engine.legacy().is_some() {
            tokio::spawn(watch(Arc::downgrade(self)));
        }
    }

    /// One round of the watch: every bridged key on the legacy server (in each database that
    /// has keys), read with its value and PTTL, and sorted into the proxy's (a majority of
    /// masters holds the same value) and the old code's.
    async fn legacy_round(
        &self,
        previous: &std::collections::HashSet<(u32, Bytes, Bytes)>,
    ) -> Result<LegacyReport, String> {
        let mut report = LegacyReport::default();
        for db in self.legacy_databases().await? {
            let mut cursor = Bytes::from_static(b"0");
            loop {
                let mut args = vec![
                    Bytes::from_static(b"SCAN"),
                    cursor.clone(),
                    Bytes::from_static(b"COUNT"),
                    Bytes::from_static(b"1000"),
                ];
                // One pattern (the usual `lock:*`): the server filters, and sends only those.
                if let [pattern] = &self.config.legacy_keys[..] {
                    args.extend([Bytes::from_static(b"MATCH"), Bytes::from(pattern.clone())]);
                }
                let scan = Request::new(db, args).inspecting();
                let (next, keys) = match self.engine.on_legacy(&Op::Command(scan)).await {
                    Ok(Reply::Array(parts)) => match <[Reply; 2]>::try_from(parts) {
                        Ok([Reply::Bulk(next), Reply::Array(keys)]) => (next, keys),
                        _ => return Err("SCAN answered in an unknown shape".to_owned()),
                    },
                    other => return Err(format!("SCAN failed: {other:?}")),
                };
                let keys: Vec<Bytes> = keys
                    .into_iter()
                    .filter_map(|k| match k {
                        Reply::Bulk(k) if self.engine.bridged(&k) => Some(k),
                        _ => None,
                    })
                    .collect();
                let reads = futures_util::future::join_all(keys.into_iter().map(|key| async move {
                    let on_legacy = self.engine.legacy_read(db, &key).await;
                    (key, on_legacy)
                }))
                .await;
                for (key, on_legacy) in reads {
                    let Ok(Some((value, pttl))) = on_legacy else { continue };
                    let held = self.engine.execute(Op::Command(request(db, [&b"GET"[..], &key]))).await;
                    if held == Reply::Bulk(value.clone()) {
                        report.proxy_locks += 1;
                        continue;
                    }
                    let found = (db, key.clone(), value);
                    if previous.contains(&found) {
                        report.old_code_count += 1;
                        if report.old_code_locks.len() < NAMED {
                            report.old_code_locks.push((db, key, pttl));
                        }
                    }
                    report.candidates.insert(found);
                }
                if report.proxy_locks + report.candidates.len() >= WATCH_KEYS {
                    report.truncated = true;
                    return Ok(report);
                }
                if &next[..] == b"0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(report)
    }

    /// The legacy server's databases that hold keys (`INFO keyspace`), within `databases`.
    async fn legacy_databases(&self) -> Result<Vec<u32>, String> {
        let info = Request::new(0, vec![Bytes::from_static(b"INFO"), Bytes::from_static(b"keyspace")]).inspecting();
        let text = match self.engine.on_legacy(&Op::Command(info)).await {
            Ok(Reply::Bulk(text)) => String::from_utf8_lossy(&text).into_owned(),
            other => return Err(format!("INFO keyspace failed: {other:?}")),
        };
        Ok(text
            .lines()
            .filter_map(|l| l.strip_prefix("db")?.split(':').next()?.parse::<u32>().ok())
            .filter(|db| *db < self.config.databases)
            .collect())
    }
}

/// The watch: a round every [`WATCH_EVERY`], its report kept for `PROXY LEGACY`.
async fn watch(proxy: Weak<Proxy>) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(proxy) = proxy.upgrade() else { return };
        let previous = std::mem::take(
            &mut proxy
                .legacy_watch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .candidates,
        );
        let round = proxy.legacy_round(&previous).await;
        let mut report = proxy
            .legacy_watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen_before = report.old_code_seen_at;
        *report = match round {
            Ok(mut found) => {
                found.old_code_seen_at = if found.old_code_count > 0 {
                    Some(Instant::now())
                } else {
                    seen_before
                };
                found
            }
            Err(error) => LegacyReport {
                error: Some(error),
                old_code_seen_at: seen_before,
                ..LegacyReport::default()
            },
        };
        report.read_at = Some(Instant::now());
        metrics::gauge!(crate::metrics::LEGACY_OLD_CODE_LOCKS).set(report.old_code_count as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Bytes::from(s.to_owned()))
    }

    #[test]
    fn a_steal_is_won_only_with_the_old_value_both_sides_agree_on_or_the_old_codes_alone() {
        let mine = bulk("mine");
        // Masters and legacy server saw the same stale value: won.
        assert_eq!(steal(bulk("stale"), &bulk("stale"), &mine), bulk("stale"));
        // The masters never held it; the old code's lock on the legacy server decides.
        assert_eq!(steal(Reply::Nil, &bulk("old-code"), &mine), bulk("old-code"));
        // Someone stole it on the legacy server first: not won, whatever the masters saw.
        assert_eq!(steal(bulk("stale"), &bulk("stolen"), &mine), mine);
        // Nothing anywhere: nil, as Redis answers a GETSET of a missing key.
        assert_eq!(steal(Reply::Nil, &Reply::Nil, &mine), Reply::Nil);
        // The masters' error stands.
        let error = Reply::error("NOQUORUM x");
        assert_eq!(steal(error.clone(), &bulk("x"), &mine), error);
    }
}
