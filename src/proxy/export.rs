//! The gauges of the masters' states, kept current from their health while the proxy runs.

use std::collections::HashSet;
use std::time::Duration;

use crate::backend::Backend;
use crate::backend::health::State;
use crate::metrics as m;

use super::*;

/// Keeps the backend state gauges current (they are read from each master's health, which
/// changes on probes and connections), and logs the moments a quorum of masters starts or
/// stops voting (a quarantine lifted or over, masters lost). Ends with the proxy.
pub(super) async fn export_backend_states(proxy: std::sync::Weak<Proxy>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    // Each member's kind and master as last exported: a failover sets the old series to 0.
    let mut shapes: std::collections::HashMap<String, (&'static str, String)> = std::collections::HashMap::new();
    // Each cluster member's shard masters as last exported.
    let mut shard_series: HashSet<(String, String)> = HashSet::new();
    // Whether a quorum voted at the last tick (the first is the start's, which its own line told).
    let mut had_quorum = None;
    loop {
        ticker.tick().await;
        let Some(proxy) = proxy.upgrade() else { return };
        let voting = proxy
            .engine
            .backends()
            .iter()
            .filter(|b| b.state() == State::Up)
            .count();
        had_quorum = Some(log_quorum_change(had_quorum, voting, proxy.engine.backends().len()));
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

/// Logs a change of whether a quorum votes (`voting` of `members` masters up), against the
/// last tick's `had` (`None`: nothing to compare with yet); returns whether it does now.
fn log_quorum_change(had: Option<bool>, voting: usize, members: usize) -> bool {
    let quorum = crate::quorum::quorum(members);
    let has = voting >= quorum;
    match had {
        Some(false) if has => tracing::info!(
            voting,
            quorum,
            "quorum reached: {voting} of {members} masters vote (a lock needs {quorum}): locks are granted again"
        ),
        Some(true) if !has => tracing::error!(
            voting,
            quorum,
            "quorum lost: only {voting} of {members} masters vote and a lock needs {quorum}: every lock answers \
             NOQUORUM until {quorum} do (PROXY BACKENDS says why each is out)"
        ),
        _ => {}
    }
    has
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
