//! The legacy member (docs/migrating-from-setnx.md, "Rolling over without a stop"): the one
//! Redis server that old code still locks on while a rollout moves the application to the
//! proxy. Old code sees only that server; new code sees the proxy's masters. For the two to
//! exclude each other, every lock the proxy grants on a key the bridge covers must also be held
//! on the legacy server, in the form old code reads there (the value the client wrote, with a
//! TTL), and a lock old code holds there must refuse the proxy's clients.
//!
//! So the legacy member has a veto beside the quorum, never a vote in it:
//! - an acquisition is granted only if a quorum of masters granted it *and* the legacy server
//!   did, both within rule 4's validity (the clock starts before either send);
//! - its refusal is a refusal (undone on the masters as any refusal, rule 5); its silence or an
//!   error is a failure the client is told of (`NOQUORUM legacy member ...`): the proxy fails
//!   closed on the keys it bridges, because a grant it could not place there is a grant the old
//!   code cannot see;
//! - an extension (a session's keepalive, `LOCK.EXTEND`) counts only if the legacy server
//!   extended too; where it answers that another value holds the key, the lock is lost at once
//!   (the old code has it);
//! - an undo removes there exactly what the attempt wrote (rule 5a, the same `UNDO` script as
//!   on a master).
//!
//! The legacy server is watched like a master (rules 8 and 15: a restart without persistence
//! loses the old code's locks too, so it is quarantined, and while it is, nothing on a bridged
//! key is granted). Keys under the proxy's own prefix (rule 11: the semaphores', read-write
//! locks' and elections' keys) are never bridged: old code never names them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fanout::{FanOut, Late};
use super::observed::Observed;
use super::{Answer, Engine, Extension, NoQuorum, Op};
use crate::backend::{Backend, BackendError};
use crate::clock::Clock;
use crate::lua::{ScriptCall, legacy};
use crate::reply::Reply;

/// The legacy server, and the keys it bridges.
pub struct Legacy<B> {
    /// The server.
    backend: Arc<B>,
    /// Glob patterns of the client keys it bridges.
    patterns: Vec<Bytes>,
    /// Its request statistics (its own record: it is not one of the masters).
    observed: Arc<Observed>,
    /// Takes it refused while a quorum of masters granted them: a lock the masters do not
    /// know, almost always the old code's (`PROXY LEGACY`).
    refusals: std::sync::atomic::AtomicU64,
}

impl<B: Backend> Legacy<B> {
    /// The legacy member `backend`, bridging the client keys that match one of `patterns`.
    pub fn new(backend: B, patterns: &[String]) -> Legacy<B> {
        Legacy {
            observed: Arc::new(Observed::new(backend.name())),
            backend: Arc::new(backend),
            patterns: patterns.iter().map(|p| Bytes::from(p.clone().into_bytes())).collect(),
            refusals: Default::default(),
        }
    }

