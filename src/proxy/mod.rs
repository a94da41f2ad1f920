//! The proxy's shared state, and the execution of every command that needs the masters.
//!
//! A connection hands a parsed [`Command`] here; this module maps it onto the quorum
//! engine and turns the engine's typed outcome into the reply Redis would give.
//!
//! One file per family: this one holds the shared state, start-up, dispatch and the
//! operator's commands; [`lock`] the lock commands (`SET` in its forms, `SETNX`, `DELEX`,
//! `PEXPIRE`, `LOCK.*`); [`semaphore`] `SEM.*`; [`script`] `EVAL`/`EVALSHA`/`SCRIPT`;
//! [`transaction`] `WATCH`/`EXEC`; [`sessions`] keeping session locks alive and releasing them
//! on the masters; [`wait`] waiting in line for a lock or a permit.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt};
use tokio::sync::watch;

use crate::auth::Access;
use crate::backend::cluster::ClusterBackend;
use crate::backend::embedded::EmbeddedBackend;
use crate::backend::health::{Health, State};
use crate::backend::redis::{self, RedisBackend};
use crate::backend::url::mask_url;
use crate::backend::{AnyBackend, Backend, Request};
use crate::clock::{Clock, TokioClock};
use crate::command::script::ScriptRef;
use crate::command::{
    Command, Condition, ElectCmd, Forward, ForwardKind, LockAllCmd, LockCmd, ProxyCmd, RwCmd, SemCmd, Set,
};
use crate::config::Config;
use crate::error::{ClientError, StartError};
use crate::metrics as m;
use crate::quorum::{self, Engine, Op, Settings};
use crate::reply::Reply;
use crate::scripts::{self, Registry};
use crate::sessions::SessionTable;
use crate::waiters::{Signals, Waiters};
use dashmap::DashMap;

pub mod info;
pub mod outcome;
mod script;
mod sessions;
mod transaction;
pub(crate) mod wait;

pub use outcome::Outcome;
pub use transaction::Queued;

/// One key's lock in this proxy: its session lock's holder, if any, and how many requests
/// wait for it here.
#[derive(Clone, Debug)]
pub struct LockEntry {
    /// The database.
    pub db: u32,
    /// The key.
    pub key: Bytes,
    /// Who holds it as a session lock (none: only a wait queue, the lock held elsewhere or
    /// by a plain `SET NX`).
    pub holder: Option<crate::sessions::Owner>,
    /// Requests waiting for it in this proxy.
    pub waiting: usize,
}

/// Counters shown in `INFO`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Locks granted.
    pub acquired: AtomicU64,
    /// Acquisitions refused because the lock is held (or not granted in time).
    pub contended: AtomicU64,
    /// Requests answered `-NOQUORUM`.
    pub noquorum: AtomicU64,
    /// Commands processed.
    pub commands: AtomicU64,
    /// Connections accepted since start.
    pub connections: AtomicU64,
    /// Clients connected now.
    pub clients: AtomicUsize,
    /// Wrong credentials given to `AUTH` / `HELLO AUTH`.
    pub auth_failures: AtomicU64,
}

