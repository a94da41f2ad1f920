//! A real Redis master, reached through one pipelined connection per database: one at a fixed
//! address, or the current master of a Sentinel group ([`super::locate`]).
//!
//! Each connection is kept by a background connector task that reconnects with capped
//! exponential backoff. While a master is known to be down, requests fail at once with
//! [`BackendError::Down`] instead of spending a timeout on it (rule 3). The `redis` crate
//! parses the URLs; the connection itself is `Pipeline`, which writes the requests of all
//! clients that are waiting in one batch (the crate's multiplexed connection wrote each
//! request on its own: one system call per request and master).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use redis::{Client, ConnectionAddr};
use tokio::sync::watch;
use tokio_rustls::TlsConnector;

use super::health::{Health, parse_identity};
use super::locate::{self, Addr, Sentinels};
use super::pipeline::Pipeline;
use super::url::plain_url;
use super::wall_clock::parse_time;
use super::{Backend, BackendError, Form, Place, Request};
use crate::reply::Reply;

/// First and largest pause between reconnection attempts.
/// The largest is short: a master that comes back (a network that heals) votes again
/// within it, and an attempt costs a connection that is refused, or one bounded by the
/// timeouts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(250));

/// How a master is reached and watched.
#[derive(Clone)]
pub struct Settings {
    /// For `rediss://` masters: the connector holding the CA they are verified against.
    pub tls: Option<TlsConnector>,
    /// Timeout for opening a connection (TCP, and TLS for `rediss://`). The handshake on it is
    /// bounded by `request_timeout`, as one request is.
    pub connect_timeout: Duration,
    /// How long a master may take to answer a request (and its probe).
    pub request_timeout: Duration,
    /// How often the master is probed with `INFO server`.
    pub probe_interval: Duration,
    /// How many databases clients may `SELECT` (checked against the master at start).
    pub databases: u32,
    /// What a new connection says once the master's identity is known, before any request.
    pub greeting: Option<Arc<dyn Greeting>>,
    /// Scripts to load on every new connection (`SCRIPT LOAD`), so that they run by SHA1
    /// without a `NOSCRIPT` round trip: the owner's (the proxy's own scripts).
    pub preload: &'static [&'static str],
    /// Whether acquisitions queued together may share one transaction (`super::acquire`): not
    /// on a cluster's nodes, where a transaction's keys must share a slot.
    pub shared_transactions: bool,
}

/// What a new master connection sends once the master's identity is known (and its database
/// selected), before any request may use it. The connection only knows how to greet a master
/// and who it is; what a new identity means for the state kept on the master belongs to that
/// state's owner (fencing demotes counters of an earlier run: `crate::quorum::EpochCheck`).
pub trait Greeting: Send + Sync {
    /// The command for the master whose run id is `run_id`.
    fn command(&self, run_id: &str) -> Vec<Bytes>;
    /// Reads its reply on master `backend`, database `db`: an error drops the connection,
    /// which is then tried again.
    fn accept(&self, reply: Reply, backend: &str, db: u32) -> Result<(), String>;
}

/// A Redis master.
pub struct RedisBackend {
    /// In logs, `INFO` and metrics: `host:port`, or `name@sentinel` for a Sentinel group.
    name: String,
    /// Where the master is now: fixed, or as the Sentinels last named it (`None` until they
    /// have). Every connection of the member follows it.
    master: Arc<watch::Sender<Option<Addr>>>,
    /// A Sentinel group's Sentinels, until [`RedisBackend::connect`] hands them to the task
    /// that follows the group's failovers.
    sentinels: Mutex<Option<Sentinels>>,
    /// Whether the master comes from Sentinels (which can name a replica that is no master
    /// yet, or any more: checked with `ROLE` before a connection is used).
    followed: bool,
    health: Arc<Health>,
    probe_interval: Duration,
    /// For a `rediss://` master: the TLS connector (it verifies the host it connects to).
    tls: Option<TlsConnector>,
    /// `AUTH` credentials from the URL: user (if any) and password.
    credentials: Option<(Option<String>, String)>,
    connect_timeout: Duration,
    /// How long the master may take to answer a request (and its probe).
    request_timeout: Duration,
    /// The master's database that the proxy's database 0 maps to (from the URL).
    base_db: i64,
    /// How many databases clients may `SELECT`.
    databases: u32,
    greeting: Option<Arc<dyn Greeting>>,
    /// Scripts loaded on every new connection ([`Settings::preload`]).
    preload: &'static [&'static str],
    /// [`Settings::shared_transactions`].
    shared_transactions: bool,
    links: DashMap<u32, Arc<Link>>,
}

