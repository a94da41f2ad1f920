//! What the status page shows, as JSON (`/status.json`): gathered from the same functions as
//! `INFO backends`, `PROXY BACKENDS`, `PROXY LOCKS` and `PROXY CONFIG`, less what the page
//! must never show.
//!
//! The page has no login: anyone who reaches `metrics_listen` reads it. So it shows what the
//! metrics there already show (the masters' addresses and states) and what helps an operator
//! at a glance, and never a lock's token (whoever has it can release or extend the lock), a
//! client's address, or a secret (passwords, and password digests, are masked). These types
//! have no field for any of them: a later change cannot leak one by accident.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::backend::health::State;
use crate::proxy::info::{self, BackendView};
use crate::proxy::{LockEntry, Proxy};

/// How many keys the page lists, the busiest first: a proxy may hold ten thousand session
/// locks, and a page that lists them all is neither quick to send nor to read.
pub const MAX_KEYS: usize = 50;

/// Keys and reasons are cut to this many characters on the page (a key may be 4 KB).
const MAX_TEXT: usize = 200;

/// Everything the page shows.
#[derive(Debug, Serialize)]
pub struct Status {
    /// The proxy itself.
    pub proxy: ProxyInfo,
    /// Each member, in configuration order.
    pub masters: Vec<Master>,
    /// Session locks and wait queues of this proxy.
    pub locks: Locks,
    /// The last session locks lost under their holders, newest first.
    pub lost: Vec<LostLock>,
    /// The legacy member of a rollout, when `legacy_backend` is set.
    pub legacy: Option<LegacyView>,
    /// The configuration in force, as TOML, secrets masked.
    pub config: String,
}

/// The proxy's own numbers.
#[derive(Debug, Serialize)]
pub struct ProxyInfo {
    /// `proxy_version` in `INFO`.
    pub version: &'static str,
    /// This process's run id (`INFO server`).
    pub run_id: String,
    /// How long it has run.
    pub uptime_ms: u64,
    /// When this view was taken, in ms since the Unix epoch.
    pub now_unix_ms: u64,
    /// The address clients connect to.
    pub listen: String,
    /// How many members there are.
    pub members: usize,
    /// How many must grant a lock.
    pub quorum: usize,
    /// How many members are up (vote) now.
    pub up: usize,
    /// Clients connected now.
    pub clients: usize,
    /// `maxclients`.
    pub max_clients: usize,
    /// Commands processed since start.
    pub commands: u64,
    /// Locks granted since start.
    pub acquired: u64,
    /// Acquisitions refused because the lock was held.
    pub contended: u64,
    /// Requests answered `NOQUORUM`.
    pub noquorum: u64,
    /// Session locks held through this proxy now.
    pub session_locks: usize,
    /// `max_session_locks`.
    pub max_session_locks: usize,
}

/// One member.
#[derive(Debug, Serialize)]
pub struct Master {
    /// Its index (`backendN`, `PROXY QUARANTINE <index>`).
    pub index: usize,
    /// Its address (a Sentinel group's `name@first-sentinel`, a cluster's `cluster@first-seed`).
    pub name: String,
    /// `redis`, `sentinel`, `cluster` or `embedded`.
    pub kind: &'static str,
    /// `up`, `down`, `quarantined` or `duplicate`.
    pub state: &'static str,
    /// Why it is not up, when known.
    pub why: Option<String>,
    /// The quarantine left, while quarantined.
    pub quarantine_remaining_ms: Option<u64>,
    /// The member a duplicate is the same server as.
    pub duplicate_of: Option<usize>,
    /// Where a Sentinel group's master is now.
    pub master: Option<String>,
    /// A cluster's shards.
    pub shards: Option<Vec<Shard>>,
    /// The master process's `run_id` as last seen.
    pub run_id: Option<String>,
    /// The last request's answer time.
    pub last_latency_us: Option<u64>,
    /// Requests that timed out since start.
    pub timeouts: Option<u64>,
    /// Requests whose connection failed since start.
    pub errors: Option<u64>,
}

/// One shard of a cluster member.
#[derive(Debug, Serialize)]
pub struct Shard {
    /// The shard master's address.
    pub master: String,
    /// `up`, `down` or `quarantined`.
    pub state: &'static str,
    /// Why it is not up, when known.
    pub why: Option<String>,
    /// The quarantine left, while quarantined.
    pub quarantine_remaining_ms: Option<u64>,
    /// Its slot ranges, `a-b` joined by `+`.
    pub slots: String,
    /// How many slots it serves.
    pub slot_count: usize,
}