/// Everything connections share.
pub struct Proxy {
    /// The effective configuration.
    pub config: Config,
    /// The quorum engine over the masters.
    pub engine: Engine<AnyBackend, TokioClock>,
    /// Scripts seen by SHA1.
    pub scripts: Registry,
    /// Passwords and users.
    pub access: Access,
    /// With `script_policy = "allowlist"`: the SHA1s clients may run.
    pub(crate) allowed_scripts: Option<HashSet<Bytes>>,
    /// Counters for `INFO`.
    pub stats: Stats,
    /// Requests waiting for locks (`LOCK.ACQUIRE ... WAIT`), per key, first come first served.
    pub waiters: Arc<Waiters>,
    /// What clients leave waiting or observing, bounded per user and in all.
    pub waiting: Arc<crate::waiting::WaitingTable>,
    /// Clients blocked in `BLPOP` on signal lists.
    pub signals: Arc<Signals>,
    /// Every session lock of this proxy: who holds it, and the counts its bounds check.
    pub sessions: SessionTable,
    /// What this proxy believes of its semaphores' slots (which to try first, which slot a
    /// token was granted): never what a grant rests on.
    pub semaphores: crate::recipes::semaphore::Ledger,
    /// The elections whose leader is observed through this proxy, each with its reader.
    pub elections: crate::recipes::election::Elections,
    /// Every connected client by id, with the signal that closes it (`CLIENT KILL ID`,
    /// shutdown).
    pub clients: DashMap<u64, Arc<crate::stop::Stop>>,
    /// Whether a member is a Redis Cluster: then every command's keys (a transaction's
    /// too) must hash to one slot, as in Redis Cluster itself.
    pub(crate) clustered: bool,
    /// Whether releases are announced on the masters for other proxies (real masters only:
    /// embedded ones serve this proxy alone).
    pub(crate) announces: bool,
    /// Release announcements made, to take the masters in turn.
    pub(crate) announcements: AtomicUsize,
    /// Release announcements published on several masters, numbered by this count.
    pub(crate) released_count: AtomicU64,
    /// The numbered release announcements heard lately, each acted on once.
    pub(crate) heard: std::sync::Mutex<wait::Heard>,
    /// This process's run id (40 hex chars, like Redis's).
    pub run_id: String,
    /// When the proxy started.
    pub started: Instant,
    pub(crate) next_client_id: AtomicU64,
}

impl Proxy {
    /// Builds the proxy from a validated config: connects to the real masters (waiting for the
    /// first attempt on each) or starts embedded ones.
    pub async fn start(config: Config) -> Result<Arc<Proxy>, StartError> {
        let backends = if config.backends.is_empty() {
            // `Config::warnings` said so at start: EMBEDDED masters, not for production.
            (0..config.embedded_backends)
                .map(|i| {
                    AnyBackend::Embedded(EmbeddedBackend::new(
                        format!("embedded-{i}"),
                        Arc::new(TokioClock::new()),
                    ))
                })
                .collect()
        } else {
            Self::connect_all(&config).await?
        };
        let settings = Settings {
            backend_timeout: config.backend_timeout(),
            drift_factor: config.drift_factor,
        };
        let scripts = Registry::new(config.max_ttl_ms);
        let (config_max_waiters_per_key, config_max_waiters) = (config.max_waiters_per_key, config.max_waiters);
        let waiting = crate::waiting::WaitingTable::new(config.max_waiting_per_user, config.max_waiting);
        let announces = !config.backends.is_empty();
        let allowed_scripts = script::allowed_scripts(&config, &scripts)?;
        let clustered = backends.iter().any(|b| matches!(b, AnyBackend::Cluster(_)));
        let run_id = random_run_id();
        let proxy = Arc::new(Proxy {
            clustered,
            access: Access::new(&config)?,
            allowed_scripts,
            engine: Engine::new(backends, TokioClock::new(), settings),
            config,
            scripts,
            stats: Stats::default(),
            waiters: Arc::new(Waiters::new(config_max_waiters_per_key, config_max_waiters)),
            waiting: Arc::new(waiting),
            sessions: SessionTable::default(),
            semaphores: crate::recipes::semaphore::Ledger::new(&run_id),
            elections: crate::recipes::election::Elections::default(),
            clients: DashMap::new(),
            signals: Arc::default(),
            announces,
            announcements: AtomicUsize::new(0),
            released_count: AtomicU64::new(0),
            heard: std::sync::Mutex::default(),
            run_id,
            started: Instant::now(),
            next_client_id: AtomicU64::new(1),
        });
        tokio::spawn(export_backend_states(Arc::downgrade(&proxy)));
        proxy.listen_for_releases();
        Ok(proxy)
    }