/// The connection to one database of a master, as the connector last left it.
#[derive(Clone, Default)]
enum LinkState {
    /// The first attempt is under way: requests wait for it.
    #[default]
    Connecting,
    /// Connected; `generation` tells this connection from earlier ones.
    Up { generation: u64, conn: Pipeline },
    /// Unreachable: requests fail at once while the connector retries.
    Down,
    /// The master is up but refuses this database (`SELECT` answered this error, e.g. the
    /// index is beyond its `databases`): requests get that error as the master's reply. It
    /// says nothing about the master's health, so other databases and clients are unaffected.
    Refused(Bytes),
}

struct Link {
    state: watch::Sender<LinkState>,
}

impl Link {
    /// The connection in use, with its generation, if up.
    fn current(&self) -> Option<(u64, Pipeline)> {
        match &*self.state.borrow() {
            LinkState::Up { generation, conn } => Some((*generation, conn.clone())),
            _ => None,
        }
    }

    /// The master's refusal of this database, if that is the state.
    fn refusal(&self) -> Option<Bytes> {
        match &*self.state.borrow() {
            LinkState::Refused(error) => Some(error.clone()),
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

impl RedisBackend {
    /// A master at `url` (`redis://[user:pass@]host:port[/db]`, or a Sentinel group's:
    /// `redis+sentinel://[user:pass@]host:port[,host:port...]/name[/db]`), its state kept by
    /// the [`Health`] that `health_for` builds from the member's name.
    pub fn new(
        url: &str,
        settings: Settings,
        health_for: impl FnOnce(&str) -> Health,
    ) -> redis::RedisResult<RedisBackend> {
        let sentinel = locate::sentinel_url(url)
            .transpose()
            .map_err(|why| invalid("bad Sentinel URL", why))?;
        let url = sentinel.as_ref().map_or(url, |s| s.master_url.as_str());
        let Reach {
            addr,
            credentials,
            tls,
            db,
        } = reach(url, settings.tls.as_ref())?;
        let (name, master, sentinels) = match sentinel {
            Some(group) => (
                format!("{}@{}", group.service, group.sentinels[0]),
                None,
                Some(Sentinels::new(group, tls.clone(), settings.connect_timeout)),
            ),
            None => (addr.to_string(), Some(addr), None),
        };
        Ok(RedisBackend {
            tls,
            health: Arc::new(health_for(&name)),
            probe_interval: settings.probe_interval,
            name,
            master: Arc::new(watch::Sender::new(master)),
            followed: sentinels.is_some(),
            sentinels: Mutex::new(sentinels),
            credentials,
            connect_timeout: settings.connect_timeout,
            request_timeout: settings.request_timeout,
            base_db: db,
            databases: settings.databases,
            greeting: settings.greeting,
            preload: settings.preload,
            shared_transactions: settings.shared_transactions,
            links: DashMap::new(),
        })
    }

    /// Opens the connection to database 0 and waits for the first attempt, so that the proxy
    /// starts with every reachable master connected, then starts the periodic probe. An
    /// unreachable master is not an error: it is retried in the background.
    pub async fn connect(&self) {
        let sentinels = self
            .sentinels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut sentinels) = sentinels {
            match sentinels.master().await {
                Ok(master) => {
                    self.master.send_replace(Some(master));
                }
                Err(e) => tracing::warn!(backend = %self.name, error = %e, "no Sentinel named the master"),
            }
            let follow = follow(
                sentinels,
                Arc::downgrade(&self.master),
                self.health.clone(),
                self.probe_interval,
                self.name.clone(),
            );
            tokio::spawn(follow);
        }
        let link = self.link(0);
        let mut state = link.state.subscribe();
        let _ = state.wait_for(|s| !matches!(s, LinkState::Connecting)).await;
        if let Some((_, conn)) = link.current() {
            self.check_databases(&conn).await;
        }
        let probe = probe(
            Arc::downgrade(&link),
            self.health.clone(),
            self.probe_interval,
            self.request_timeout,
        );
        tokio::spawn(probe);
    }

    /// Warns at start when the master has fewer databases than the URL's base plus
    /// `databases`: clients selecting the missing ones would get the master's error. Where
    /// `CONFIG` is not allowed, nothing can be checked.
    async fn check_databases(&self, conn: &Pipeline) {
        let asked = tokio::time::timeout(self.request_timeout, conn.command(&[b"CONFIG", b"GET", b"databases"]));
        let Ok(Ok(Reply::Array(items))) = asked.await else {
            return;
        };
        let have = match items.as_slice() {
            [_, Reply::Bulk(n)] => std::str::from_utf8(n).ok().and_then(|n| n.parse::<i64>().ok()),
            _ => None,
        };
        let need = self.base_db + i64::from(self.databases);
        if let Some(have) = have.filter(|have| *have < need) {
            tracing::error!(
                backend = %self.name,
                master_databases = have,
                needed = need,
                "the master has fewer databases than the URL's database plus `databases`: \
                 SELECT of the missing ones answers the master's error"
            );
        }
    }

    /// How to open a subscription on this master (its own connection: see
    /// [`super::subscriber`]).
    pub fn subscription_target(&self) -> super::subscriber::Target {
        super::subscriber::Target {
            master: self.master.subscribe(),
            tls: self.tls.clone(),
            credentials: self.credentials.clone(),
            connect_timeout: self.connect_timeout,
        }
    }

    /// The master's health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The master's address now (for a Sentinel group: the one it last named).
    pub fn master(&self) -> Option<Addr> {
        self.master.borrow().clone()
    }

    /// A command on database 0's connection, whatever the master's health: for the
    /// member's own questions (a cluster's slot map), never a vote.
    pub async fn command(&self, args: &[&[u8]]) -> super::Answer {
        match self.link(0).current() {
            Some((_, conn)) => conn.command(args).await,
            None => Err(BackendError::Down),
        }
    }

    /// The master's replication id (`master_replid`), if it answers: it changes when a
    /// replica is promoted, and when a master becomes a replica.
    pub async fn replication_id(&self) -> Option<String> {
        let asked = tokio::time::timeout(self.request_timeout, self.command(&[b"INFO", b"replication"]));
        match asked.await {
            Ok(Ok(Reply::Bulk(text))) => String::from_utf8_lossy(&text)
                .lines()
                .find_map(|l| l.strip_prefix("master_replid:").map(|id| id.trim().to_owned())),
            _ => None,
        }
    }

    /// `redis`, or `sentinel` for a Sentinel group's master.
    pub fn kind(&self) -> &'static str {
        if self.followed { "sentinel" } else { "redis" }
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
        let (credentials, tls) = (self.credentials.clone(), self.tls.clone());
        let master_db = self.base_db + i64::from(db);
        let (name, connect_timeout, request_timeout) = (self.name.clone(), self.connect_timeout, self.request_timeout);
        let (health, greeting, scripts) = (self.health.clone(), self.greeting.clone(), self.preload);
        let shared_transactions = self.shared_transactions;
        let (mut master, followed) = (self.master.subscribe(), self.followed);
        let weak = Arc::downgrade(&link);
        drop(link);
        async move {
            let mut backoff = BACKOFF.0;
            let mut generation = 0;
            loop {
                let addr = master.borrow_and_update().clone();
                // Rule 8: the master's identity is read on the new connection before any
                // request may use it, so a restarted master is quarantined before it votes.
                // Each stage has its own bound (the whole handshake is two round trips,
                // pipelined), so a master whose round trip fits `backend_timeout_ms` connects
                // however far away it is.
                let attempt = async {
                    let addr = addr.ok_or_else(|| "no Sentinel has named the master yet".to_owned())?;
                    let tls = tls.as_ref().map(|connector| (connector, addr.host.as_str()));
                    let at = addr.to_string();
                    let conn = match tokio::time::timeout(connect_timeout, Pipeline::connect(&at, tls)).await {
                        Ok(conn) => conn.map_err(|e| e.to_string())?,
                        Err(_) => return Err(timed_out("connect", connect_timeout)),
                    };
                    conn.join_acquisitions(shared_transactions);
                    let hello = Hello {
                        credentials: credentials.as_ref(),
                        followed,
                        db: master_db,
                        scripts,
                    };
                    let run_id = within(request_timeout, "handshake", handshake(&conn, &hello, &health)).await?;
                    if let Some(greeting) = &greeting {
                        let greeted = greet(&conn, &**greeting, &run_id, &name, db);
                        within(request_timeout, "greeting", async { Ok(greeted.await?) }).await?;
                    }
                    Ok::<_, Failure>(conn)
                };
                let result = attempt.await;
                let Some(link) = weak.upgrade() else { return };
                match result {
                    Ok(conn) => {
                        generation += 1;
                        tracing::info!(backend = %name, db, "backend connected");
                        let watched = conn.clone();
                        link.state.send_replace(LinkState::Up { generation, conn });
                        backoff = BACKOFF.0;
                        let mut watcher = link.state.subscribe();
                        drop(link);
                        // Until the connection fails (the proxy hears of it from the
                        // connection itself), is given up (the probe found it dead), or the
                        // master moved (a failover: requests fail at once until reconnected).
                        tokio::select! {
                            _ = watcher.wait_for(|s| !matches!(s, LinkState::Up { .. })) => {}
                            () = watched.closed() => {
                                if let Some(link) = weak.upgrade() {
                                    link.broken(generation);
                                }
                            }
                            _ = master.changed() => {
                                if let Some(link) = weak.upgrade() {
                                    link.broken(generation);
                                }
                                backoff = std::time::Duration::ZERO;
                            }
                        }
                        drop(watched);
                        tracing::warn!(backend = %name, db, "backend connection lost");
                    }
                    Err(Failure::Refused(error)) => {
                        // A database's problem, not the master's: its health is untouched.
                        link.state.send_if_modified(|s| {
                            if matches!(s, LinkState::Refused(e) if *e == error) {
                                return false;
                            }
                            let why = String::from_utf8_lossy(&error);
                            tracing::warn!(backend = %name, db, error = %why, "backend refuses this database");
                            *s = LinkState::Refused(error.clone());
                            true
                        });
                    }
                    Err(Failure::Down(e)) => {
                        health.failed(&e);
                        link.state.send_if_modified(|s| mark_down(s, &name, &e));
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).clamp(BACKOFF.0, BACKOFF.1);
            }
        }
    }
}

/// Asks the Sentinels for the master every `interval` and moves the member when they name
/// another: a failover. The member is quarantined first (rule 8: the new master may lack
/// the last writes), so that no request started after this moment counts its vote, whichever
/// connection it would have gone to; then its connections follow the new address. Ends when
/// the backend is dropped.
async fn follow(
    mut sentinels: Sentinels,
    master: std::sync::Weak<watch::Sender<Option<Addr>>>,
    health: Arc<Health>,
    interval: Duration,
    name: String,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if master.strong_count() == 0 {
            return;
        }
        let named = match sentinels.master().await {
            Ok(named) => named,
            Err(e) => {
                tracing::debug!(backend = %name, error = %e, "no Sentinel answered");
                continue;
            }
        };
        let Some(master) = master.upgrade() else { return };
        let before = master.borrow().clone();
        if before.as_ref() == Some(&named) {
            continue;
        }
        // A first naming (no Sentinel answered at start) is no failover: nothing was written
        // to any master of the group yet, and the first sight of the master is judged as any
        // master's (rule 8, `Health::observed`).
        if let Some(before) = before {
            health.switched(&before.to_string(), &named.to_string());
        }
        master.send_replace(Some(named));
    }
}

/// Probes the master every `interval` with `INFO server` (and `TIME`, where its clock is
/// judged), pipelined: a master that does not answer the probe within `timeout` (one round
/// trip) is down (requests skip it instead of each spending a timeout), and its identity is
/// checked again (rule 8).
///
/// Two probes in a row that timed out on one connection also give it up: the connector opens
/// a fresh one. A connection whose packets were lost (a one-way cut: requests arrive, replies
/// do not) is left to TCP's retransmission, whose backoff can keep it silent for seconds after
/// the network heals; a new connection works as soon as it does. One timeout is not enough:
/// a proxy descheduled for a moment (a loaded host) sees every master's probe time out at once,
/// and replacing every connection then would fail every request in flight for nothing. A request still unsent in the
/// kernel's buffers of the old connection may then run after one sent on the new: the only
/// writes that could follow one another that way are an acquisition and its undo, and the
/// undo deletes only the key with its attempt's exact expiry (rule 5a), so at worst the
/// partial lock stays until its TTL. Ends when the backend is dropped.
async fn probe(link: std::sync::Weak<Link>, health: Arc<Health>, interval: Duration, timeout: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The connection whose last probe timed out, if the last probe did.
    let mut timed_out: Option<u64> = None;
    loop {
        ticker.tick().await;
        let Some(link) = link.upgrade() else { return };
        // No connection: the connector reports the failures and the recovery.
        let Some((generation, conn)) = link.current() else {
            continue;
        };
        // The clock reading is inside the timeout: a master that stops after answering
        // `INFO` would otherwise hold the probe for as long as it is stopped, never marked
        // down, and every request would spend a timeout on it.
        let probed = async {
            let (identity, ()) = futures_util::join!(identity(&conn), read_clock(&conn, &health));
            let (run_id, uptime) = identity?;
            health.observed(&run_id, uptime);
            Ok::<_, String>(())
        };
        let result = tokio::time::timeout(timeout, probed).await;
        let again = timed_out.replace(generation) == Some(generation);
        match result {
            Ok(Ok(())) => timed_out = None,
            Ok(Err(e)) => {
                timed_out = None;
                health.failed(&e);
                if conn.is_dead() {
                    link.broken(generation);
                }
            }
            Err(_) => {
                health.failed("probe timed out");
                if again {
                    link.broken(generation);
                    timed_out = None;
                }
            }
        }
    }
}

/// What a new connection to a master says before any request may use it.
struct Hello<'a> {
    /// `AUTH` credentials: user (if any) and password.
    credentials: Option<&'a (Option<String>, String)>,
    /// A Sentinel group's master: checked with `ROLE`.
    followed: bool,
    /// The master's database this connection serves.
    db: i64,
    /// Scripts to load ([`Settings::preload`]).
    scripts: &'static [&'static str],
}

