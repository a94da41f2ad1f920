//! Transactions: `WATCH` records the value a quorum holds, `EXEC` runs the queue as one script per master.

// Every match on a command names each variant (no `_ =>`): a forgotten one is a compile error.
#![cfg_attr(not(test), deny(clippy::wildcard_enum_match_arm))]

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::command::{Command, Condition, ForwardKind};
use crate::error::ClientError;
use crate::lua::ScriptCall;
use crate::quorum::{Answer, Op, combine, combine_or};
use crate::reply::Reply;

use super::outcome::{Unit, told};
use super::{Proxy, request};
use crate::recipes::lock::serve::{PlainSet, Wrote};

/// A command queued in `MULTI`: what each master runs, the keys it names, and, for a write
/// that leaves its key with a TTL, how rule 7 judges its position of the `EXEC` reply (rule 7a).
#[derive(Clone, Debug)]
pub struct Queued {
    args: Vec<Bytes>,
    /// Declared in the `EXEC` script's `KEYS` (after the watched ones): a cluster member routes
    /// the script by them to the shard of their slot. Without them a transaction without
    /// `WATCH` declared no key and ran on any shard, failing for keys of the others.
    keys: Vec<Bytes>,
    ttl_write: Option<TtlWrite>,
    /// For `PTTL` and `TTL` (asked as `PTTL`): the position is a figure of milliseconds left,
    /// told as it stands when the reply is written (rule 4a), in this unit.
    ttl_read: Option<Unit>,
}

/// A queued write that leaves a TTL.
#[derive(Clone, Debug)]
struct TtlWrite {
    /// The TTL it writes.
    ttl: Duration,
    /// Which reply of one master means it wrote.
    wrote: Wrote,
    /// What the position answers when a quorum did not write within the validity.
    failure: Reply,
}

impl Proxy {
    /// `WATCH`: the value each key holds on a majority now, to compare at `EXEC`.
    pub async fn watch(&self, db: u32, keys: Vec<Bytes>) -> Result<Vec<(Bytes, Option<Bytes>)>, Reply> {
        let mut watched = Vec::with_capacity(keys.len());
        for key in keys {
            let value = match self.engine.execute(Op::Command(request(db, [&b"GET"[..], &key]))).await {
                Reply::Bulk(v) => Some(v),
                Reply::Nil => None,
                error @ Reply::Status(_)
                | error @ Reply::Error(_)
                | error @ Reply::Int(_)
                | error @ Reply::NilArray
                | error @ Reply::Array(_)
                | error @ Reply::Map(_)
                | error @ Reply::Set(_)
                | error @ Reply::Double(_)
                | error @ Reply::Bool(_)
                | error @ Reply::Push(_) => return Err(error),
            };
            watched.push((key, value));
        }
        Ok(watched)
    }

    /// `EXEC`: the queued commands, guarded by the watched values, run as one script on each
    /// master (atomic there); each reply is combined position by position. Nil (the
    /// transaction aborted) when a majority saw a watched key change. A position that wrote a
    /// TTL counts only if a quorum wrote it within its validity (rule 7a); else it answers the
    /// command's failure value. The reply is written at once (`EXEC` runs alone).
    pub async fn exec(&self, db: u32, watched: &[(Bytes, Option<Bytes>)], queued: &[Queued]) -> Reply {
        let commands: Vec<Vec<Bytes>> = queued.iter().map(|q| q.args.clone()).collect();
        let keys: Vec<Bytes> = queued.iter().flat_map(|q| q.keys.iter().cloned()).collect();
        // On bridged keys the transaction runs on the legacy member too, as the same one step
        // (the old code's server gives it its single-instance meaning); one that names bridged
        // and other keys would touch the legacy server beyond the lock keys.
        let every_key: Vec<Bytes> = watched
            .iter()
            .map(|(k, _)| k.clone())
            .chain(keys.iter().cloned())
            .collect();
        if let Some(refused) = self.half_bridged(&every_key) {
            return refused;
        }
        let start = Instant::now();
        let op = Op::Script(ScriptCall::exec(db, watched, &keys, &commands));
        let (answers, legacy) = self
            .engine
            .mirrored(&every_key, &op, self.engine.broadcast(op.clone()))
            .await;
        let elapsed = start.elapsed();
        let q = self.engine.quorum();
        // Ran where the script answered its array of results. The arrays differ as wholes
        // whenever one position does (each master's PTTL): only positions are combined.
        let ran = answers.iter().filter(|a| matches!(a, Ok(Reply::Array(_)))).count();
        if ran < q {
            // Not run by a quorum: the masters' errors, `NOQUORUM`, or else aborted (a quorum
            // saw a watched key change, or none agrees either way: nothing counts as done).
            return match combine(&answers, q) {
                error @ Reply::Error(_) => error,
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
                | Reply::Push(_) => Reply::NilArray,
            };
        }
        let column = |i: usize| -> Vec<Answer> {
            answers
                .iter()
                .map(|a| match a {
                    Ok(Reply::Array(items)) => Ok(items.get(i).cloned().unwrap_or(Reply::Nil)),
                    other => other.clone(),
                })
                .collect()
        };
        let positions = queued.iter().enumerate().map(|(i, queued)| {
            let column = column(i);
            if let Some(unit) = queued.ttl_read {
                // Each master's figure is from some moment of the broadcast: counted from its
                // start. The reply is written at once (`EXEC` runs alone).
                return told(combine(&column, q), elapsed, unit);
            }
            let Some(write) = &queued.ttl_write else {
                return combine(&column, q);
            };
            let reply = match write.wrote {
                Wrote::AnyValue => combine_or(&column, q, write.failure.clone()),
                Wrote::Ok | Wrote::OldValue | Wrote::One => combine(&column, q),
            };
            let wrote = column
                .iter()
                .filter(|a| a.as_ref().is_ok_and(|r| write.wrote.matches(r)))
                .count();
            // A bridged write counts only if the legacy member wrote it too.
            let legacy_wrote = match &legacy {
                None => true,
                Some(Ok(Reply::Array(items))) => items.get(i).is_some_and(|r| write.wrote.matches(r)),
                Some(_) => false,
            };
            let valid = wrote >= q && legacy_wrote && self.engine.validity(write.ttl, elapsed).is_some();
            if valid || reply.is_error() {
                reply
            } else {
                write.failure.clone()
            }
        });
        Reply::Array(positions.collect())
    }