    /// How many takes it refused while a quorum of masters granted them (the old code's locks).
    pub fn refusals(&self) -> u64 {
        self.refusals.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a refusal of a take a quorum of masters granted.
    pub(crate) fn refused_while_granted(&self) {
        self.refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!(crate::metrics::LEGACY_REFUSALS).increment(1);
    }

    /// The server.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Its request statistics.
    pub fn observed(&self) -> &Observed {
        &self.observed
    }

    /// Whether `key` is bridged: a client key that matches a pattern. The proxy's own keys
    /// (rule 11) never are.
    pub fn bridges(&self, key: &[u8]) -> bool {
        !key.starts_with(crate::keys::OWN_PREFIX) && self.patterns.iter().any(|p| crate::glob::matches(p, key))
    }
}

/// How the legacy server answered a take.
#[derive(Clone, Debug)]
pub(crate) enum LegacyVote {
    /// It holds every key for the token now: per key, the expiry this attempt wrote (0: it
    /// wrote nothing new there, the token held it already).
    Granted(Vec<i64>),
    /// Another value holds a key there (the old code's lock, or another client's): its PTTL,
    /// when it has one.
    Held(Option<Duration>),
    /// No answer in time, or an error: the take failed.
    Failed(Answer),
}

impl LegacyVote {
    fn of(answer: Answer) -> LegacyVote {
        match &answer {
            Ok(Reply::Array(items)) => match items.as_slice() {
                [Reply::Int(0), Reply::Int(pttl)] => {
                    LegacyVote::Held(u64::try_from(*pttl).ok().map(|ms| Duration::from_millis(ms.max(1))))
                }
                [Reply::Int(1), expiries @ ..] => LegacyVote::Granted(
                    expiries
                        .iter()
                        .map(|e| match e {
                            Reply::Int(e) => *e,
                            _ => 0,
                        })
                        .collect(),
                ),
                _ => LegacyVote::Failed(answer),
            },
            _ => LegacyVote::Failed(answer),
        }
    }
}

/// What one acquisition attempt wrote on the legacy server: each bridged key with the expiry
/// that names the write (rule 5a). Kept in the attempt's [`super::Undo`].
#[derive(Clone, Debug)]
pub(crate) struct LegacyWrite {
    db: u32,
    token: Bytes,
    written: Vec<(Bytes, i64)>,
}

impl LegacyWrite {
    /// The undo of each key written.
    fn undo_calls(&self) -> impl Iterator<Item = ScriptCall> + '_ {
        self.written
            .iter()
            .filter(|(_, expiry)| *expiry > 0)
            .map(|(key, expiry)| ScriptCall::undo(self.db, key.clone(), self.token.clone(), *expiry))
    }
}

/// One acquisition's take on the legacy server, under way beside the masters'.
pub(crate) struct LegacyTake {
    fan_out: Arc<FanOut>,
    db: u32,
    token: Bytes,
    keys: Vec<Bytes>,
    vote: Option<LegacyVote>,
}

impl LegacyTake {
    /// The legacy server's vote, awaited once (within rule 3's deadline, shared with the
    /// masters').
    pub(crate) async fn vote(&mut self) -> &LegacyVote {
        if self.vote.is_none() {
            let deadline = tokio::time::sleep_until(self.fan_out.deadline());
            tokio::pin!(deadline);
            let answer = match self.fan_out.next(1, deadline).await {
                Some((_, answer)) => answer,
                None => Err(BackendError::Timeout),
            };
            self.vote = Some(LegacyVote::of(answer));
        }
        self.vote.get_or_insert(LegacyVote::Failed(Err(BackendError::Pending)))
    }

    /// What the take wrote, once granted.
    pub(crate) fn written(&self) -> Option<LegacyWrite> {
        match &self.vote {
            Some(LegacyVote::Granted(expiries)) => Some(LegacyWrite {
                db: self.db,
                token: self.token.clone(),
                written: self.keys.iter().cloned().zip(expiries.iter().copied()).collect(),
            }),
            _ => None,
        }
    }
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// The engine with a legacy member (see the module's text).
    pub fn with_legacy(mut self, legacy: Legacy<B>) -> Engine<B, C> {
        self.legacy = Some(Arc::new(legacy));
        self
    }

    /// The legacy member, if one is set.
    pub fn legacy(&self) -> Option<&Legacy<B>> {
        self.legacy.as_deref()
    }

    /// Whether `key` is bridged to a legacy member.
    pub fn bridged(&self, key: &[u8]) -> bool {
        self.legacy.as_ref().is_some_and(|l| l.bridges(key))
    }

    /// Starts the take of the bridged ones of `keys` on the legacy server, beside the masters',
    /// within the same deadline (rule 3); `None` when none is bridged.
    pub(crate) fn legacy_take(
        &self,
        db: u32,
        keys: Vec<Bytes>,
        token: &Bytes,
        ttl: Duration,
        reenter: bool,
        deadline: tokio::time::Instant,
    ) -> Option<LegacyTake> {
        let legacy = self.legacy.as_ref()?;
        let keys: Vec<Bytes> = keys.into_iter().filter(|k| legacy.bridges(k)).collect();
        if keys.is_empty() {
            return None;
        }
        let fan_out = Arc::new(FanOut::new(1, deadline, Arc::from([legacy.observed.clone()]), None));
        let op = Op::Script(legacy::take(db, &keys, token.clone(), ttl, reenter));
        let (request, fallback) = op.parts();
        legacy.backend.start(request, fallback, FanOut::place(&fan_out, 0));
        Some(LegacyTake {
            fan_out,
            db,
            token: token.clone(),
            keys,
            vote: None,
        })
    }