/// The handshake of a new connection, in one pipelined batch (one round trip): `AUTH`,
/// `ROLE` for a Sentinel group's master, the identity (rule 8), the clock (rule 15), `SELECT`
/// and the scripts. Each command's reply is read in the order sent, so `AUTH` applies to
/// the rest, and the first failure in that order is the one reported. The master's run id.
async fn handshake(conn: &Pipeline, hello: &Hello<'_>, health: &Health) -> Result<String, Failure> {
    let auth = authenticate(conn, hello.credentials);
    let master = async {
        if hello.followed {
            // The Sentinels may be behind a failover: a demoted master is a replica, whose
            // every write would fail (READONLY).
            role(conn).await
        } else {
            Ok(())
        }
    };
    let (auth, master, identity, (), selected, ()) = futures_util::join!(
        auth,
        master,
        identity(conn),
        read_clock(conn, health),
        select(conn, hello.db),
        preload(conn, hello.scripts),
    );
    auth?;
    master?;
    let (run_id, uptime) = identity?;
    health.observed(&run_id, uptime);
    selected?;
    Ok(run_id)
}

/// `step`, failed as [`timed_out`] when it takes longer than `limit`.
async fn within<T>(limit: Duration, what: &str, step: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
    tokio::time::timeout(limit, step)
        .await
        .unwrap_or_else(|_| Err(timed_out(what, limit)))
}