    async fn connect_all(config: &Config) -> Result<Vec<AnyBackend>, StartError> {
        let tls = config.tls_ca_file.as_deref().map(crate::tls::connector).transpose()?;
        let settings = redis::Settings {
            tls,
            connect_timeout: config.connect_timeout(),
            request_timeout: config.backend_timeout(),
            probe_interval: Duration::from_millis(config.probe_interval_ms),
            databases: config.databases,
            greeting: Some(Arc::new(quorum::EpochCheck)),
            preload: &PRELOADED,
            shared_transactions: true,
        };
        // Rule 8: a restarted master stays out until every lock granted before its restart
        // has expired: the longest TTL plus its drift allowance.
        let max_ttl = Duration::from_millis(config.max_ttl_ms);
        let quarantine = max_ttl + quorum::drift(max_ttl, config.drift_factor);
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let mut backends = Vec::with_capacity(config.backends.len());
        // Rule 15: one server behind two members' URLs counts once.
        let identities = Arc::new(crate::backend::identity::Identities::default());
        for (index, url) in config.backends.iter().enumerate() {
            let mode = config.quarantine;
            let clock = clock.clone();
            let drift_factor = config.drift_factor;
            let health =
                move |name: &str| Health::new(name, clock.clone(), mode, quarantine).watching_clock(drift_factor);
            let invalid = |e: String| StartError::Config(format!("backends: '{}': {e}", mask_url(url)));
            let backend = match crate::backend::cluster::cluster_url(url) {
                // A cluster's shards are not checked against the members (see `Identities`).
                Some(_) => AnyBackend::Cluster(Arc::new(
                    ClusterBackend::new(url, settings.clone(), health).map_err(invalid)?,
                )),
                None => {
                    let identities = identities.clone();
                    let member = move |name: &str| health(name).member_of(identities, index);
                    AnyBackend::Redis(Box::new(
                        RedisBackend::new(url, settings.clone(), member).map_err(|e| invalid(e.to_string()))?,
                    ))
                }
            };
            backends.push(backend);
        }
        futures_util::future::join_all(backends.iter().map(|b| async move {
            match b {
                AnyBackend::Redis(r) => r.connect().await,
                AnyBackend::Cluster(c) => c.connect().await,
                AnyBackend::Embedded(_) => {}
            }
        }))
        .await;
        let states: Vec<State> = backends.iter().map(AnyBackend::state).collect();
        match no_quorum_at_start(&states) {
            Some(why) => tracing::error!("{why}"),
            None => tracing::info!(
                up = states.len(),
                quorum = quorum::quorum(states.len()),
                "a quorum of masters votes"
            ),
        }
        Ok(backends)
    }

