//! Dispatch: every command that needs the masters, from its parsed [`Command`] to the
//! [`Outcome`] the connection writes, metered by kind.

// Every match on a command names each variant (no `_ =>`): a forgotten one is a compile error.
#![cfg_attr(not(test), deny(clippy::wildcard_enum_match_arm))]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt};
use tokio::sync::watch;

use crate::backend::Request;
use crate::command::LockOp;
use crate::command::script::ScriptRef;
use crate::command::{Command, Condition, Forward, ForwardKind, Set};
use crate::metrics as m;
use crate::quorum::Op;
use crate::reply::Reply;
use crate::scripts;

use super::*;

impl Proxy {
    /// Runs a command that needs the masters. Connection commands never come here. The
    /// outcome says until when the reply holds (rule 4a): the connection settles it when it
    /// writes it.
    /// `closed` turns true when the client's connection ends: a request waiting for a lock
    /// then stops waiting (only those watch it).
    ///
    /// Each kind of command gets a future boxed at its own size: one allocation per command.
    /// One future for every kind would be as large as the largest (a waiting acquisition, 3 KB)
    /// and put every `SET NX` on the allocator's slow path for large blocks (BENCHMARKS.md,
    /// "Allocations per request").
    pub fn execute(
        self: &Arc<Self>,
        db: u32,
        command: Command,
        closed: &watch::Sender<bool>,
    ) -> BoxFuture<'static, Outcome> {
        let (name, kind) = self.describe(&command);
        let p = self.clone();
        match command {
            Command::Recipe(r) => r.serve(self, db, closed, (name, kind)),
            Command::Acquire(set) => self.metered(name, kind, async move { p.set_nx(db, set).await }),
            Command::Set(set) => self.metered(name, kind, async move { p.set(db, set).await }),
            Command::SetNx { key, value } => self.metered(name, kind, async move { p.setnx(db, key, value).await }),
            Command::DelEx(d) => self.metered(name, kind, async move {
                // A deletion's 1: the key is gone from a quorum (what a session lock ends with).
                let reply = p.delex(db, d).await;
                if reply == Reply::Int(1) {
                    Outcome::plain(reply).freed()
                } else {
                    reply.into()
                }
            }),
            Command::Expire(e) => self.metered(name, kind, async move { p.expire(db, e).await }),
            Command::Eval(e) => self.metered(name, kind, async move { p.eval(db, e).await }),
            Command::Script(s) => self.metered(name, kind, async move { p.script(s).await.into() }),
            Command::Forward(f) => self.metered(name, kind, async move { p.forward(db, f).await }),
            Command::BlPop { keys, timeout } => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move { p.blpop(db, keys, timeout, closed).await })
            }
            other @ Command::Local(_)
            | other @ Command::Multi
            | other @ Command::Exec
            | other @ Command::Discard
            | other @ Command::Watch(_)
            | other @ Command::Unwatch
            | other @ Command::Proxy(_) => {
                let reply = Reply::error(format!("ERR internal: {other:?} is not a backend command"));
                Box::pin(std::future::ready(reply.into()))
            }
        }
    }

    /// A command's future, boxed, with its metrics recorded when it ends.
    pub(crate) fn metered(
        self: &Arc<Self>,
        name: &'static str,
        kind: LockOp,
        run: impl Future<Output = Outcome> + Send + 'static,
    ) -> BoxFuture<'static, Outcome> {
        let (proxy, start) = (self.clone(), Instant::now());
        // `inspect`, not an `async` block awaiting `run`: that would hold `run` twice.
        Box::pin(run.inspect(move |outcome| proxy.record(name, kind, start, &outcome.reply)))
    }

    /// [`Proxy::metered`] for a fenced command, which may meet a master that cannot vouch for
    /// its fencing counter: the repair is looked for when it ends (F5, [`Proxy::recover_fencing`]).
    pub(crate) fn metered_fenced(
        self: &Arc<Self>,
        (name, kind): (&'static str, LockOp),
        db: u32,
        run: impl Future<Output = Outcome> + Send + 'static,
    ) -> BoxFuture<'static, Outcome> {
        let proxy = self.clone();
        self.metered(name, kind, run.inspect(move |_| proxy.recover_fencing(db)))
    }

    /// Counts a finished command and its latency, by name and outcome.
    fn record(&self, name: &'static str, kind: LockOp, start: Instant, reply: &Reply) {
        if reply.is_error_code("NOQUORUM") {
            self.stats.noquorum.fetch_add(1, Ordering::Relaxed);
        }
        if self.config.metrics_listen.is_none() {
            // Nothing would read them: the labelled key alone costs an allocation.
            return;
        }
        let label = kind.outcome(reply);
        metrics::counter!(m::COMMANDS, "command" => name, "outcome" => label).increment(1);
        // A `NOSCRIPT` answer released or extended nothing: the client's retry with `EVAL`
        // is the operation, and is timed.
        if let Some(histogram) = kind.histogram().filter(|_| label != NOSCRIPT) {
            metrics::histogram!(histogram).record(start.elapsed().as_secs_f64());
        }
    }

    /// A key command sent to every master as it is (`GET`, `DEL`, `PTTL`...).
    async fn forward(&self, db: u32, mut f: Forward) -> Outcome {
        let deletes = f.releases();
        // `TTL` is asked as `PTTL`: its figure counts down in milliseconds until it is written
        // (rule 4a) and is rounded to seconds, as Redis rounds it, only then.
        if let (ForwardKind::Ttl, Some(name)) = (f.kind, f.args.first_mut()) {
            *name = Bytes::from_static(b"PTTL");
        }
        // Each master's figure is from some moment of the read: counted from its start.
        let asked = tokio::time::Instant::now();
        // A bridged key's `GET` sees the old code's lock on the legacy member; its `DEL` (the
        // `SETNX` pattern's release) deletes there too (`crate::quorum::Legacy`).
        if let (ForwardKind::Get, [key]) = (f.kind, &f.keys[..]) {
            return self.read_value(db, key).await.into();
        }
        // On the legacy member, the same deletion of the bridged keys alone: it is touched on
        // the lock keys only.
        let bridged: Vec<Bytes> = f.keys.iter().filter(|k| self.engine.bridged(k)).cloned().collect();
        let on_legacy = (f.deletes() && !bridged.is_empty()).then(|| {
            let name = f.args.first().cloned().unwrap_or_else(|| Bytes::from_static(b"DEL"));
            Op::Command(Request::new(
                db,
                std::iter::once(name).chain(bridged.iter().cloned()).collect(),
            ))
        });
        let masters = self.engine.execute(Op::Command(Request::new(db, f.args)));
        let reply = match &on_legacy {
            Some(op) => self.engine.mirrored(&bridged, op, masters).await.0,
            None => masters.await,
        };
        match reply {
            // A deletion may have freed locks others wait for.
            Reply::Int(n) if deletes && n > 0 => {
                for key in &f.keys {
                    self.announce_release(db, key);
                }
                Reply::Int(n).into()
            }
            // Rule 4a: the TTL a quorum guarantees is what is left when written.
            Reply::Int(ms) if ms > 0 && f.kind == ForwardKind::Pttl => Outcome::remaining_since(Reply::Int(ms), asked),
            Reply::Int(ms) if ms > 0 && f.kind == ForwardKind::Ttl => Outcome::seconds_remaining_since(ms, asked),
            reply @ Reply::Status(_)
            | reply @ Reply::Error(_)
            | reply @ Reply::Int(_)
            | reply @ Reply::Bulk(_)
            | reply @ Reply::Nil
            | reply @ Reply::NilArray
            | reply @ Reply::Array(_)
            | reply @ Reply::Map(_)
            | reply @ Reply::Set(_)
            | reply @ Reply::Double(_)
            | reply @ Reply::Bool(_)
            | reply @ Reply::Push(_) => reply.into(),
        }
    }

    /// A command's name for metrics (the `command` label: what the client sent, from a fixed
    /// set), and what kind of lock operation it is.
    fn describe(&self, command: &Command) -> (&'static str, LockOp) {
        match command {
            Command::Acquire(_) => ("set_nx", LockOp::Acquire),
            Command::Set(Set {
                condition: Condition::IfEq(_),
                ..
            }) => ("set_ifeq", LockOp::Extend),
            Command::Set(_) => ("set", LockOp::Other),
            Command::SetNx { .. } => ("setnx", LockOp::Acquire),
            Command::DelEx(_) => ("delex", LockOp::Release),
            Command::Expire(_) => ("pexpire", LockOp::Extend),
            Command::Eval(e) => {
                let name = if matches!(e.script, ScriptRef::Sha(_)) {
                    "evalsha"
                } else {
                    "eval"
                };
                let sets_ttl = match &e.script {
                    ScriptRef::Body(body) => scripts::sets_ttl(body),
                    ScriptRef::Sha(sha) => self.scripts.get(sha).is_some_and(|s| s.sets_ttl),
                };
                (name, if sets_ttl { LockOp::Extend } else { LockOp::Release })
            }
            Command::Script(_) => ("script", LockOp::Other),
            Command::Forward(f) => {
                let name = match f.kind {
                    ForwardKind::Get => "get",
                    ForwardKind::Pttl => "pttl",
                    ForwardKind::Ttl => "ttl",
                    ForwardKind::Llen => "llen",
                    ForwardKind::Exists => "exists",
                    ForwardKind::Del => "del",
                    ForwardKind::Unlink => "unlink",
                    ForwardKind::Zrem => "zrem",
                };
                (name, if f.releases() { LockOp::Release } else { LockOp::Other })
            }
            Command::Recipe(r) => r.call().metered(),
            Command::BlPop { .. } => ("blpop", LockOp::Other),
            // The connection answers these itself: `execute` never meters them.
            Command::Local(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_) => ("connection", LockOp::Other),
        }
    }
}

