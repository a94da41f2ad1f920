//! Start-up: the masters connected (or embedded ones started) and the proxy's shared state
//! built; a start without a quorum says who is out, why, and the ways out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

use crate::auth::Access;
use crate::backend::AnyBackend;
use crate::backend::cluster::ClusterBackend;
use crate::backend::embedded::EmbeddedBackend;
use crate::backend::health::{Health, State};
use crate::backend::redis::{self, RedisBackend};
use crate::backend::url::mask_url;
use crate::clock::{Clock, TokioClock};
use crate::config::Config;
use crate::error::StartError;
use crate::quorum::{self, Engine, Settings};
use crate::scripts::Registry;
use crate::sessions::SessionTable;
use crate::waiters::Waiters;
use dashmap::DashMap;

use super::*;

/// The log target of start-up's lines: the module's they were written in first
/// (`redlock_proxy::proxy`), which operators filter and the README quotes.
const TARGET: &str = "redlock_proxy::proxy";

impl Proxy {
    /// Builds the proxy from a validated config: connects to the real masters (waiting for the
    /// first attempt on each) or starts embedded ones.
    pub async fn start(config: Config) -> Result<Arc<Proxy>, StartError> {
        let legacy = Self::connect_legacy(&config).await?;
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
            engine: match legacy {
                Some(legacy) => Engine::new(backends, TokioClock::new(), settings)
                    .with_legacy(quorum::Legacy::new(legacy, &config.legacy_keys)),
                None => Engine::new(backends, TokioClock::new(), settings),
            },
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
            legacy_watch: Arc::default(),
        });
        proxy.watch_legacy();
        tokio::spawn(super::export::export_backend_states(Arc::downgrade(&proxy)));
        proxy.listen_for_releases();
        Ok(proxy)
    }

    /// The legacy member, when `legacy_backend` is set (`crate::quorum::Legacy`): connected
    /// as a master is and watched as one (rules 8 and 15: its restart quarantines it, and it
    /// must be another server than every master), but it keeps none of the proxy's own keys:
    /// no fencing epoch is written there.
    async fn connect_legacy(config: &Config) -> Result<Option<AnyBackend>, StartError> {
        let Some(url) = &config.legacy_backend else {
            return Ok(None);
        };
        let settings = redis::Settings {
            greeting: None,
            preload: &crate::lua::legacy::PRELOADED,
            ..Self::member_settings(config)?
        };
        let max_ttl = Duration::from_millis(config.max_ttl_ms);
        let quarantine = max_ttl + quorum::drift(max_ttl, config.drift_factor);
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let (mode, drift_factor) = (config.quarantine, config.drift_factor);
        let health = move |name: &str| Health::new(name, clock.clone(), mode, quarantine).watching_clock(drift_factor);
        let invalid = |e: String| StartError::Config(format!("legacy_backend: '{}': {e}", mask_url(url)));
        let backend = RedisBackend::new(url, settings, health).map_err(|e| invalid(e.to_string()))?;
        backend.connect().await;
        let backend = AnyBackend::Redis(Box::new(backend));
        tracing::info!(target: TARGET, legacy = %mask_url(url), state = backend.state().name(), keys = ?config.legacy_keys,
            "the legacy member bridges these keys: every lock on them is also taken there");
        Ok(Some(backend))
    }

    /// How the proxy connects to a master.
    fn member_settings(config: &Config) -> Result<redis::Settings, StartError> {
        let tls = config.tls_ca_file.as_deref().map(crate::tls::connector).transpose()?;
        Ok(redis::Settings {
            tls,
            connect_timeout: config.connect_timeout(),
            request_timeout: config.backend_timeout(),
            probe_interval: Duration::from_millis(config.probe_interval_ms),
            databases: config.databases,
            greeting: Some(Arc::new(quorum::EpochCheck)),
            preload: &PRELOADED,
            shared_transactions: true,
        })
    }

    async fn connect_all(config: &Config) -> Result<Vec<AnyBackend>, StartError> {
        let settings = Self::member_settings(config)?;
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
        match no_quorum_at_start(&states, &config.listen) {
            Some(why) => tracing::error!(target: TARGET, "{why}"),
            None => tracing::info!(
                target: TARGET,
                up = states.iter().filter(|s| **s == State::Up).count(),
                quorum = quorum::quorum(states.len()),
                "a quorum of masters votes"
            ),
        }
        Ok(backends)
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

/// A request from borrowed pieces.
/// The proxy's scripts that run by SHA1 (with their source to fall back on), loaded on every
/// new connection to a master.
const PRELOADED: [&str; 3] = [
    crate::lua::own::UNDO,
    crate::lua::own::RELEASE,
    crate::recipes::reentrant::lua::GIVE_BACK,
];

/// What a newcomer must read when the proxy starts without a quorum of voting masters: one
/// line that says which members are out, why, for how long, and the ways out (rule 8's
/// quarantine of masters first seen young is the usual cause with fresh masters). `None`
/// when a quorum votes. `listen`: the proxy's address, for the `redis-cli` line to copy.
fn no_quorum_at_start(states: &[State], listen: &str) -> Option<String> {
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
             may have restarted and lost locks granted before (rule 8). If no lock can predate them (new masters, \
             or masters that kept their data), restart the proxy with --quarantine restarts, or lift {lift} of \
             them now with `{} PROXY QUARANTINE <member> LIFT`; otherwise wait",
            quarantined.join(", "),
            redis_cli(listen)
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

/// The `redis-cli` invocation that reaches a proxy listening on `listen`: `-p` alone on the
/// loopback or all addresses (where redis-cli connects by default), else `-h` and `-p`.
fn redis_cli(listen: &str) -> String {
    match listen.rsplit_once(':') {
        Some(("127.0.0.1" | "0.0.0.0" | "localhost" | "[::]" | "[::1]", port)) => format!("redis-cli -p {port}"),
        Some((host, port)) => format!("redis-cli -h {} -p {port}", host.trim_matches(['[', ']'])),
        None => "redis-cli".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_cli_line_reaches_this_proxy() {
        assert_eq!(redis_cli("127.0.0.1:7379"), "redis-cli -p 7379");
        assert_eq!(redis_cli("0.0.0.0:7400"), "redis-cli -p 7400");
        assert_eq!(redis_cli("10.0.0.5:7379"), "redis-cli -h 10.0.0.5 -p 7379");
    }

    #[test]
    fn a_start_without_quorum_says_who_is_out_why_and_the_ways_out() {
        let q = State::Quarantined {
            remaining: Duration::from_secs(301),
        };
        let why = no_quorum_at_start(&[q, q, State::Down], "127.0.0.1:7400").expect("no quorum");
        assert!(why.starts_with("only 0 of 3 masters vote and a lock needs 2"), "{why}");
        assert!(why.contains("Members 0, 1 are quarantined for up to 301 s"), "{why}");
        assert!(why.contains("--quarantine restarts"), "{why}");
        assert!(why.contains("lift 2 of them now"), "{why}");
        assert!(
            why.contains("`redis-cli -p 7400 PROXY QUARANTINE <member> LIFT`"),
            "{why}"
        );
        assert!(why.contains("Members 2 are unreachable"), "{why}");
        let one_short = no_quorum_at_start(&[State::Up, q, q], "127.0.0.1:7400").expect("no quorum");
        assert!(one_short.contains("lift 1 of them now"), "{one_short}");
        assert_eq!(no_quorum_at_start(&[State::Up, State::Up, q], "127.0.0.1:7400"), None);
    }
}
