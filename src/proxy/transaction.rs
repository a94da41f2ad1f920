//! Transactions: `WATCH` records the value a quorum holds, `EXEC` runs the queue as one script per master.

use bytes::Bytes;

use crate::command::{Command, Condition};
use crate::error::ClientError;
use crate::quorum::{Answer, Op, combine};
use crate::reply::Reply;
use crate::scripts::ScriptCall;

use super::{Proxy, request};

impl Proxy {
    /// `WATCH`: the value each key holds on a majority now, to compare at `EXEC`.
    pub async fn watch(&self, db: u32, keys: Vec<Bytes>) -> Result<Vec<(Bytes, Option<Bytes>)>, Reply> {
        let mut watched = Vec::with_capacity(keys.len());
        for key in keys {
            let value = match self.engine.execute(Op::Command(request(db, [&b"GET"[..], &key]))).await {
                Reply::Bulk(v) => Some(v),
                Reply::Nil => None,
                error => return Err(error),
            };
            watched.push((key, value));
        }
        Ok(watched)
    }

    /// `EXEC`: the queued commands, guarded by the watched values, run as one script on each
    /// master (atomic there); each reply is combined position by position. Nil (the
    /// transaction aborted) when a majority saw a watched key change.
    pub async fn exec(&self, db: u32, watched: &[(Bytes, Option<Bytes>)], queued: &[Vec<Bytes>]) -> Reply {
        let answers = self
            .engine
            .broadcast(Op::Script(ScriptCall::exec(db, watched, queued)))
            .await;
        let q = self.engine.quorum();
        if let reply @ (Reply::Nil | Reply::Error(_)) = combine(&answers, q) {
            return if reply == Reply::Nil { Reply::NilArray } else { reply };
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
        Reply::Array((0..queued.len()).map(|i| combine(&column(i), q)).collect())
    }

    /// What a command queued in `MULTI` sends to each master, or why it can't be queued.
    pub fn queued_args(&self, command: Command) -> Result<Vec<Bytes>, ClientError> {
        match command {
            Command::Forward(f) => Ok(f.args),
            Command::Set(set) if matches!(set.condition, Condition::Always | Condition::Xx | Condition::Nx) => {
                let ttl = self.ttl_of(&set)?;
                let mut args = vec![Bytes::from_static(b"SET"), set.key, set.value];
                match set.condition {
                    Condition::Nx => args.push(Bytes::from_static(b"NX")),
                    Condition::Xx => args.push(Bytes::from_static(b"XX")),
                    _ => {}
                }
                if set.get {
                    args.push(Bytes::from_static(b"GET"));
                }
                args.extend([Bytes::from_static(b"PX"), Bytes::from(ttl.to_string())]);
                Ok(args)
            }
            Command::Expire(e) => {
                if let Ok(ttl) = u64::try_from(e.ttl_ms) {
                    self.check_ttl(ttl)?;
                }
                let mut args = vec![Bytes::from_static(b"PEXPIRE"), e.key, Bytes::from(e.ttl_ms.to_string())];
                args.extend(e.flag);
                Ok(args)
            }
            _ => Err(ClientError::Unsupported(
                "only GET, EXISTS, PTTL, TTL, DEL, UNLINK, SET and PEXPIRE/EXPIRE can be queued in MULTI through the proxy".into(),
            )),
        }
    }
}