    /// Rule 5a on the legacy server: takes back what an attempt wrote there, and an answer
    /// still to come, should it say it wrote.
    pub(crate) async fn legacy_undo(&self, take: Option<Box<LegacyTake>>) {
        let (Some(legacy), Some(take)) = (self.legacy.clone(), take) else {
            return;
        };
        match take.written() {
            Some(write) => self.undo_legacy_write(&write).await,
            None if take.vote.is_none() || matches!(take.vote, Some(LegacyVote::Failed(_))) => {
                // Not read, or failed on its deadline: should the answer come late and say it
                // wrote, take that write back then.
                let (db, token, keys) = (take.db, take.token.clone(), take.keys.clone());
                let late: Late = Box::new(move |_, answer| {
                    if let LegacyVote::Granted(expiries) = LegacyVote::of(answer) {
                        let write = LegacyWrite {
                            db,
                            token: token.clone(),
                            written: keys.iter().cloned().zip(expiries).collect(),
                        };
                        for call in write.undo_calls() {
                            let op = Op::Script(call);
                            let (request, fallback) = op.parts();
                            legacy
                                .backend
                                .start(request, fallback, crate::backend::Place::ignored());
                        }
                    }
                });
                take.fan_out.hand_over(late);
            }
            None => {}
        }
    }

    /// Takes back one write on the legacy server (awaited, each bounded by rule 3).
    pub(crate) async fn undo_legacy_write(&self, write: &LegacyWrite) {
        for call in write.undo_calls() {
            // Each undo is bounded; one that fails leaves the write to its TTL (as on a master).
            let _ = self.on_legacy(&Op::Script(call)).await;
        }
    }

    /// Runs `op` on the legacy server, bounded by the backend timeout (rule 3).
    pub async fn on_legacy(&self, op: &Op) -> Answer {
        let Some(legacy) = &self.legacy else {
            return Err(BackendError::Down);
        };
        let (request, fallback) = op.parts();
        super::bounded(
            self.settings.backend_timeout,
            crate::backend::call(&legacy.backend, request, fallback),
        )
        .await
    }

    /// An extension of `key` for `token` (a keepalive, `LOCK.EXTEND`), run on the masters by
    /// `masters` and, for a bridged key, on the legacy server beside them: it counts only if
    /// both did (rule 7; the validity is the masters'). Where the legacy server answers that
    /// another value holds the key, or that it may have lost its keys (quarantined after a
    /// restart), the extension says the lock is lost: the old code may hold it now.
    pub(crate) async fn extend_bridged(
        &self,
        db: u32,
        key: &Bytes,
        token: &Bytes,
        ttl: Duration,
        masters: impl Future<Output = Extension>,
    ) -> Extension {
        if !self.bridged(key) {
            return masters.await;
        }
        let op = Op::Script(legacy::extend(db, key.clone(), token.clone(), ttl));
        let (mut extension, answer) = futures_util::future::join(masters, self.on_legacy(&op)).await;
        match answer {
            Ok(Reply::Int(1 | 2)) => {}
            Ok(Reply::Int(0)) | Err(BackendError::Quarantined { .. } | BackendError::ClockAhead { .. }) => {
                extension.validity = None;
                extension.lost = true;
            }
            Ok(_) | Err(_) => extension.validity = None,
        }
        extension
    }

    /// The lock on `key` as the legacy server holds it: `Some((value, pttl))`, `None` when the
    /// key is absent there.
    pub async fn legacy_read(&self, db: u32, key: &Bytes) -> Result<Option<(Bytes, i64)>, NoQuorum> {
        let answer = self.on_legacy(&Op::Script(legacy::read(db, key.clone()))).await;
        match answer {
            Ok(Reply::Array(items)) => match items.as_slice() {
                [] => Ok(None),
                [Reply::Bulk(value), Reply::Int(pttl)] => Ok(Some((value.clone(), *pttl))),
                _ => Err(self.legacy_failure(&Ok(Reply::Array(items)))),
            },
            other => Err(self.legacy_failure(&other)),
        }
    }