    /// The one hash slot of `keys` (`None` for no keys); `CROSSSLOT` when they differ and a
    /// member is a Redis Cluster. Checked before anything is sent, so that no member runs
    /// what a cluster member must refuse.
    pub fn slot_of<'a>(&self, keys: impl IntoIterator<Item = &'a Bytes>) -> Result<Option<u16>, ClientError> {
        if !self.clustered {
            return Ok(None);
        }
        crate::backend::cluster::common_slot(keys.into_iter().map(|k| &k[..])).map_err(|_| ClientError::CrossSlot)
    }

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
            ProxyCmd::Quarantine { backend, lift } => {
                let backends = self.engine.backends();
                let wanted = String::from_utf8_lossy(&backend);
                let found = backends
                    .iter()
                    .enumerate()
                    .find(|(i, b)| wanted == i.to_string() || wanted == b.name())
                    .map(|(_, b)| b);
                let changed = found.is_some_and(|b| {
                    b.each_health(|health| {
                        if lift {
                            health.lift_quarantine();
                        } else {
                            health.quarantine_now();
                        }
                    })
                });
                if changed {
                    Reply::ok()
                } else {
                    Reply::error(format!("ERR no such backend '{wanted}' (give its index or address)"))
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

    /// A fresh client id for `CLIENT ID` and `HELLO`.
    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    /// After a fenced command: when it met a master that could not vouch for its fencing
    /// counter, repairs the database in the background (`docs/fencing.md`, F5).
    pub fn recover_fencing(self: &Arc<Self>, db: u32) {
        if self.engine.recovery_wanted(db) {
            let proxy = self.clone();
            tokio::spawn(async move { proxy.engine.recover(db).await });
        }
    }

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
            Command::Lock(
                acquire @ LockCmd::Acquire {
                    wait_ms: Some(wait), ..
                },
            ) => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move {
                    let outcome = p
                        .acquire_waiting(db, acquire, Duration::from_millis(wait), closed)
                        .await;
                    p.recover_fencing(db);
                    outcome
                })
            }
            Command::Acquire(set) => self.metered(name, kind, async move { p.set_nx(db, set).await }),
            Command::Set(set) => self.metered(name, kind, async move { p.set(db, set).await }),
            Command::SetNx { key, value } => self.metered(name, kind, async move { p.setnx(db, key, value).await }),
            Command::DelEx(d) => self.metered(name, kind, async move {
                // A deletion's 1: the key is gone from a quorum (what a session lock ends with).
                match p.delex(db, d).await {
                    Reply::Int(1) => Outcome::plain(Reply::Int(1)).freed(),
                    reply => reply.into(),
                }
            }),
            Command::Expire(e) => self.metered(name, kind, async move { p.expire(db, e).await }),
            Command::Eval(e) => self.metered(name, kind, async move { p.eval(db, e).await }),
            Command::Script(s) => self.metered(name, kind, async move { p.script(s).await.into() }),
            Command::Forward(f) => self.metered(name, kind, async move { p.forward(db, f).await }),
            // The fenced acquisition, straight to its own future: `lock_cmd`'s is as large as
            // its largest arm.
            Command::Lock(LockCmd::Acquire {
                key,
                token,
                ttl_ms,
                keepalive,
                wait_ms: None,
                reentrant,
            }) => self.metered(name, kind, async move {
                let (outcome, _) = p.acquire_native(db, key, token, ttl_ms, (keepalive, reentrant)).await;
                // F5: it may have met a master that cannot vouch for its counter.
                p.recover_fencing(db);
                outcome
            }),
            Command::Lock(l) => {
                // Acquisitions have their arms above. Of the rest only LOCK.FENCE can meet a
                // master that cannot vouch for its counter (F5): only it looks for a repair.
                let fenced = matches!(l, LockCmd::Fence { .. });
                self.metered(name, kind, async move {
                    let outcome = p.lock_cmd(db, l).await;
                    if fenced {
                        p.recover_fencing(db);
                    }
                    outcome
                })
            }
            Command::Sem(
                acquire @ SemCmd::Acquire {
                    wait_ms: Some(wait), ..
                },
            ) => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move {
                    let outcome = p
                        .acquire_permit_waiting(db, acquire, Duration::from_millis(wait), closed)
                        .await;
                    p.recover_fencing(db);
                    outcome
                })
            }
            Command::Sem(SemCmd::Acquire {
                key,
                token,
                permits,
                ttl_ms,
                keepalive,
                wait_ms: None,
            }) => self.metered(name, kind, async move {
                let (outcome, _) = p.acquire_permit(db, key, token, permits, ttl_ms, keepalive).await;
                // F5: a slot is fenced as a lock is, and may meet a master that cannot vouch.
                p.recover_fencing(db);
                outcome
            }),
            Command::Sem(s) => self.metered(name, kind, async move { p.sem_cmd(db, s).await }),
            Command::RwLock(
                acquire @ RwCmd::Acquire {
                    wait_ms: Some(wait), ..
                },
            ) => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move {
                    let outcome = p
                        .acquire_hold_waiting(db, acquire, Duration::from_millis(wait), closed)
                        .await;
                    p.recover_fencing(db);
                    outcome
                })
            }
            Command::LockAll(
                acquire @ LockAllCmd::Acquire {
                    wait_ms: Some(wait), ..
                },
            ) => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move {
                    let outcome = p
                        .acquire_all_waiting(db, acquire, Duration::from_millis(wait), closed)
                        .await;
                    p.recover_fencing(db);
                    outcome
                })
            }
            Command::RwLock(r) => {
                // F5: a hold is fenced as a lock is, and may meet a master that cannot vouch.
                let fenced = matches!(r, RwCmd::Acquire { .. });
                self.metered(name, kind, async move {
                    let outcome = p.rw_cmd(db, r).await;
                    if fenced {
                        p.recover_fencing(db);
                    }
                    outcome
                })
            }
            Command::Elect(e) => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move {
                    let fenced = matches!(e, ElectCmd::Campaign { .. });
                    let outcome = p.elect_cmd(db, e, closed).await;
                    // F5: a campaign is a fenced acquisition.
                    if fenced {
                        p.recover_fencing(db);
                    }
                    outcome
                })
            }
            Command::LockAll(LockAllCmd::Acquire {
                token,
                ttl_ms,
                keys,
                keepalive,
                wait_ms: None,
            }) => self.metered(name, kind, async move {
                let (outcome, _) = p.acquire_all(db, token, ttl_ms, &keys, keepalive).await;
                // F5: each key is fenced as a lock is, and may meet a master that cannot vouch.
                p.recover_fencing(db);
                outcome
            }),
            Command::LockAll(LockAllCmd::Release { token, keys }) => {
                self.metered(name, kind, async move { p.release_all(db, token, keys).await.into() })
            }
            Command::BlPop { keys, timeout } => {
                let closed = closed.subscribe();
                self.metered(name, kind, async move { p.blpop(db, keys, timeout, closed).await })
            }
            other => {
                let reply = Reply::error(format!("ERR internal: {other:?} is not a backend command"));
                Box::pin(std::future::ready(reply.into()))
            }
        }
    }

    /// A command's future, boxed, with its metrics recorded when it ends.
    fn metered(
        self: &Arc<Self>,
        name: &'static str,
        kind: LockOp,
        run: impl Future<Output = Outcome> + Send + 'static,
    ) -> BoxFuture<'static, Outcome> {
        let (proxy, start) = (self.clone(), Instant::now());
        // `inspect`, not an `async` block awaiting `run`: that would hold `run` twice.
        Box::pin(run.inspect(move |outcome| proxy.record(name, kind, start, &outcome.reply)))
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
        match self.engine.execute(Op::Command(Request::new(db, f.args))).await {
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
            reply => reply.into(),
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
            Command::Lock(l) => (
                l.name(),
                match l {
                    LockCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
                    LockCmd::Acquire { .. } => LockOp::Acquire,
                    LockCmd::Extend { .. } => LockOp::Extend,
                    LockCmd::Release { .. } => LockOp::Release,
                    LockCmd::Info { .. } | LockCmd::Fence { .. } => LockOp::Other,
                },
            ),
            Command::Sem(s) => (
                s.name(),
                match s {
                    SemCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
                    SemCmd::Acquire { .. } => LockOp::Acquire,
                    SemCmd::Extend { .. } => LockOp::Extend,
                    SemCmd::Release { .. } => LockOp::Release,
                    SemCmd::Info { .. } => LockOp::Other,
                },
            ),
            Command::RwLock(r) => (
                r.name(),
                match r {
                    RwCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
                    RwCmd::Acquire { .. } => LockOp::Acquire,
                    RwCmd::Extend { .. } => LockOp::Extend,
                    RwCmd::Release { .. } => LockOp::Release,
                    RwCmd::Info { .. } => LockOp::Other,
                },
            ),
            Command::Elect(e) => (
                e.name(),
                match e {
                    ElectCmd::Campaign { wait_ms: Some(_), .. } => LockOp::Waiting,
                    ElectCmd::Campaign { .. } => LockOp::Acquire,
                    ElectCmd::Resign { .. } => LockOp::Release,
                    _ => LockOp::Other,
                },
            ),
            Command::LockAll(l) => (
                l.name(),
                match l {
                    LockAllCmd::Acquire { wait_ms: Some(_), .. } => LockOp::Waiting,
                    LockAllCmd::Acquire { .. } => LockOp::Acquire,
                    LockAllCmd::Release { .. } => LockOp::Release,
                },
            ),
            Command::BlPop { .. } => ("blpop", LockOp::Other),
            // The connection answers these itself: `execute` never meters them.
            _ => ("connection", LockOp::Other),
        }
    }
}
/// 40 random hex characters, like Redis's `run_id`.
fn random_run_id() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..40)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect()
}