/// The `outcome` of an `EVALSHA` whose script the proxy has not seen: a client library's
/// normal first try (it sends the script with `EVAL` next), not an error.
const NOSCRIPT: &str = "noscript";

impl LockOp {
    /// The latency histogram this kind of command is timed in, as a whole.
    fn histogram(self) -> Option<&'static str> {
        match self {
            LockOp::Acquire => Some(m::ACQUIRE_SECONDS),
            LockOp::Release => Some(m::RELEASE_SECONDS),
            LockOp::Extend => Some(m::EXTEND_SECONDS),
            LockOp::Waiting | LockOp::Other => None,
        }
    }

    /// `acquired`, `contended`, `noquorum`, `noscript`, `error` or `ok`.
    fn outcome(self, reply: &Reply) -> &'static str {
        let acquires = matches!(self, LockOp::Acquire | LockOp::Waiting);
        match reply {
            r if r.is_error_code("NOQUORUM") => "noquorum",
            r if r.is_error_code("NOSCRIPT") => NOSCRIPT,
            Reply::Error(_) => "error",
            // A permit is `[slot, token]`.
            Reply::Status(_) | Reply::Int(1..) | Reply::Array(_) if acquires => "acquired",
            Reply::Nil | Reply::Int(0) if acquires => "contended",
            Reply::Status(_)
            | Reply::Int(_)
            | Reply::Bulk(_)
            | Reply::Nil
            | Reply::NilArray
            | Reply::Array(_)
            | Reply::Map(_)
            | Reply::Set(_)
            | Reply::Double(_)
            | Reply::Bool(_)
            | Reply::Push(_) => "ok",
        }
    }
}
