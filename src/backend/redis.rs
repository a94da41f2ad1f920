//! A real Redis master, reached through the `redis` crate's multiplexed connection.
//!
//! One connection per (master, database), kept by a background connector task that
//! reconnects with capped exponential backoff. While a master is known to be down, requests
//! fail at once with [`BackendError::Down`] instead of spending a timeout on it (rule 3).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, Value};
use tokio::sync::watch;

use super::health::{Health, parse_identity};
use super::{Backend, BackendError, Request};
use crate::reply::Reply;

/// First and largest pause between reconnection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// How a master is reached and watched.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Timeout for opening a connection (and reading the master's identity on it).
    pub connect_timeout: Duration,
    /// Timeout of one request inside the `redis` crate, replacing its hidden 500 ms default.
    pub request_timeout: Duration,
    /// How often the master is probed with `INFO server`.
    pub probe_interval: Duration,
}

/// A Redis master.
pub struct RedisBackend {
    name: String,
    health: Arc<Health>,
    probe_interval: Duration,
    client: Client,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// How long the master may take to answer a request (and its probe).
    request_timeout: Duration,
    /// The master's database that the proxy's database 0 maps to (from the URL).
    base_db: i64,
    links: DashMap<u32, Arc<Link>>,
}

/// The connection to one database of a master, as the connector last left it.
#[derive(Clone, Default)]
enum LinkState {
    /// The first attempt is under way: requests wait for it.
    #[default]
    Connecting,
    /// Connected; `generation` tells this connection from earlier ones.
    Up {
        generation: u64,
        conn: MultiplexedConnection,
    },
    /// Unreachable: requests fail at once while the connector retries.
    Down,
}

struct Link {
    state: watch::Sender<LinkState>,
}

impl Link {
    /// The connection in use, with its generation, if up.
    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        match &*self.state.borrow() {
            LinkState::Up { generation, conn } => Some((*generation, conn.clone())),
            _ => None,
        }
    }

    /// Gives up connection `generation` after an I/O error, so the connector reconnects.
    /// Only that connection: a newer one stays.
    fn broken(&self, generation: u64) {
        self.state.send_if_modified(|s| match s {
            LinkState::Up { generation: g, .. } if *g == generation => {
                *s = LinkState::Down;
                true
            }
            _ => false,
        });
    }
}

/// Whether a `redis` crate error means the connection itself is gone.
fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

impl RedisBackend {
    /// A master at `url` (`redis://[user:pass@]host:port[/db]`), its state kept by the
    /// [`Health`] that `health_for` builds from the master's name.
    pub fn new(
        url: &str,
        settings: Settings,
        health_for: impl FnOnce(&str) -> Health,
    ) -> redis::RedisResult<RedisBackend> {
        let (connect_timeout, request_timeout) = (settings.connect_timeout, settings.request_timeout);
        let client = Client::open(url)?;
        let info = client.get_connection_info();
        let name = match info.addr() {
            ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => other.to_string(),
        };
        let base_db = info.redis_settings().db();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(request_timeout));
        Ok(RedisBackend {
            health: Arc::new(health_for(&name)),
            probe_interval: settings.probe_interval,
            name,
            client,
            config,
            connect_timeout,
            request_timeout,
            base_db,
            links: DashMap::new(),
        })
    }

    /// Opens the connection to database 0 and waits for the first attempt, so that the proxy
    /// starts with every reachable master connected, then starts the periodic probe. An
    /// unreachable master is not an error: it is retried in the background.
    pub async fn connect(&self) {
        let link = self.link(0);
        let mut state = link.state.subscribe();
        let _ = state.wait_for(|s| !matches!(s, LinkState::Connecting)).await;
        let probe = probe(
            Arc::downgrade(&link),
            self.health.clone(),
            self.probe_interval,
            self.request_timeout,
        );
        tokio::spawn(probe);
    }

    /// The master's health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The link for `db`, created (with its connector task) on first use.
    fn link(&self, db: u32) -> Arc<Link> {
        if let Some(link) = self.links.get(&db) {
            return link.clone();
        }
        self.links
            .entry(db)
            .or_insert_with(|| {
                let link = Arc::new(Link {
                    state: watch::Sender::new(LinkState::Connecting),
                });
                tokio::spawn(self.connector(db, link.clone()));
                link
            })
            .clone()
    }

    /// Keeps `link` connected: connect, wait until a request reports the connection broken,
    /// reconnect with capped exponential backoff. Ends when the backend is dropped.
    fn connector(&self, db: u32, link: Arc<Link>) -> impl Future<Output = ()> + Send + 'static {
        let settings = self
            .client
            .get_connection_info()
            .redis_settings()
            .clone()
            .set_db(self.base_db + i64::from(db));
        let info = self.client.get_connection_info().clone().set_redis_settings(settings);
        let (config, name, connect_timeout) = (self.config.clone(), self.name.clone(), self.connect_timeout);
        let health = self.health.clone();
        let weak = Arc::downgrade(&link);
        drop(link);
        async move {
            let mut backoff = BACKOFF.0;
            let mut generation = 0;
            loop {
                // Rule 8: the master's identity is read on the new connection before any
                // request may use it, so a restarted master is quarantined before it votes.
                let attempt = async {
                    let client = Client::open(info.clone())?;
                    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
                    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
                    let (run_id, uptime) = parse_identity(&info).ok_or_else(|| {
                        redis::RedisError::from((redis::ErrorKind::Parse, "no run_id in INFO server"))
                    })?;
                    health.observed(&run_id, uptime);
                    Ok::<_, redis::RedisError>(conn)
                };
                let result = tokio::time::timeout(connect_timeout, attempt).await;
                let Some(link) = weak.upgrade() else { return };
                match result {
                    Ok(Ok(conn)) => {
                        generation += 1;
                        tracing::info!(backend = %name, db, "backend connected");
                        link.state.send_replace(LinkState::Up { generation, conn });
                        backoff = BACKOFF.0;
                        let mut watcher = link.state.subscribe();
                        drop(link);
                        let _ = watcher.wait_for(|s| !matches!(s, LinkState::Up { .. })).await;
                        tracing::warn!(backend = %name, db, "backend connection lost");
                    }
                    Ok(Err(e)) => {
                        health.failed(&e.to_string());
                        link.state.send_if_modified(|s| mark_down(s, &name, &e.to_string()));
                    }
                    Err(_) => {
                        health.failed("connect timed out");
                        link.state
                            .send_if_modified(|s| mark_down(s, &name, "connect timed out"));
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
            }
        }
    }
}

