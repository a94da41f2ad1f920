//! The proxy's shared state, and the execution of every command that needs the masters.
//!
//! A connection hands a parsed [`Command`] here; this module maps it onto the quorum
//! engine and turns the engine's typed outcome into the reply Redis would give.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::auth::Access;
use crate::backend::embedded::EmbeddedBackend;
use crate::backend::health::{Health, State};
use crate::backend::redis::{self, RedisBackend};
use crate::backend::{AnyBackend, Backend, Request};
use crate::clock::{Clock, TokioClock};
use crate::command::script::ScriptRef;
use crate::command::{
    Command, Condition, DelCondition, DelEx, Eval, Expire, Expiry, LockCmd, ProxyCmd, ScriptCmd, Set,
};
use crate::config::{Config, ScriptPolicy, mask_url};
use crate::error::{ClientError, StartError};
use crate::info;
use crate::metrics as m;
use crate::quorum::{self, Acquired, Answer, Engine, Fenced, Op, Settings, combine, combine_or};
use crate::reply::Reply;
use crate::scripts::{self, Registry, Script, ScriptCall};

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
    allowed_scripts: Option<HashSet<Bytes>>,
    /// Counters for `INFO`.
    pub stats: Stats,
    /// This process's run id (40 hex chars, like Redis's).
    pub run_id: String,
    /// When the proxy started.
    pub started: Instant,
    next_client_id: AtomicU64,
}