/// Keeps the backend state gauges current (they are read from each master's health, which
/// changes on probes and connections). Ends with the proxy.
async fn export_backend_states(proxy: std::sync::Weak<Proxy>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    // Each member's kind and master as last exported: a failover sets the old series to 0.
    let mut shapes: std::collections::HashMap<String, (&'static str, String)> = std::collections::HashMap::new();
    // Each cluster member's shard masters as last exported.
    let mut shard_series: HashSet<(String, String)> = HashSet::new();
    loop {
        ticker.tick().await;
        let Some(proxy) = proxy.upgrade() else { return };
        for backend in proxy.engine.backends() {
            let name = backend.name().to_owned();
            let shape = (backend.kind(), backend.master().unwrap_or_else(|| name.clone()));
            if let Some(before) = shapes.insert(name.clone(), shape.clone())
                && before != shape
            {
                metrics::gauge!(m::BACKEND_MASTER, "backend" => name.clone(), "kind" => before.0, "master" => before.1)
                    .set(0.0);
            }
            metrics::gauge!(m::BACKEND_MASTER, "backend" => name.clone(), "kind" => shape.0, "master" => shape.1)
                .set(1.0);
            let (code, remaining) = state_code(backend.state());
            if let Some(shards) = backend.shards() {
                export_shards(&name, &shards, &mut shard_series);
            }
            metrics::gauge!(m::BACKEND_STATE, "backend" => name.clone()).set(code);
            metrics::gauge!(m::BACKEND_QUARANTINE_REMAINING, "backend" => name).set(remaining);
        }
    }
}

/// A cluster member's shards: per shard master, its state and how many slots it serves; a
/// master that no longer serves any slot is set to 0 slots.
fn export_shards(name: &str, shards: &[crate::backend::cluster::ShardView], series: &mut HashSet<(String, String)>) {
    let now: HashSet<(String, String)> = shards.iter().map(|s| (name.to_owned(), s.master.clone())).collect();
    for (backend, master) in series.iter().filter(|s| s.0 == name && !now.contains(*s)) {
        metrics::gauge!(m::SHARD_SLOTS, "backend" => backend.clone(), "master" => master.clone()).set(0.0);
    }
    series.retain(|s| s.0 != name);
    for shard in shards {
        let labels = [("backend", name.to_owned()), ("master", shard.master.clone())];
        metrics::gauge!(m::SHARD_SLOTS, &labels).set(shard.slot_count as f64);
        let (code, remaining) = state_code(shard.state);
        metrics::gauge!(m::SHARD_STATE, &labels).set(code);
        metrics::gauge!(m::SHARD_QUARANTINE_REMAINING, &labels).set(remaining);
    }
    series.extend(now);
}

/// A state as the gauges give it: 0 down, 1 up, 2 quarantined, 3 duplicate; and the quarantine left, in
/// seconds.
fn state_code(state: State) -> (f64, f64) {
    match state {
        State::Down => (0.0, 0.0),
        State::Up => (1.0, 0.0),
        State::Quarantined { remaining } => (2.0, remaining.as_secs_f64()),
        State::Duplicate { .. } => (3.0, 0.0),
    }
}

/// The `outcome` of an `EVALSHA` whose script the proxy has not seen: a client library's
/// normal first try (it sends the script with `EVAL` next), not an error.
const NOSCRIPT: &str = "noscript";

/// What a command does to a lock, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LockOp {
    Acquire,
    /// `LOCK.ACQUIRE ... WAIT`: each quorum round is timed as an acquisition and the whole
    /// as a wait, apart (`Proxy::acquire_waiting`): timed as a whole in the acquisition
    /// histogram, one wait of seconds would look like a slow quorum.
    Waiting,
    Release,
    Extend,
    Other,
}

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
            _ => "ok",
        }
    }
}