/// A stage of a new connection (`connect`, `handshake`, `greeting`) that took longer than
/// `limit`: the master is down, as far as this proxy can tell.
fn timed_out(what: &str, limit: Duration) -> Failure {
    Failure::Down(format!("{what} timed out ({} ms)", limit.as_millis()))
}

/// Connects to `addr`, authenticates and selects `db`.
async fn open(
    addr: &str,
    tls: Option<(&TlsConnector, &str)>,
    credentials: Option<&(Option<String>, String)>,
) -> Result<Pipeline, String> {
    let conn = Pipeline::connect(addr, tls).await.map_err(|e| e.to_string())?;
    authenticate(&conn, credentials).await?;
    Ok(conn)
}

/// Authenticates `conn` with `credentials`, if any.
async fn authenticate(conn: &Pipeline, credentials: Option<&(Option<String>, String)>) -> Result<(), String> {
    match credentials {
        None => Ok(()),
        Some(credentials) => expect_ok(conn.command(&super::auth_args(credentials)).await, "AUTH"),
    }
}

/// How a master's URL says to reach it.
struct Reach {
    addr: Addr,
    /// `AUTH` credentials: user (if any) and password.
    credentials: Option<(Option<String>, String)>,
    /// For `rediss://`: the connector.
    tls: Option<TlsConnector>,
    /// The URL's database.
    db: i64,
}

