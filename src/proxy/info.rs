//! `INFO`: the sections a Redis user recognises, plus the proxy's own `backends` and `quorum`.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::Proxy;
use crate::backend::Backend;
use crate::backend::cluster::ShardView;
use crate::backend::health::State;

/// The Redis version the proxy reports in `INFO` and `HELLO`. Clients pick features by it;
/// see docs/commands.md ("Which Redis version the proxy reports").
pub const REDIS_VERSION: &str = "8.4.0";

/// Sections shown by a plain `INFO`, in order.
const DEFAULT_SECTIONS: [&str; 5] = ["server", "clients", "stats", "backends", "quorum"];

/// Renders the requested sections (`INFO`, `INFO server`, `INFO all`, ...). `backends` (the
/// masters' addresses and run ids: the deployment's topology, as `PROXY BACKENDS` shows it)
/// only for an `operator`; for other users it is left out, as Redis leaves out unknown sections.
pub fn render(proxy: &Proxy, sections: &[Bytes], operator: bool) -> String {
    let wanted: Vec<String> = sections
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_lowercase())
        .collect();
    let show_all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| matches!(w.as_str(), "all" | "default" | "everything"));
    let mut out = String::new();
    for name in DEFAULT_SECTIONS {
        if name == "backends" && !operator {
            continue;
        }
        if show_all || wanted.iter().any(|w| w == name) {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            section(proxy, name, &mut out);
        }
    }
    out
}

fn section(proxy: &Proxy, name: &str, out: &mut String) {
    let stats = &proxy.stats;
    // Writing to a String cannot fail.
    let _ = match name {
        "server" => write!(
            out,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\nrole:master\r\n\
             loading:0\r\nrun_id:{}\r\nproxy:redlock-proxy\r\nproxy_version:{}\r\nprocess_id:{}\r\n\
             tcp_port:{}\r\nuptime_in_seconds:{}\r\n",
            proxy.run_id,
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            proxy.config.listen.rsplit(':').next().unwrap_or(""),
            proxy.started.elapsed().as_secs(),
        ),
        "clients" => write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\n",
            stats.clients.load(Ordering::Relaxed)
        ),
        "stats" => write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nauth_failures:{}\r\n",
            stats.connections.load(Ordering::Relaxed),
            stats.commands.load(Ordering::Relaxed),
            stats.auth_failures.load(Ordering::Relaxed),
        ),
        "backends" => backends(proxy, out),
        _ => write!(
            out,
            "# Quorum\r\nbackends:{}\r\nquorum:{}\r\ndrift_factor:{}\r\nbackend_timeout_ms:{}\r\n\
             default_ttl_ms:{}\r\nmax_ttl_ms:{}\r\nlocks_acquired:{}\r\nlocks_contended:{}\r\nnoquorum:{}\r\n",
            proxy.engine.backends().len(),
            proxy.engine.quorum(),
            proxy.config.drift_factor,
            proxy.config.backend_timeout_ms,
            proxy.config.default_ttl_ms,
            proxy.config.max_ttl_ms,
            stats.acquired.load(Ordering::Relaxed),
            stats.contended.load(Ordering::Relaxed),
            stats.noquorum.load(Ordering::Relaxed),
        ),
    };
}

fn backends(proxy: &Proxy, out: &mut String) -> std::fmt::Result {
    out.push_str("# Backends\r\n");
    for (i, line) in backend_lines(proxy).iter().enumerate() {
        write!(out, "backend{i}:{line}\r\n")?;
    }
    Ok(())
}

/// One member as `INFO backends`, `PROXY BACKENDS` and the status page show it: gathered
/// here once, so that the three say the same thing.
#[derive(Clone, Debug)]
pub struct BackendView {
    /// Its index in `backends` (`backendN`, `PROXY QUARANTINE <index>`).
    pub index: usize,
    /// Its address (a Sentinel group's: `name@first-sentinel`, a cluster's:
    /// `cluster@first-seed`).
    pub name: String,
    /// `redis`, `sentinel`, `cluster` or `embedded`.
    pub kind: &'static str,
    /// Its state, with the quarantine left.
    pub state: State,
    /// Why it is not up, when known.
    pub why: Option<String>,
    /// The master a Sentinel group names now.
    pub master: Option<String>,
    /// A cluster's shards.
    pub shards: Option<Vec<ShardView>>,
    /// The member (index, address) a duplicate is the same server as (rule 15).
    pub duplicate_of: Option<(usize, String)>,
    /// The master process's `run_id` as last seen.
    pub run_id: Option<String>,
    /// The engine's request statistics: the last request's latency, timeouts, errors.
    pub requests: Option<(Duration, u64, u64)>,
}

/// Every member, in configuration order.
pub fn backend_views(proxy: &Proxy) -> Vec<BackendView> {
    let backends = proxy.engine.backends();
    backends
        .iter()
        .enumerate()
        .map(|(index, b)| {
            let state = b.state();
            let duplicate_of = match state {
                State::Duplicate { of } => {
                    Some((of, backends.get(of).map(|b| b.name().to_owned()).unwrap_or_default()))
                }
                _ => None,
            };
            BackendView {
                index,
                name: b.name().to_owned(),
                kind: b.kind(),
                state,
                why: b.why(),
                master: b.master(),
                shards: b.shards(),
                duplicate_of,
                run_id: Backend::run_id(&**b),
                requests: proxy
                    .engine
                    .observed(index)
                    .map(|o| (o.last_latency(), o.timeouts(), o.errors())),
            }
        })
        .collect()
}

/// One line per member: address (a Sentinel group's: `name@first-sentinel`, a cluster's:
/// `cluster@first-seed`), kind, state (with the quarantine left), the master a Sentinel group
/// names now, a cluster's shards (`shardN=master;state;slots`, the slots as `a-b` ranges
/// joined by `+`), the member a duplicate is the same server as (`duplicate_of=index:addr`,
/// rule 15), run id, and the engine's request statistics.
pub fn backend_lines(proxy: &Proxy) -> Vec<String> {
    backend_views(proxy).iter().map(backend_line).collect()
}

fn backend_line(b: &BackendView) -> String {
    let mut line = format!("addr={},kind={},state={}", b.name, b.kind, b.state.name());
    if let Some(master) = &b.master {
        let _ = write!(line, ",master={master}");
    }
    if let Some(shards) = &b.shards {
        let _ = write!(line, ",shards={}", shards.len());
        for (j, shard) in shards.iter().enumerate() {
            let state = match shard.state {
                State::Quarantined { remaining } => format!("quarantined:{}ms", remaining.as_millis()),
                other => other.name().to_owned(),
            };
            let _ = write!(line, ",shard{j}={};{state};{}", shard.master, shard.slots);
        }
    }
    if let State::Quarantined { remaining } = b.state {
        let _ = write!(line, ",quarantine_remaining_ms={}", remaining.as_millis());
    }
    if let Some((of, name)) = &b.duplicate_of {
        let _ = write!(line, ",duplicate_of={of}:{name}");
    }
    let _ = write!(line, ",run_id={}", b.run_id.as_deref().unwrap_or_default());
    if let Some((latency, timeouts, errors)) = b.requests {
        let _ = write!(
            line,
            ",last_latency_us={},timeouts={timeouts},errors={errors}",
            latency.as_micros()
        );
    }
    line
}