/// A request from borrowed pieces.
/// The proxy's scripts that run by SHA1 (with their source to fall back on), loaded on every
/// new connection to a master.
const PRELOADED: [&str; 3] = [
    crate::lua::own::UNDO,
    crate::lua::own::RELEASE,
    crate::recipes::reentrant::lua::GIVE_BACK,
];

pub(crate) fn request<const N: usize>(db: u32, args: [&[u8]; N]) -> Request {
    Request::new(db, args.iter().map(|a| Bytes::copy_from_slice(a)).collect())
}

/// What a newcomer must read when the proxy starts without a quorum of voting masters: one
/// line that says which members are out, why, for how long, and the ways out (rule 8's
/// quarantine of masters first seen young is the usual cause with fresh masters). `None`
/// when a quorum votes.
fn no_quorum_at_start(states: &[State]) -> Option<String> {
    let quorum = quorum::quorum(states.len());
    let up = states.iter().filter(|s| **s == State::Up).count();
    if up >= quorum {
        return None;
    }
    let members = |pick: &dyn Fn(&State) -> bool| -> Vec<String> {
        (0..states.len())
            .filter(|i| pick(&states[*i]))
            .map(|i| i.to_string())
            .collect()
    };
    let mut why = format!(
        "only {up} of {} masters vote and a lock needs {quorum}: every lock answers NOQUORUM until {quorum} do",
        states.len()
    );
    let quarantined = members(&|s| matches!(s, State::Quarantined { .. }));
    if !quarantined.is_empty() {
        let longest = states
            .iter()
            .filter_map(|s| match s {
                State::Quarantined { remaining } => Some(remaining.as_secs()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let lift = (quorum - up).min(quarantined.len());
        why.push_str(&format!(
            ". Members {} are quarantined for up to {longest} s: they started less than max_ttl_ms ago, so they \
             may have restarted and lost locks granted before (rule 8). If no lock can predate them (new masters), \
             restart the proxy with --quarantine restarts, or lift {lift} of them now with \
             `redis-cli -p <port> PROXY QUARANTINE <member> LIFT`; otherwise wait",
            quarantined.join(", ")
        ));
    }
    let down = members(&|s| *s == State::Down);
    if !down.is_empty() {
        why.push_str(&format!(
            ". Members {} are unreachable (see their log lines)",
            down.join(", ")
        ));
    }
    let duplicates = members(&|s| matches!(s, State::Duplicate { .. }));
    if !duplicates.is_empty() {
        why.push_str(&format!(
            ". Members {} are the same server as another member and do not vote: list each master once",
            duplicates.join(", ")
        ));
    }
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_without_quorum_says_who_is_out_why_and_the_ways_out() {
        let q = State::Quarantined {
            remaining: Duration::from_secs(301),
        };
        let why = no_quorum_at_start(&[q, q, State::Down]).expect("no quorum");
        assert!(why.starts_with("only 0 of 3 masters vote and a lock needs 2"), "{why}");
        assert!(why.contains("Members 0, 1 are quarantined for up to 301 s"), "{why}");
        assert!(why.contains("--quarantine restarts"), "{why}");
        assert!(why.contains("lift 2 of them now"), "{why}");
        assert!(why.contains("Members 2 are unreachable"), "{why}");
        let one_short = no_quorum_at_start(&[State::Up, q, q]).expect("no quorum");
        assert!(one_short.contains("lift 1 of them now"), "{one_short}");
        assert_eq!(no_quorum_at_start(&[State::Up, State::Up, q]), None);
    }
}
