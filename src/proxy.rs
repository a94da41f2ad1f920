//! The proxy's shared state, and the execution of every command that needs the masters.
//!
//! A connection hands a parsed [`Command`] here; this module maps it onto the quorum
//! engine and turns the engine's typed outcome into the reply Redis would give.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::backend::embedded::EmbeddedBackend;
use crate::backend::redis::RedisBackend;
use crate::backend::{AnyBackend, Request};
use crate::clock::TokioClock;
use crate::command::script::ScriptRef;
use crate::command::{Acquire, Command, Eval, ScriptCmd};
use crate::config::{Config, mask_url};
use crate::error::{ClientError, StartError};
use crate::quorum::{self, Acquired, Answer, Engine, Op, Settings};
use crate::reply::Reply;
use crate::scripts::{Registry, ScriptCall};

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
}

/// Everything connections share.
pub struct Proxy {
    /// The effective configuration.
    pub config: Config,
    /// The quorum engine over the masters.
    pub engine: Engine<AnyBackend, TokioClock>,
    /// Scripts seen by SHA1.
    pub scripts: Registry,
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
        Ok(Arc::new(Proxy {
            engine: Engine::new(backends, TokioClock::new(), settings),
            config,
            scripts: Registry::default(),
            stats: Stats::default(),
            run_id: random_run_id(),
            started: Instant::now(),
            next_client_id: AtomicU64::new(1),
        }))
    }

    async fn connect_all(config: &Config) -> Result<Vec<AnyBackend>, StartError> {
        let mut backends = Vec::with_capacity(config.backends.len());
        for url in &config.backends {
            let backend =
                RedisBackend::new(url, config.connect_timeout(), config.backend_timeout())
                    .map_err(|e| {
                        StartError::Config(format!("backends: '{}': {e}", mask_url(url)))
                    })?;
            backends.push(backend);
        }
        futures_util::future::join_all(backends.iter().map(RedisBackend::connect)).await;
        let up = backends.iter().filter(|b| b.is_up()).count();
        let q = quorum::quorum(backends.len());
        if up < q {
            tracing::error!(
                up,
                quorum = q,
                "fewer than a quorum of backends reachable: locks answer NOQUORUM until they are"
            );
        }
        Ok(backends
            .into_iter()
            .map(|b| AnyBackend::Redis(Box::new(b)))
            .collect())
    }

    /// A fresh client id for `CLIENT ID` and `HELLO`.
    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs a command that needs the masters. Connection commands never come here.
    pub async fn execute(&self, db: u32, command: Command) -> Reply {
        match command {
            Command::Acquire(a) => self.acquire(db, a).await,
            Command::Eval(e) => self.eval(db, e).await,
            Command::Script(s) => self.script(s).await,
            Command::Forward(f) => {
                self.engine
                    .execute(Op::Command(Request::new(db, f.args)))
                    .await
            }
            other => Reply::error(format!("ERR internal: {other:?} is not a backend command")),
        }
    }

    async fn acquire(&self, db: u32, a: Acquire) -> Reply {
        let ttl_ms = a.ttl_ms.unwrap_or(self.config.default_ttl_ms);
        if ttl_ms > self.config.max_ttl_ms {
            return ClientError::TtlTooLong {
                ttl_ms,
                max_ttl_ms: self.config.max_ttl_ms,
            }
            .into();
        }
        let outcome = self
            .engine
            .acquire(db, a.key, a.token, Duration::from_millis(ttl_ms))
            .await;
        match outcome {
            Acquired::Yes { .. } => {
                self.stats.acquired.fetch_add(1, Ordering::Relaxed);
                Reply::ok()
            }
            // Rule 9: "not acquired" is a nil, as Redis answers a failed SET NX.
            Acquired::No => {
                self.stats.contended.fetch_add(1, Ordering::Relaxed);
                Reply::Nil
            }
            Acquired::NoQuorum(e) => {
                self.stats.noquorum.fetch_add(1, Ordering::Relaxed);
                e.into()
            }
        }
    }

    async fn eval(&self, db: u32, e: Eval) -> Reply {
        let (sha, body) = match e.script {
            ScriptRef::Body(body) => (self.scripts.insert(body.clone()), Some(body)),
            ScriptRef::Sha(sha) => {
                let body = self.scripts.get(&sha);
                (sha, body)
            }
        };
        let call = ScriptCall::new(db, sha, body, e.numkeys, &e.keys_and_args);
        let reply = self.engine.execute(Op::Script(call)).await;
        // Clients match this text exactly (redsync even checks the trailing space).
        if reply.is_error_code("NOSCRIPT") {
            return ClientError::NoScript.into();
        }
        self.count_noquorum(&reply);
        reply
    }

    async fn script(&self, s: ScriptCmd) -> Reply {
        match s {
            ScriptCmd::Load(body) => {
                let sha = self.scripts.insert(body.clone());
                // Warm the masters' caches; the proxy keeps the source, so a master that
                // misses it later gets it by EVAL.
                let load = Request::new(
                    0,
                    vec![
                        Bytes::from_static(b"SCRIPT"),
                        Bytes::from_static(b"LOAD"),
                        body,
                    ],
                );
                self.engine.broadcast(Op::Command(load)).await;
                Reply::Bulk(sha)
            }
            ScriptCmd::Exists(shas) => self.script_exists(shas).await,
            ScriptCmd::Flush => {
                self.scripts.clear();
                let flush = Request::new(
                    0,
                    vec![Bytes::from_static(b"SCRIPT"), Bytes::from_static(b"FLUSH")],
                );
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
        let answers = self
            .engine
            .broadcast(Op::Command(Request::new(0, args)))
            .await;
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

    fn count_noquorum(&self, reply: &Reply) {
        if reply.is_error_code("NOQUORUM") {
            self.stats.noquorum.fetch_add(1, Ordering::Relaxed);
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