/// This proxy's locks, the busiest keys first.
#[derive(Debug, Serialize)]
pub struct Locks {
    /// Keys with a session lock or a wait queue here, in all.
    pub keys_total: usize,
    /// Requests waiting here, all keys together.
    pub waiting_total: usize,
    /// The busiest [`MAX_KEYS`] keys: most waiters first, then held ones, then by key.
    pub keys: Vec<LockKey>,
}

/// One key's lock in this proxy.
#[derive(Debug, Serialize)]
pub struct LockKey {
    /// The database.
    pub db: u32,
    /// The key (cut to a few hundred characters).
    pub key: String,
    /// Whether this proxy holds it as a session lock.
    pub held: bool,
    /// The holder's client id (`CLIENT KILL ID` takes it); never its address or token.
    pub client_id: Option<u64>,
    /// Requests waiting for it in this proxy.
    pub waiting: usize,
    /// Other proxies that announced waiters for it.
    pub waiting_elsewhere: usize,
}

/// The legacy member (`PROXY LEGACY`): its state and the old code's locks held there. Keys
/// only, never a value (a value is a lock's token).
#[derive(Debug, Serialize)]
pub struct LegacyView {
    /// Its address.
    pub name: String,
    /// `up`, `down` or `quarantined`.
    pub state: &'static str,
    /// The patterns of the keys it bridges.
    pub keys: Vec<String>,
    /// The old code's locks held there now, as its watch last counted them.
    pub old_code_locks: usize,
    /// The first few of them.
    pub old_code_keys: Vec<LegacyKey>,
    /// How long ago an old-code lock was last seen (none: never).
    pub old_code_seen_ago_ms: Option<u64>,
    /// Acquisitions the legacy member refused while a quorum of masters granted them.
    pub refusals: u64,
}

/// One lock the old code holds on the legacy member.
#[derive(Debug, Serialize)]
pub struct LegacyKey {
    /// The database.
    pub db: u32,
    /// The key (cut to a few hundred characters).
    pub key: String,
    /// Its PTTL there (-1: none, as the `SETNX` pattern writes it).
    pub pttl_ms: i64,
}

/// A session lock lost under its holder.
#[derive(Debug, Serialize)]
pub struct LostLock {
    /// The database.
    pub db: u32,
    /// The key (cut to a few hundred characters).
    pub key: String,
    /// `not-extended`, `max-hold`, `deleted`, `overwritten` or `expire-changed`.
    pub reason: &'static str,
    /// The holder's client id.
    pub client_id: u64,
    /// When, in ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// How long ago.
    pub ago_ms: u64,
}

/// The status of `proxy` now.
pub fn status(proxy: &Proxy) -> Status {
    let masters: Vec<Master> = info::backend_views(proxy).into_iter().map(master).collect();
    let stats = &proxy.stats;
    let config = &proxy.config;
    Status {
        proxy: ProxyInfo {
            version: env!("CARGO_PKG_VERSION"),
            run_id: proxy.run_id.clone(),
            uptime_ms: millis(proxy.started.elapsed()),
            now_unix_ms: unix_ms(SystemTime::now()),
            listen: config.listen.clone(),
            members: masters.len(),
            quorum: proxy.engine.quorum(),
            up: masters.iter().filter(|m| m.state == State::Up.name()).count(),
            clients: stats.clients.load(Ordering::Relaxed),
            max_clients: config.maxclients,
            commands: stats.commands.load(Ordering::Relaxed),
            acquired: stats.acquired.load(Ordering::Relaxed),
            contended: stats.contended.load(Ordering::Relaxed),
            noquorum: stats.noquorum.load(Ordering::Relaxed),
            session_locks: proxy.sessions.total(),
            max_session_locks: config.max_session_locks,
        },
        masters,
        locks: locks(proxy, proxy.locks(None)),
        lost: lost(proxy),
        legacy: legacy(proxy),
        config: masked_config(proxy),
    }
}