/// Probes the master every `interval` with `INFO server`: a master that does not answer
/// within `timeout` is down (requests skip it instead of each spending a timeout), and its
/// identity is checked again (rule 8). Ends when the backend is dropped.
async fn probe(link: std::sync::Weak<Link>, health: Arc<Health>, interval: Duration, timeout: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(link) = link.upgrade() else { return };
        // No connection: the connector reports the failures and the recovery.
        let Some((generation, mut conn)) = link.current() else {
            continue;
        };
        let answer = tokio::time::timeout(timeout, async {
            redis::cmd("INFO").arg("server").query_async::<String>(&mut conn).await
        })
        .await;
        match answer.map(|r| r.map(|info| parse_identity(&info))) {
            Ok(Ok(Some((run_id, uptime)))) => health.observed(&run_id, uptime),
            Ok(Ok(None)) => health.failed("no run_id in INFO server"),
            Ok(Err(e)) => {
                health.failed(&e.to_string());
                if connection_lost(&e) {
                    link.broken(generation);
                }
            }
            Err(_) => health.failed("probe timed out"),
        }
    }
}

/// Marks a link down after a failed attempt; logs only the transition, not every retry.
fn mark_down(state: &mut LinkState, name: &str, why: &str) -> bool {
    if matches!(state, LinkState::Down) {
        return false;
    }
    tracing::warn!(backend = %name, error = %why, "backend unreachable");
    *state = LinkState::Down;
    true
}

impl Backend for RedisBackend {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &Request) -> Result<Reply, BackendError> {
        self.health.admit()?;
        let link = self.link(request.db);
        let mut state = link.state.subscribe();
        let _ = state.wait_for(|s| !matches!(s, LinkState::Connecting)).await;
        let (generation, mut conn) = link.current().ok_or(BackendError::Down)?;
        let mut cmd = redis::Cmd::new();
        for arg in &request.args {
            cmd.arg(arg.as_ref());
        }
        match conn.send_packed_command(&cmd).await {
            Ok(value) => Ok(to_reply(value)),
            Err(e) if e.is_timeout() => Err(BackendError::Timeout),
            Err(e) => {
                if connection_lost(&e) {
                    link.broken(generation);
                }
                Err(BackendError::Io(e.to_string()))
            }
        }
    }
}

/// Converts a `redis` crate value (RESP2 or RESP3) into the proxy's reply.
fn to_reply(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(i),
        Value::BulkString(b) => Reply::Bulk(Bytes::from(b)),
        Value::Array(items) | Value::Set(items) | Value::Push { data: items, .. } => {
            Reply::Array(items.into_iter().map(to_reply).collect())
        }
        Value::SimpleString(s) => Reply::Status(Bytes::from(s)),
        Value::Okay => Reply::ok(),
        Value::Map(pairs) => Reply::Map(pairs.into_iter().map(|(k, v)| (to_reply(k), to_reply(v))).collect()),
        Value::Attribute { data, .. } => to_reply(*data),
        Value::Double(d) => Reply::Double(d),
        Value::Boolean(b) => Reply::Bool(b),
        Value::VerbatimString { text, .. } => Reply::Bulk(Bytes::from(text)),
        Value::BigNumber(n) => Reply::Bulk(Bytes::from(n)),
        Value::ServerError(e) => match e.details() {
            Some(details) => Reply::error(format!("{} {details}", e.code())),
            None => Reply::error(e.code().to_owned()),
        },
        _ => Reply::error("ERR unsupported reply type from backend"),
    }
}