    /// What a command queued in `MULTI` sends to each master, or why it can't be queued.
    pub fn queued_args(&self, command: Command) -> Result<Queued, ClientError> {
        let keys = command.keys().to_vec();
        match command {
            Command::Forward(mut f) => {
                let ttl_read = match f.kind {
                    ForwardKind::Pttl => Some(Unit::Ms),
                    ForwardKind::Ttl => Some(Unit::Seconds),
                    ForwardKind::Get | ForwardKind::Llen | ForwardKind::Exists | ForwardKind::Del | ForwardKind::Unlink | ForwardKind::Zrem => None,
                };
                if let (Some(Unit::Seconds), Some(name)) = (ttl_read, f.args.first_mut()) {
                    *name = Bytes::from_static(b"PTTL");
                }
                Ok(Queued {
                    args: f.args,
                    keys,
                    ttl_write: None,
                    ttl_read,
                })
            }
            Command::Acquire(_) => Err(ClientError::Unsupported(
                "SET NX cannot be queued in MULTI through the proxy: a lock is taken by a quorum, with an undo when refused; send it outside the transaction".into(),
            )),
            Command::Set(set) if matches!(set.condition, Condition::Always | Condition::Xx) => {
                let ttl = self.ttl_of(&set)?;
                // As `SET` outside a transaction (see `Proxy::write`).
                let PlainSet { args, wrote, failure } =
                    PlainSet::new(set.key, set.value, set.condition == Condition::Xx, set.get, ttl);
                let ttl_write = Some(TtlWrite {
                    ttl: Duration::from_millis(ttl),
                    wrote,
                    failure,
                });
                Ok(Queued {
                    args,
                    keys,
                    ttl_write,
                    ttl_read: None,
                })
            }
            Command::Expire(e) => {
                let ttl = u64::try_from(e.ttl_ms).ok().filter(|t| *t > 0);
                if let Some(ttl) = ttl {
                    self.check_ttl(ttl)?;
                }
                let mut args = vec![Bytes::from_static(b"PEXPIRE"), e.key, Bytes::from(e.ttl_ms.to_string())];
                args.extend(e.flag);
                let ttl_write = ttl.map(|ttl| TtlWrite {
                    ttl: Duration::from_millis(ttl),
                    wrote: Wrote::One,
                    failure: Reply::Int(0),
                });
                Ok(Queued {
                    args,
                    keys,
                    ttl_write,
                    ttl_read: None,
                })
            }
            Command::Local(_)
                | Command::Set(_)
                | Command::SetNx { .. }
                | Command::DelEx(_)
                | Command::Eval(_)
                | Command::Script(_)
                | Command::Multi
                | Command::Exec
                | Command::Discard
                | Command::Watch(_)
                | Command::Unwatch
                | Command::Proxy(_)
                | Command::Recipe(_
            ) | Command::BlPop { .. } => Err(ClientError::Unsupported(
                "only GET, EXISTS, PTTL, TTL, LLEN, DEL, UNLINK, ZREM, SET (not NX) and PEXPIRE/EXPIRE can be queued in MULTI through the proxy".into(),
            )),
        }
    }
}