/// Reads a master's URL (`redis[s]://[user:pass@]host:port[/db]`; the `redis` crate parses it,
/// TLS is ours).
fn reach(url: &str, tls: Option<&TlsConnector>) -> redis::RedisResult<Reach> {
    let client = Client::open(plain_url(url).as_str())?;
    let info = client.get_connection_info();
    let addr = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Addr {
            host: host.clone(),
            port: *port,
        },
        other => {
            let why = format!("only redis://host:port masters are supported, not {other}");
            return Err(invalid("unsupported address", why));
        }
    };
    let redis = info.redis_settings();
    let credentials = redis
        .password()
        .map(|p| (redis.username().map(str::to_owned), p.to_owned()));
    let tls = match (url.starts_with("rediss://"), tls) {
        (false, _) => None,
        (true, Some(connector)) => Some(connector.clone()),
        (true, None) => return Err(invalid("no CA", "rediss:// needs tls_ca_file".to_owned())),
    };
    Ok(Reach {
        addr,
        credentials,
        tls,
        db: redis.db(),
    })
}

/// A connection to the master at `url`, authenticated: for a cluster member's questions to
/// its seeds.
pub async fn open_url(url: &str, tls: Option<&TlsConnector>) -> Result<Pipeline, String> {
    let reach = reach(url, tls).map_err(|e| e.to_string())?;
    let tls = reach
        .tls
        .as_ref()
        .map(|connector| (connector, reach.addr.host.as_str()));
    open(&reach.addr.to_string(), tls, reach.credentials.as_ref()).await
}