impl Proxy {
    /// Builds the proxy from a validated config: connects to the real masters (waiting for the
    /// first attempt on each) or starts embedded ones.
    pub async fn start(config: Config) -> Result<Arc<Proxy>, StartError> {
        let backends = if config.backends.is_empty() {
            tracing::warn!(
                count = config.embedded_backends,
                "no backends configured: running EMBEDDED in-process masters. They are for trying \
                 the proxy out, NOT for production: they share this process's fate, so a crash \
                 loses every lock. Configure `backends` with real Redis masters."
            );
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
        let scripts = Registry::default();
        let allowed_scripts = allowed_scripts(&config, &scripts)?;
        let proxy = Arc::new(Proxy {
            access: Access::new(&config)?,
            allowed_scripts,
            engine: Engine::new(backends, TokioClock::new(), settings),
            config,
            scripts,
            stats: Stats::default(),
            run_id: random_run_id(),
            started: Instant::now(),
            next_client_id: AtomicU64::new(1),
        });
        tokio::spawn(export_backend_states(Arc::downgrade(&proxy)));
        Ok(proxy)
    }

    async fn connect_all(config: &Config) -> Result<Vec<AnyBackend>, StartError> {
        let tls = config.tls_ca_file.as_deref().map(crate::tls::connector).transpose()?;
        let settings = redis::Settings {
            tls,
            connect_timeout: config.connect_timeout(),
            request_timeout: config.backend_timeout(),
            probe_interval: Duration::from_millis(config.probe_interval_ms),
        };
        // Rule 8: a restarted master stays out until every lock granted before its restart
        // has expired: the longest TTL plus its drift allowance.
        let max_ttl = Duration::from_millis(config.max_ttl_ms);
        let quarantine = max_ttl + quorum::drift(max_ttl, config.drift_factor);
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let mut backends = Vec::with_capacity(config.backends.len());
        for url in &config.backends {
            let health = |name: &str| Health::new(name, clock.clone(), config.quarantine, quarantine);
            let backend = RedisBackend::new(url, settings.clone(), health)
                .map_err(|e| StartError::Config(format!("backends: '{}': {e}", mask_url(url))))?;
            backends.push(backend);
        }
        futures_util::future::join_all(backends.iter().map(RedisBackend::connect)).await;
        let up = backends.iter().filter(|b| b.health().state() == State::Up).count();
        let q = quorum::quorum(backends.len());
        if up < q {
            tracing::error!(
                up,
                quorum = q,
                "fewer than a quorum of backends reachable: locks answer NOQUORUM until they are"
            );
        }
        Ok(backends.into_iter().map(|b| AnyBackend::Redis(Box::new(b))).collect())
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
            ProxyCmd::Quarantine { backend, lift } => {
                let backends = self.engine.backends();
                let wanted = String::from_utf8_lossy(&backend);
                let found = backends
                    .iter()
                    .enumerate()
                    .find(|(i, b)| wanted == i.to_string() || wanted == b.name())
                    .map(|(_, b)| b);
                match found.and_then(|b| b.health()) {
                    Some(health) if lift => {
                        health.lift_quarantine();
                        Reply::ok()
                    }
                    Some(health) => {
                        health.quarantine_now();
                        Reply::ok()
                    }
                    None => Reply::error(format!("ERR no such backend '{wanted}' (give its index or address)")),
                }
            }
        }
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

    /// Runs a command that needs the masters. Connection commands never come here.
    pub async fn execute(&self, db: u32, command: Command) -> Reply {
        let (name, kind) = self.describe(&command);
        let start = Instant::now();
        let reply = match command {
            Command::Set(set) => self.set(db, set).await,
            Command::SetNx { key, value } => self.setnx(db, key, value).await,
            Command::DelEx(d) => self.delex(db, d).await,
            Command::Expire(e) => self.expire(db, e).await,
            Command::Eval(e) => self.eval(db, e).await,
            Command::Script(s) => self.script(s).await,
            Command::Forward(f) => self.engine.execute(Op::Command(Request::new(db, f.args))).await,
            Command::Lock(l) => self.lock_cmd(db, l).await,
            other => Reply::error(format!("ERR internal: {other:?} is not a backend command")),
        };
        if reply.is_error_code("NOQUORUM") {
            self.stats.noquorum.fetch_add(1, Ordering::Relaxed);
        }
        let outcome = kind.outcome(&reply);
        metrics::counter!(m::COMMANDS, "command" => name, "outcome" => outcome).increment(1);
        if let Some(histogram) = kind.histogram() {
            metrics::histogram!(histogram).record(start.elapsed().as_secs_f64());
        }
        reply
    }

    /// A command's name for metrics, and what kind of lock operation it is.
    fn describe(&self, command: &Command) -> (&'static str, LockOp) {
        match command {
            Command::Set(Set {
                condition: Condition::Nx,
                ..
            }) => ("set_nx", LockOp::Acquire),
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
                    ScriptRef::Sha(sha) => self.scripts.get(sha).is_some_and(|s| s.ttl_probe.is_some()),
                };
                (name, if sets_ttl { LockOp::Extend } else { LockOp::Release })
            }
            Command::Forward(f)
                if f.args[0].eq_ignore_ascii_case(b"DEL") || f.args[0].eq_ignore_ascii_case(b"UNLINK") =>
            {
                ("del", LockOp::Release)
            }
            Command::Forward(f) if f.args[0].eq_ignore_ascii_case(b"GET") => ("get", LockOp::Other),
            Command::Lock(l) => (
                l.name(),
                match l {
                    LockCmd::Acquire { .. } => LockOp::Acquire,
                    LockCmd::Extend { .. } => LockOp::Extend,
                    LockCmd::Release { .. } => LockOp::Release,
                    LockCmd::Info { .. } | LockCmd::Fence { .. } => LockOp::Other,
                },
            ),
            Command::Forward(_) => ("key_command", LockOp::Other),
            _ => ("other", LockOp::Other),
        }
    }

    /// `SET`: with `NX`, a lock acquisition; with `IFEQ`, an owner-checked extension; else a
    /// write sent to every master (with `GET`, the legacy steal).
    async fn set(&self, db: u32, set: Set) -> Reply {
        let ttl_ms = match self.ttl_of(&set) {
            Ok(ttl) => ttl,
            Err(e) => return e.into(),
        };
        match (set.condition, set.get) {
            (Condition::Nx, false) => match self.acquire(db, set.key, set.value, ttl_ms).await {
                Acquired::Yes { .. } => Reply::ok(),
                // Rule 9: "not acquired" is a nil, as Redis answers a failed SET NX.
                Acquired::No => Reply::Nil,
                Acquired::NoQuorum(e) => e.into(),
            },
            // Redis 7's `SET NX GET`: nil when set, else the value held (read after the refusal).
            (Condition::Nx, true) => {
                let key = set.key.clone();
                match self.acquire(db, set.key, set.value, ttl_ms).await {
                    Acquired::Yes { .. } => Reply::Nil,
                    Acquired::No => self.engine.execute(Op::Command(request(db, [&b"GET"[..], &key]))).await,
                    Acquired::NoQuorum(e) => e.into(),
                }
            }
            (Condition::IfEq(old), false) => {
                let call = ScriptCall::set_ifeq(db, set.key, old, set.value, ttl_ms);
                let ext = self
                    .engine
                    .extend(Op::Script(call), |r| {
                        (*r == Reply::ok()).then_some(Duration::from_millis(ttl_ms))
                    })
                    .await;
                not_extended_unless(combine(&ext.answers, self.engine.quorum()), ext.validity.is_some())
            }
            (Condition::IfEq(_), true) => {
                ClientError::Unsupported("SET with IFEQ and GET is not supported by the proxy".into()).into()
            }
            (condition, get) => {
                let mut args = vec![Bytes::from_static(b"SET"), set.key, set.value.clone()];
                if condition == Condition::Xx {
                    args.push(Bytes::from_static(b"XX"));
                }
                if get {
                    args.push(Bytes::from_static(b"GET"));
                }
                args.extend([Bytes::from_static(b"PX"), Bytes::from(ttl_ms.to_string())]);
                let answers = self.engine.broadcast(Op::Command(Request::new(db, args))).await;
                // The legacy steal: an old value counts only if a majority held it; else the
                // caller sees its own new value, i.e. "someone holds it", never a win.
                let fallback = if get { Reply::Bulk(set.value) } else { Reply::Nil };
                combine_or(&answers, self.engine.quorum(), fallback)
            }
        }
    }

    /// The TTL a `SET` writes with: its own, or `default_ttl_ms` for a lock taken without one,
    /// or `legacy_ttl_ms` for other writes without one. Never above `max_ttl_ms`, so every
    /// key the proxy writes expires within it.
    fn ttl_of(&self, set: &Set) -> Result<u64, ClientError> {
        let ttl = match set.expiry {
            Expiry::Px(ms) => ms,
            Expiry::AtMs(at) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                match at.checked_sub(now) {
                    Some(ttl) if ttl > 0 => ttl,
                    _ => return Err(ClientError::InvalidExpire("set".into())),
                }
            }
            Expiry::None if set.condition == Condition::Xx || set.condition == Condition::Always => {
                self.config.legacy_ttl_ms
            }
            Expiry::None => self.config.default_ttl_ms,
            Expiry::KeepTtl => {
                return Err(ClientError::Unsupported(
                    "KEEPTTL is not supported by the proxy: every key it writes carries a TTL of at most max_ttl_ms"
                        .into(),
                ));
            }
        };
        self.check_ttl(ttl)
    }

    fn check_ttl(&self, ttl_ms: u64) -> Result<u64, ClientError> {
        if ttl_ms > self.config.max_ttl_ms {
            return Err(ClientError::TtlTooLong {
                ttl_ms,
                max_ttl_ms: self.config.max_ttl_ms,
            });
        }
        Ok(ttl_ms)
    }

    /// Takes a lock through the engine and counts the outcome.
    async fn acquire(&self, db: u32, key: Bytes, token: Bytes, ttl_ms: u64) -> Acquired {
        let outcome = self.engine.acquire(db, key, token, Duration::from_millis(ttl_ms)).await;
        let counter = match outcome {
            Acquired::Yes { .. } => &self.stats.acquired,
            Acquired::No => &self.stats.contended,
            Acquired::NoQuorum(_) => return outcome,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    /// The native `LOCK.*` commands (fencing tokens: `docs/fencing.md`).
    async fn lock_cmd(&self, db: u32, command: LockCmd) -> Reply {
        match command {
            LockCmd::Acquire { key, token, ttl_ms } => {
                if let Err(e) = self.check_ttl(ttl_ms) {
                    return e.into();
                }
                let ttl = Duration::from_millis(ttl_ms);
                let fenced = self.engine.acquire_fenced(db, key, token, ttl).await;
                match &fenced {
                    Fenced::Yes { .. } => self.stats.acquired.fetch_add(1, Ordering::Relaxed),
                    Fenced::No => self.stats.contended.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
                fenced_reply(fenced)
            }
            LockCmd::Fence { key, token } => fenced_reply(self.engine.fence(db, key, token).await),
            LockCmd::Extend { key, token, ttl_ms } => {
                if let Err(e) = self.check_ttl(ttl_ms) {
                    return e.into();
                }
                let ttl = Duration::from_millis(ttl_ms);
                match self.engine.extend_lock(db, key, token, ttl).await {
                    Some(validity) => Reply::Int(validity.as_millis().max(1) as i64),
                    None => Reply::Int(0),
                }
            }
            LockCmd::Release { key, token } => {
                let answers = self.engine.release(db, key, token).await;
                combine(&answers, self.engine.quorum())
            }
            LockCmd::Info { key } => match self.engine.lock_info(db, key).await {
                Ok(info) => Reply::Map(vec![
                    (
                        Reply::Bulk(Bytes::from_static(b"holder")),
                        info.holder.map_or(Reply::Nil, Reply::Bulk),
                    ),
                    (
                        Reply::Bulk(Bytes::from_static(b"validity_ms")),
                        Reply::Int(info.validity.as_millis() as i64),
                    ),
                    (
                        Reply::Bulk(Bytes::from_static(b"fencing_token")),
                        info.last_token.map_or(Reply::Nil, |t| Reply::Int(t as i64)),
                    ),
                ]),
                Err(e) => e.into(),
            },
        }
    }

    /// `SETNX`: the legacy acquisition, decided like `SET NX` with `legacy_ttl_ms`; 1 or 0.
    async fn setnx(&self, db: u32, key: Bytes, value: Bytes) -> Reply {
        match self.acquire(db, key, value, self.config.legacy_ttl_ms).await {
            Acquired::Yes { .. } => Reply::Int(1),
            Acquired::No => Reply::Int(0),
            Acquired::NoQuorum(e) => e.into(),
        }
    }

    /// `DELEX`: an atomic compare-and-delete on each master, replies combined.
    async fn delex(&self, db: u32, d: DelEx) -> Reply {
        let (condition, value) = match d.condition {
            DelCondition::Always => ("", Bytes::new()),
            DelCondition::IfEq(v) => ("IFEQ", v),
            DelCondition::IfNe(v) => ("IFNE", v),
        };
        self.engine
            .execute(Op::Script(ScriptCall::delex(db, d.key, condition, value)))
            .await
    }

    /// `PEXPIRE`/`EXPIRE`: counts only if a quorum set it within the new validity (rule 7).
    async fn expire(&self, db: u32, e: Expire) -> Reply {
        let ttl_ms = match u64::try_from(e.ttl_ms) {
            Ok(ttl) if ttl > 0 => match self.check_ttl(ttl) {
                Ok(ttl) => ttl,
                Err(err) => return err.into(),
            },
            // Zero or negative: Redis deletes the key; no validity to check.
            _ => 0,
        };
        let mut args = vec![Bytes::from_static(b"PEXPIRE"), e.key, Bytes::from(e.ttl_ms.to_string())];
        args.extend(e.flag);
        let op = Op::Command(Request::new(db, args));
        if ttl_ms == 0 {
            return self.engine.execute(op).await;
        }
        let ext = self
            .engine
            .extend(op, |r| (*r == Reply::Int(1)).then_some(Duration::from_millis(ttl_ms)))
            .await;
        not_extended_unless(combine(&ext.answers, self.engine.quorum()), ext.validity.is_some())
    }

    /// `EVAL`/`EVALSHA`. A script that sets a TTL runs as its TTL probe and counts only
    /// within the new validity (rule 7); any other is combined by the generic rule.
    /// Whether clients may run the script `sha` (`script_policy`).
    fn script_allowed(&self, sha: &[u8]) -> Result<(), ClientError> {
        match &self.allowed_scripts {
            Some(allowed) if !allowed.contains(sha) => {
                Err(ClientError::NoPermScript(String::from_utf8_lossy(sha).into_owned()))
            }
            _ => Ok(()),
        }
    }

    async fn eval(&self, db: u32, e: Eval) -> Reply {
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

    async fn script(&self, s: ScriptCmd) -> Reply {
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

/// 40 random hex characters, like Redis's `run_id`.
fn random_run_id() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..40)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect()
}

/// With `script_policy = "allowlist"`, the SHA1s clients may run: the listed ones and those
/// of `script_files`, whose sources are loaded into `registry` (so `EVALSHA` works at once).
fn allowed_scripts(config: &Config, registry: &Registry) -> Result<Option<HashSet<Bytes>>, StartError> {
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

/// Keeps the backend state gauges current (they are read from each master's health, which
/// changes on probes and connections). Ends with the proxy.
async fn export_backend_states(proxy: std::sync::Weak<Proxy>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    loop {
        ticker.tick().await;
        let Some(proxy) = proxy.upgrade() else { return };
        for backend in proxy.engine.backends() {
            let name = backend.name().to_owned();
            let (code, remaining) = match backend.state() {
                State::Down => (0.0, 0.0),
                State::Up => (1.0, 0.0),
                State::Quarantined { remaining } => (2.0, remaining.as_secs_f64()),
            };
            metrics::gauge!(m::BACKEND_STATE, "backend" => name.clone()).set(code);
            metrics::gauge!(m::BACKEND_QUARANTINE_REMAINING, "backend" => name).set(remaining);
        }
    }
}

/// What a command does to a lock, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LockOp {
    Acquire,
    Release,
    Extend,
    Other,
}

impl LockOp {
    /// The latency histogram this kind of command is timed in.
    fn histogram(self) -> Option<&'static str> {
        match self {
            LockOp::Acquire => Some(m::ACQUIRE_SECONDS),
            LockOp::Release => Some(m::RELEASE_SECONDS),
            LockOp::Extend => Some(m::EXTEND_SECONDS),
            LockOp::Other => None,
        }
    }

    /// `acquired`, `contended`, `noquorum`, `error` or `ok`.
    fn outcome(self, reply: &Reply) -> &'static str {
        match reply {
            r if r.is_error_code("NOQUORUM") => "noquorum",
            Reply::Error(_) => "error",
            Reply::Status(_) | Reply::Int(1..) if self == LockOp::Acquire => "acquired",
            Reply::Nil | Reply::Int(0) if self == LockOp::Acquire => "contended",
            _ => "ok",
        }
    }
}

/// A request from borrowed pieces.
fn request<const N: usize>(db: u32, args: [&[u8]; N]) -> Request {
    Request::new(db, args.iter().map(|a| Bytes::copy_from_slice(a)).collect())
}

/// A fenced outcome as the client sees it: the token, nil, or why none could be given.
fn fenced_reply(fenced: Fenced) -> Reply {
    match fenced {
        Fenced::Yes { token, .. } => Reply::Int(i64::try_from(token).unwrap_or(i64::MAX)),
        Fenced::No => Reply::Nil,
        Fenced::NoQuorum(e) => e.into(),
        Fenced::Unfenced(e) => e.into(),
    }
}

/// A success that did not hold for the validity time is "not extended": 0 for an integer
/// reply, nil for `OK`.
fn not_extended_unless(reply: Reply, extended: bool) -> Reply {
    match reply {
        Reply::Int(n) if n > 0 && !extended => Reply::Int(0),
        Reply::Status(_) if !extended => Reply::Nil,
        other => other,
    }
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
