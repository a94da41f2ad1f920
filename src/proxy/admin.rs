//! The operator's commands, `PROXY BACKENDS | CONFIG | QUARANTINE | LOCKS`, answered from the
//! proxy's state.

use bytes::Bytes;

use crate::backend::Backend;
use crate::command::ProxyCmd;
use crate::reply::Reply;

use super::*;

impl Proxy {
    /// The operator's `PROXY` commands.
    pub fn admin(&self, command: ProxyCmd) -> Reply {
        match command {
            ProxyCmd::Backends => Reply::Array(
                info::backend_lines(self)
                    .into_iter()
                    .map(|line| Reply::Bulk(Bytes::from(line)))
                    .collect(),
            ),
            ProxyCmd::Config => Reply::Bulk(Bytes::from(self.config.to_toml())),
            ProxyCmd::Locks(pattern) => Reply::Array(self.lock_lines(pattern.as_deref())),
            ProxyCmd::Legacy => Reply::Array(
                self.legacy_lines()
                    .into_iter()
                    .map(|line| Reply::Bulk(Bytes::from(line)))
                    .collect(),
            ),
            ProxyCmd::Quarantine { backend, lift } => {
                let backends = self.engine.backends();
                let wanted = String::from_utf8_lossy(&backend);
                // The legacy member by that word or its address (rule 8 applies to it as to a
                // master: lift it only when it kept its data).
                let legacy = self
                    .engine
                    .legacy()
                    .map(|l| l.backend())
                    .filter(|b| wanted == "legacy" || wanted == b.name());
                let found = backends
                    .iter()
                    .enumerate()
                    .find(|(i, b)| wanted == i.to_string() || wanted == b.name())
                    .map(|(_, b)| b)
                    .or(legacy);
                let lifted = std::cell::Cell::new(false);
                let changed = found.is_some_and(|b| {
                    b.each_health(|health| {
                        if lift {
                            lifted.set(health.lift_quarantine() | lifted.get());
                        } else {
                            health.quarantine_now();
                        }
                    })
                });
                if !changed {
                    Reply::error(format!("ERR no such backend '{wanted}' (give its index or address)"))
                } else if lift && !lifted.get() {
                    // An `OK` would read as a quarantine lifted, and tell nothing of the state.
                    Reply::error(format!(
                        "ERR backend '{wanted}' is not quarantined: nothing to lift (PROXY BACKENDS shows each \
                         master's state)"
                    ))
                } else {
                    Reply::ok()
                }
            }
        }
    }

    /// `PROXY LOCKS [pattern]`: one line per session lock and per wait queue of this proxy
    /// whose key matches `pattern` (a glob).
    fn lock_lines(&self, pattern: Option<&[u8]>) -> Vec<Reply> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let mut lines: Vec<String> = self
            .locks(pattern)
            .into_iter()
            .map(|lock| match &lock.holder {
                Some(owner) => format!(
                    "session db={} key={} token={} client_id={} client_name={} client_addr={} waiting={}",
                    lock.db,
                    text(&lock.key),
                    text(&owner.token),
                    owner.client_id,
                    text(owner.client_name.as_deref().unwrap_or_default()),
                    owner.client_addr,
                    lock.waiting
                ),
                None => format!("queue db={} key={} waiting={}", lock.db, text(&lock.key), lock.waiting),
            })
            .collect();
        lines.sort();
        lines.into_iter().map(|l| Reply::Bulk(Bytes::from(l))).collect()
    }

    /// This proxy's session locks and wait queues whose key matches `pattern` (a glob; all
    /// when `None`), one entry per key, in no order: for `PROXY LOCKS` and the status page.
    pub fn locks(&self, pattern: Option<&[u8]>) -> Vec<LockEntry> {
        // The pattern is read once for every key (rule 16, `crate::glob`): keys are at most
        // `max_key_len` long, and a longer one is matched all the same.
        let pattern = pattern.map(|p| crate::glob::Pattern::new(p, self.config.max_key_len));
        let wanted = |key: &[u8]| pattern.as_ref().is_none_or(|p| p.matches(key));
        let mut queues: std::collections::HashMap<(u32, Bytes), usize> = self
            .waiters
            .queues()
            .into_iter()
            .filter(|(_, key, _)| wanted(key))
            .map(|(db, key, waiting)| ((db, key), waiting))
            .collect();
        let mut locks: Vec<LockEntry> = self
            .sessions
            .owners
            .iter()
            .filter(|entry| wanted(&entry.key().1))
            .map(|entry| {
                let (db, key) = entry.key().clone();
                let waiting = queues.remove(&(db, key.clone())).unwrap_or(0);
                LockEntry {
                    db,
                    key,
                    holder: Some(entry.value().clone()),
                    waiting,
                }
            })
            .collect();
        locks.extend(queues.into_iter().map(|((db, key), waiting)| LockEntry {
            db,
            key,
            holder: None,
            waiting,
        }));
        locks
    }
}