/// The `AUTH` credentials of `url`: user (if any) and password. (`tls`: the connector a
/// `rediss://` URL needs to be valid.)
pub fn url_credentials(url: &str, tls: Option<&TlsConnector>) -> Option<(Option<String>, String)> {
    reach(url, tls).ok()?.credentials
}

/// Why a connection attempt failed.
enum Failure {
    /// The master is unreachable or misbehaves: it is down.
    Down(String),
    /// The master refused the database with this error reply.
    Refused(Bytes),
}

impl From<String> for Failure {
    fn from(why: String) -> Failure {
        Failure::Down(why)
    }
}

/// Selects the master's database `db` on a new connection. An error reply is the database's
/// refusal; only a failure to answer says the master is down.
async fn select(conn: &Pipeline, db: i64) -> Result<(), Failure> {
    if db == 0 {
        return Ok(());
    }
    match conn.command(&[b"SELECT", db.to_string().as_bytes()]).await {
        Ok(Reply::Status(_)) => Ok(()),
        Ok(Reply::Error(e)) => Err(Failure::Refused(e)),
        Ok(other) => Err(Failure::Down(format!("SELECT: unexpected reply {other:?}"))),
        Err(e) => Err(Failure::Down(format!("SELECT: {e}"))),
    }
}

fn expect_ok(reply: Result<Reply, BackendError>, what: &str) -> Result<(), String> {
    match reply {
        Ok(Reply::Status(_)) => Ok(()),
        Ok(Reply::Error(e)) => Err(format!("{what}: {}", String::from_utf8_lossy(&e))),
        Ok(other) => Err(format!("{what}: unexpected reply {other:?}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Checks that the node is a master (`ROLE`), for a master a Sentinel named.
async fn role(conn: &Pipeline) -> Result<(), String> {
    match conn.command(&[b"ROLE"]).await {
        Ok(reply) if locate::is_master(&reply) => Ok(()),
        Ok(other) => Err(format!("not a master (ROLE: {other:?})")),
        Err(e) => Err(format!("ROLE: {e}")),
    }
}

/// The master's `run_id` and uptime, from `INFO server`.
async fn identity(conn: &Pipeline) -> Result<(String, Duration), String> {
    match conn.command(&[b"INFO", b"server"]).await {
        Ok(Reply::Bulk(text)) => {
            parse_identity(&String::from_utf8_lossy(&text)).ok_or_else(|| "no run_id in INFO server".to_owned())
        }
        Ok(other) => Err(format!("INFO server: unexpected reply {other:?}")),
        Err(e) => Err(format!("INFO server: {e}")),
    }
}

/// Rule 15: reads the master's wall clock (`TIME`) into its health's history, so that a jump
/// is seen within a probe interval even where no acquisition's vote carries a reading. What
/// the reading says is the health's to act on; a master that cannot answer `TIME` is judged
/// by its votes' readings alone (and a probe that fails says so by `INFO`).
async fn read_clock(conn: &Pipeline, health: &Health) {
    if !health.watches_clock() {
        return;
    }
    let sent = health.now();
    if let Ok(reply) = conn.command(&[b"TIME"]).await
        && let Some(master) = parse_time(&reply)
    {
        // An `Err` is the quarantine it started, which the health keeps.
        let _ = health.clock_read(sent, master);
    }
}

/// Loads `scripts` on a new connection ([`Settings::preload`]). A master that refuses
/// (scripting denied to the proxy's user) is not failed for it: each call still has its
/// source to fall back on.
async fn preload(conn: &Pipeline, scripts: &[&str]) {
    let loads = scripts
        .iter()
        .map(|body| async move { conn.command(&[b"SCRIPT", b"LOAD", body.as_bytes()]).await });
    futures_util::future::join_all(loads).await;
}

/// Sends `greeting`'s command on a new connection to the master `run_id` and has it read the
/// reply.
async fn greet(conn: &Pipeline, greeting: &dyn Greeting, run_id: &str, name: &str, db: u32) -> Result<(), String> {
    let command = greeting.command(run_id);
    let args: Vec<&[u8]> = command.iter().map(|a| &a[..]).collect();
    match conn.command(&args).await {
        Ok(reply) => greeting.accept(reply, name, db),
        Err(e) => Err(format!("greeting: {e}")),
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

impl RedisBackend {
    /// Sends `request` (and on `NOSCRIPT` its `fallback`) on the connection for its database;
    /// the answer completes `place`. Refused at once, without spending a timeout, while the
    /// master is down or quarantined (rules 3 and 8), except an owner-checked cleanup.
    pub fn send(&self, request: &Request, fallback: Option<&Request>, place: Place) {
        self.send_with(request, fallback, place, false);
    }

    /// [`RedisBackend::send`] after `ASKING` (a cluster shard importing the key's slot).
    pub fn send_asking(&self, request: &Request, fallback: Option<&Request>, place: Place) {
        self.send_with(request, fallback, place, true);
    }

    fn send_with(&self, request: &Request, fallback: Option<&Request>, place: Place, asking: bool) {
        let link = self.link(request.db);
        // Rule 8: the connection is chosen *before* the admission is read. A connection to
        // another process (a restart, a failover) is only up once that process's identity was
        // observed, and a failover quarantines the member before any connection moves; so a
        // request admitted here goes to a process it was admitted to, never to a new master
        // whose quarantine began after the admission.
        let current = link.current();
        if let Err(refused) = admission(&self.health, (request.cleanup, request.inspect)) {
            return place.complete(Err(refused));
        }
        let place = if request.timed {
            Health::timed(&self.health, place)
        } else {
            place
        };
        let fallback = fallback.map(Request::encoded);
        if let Some((_, conn)) = current {
            return deliver(&conn, request.wire(), request.form, fallback, place, asking);
        }
        // Only a database's first requests wait, for its first connection attempt.
        let (encoded, form, health) = (request.encoded(), request.form, self.health.clone());
        let kind = (request.cleanup, request.inspect);
        tokio::spawn(async move {
            let mut state = link.state.subscribe();
            let _ = state.wait_for(|s| !matches!(s, LinkState::Connecting)).await;
            if let Some(error) = link.refusal() {
                // The master's own answer for this database: a per-database failure is
                // that database's problem, not the master's health.
                return place.complete(Ok(Reply::Error(error)));
            }
            let current = link.current();
            // Admitted again, after the wait: the connection may be to a process that was
            // quarantined meanwhile (rule 8, as above).
            match (current, admission(&health, kind)) {
                (_, Err(refused)) => place.complete(Err(refused)),
                (Some((_, conn)), Ok(())) => deliver(&conn, &encoded, form, fallback, place, asking),
                (None, Ok(())) => place.complete(Err(BackendError::Down)),
            }
        });
    }
}

/// Puts a request on `conn`, after `ASKING` if `asking`.
fn deliver(conn: &Pipeline, encoded: &[u8], form: Form, fallback: Option<Bytes>, place: Place, asking: bool) {
    if asking {
        conn.send_asking(encoded, form, fallback, place);
    } else {
        conn.send(encoded, form, fallback, place);
    }
}

/// Whether a request may go to the master now (rules 3 and 8): an owner-checked `cleanup`
/// also while it is marked down (see [`Request::cleanup`]), nothing while it is quarantined.
/// Whether a request of this kind (`cleanup`, `inspect`: see [`Request`]) may go to the
/// master now.
fn admission(health: &Health, (cleanup, inspect): (bool, bool)) -> Result<(), BackendError> {
    if inspect {
        health.admit_inspection()
    } else if cleanup {
        health.admit_cleanup()
    } else {
        health.admit()
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place) {
        self.send(request, fallback, place);
    }
}

/// An error about the member's URL.
fn invalid(what: &'static str, why: String) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, what, why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::health::{QuarantineMode, State};
    use crate::clock::TokioClock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    #[test]
    fn auth_names_the_user_only_when_there_is_one() {
        let with_user = (Some("proxy".to_owned()), "pw".to_owned());
        assert_eq!(crate::backend::auth_args(&with_user), [&b"AUTH"[..], b"proxy", b"pw"]);
        let password_only = (None, "pw".to_owned());
        assert_eq!(crate::backend::auth_args(&password_only), [&b"AUTH"[..], b"pw"]);
    }

    /// Reads one command (an array of bulk strings) from a client; `None` at end of stream.
    async fn read_command<R: AsyncBufReadExt + Unpin>(r: &mut R) -> Option<Vec<Vec<u8>>> {
        let mut line = String::new();
        r.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
        let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            line.clear();
            r.read_line(&mut line).await.ok()?;
            let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
            let mut arg = vec![0; len + 2];
            r.read_exact(&mut arg).await.ok()?;
            arg.truncate(len);
            args.push(arg);
        }
        Some(args)
    }

    /// A master that answers what a connection and its probe ask, except that once `stall`
    /// is set it never answers `TIME`: a master stopped between a probe's two questions.
    async fn stalling_master(stall: Arc<AtomicBool>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let stall = stall.clone();
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut read = BufReader::new(read);
                    while let Some(args) = read_command(&mut read).await {
                        let reply: Vec<u8> = match args[0].to_ascii_uppercase().as_slice() {
                            b"INFO" => {
                                let text = "run_id:a1\r\nuptime_in_milliseconds:100000\r\n";
                                format!("${}\r\n{text}\r\n", text.len()).into_bytes()
                            }
                            b"TIME" if stall.load(Ordering::SeqCst) => continue,
                            b"TIME" => {
                                let now = std::time::SystemTime::now()
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .expect("after 1970");
                                let (s, us) = (now.as_secs().to_string(), now.subsec_micros().to_string());
                                format!("*2\r\n${}\r\n{s}\r\n${}\r\n{us}\r\n", s.len(), us.len()).into_bytes()
                            }
                            b"CONFIG" => b"*2\r\n$9\r\ndatabases\r\n$2\r\n16\r\n".to_vec(),
                            _ => b"+OK\r\n".to_vec(),
                        };
                        if write.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_master_that_stops_answering_between_the_probes_questions_is_marked_down() {
        let stall = Arc::new(AtomicBool::new(false));
        let port = stalling_master(stall.clone()).await;
        let settings = Settings {
            tls: None,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_millis(100),
            probe_interval: Duration::from_millis(20),
            databases: 1,
            greeting: None,
            preload: &[],
            shared_transactions: true,
        };
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(TokioClock::new());
        let backend = RedisBackend::new(&format!("redis://127.0.0.1:{port}"), settings, |name| {
            Health::new(name, clock, QuarantineMode::Always, Duration::from_secs(1)).watching_clock(0.01)
        })
        .expect("backend");
        backend.connect().await;
        assert_eq!(backend.health().state(), State::Up);
        stall.store(true, Ordering::SeqCst);
        let marked = async {
            while backend.health().state() != State::Down {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        // Many probe timeouts' worth: a probe held by its unanswered `TIME` never gets there.
        tokio::time::timeout(Duration::from_secs(5), marked)
            .await
            .expect("the master was never marked down");
    }
}