/// The legacy member's view, from the watch's last report.
fn legacy(proxy: &Proxy) -> Option<LegacyView> {
    let member = proxy.engine.legacy()?;
    let report = proxy
        .legacy_watch
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Some(LegacyView {
        name: crate::backend::Backend::name(&**member.backend()).to_owned(),
        state: member.backend().state().name(),
        keys: proxy.config.legacy_keys.clone(),
        old_code_locks: report.old_code_count,
        old_code_keys: report
            .old_code_locks
            .iter()
            .map(|(db, key, pttl)| LegacyKey {
                db: *db,
                key: cut(String::from_utf8_lossy(key).into_owned()),
                pttl_ms: *pttl,
            })
            .collect(),
        old_code_seen_ago_ms: report.old_code_seen_at.map(|at| millis(at.elapsed())),
        refusals: member.refusals(),
    })
}

fn master(b: BackendView) -> Master {
    Master {
        index: b.index,
        name: b.name,
        kind: b.kind,
        state: b.state.name(),
        why: b.why.map(cut),
        quarantine_remaining_ms: quarantine_left(b.state),
        duplicate_of: b.duplicate_of.map(|(of, _)| of),
        master: b.master,
        shards: b.shards.map(|shards| {
            shards
                .into_iter()
                .map(|s| Shard {
                    master: s.master,
                    state: s.state.name(),
                    why: s.why.map(cut),
                    quarantine_remaining_ms: quarantine_left(s.state),
                    slots: s.slots,
                    slot_count: s.slot_count,
                })
                .collect()
        }),
        run_id: b.run_id,
        last_latency_us: b
            .requests
            .map(|(latency, _, _)| latency.as_micros().try_into().unwrap_or(u64::MAX)),
        timeouts: b.requests.map(|(_, timeouts, _)| timeouts),
        errors: b.requests.map(|(_, _, errors)| errors),
    }
}

/// The busiest [`MAX_KEYS`] of `all`: most waiters first, then held ones, then by key. The
/// holder is kept as its client id only.
fn locks(proxy: &Proxy, mut all: Vec<LockEntry>) -> Locks {
    let keys_total = all.len();
    let waiting_total = all.iter().map(|l| l.waiting).sum();
    all.sort_unstable_by(|a, b| {
        b.waiting
            .cmp(&a.waiting)
            .then(b.holder.is_some().cmp(&a.holder.is_some()))
            .then(a.db.cmp(&b.db))
            .then(a.key.cmp(&b.key))
    });
    all.truncate(MAX_KEYS);
    let keys = all
        .into_iter()
        .map(|l| LockKey {
            waiting_elsewhere: proxy.waiters.proxies_waiting(l.db, &l.key),
            db: l.db,
            // A reader's hold name carries its token: never on the page.
            key: cut(String::from_utf8_lossy(&crate::recipes::rwlock::public_name(&l.key)).into_owned()),
            held: l.holder.is_some(),
            client_id: l.holder.map(|h| h.client_id),
            waiting: l.waiting,
        })
        .collect();
    Locks {
        keys_total,
        waiting_total,
        keys,
    }
}

fn lost(proxy: &Proxy) -> Vec<LostLock> {
    proxy
        .sessions
        .recent_lost()
        .into_iter()
        .map(|l| LostLock {
            db: l.db,
            key: cut(String::from_utf8_lossy(&crate::recipes::rwlock::public_name(&l.key)).into_owned()),
            reason: l.reason,
            client_id: l.client_id,
            at_unix_ms: unix_ms(l.at),
            ago_ms: millis(l.when.elapsed()),
        })
        .collect()
}

/// The configuration as `PROXY CONFIG` gives it (passwords masked, and those in the masters'
/// URLs), with the users' password digests masked too: `PROXY CONFIG` is for operators, who
/// authenticated; this page is for whoever reaches the listener, and a digest of a weak
/// password can be searched for offline.
fn masked_config(proxy: &Proxy) -> String {
    let mut config = proxy.config.masked();
    for user in &mut config.users {
        if user.password_sha256.is_some() {
            user.password_sha256 = Some("***".to_owned());
        }
    }
    config.to_toml()
}

fn quarantine_left(state: State) -> Option<u64> {
    match state {
        State::Quarantined { remaining } => Some(millis(remaining)),
        _ => None,
    }
}

/// `text` cut to [`MAX_TEXT`] characters, marked with an ellipsis when cut.
fn cut(text: String) -> String {
    match text.char_indices().nth(MAX_TEXT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_character() {
        assert_eq!(cut("short".into()), "short");
        let long = "é".repeat(MAX_TEXT + 5);
        let shown = cut(long);
        assert_eq!(shown.chars().count(), MAX_TEXT + 1);
        assert!(shown.ends_with('…'));
    }
}