    /// Why the legacy member could not decide, for the client (`NOQUORUM legacy member ...`).
    pub(crate) fn legacy_failure(&self, answer: &Answer) -> NoQuorum {
        let mut why = NoQuorum::of([answer], |_| false);
        why.legacy = self.legacy.as_ref().map(|l| l.backend.name().into());
        why
    }
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// A client's own write or delete on `keys` (`SET ... PX`, `PEXPIRE`, `DEL`, a script's
    /// probe): run on the masters by `masters` and, when a key is bridged, the same `op` on the
    /// legacy server beside them, where it keeps the single-instance meaning the old code gives
    /// it. The legacy server's answer (`None` when nothing is bridged), for the caller to
    /// judge as it judges a master's ([`Extension::vetoed`]).
    pub async fn mirrored<T>(&self, keys: &[Bytes], op: &Op, masters: impl Future<Output = T>) -> (T, Option<Answer>) {
        if !keys.iter().any(|k| self.bridged(k)) {
            return (masters.await, None);
        }
        let (outcome, answer) = futures_util::future::join(masters, self.on_legacy(op)).await;
        (outcome, Some(answer))
    }
}

impl Extension {
    /// The extension once the legacy member's answer to the same write is in: it counts only
    /// if that answer is a success too (`succeeded`), else it is withheld, as a quorum that
    /// did not write it would withhold it (rule 7a: a success is never manufactured).
    pub fn vetoed(mut self, legacy: Option<&Answer>, succeeded: impl Fn(&Reply) -> bool) -> Extension {
        if let Some(answer) = legacy
            && !answer.as_ref().is_ok_and(succeeded)
        {
            self.validity = None;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::embedded::EmbeddedBackend;
    use crate::clock::TokioClock;

    fn legacy(patterns: &[&str]) -> Legacy<EmbeddedBackend> {
        let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
        Legacy::new(EmbeddedBackend::new("legacy", Arc::new(TokioClock::new())), &patterns)
    }

    #[test]
    fn only_client_keys_that_match_a_pattern_are_bridged() {
        let l = legacy(&["lock:*", "job.?"]);
        assert!(l.bridges(b"lock:a"));
        assert!(l.bridges(b"job.1"));
        assert!(!l.bridges(b"cache:a"));
        // Rule 11: the proxy's own keys never, whatever the pattern.
        let all = legacy(&["*"]);
        assert!(all.bridges(b"anything"));
        assert!(!all.bridges(b"redlock-proxy:fence:c:lock:a"));
    }

    #[test]
    fn a_take_is_read_as_granted_held_or_failed() {
        let granted = LegacyVote::of(Ok(Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(1_700_000_000_123),
            Reply::Int(0),
        ])));
        assert!(matches!(granted, LegacyVote::Granted(e) if e == vec![1_700_000_000_123, 0]));
        let held = LegacyVote::of(Ok(Reply::Array(vec![Reply::Int(0), Reply::Int(250)])));
        assert!(matches!(held, LegacyVote::Held(Some(d)) if d == Duration::from_millis(250)));
        // The SETNX pattern's key has no TTL: free "when the old code says", not now.
        let forever = LegacyVote::of(Ok(Reply::Array(vec![Reply::Int(0), Reply::Int(-1)])));
        assert!(matches!(forever, LegacyVote::Held(None)));
        // An error reply is a failure, never a refusal (rule 5a).
        assert!(matches!(
            LegacyVote::of(Ok(Reply::error("WRONGTYPE x"))),
            LegacyVote::Failed(_)
        ));
        assert!(matches!(
            LegacyVote::of(Err(BackendError::Timeout)),
            LegacyVote::Failed(_)
        ));
    }

    #[test]
    fn a_failed_legacy_member_says_so_and_where_to_look() {
        let mut why = NoQuorum::of([&Err(BackendError::Down)], |_| false);
        why.legacy = Some("10.0.0.9:6379".into());
        let text = why.to_string();
        assert!(
            text.starts_with("NOQUORUM legacy member 10.0.0.9:6379 cannot vote: it is down"),
            "{text}"
        );
        assert!(text.ends_with("see PROXY LEGACY"), "{text}");
    }
}
