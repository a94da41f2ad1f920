//! A Redis Cluster as one member of the quorum: each request goes to the shard that serves its
//! key's hash slot, so the member's capacity grows with its shards.
//!
//! `redis+cluster://[user:pass@]seed1:6379,seed2:6379` (or `rediss+cluster://`) names the
//! cluster by a few of its nodes. The member asks one of them for the slot map (`CLUSTER
//! SLOTS`) at start, every probe interval, and whenever a shard answers `MOVED`. Each shard's
//! master is a [`RedisBackend`] of its own (one pipelined connection, its own probe and its own
//! [`Health`]), so a restart or a failover of one shard quarantines that shard's slots only.
//!
//! Rule 8 for shards: a slot range whose master is a node that was no master in the previous
//! map (a replica promoted in a failover), or a master whose replication history changed
//! since it was last asked (`master_replid`: it was a replica in between, and resynchronised
//! from a master that may have lacked the last writes), is quarantined from the moment the
//! proxy learns of it, *before* the new map is used. A slot moving between masters the proxy
//! already trusts (a resharding) is no failover: `MIGRATE` moves each key with its TTL, and
//! during the move the source answers for the keys it still has and `-ASK`s for the others,
//! so a held lock keeps its vote wherever its key is.
//!
//! The router is the proxy's own rather than the `redis` crate's cluster connection: that
//! connection follows `MOVED` to whichever node is named, so after a failover a promoted
//! replica would vote before the proxy saw it change, and it offers no way to refuse one
//! shard's requests while keeping the others.
//!
//! The hash slots and the slot map are in `slots.rs`; the routes, the sends to the shards and
//! the following of `MOVED` and `ASK` in `route.rs`; rule 8 per shard in `failover.rs`; the
//! `redis+cluster://` URL in `url.rs`. This module is the member itself: its public API, and
//! the reading of the slot map (at start, every probe interval, on `MOVED`).

mod failover;
mod route;
mod slots;

pub use super::url::{ClusterUrl, check_cluster, cluster_url, describe_cluster};
pub use crate::keys::hash_tag;
pub use slots::{CROSSSLOT, SLOTS, common_slot, slot};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::health::{Health, State};
use super::locate::Addr;
use super::redis::{RedisBackend, Settings};
use super::{Place, Request};
use crate::reply::Reply;
use route::{Route, route};
use slots::{Map, Shard, parse_slots};

/// One shard as `INFO`, `PROXY BACKENDS` and the metrics show it.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardView {
    /// The shard master's address.
    pub master: String,
    /// Its slot ranges, `a-b` joined by `+`.
    pub slots: String,
    /// How many slots it serves.
    pub slot_count: usize,
    /// Its state (a quarantine covers these slots only).
    pub state: State,
    /// Why it is not up, when known (the status page).
    pub why: Option<String>,
}

/// A Redis Cluster member.
pub struct ClusterBackend {
    /// `cluster@first-seed`, in logs, `INFO` and metrics.
    name: String,
    url: ClusterUrl,
    settings: Settings,
    health_for: Box<dyn Fn(&str) -> Health + Send + Sync>,
    map: RwLock<Arc<Map>>,
    /// Every shard master met so far, by address: kept across maps (with its connection and
    /// its health) while it serves slots.
    nodes: Mutex<HashMap<String, Arc<RedisBackend>>>,
    /// Each master's replication id when last asked (rule 8: a change is a failover).
    replids: Mutex<HashMap<String, String>>,
    /// Asks the task that keeps the map for a new one now (a shard answered `MOVED`).
    wake: Arc<Notify>,
    /// The map's generation, for requests waiting for a newer map.
    generation: watch::Sender<u64>,
    /// A master of the cluster, for the release subscription (`PUBLISH` reaches every node).
    any_master: Arc<watch::Sender<Option<Addr>>>,
}

impl ClusterBackend {
    /// A cluster member for `url`, each shard master's [`Health`] built by `health_for` from
    /// its name.
    pub fn new(
        url: &str,
        settings: Settings,
        health_for: impl Fn(&str) -> Health + Send + Sync + 'static,
    ) -> Result<ClusterBackend, String> {
        let url = cluster_url(url).ok_or_else(|| "not a redis+cluster:// URL".to_owned())??;
        if url.node_prefix.starts_with("rediss") && settings.tls.is_none() {
            return Err("rediss+cluster:// needs tls_ca_file".into());
        }
        // The node URLs must parse as the `redis` crate reads them (credentials).
        check_cluster(&url)?;
        let settings = Settings {
            // A cluster has database 0 only, and the fencing epoch check names a key that
            // lives on one shard: no greeting (fencing needs single masters: docs/operations.md, "Cluster members").
            databases: 1,
            greeting: None,
            // A transaction's keys must share a slot: each acquisition has its own.
            shared_transactions: false,
            ..settings
        };
        Ok(ClusterBackend {
            name: format!("cluster@{}", url.seeds[0]),
            url,
            settings,
            health_for: Box::new(health_for),
            map: RwLock::default(),
            nodes: Mutex::default(),
            replids: Mutex::default(),
            wake: Arc::new(Notify::new()),
            generation: watch::Sender::new(0),
            any_master: Arc::new(watch::Sender::new(None)),
        })
    }

    /// Reads the first map (connecting to every shard master), then keeps it current in the
    /// background. An unreachable cluster is not an error: it is asked again every interval.
    pub async fn connect(self: &Arc<Self>) {
        if let Err(e) = self.refresh().await {
            tracing::warn!(backend = %self.name, error = %e, "no cluster node gave the slot map");
        }
        tokio::spawn(keep_mapped(
            Arc::downgrade(self),
            self.wake.clone(),
            self.settings.probe_interval,
        ));
    }

    /// The member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn map(&self) -> Arc<Map> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The shards now, for `INFO` and metrics.
    pub fn shards(&self) -> Vec<ShardView> {
        let map = self.map();
        map.shards
            .iter()
            .map(|s| ShardView {
                master: s.addr.to_string(),
                slots: s
                    .ranges
                    .iter()
                    .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
                    .collect::<Vec<_>>()
                    .join("+"),
                slot_count: s.ranges.iter().map(|(a, b)| usize::from(b - a) + 1).sum(),
                state: s.node.health().state(),
                why: s.node.health().why(),
            })
            .collect()
    }

    /// The member's state: up when every slot is served by a master that is up; otherwise the
    /// worst of its shards (a quarantine, then down). A quarantined or down shard refuses only
    /// its own slots.
    pub fn state(&self) -> State {
        let map = self.map();
        if map.shards.is_empty() || map.slots.iter().any(Option::is_none) {
            return State::Down;
        }
        let states = map.shards.iter().map(|s| s.node.health().state());
        let quarantine = states
            .clone()
            .filter_map(|s| match s {
                State::Quarantined { remaining } => Some(remaining),
                _ => None,
            })
            .max();
        match quarantine {
            Some(remaining) => State::Quarantined { remaining },
            None if states.into_iter().any(|s| s == State::Down) => State::Down,
            None => State::Up,
        }
    }

    /// Why the member is down as a whole, when that is not one shard's doing (each shard has
    /// its own reason, [`ShardView::why`]): no slot map yet, or slots no master serves.
    pub fn why(&self) -> Option<String> {
        let map = self.map();
        let unserved = map.slots.iter().filter(|s| s.is_none()).count();
        if map.shards.is_empty() {
            Some("no cluster node gave the slot map yet".to_owned())
        } else if unserved > 0 {
            Some(format!("{unserved} hash slots have no master in the slot map"))
        } else {
            None
        }
    }

    /// Every shard master now (for `PROXY QUARANTINE`, which applies to all of them).
    pub fn nodes(&self) -> Vec<Arc<RedisBackend>> {
        self.map().shards.iter().map(|s| s.node.clone()).collect()
    }

    /// How to open the release subscription: on any master (a cluster delivers `PUBLISH` to
    /// every node).
    pub fn subscription_target(&self) -> super::subscriber::Target {
        super::subscriber::Target {
            master: self.any_master.subscribe(),
            tls: self.settings.tls.clone(),
            credentials: super::redis::url_credentials(
                &self.url.node_url(&self.url.seeds[0]),
                self.settings.tls.as_ref(),
            ),
            connect_timeout: self.settings.connect_timeout,
        }
    }

    /// Sends `request` to the shard its keys route to; its answer completes `place`.
    pub fn send(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place) {
        // Both answers are error replies, which the engine counts as failed votes, never as
        // refusals or grants. The proxy refuses commands across slots before the fan-out
        // (`Proxy::hash_slot_of`), so that no other member runs what this one cannot.
        if request.db != 0 {
            let error = Bytes::from_static(b"ERR SELECT is not allowed in cluster mode");
            return place.complete(Ok(Reply::Error(error)));
        }
        match route(&request.args) {
            Route::Slot(s) => self.send_to_slot(s, request, fallback, place, 0),
            Route::Any => self.send_to_any(request, fallback, place),
            Route::All => self.send_to_all(request, fallback, place),
            Route::CrossSlot => place.complete(Ok(Reply::Error(Bytes::from_static(CROSSSLOT.as_bytes())))),
        }
    }

    /// Reads the slot map from the first node that gives it, quarantines the shards whose
    /// master changed (rule 8), and only then puts the new map in use.
    async fn refresh(&self) -> Result<(), String> {
        let (ranges, from) = self.read_slots().await?;
        let previous = self.map();
        let mut shards: Vec<Shard> = Vec::new();
        let mut slots = vec![None; SLOTS];
        for (start, end, addr) in ranges {
            let index = match shards.iter().position(|s| s.addr == addr) {
                Some(index) => index,
                None => {
                    let node = self.node(&addr).await?;
                    shards.push(Shard {
                        addr,
                        node,
                        ranges: Vec::new(),
                    });
                    shards.len() - 1
                }
            };
            shards[index].ranges.push((start, end));
            for s in start..=end {
                if let Some(entry) = slots.get_mut(usize::from(s)) {
                    *entry = u16::try_from(index).ok();
                }
            }
        }
        for shard in &shards {
            self.judge(shard, &previous).await;
        }
        let generation = previous.generation + 1;
        if let Some(first) = shards.first() {
            let addr = first.addr.clone();
            self.any_master.send_if_modified(|now| {
                let moved = now.as_ref() != Some(&addr);
                *now = Some(addr);
                moved
            });
        }
        let served: std::collections::HashSet<String> = shards.iter().map(|s| s.addr.to_string()).collect();
        let map = Arc::new(Map {
            shards,
            slots,
            generation,
        });
        *self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner) = map;
        // A master that serves no slot any more is let go (its connection closes with it).
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|addr, _| served.contains(addr));
        self.generation.send_replace(generation);
        tracing::debug!(backend = %self.name, from = %from, generation, "slot map read");
        Ok(())
    }

    /// The slot ranges and their masters, from the first node that answers `CLUSTER SLOTS`:
    /// the masters of the current map first, then the seeds.
    async fn read_slots(&self) -> Result<(Vec<(u16, u16, Addr)>, Addr), String> {
        let mut last = "no node to ask".to_owned();
        for shard in &self.map().shards {
            // Timed: a shard stopped mid-question must not hold every later refresh.
            let asked = shard.node.command(&[b"CLUSTER", b"SLOTS"]);
            match tokio::time::timeout(self.settings.request_timeout, asked).await {
                Ok(Ok(reply)) => match parse_slots(&reply, &shard.addr) {
                    Ok(ranges) => return Ok((ranges, shard.addr.clone())),
                    Err(e) => last = format!("{}: {e}", shard.addr),
                },
                Ok(Err(e)) => last = format!("{}: {e}", shard.addr),
                Err(_) => last = format!("{}: timed out", shard.addr),
            }
        }
        for seed in &self.url.seeds {
            let asked = async {
                let conn = super::redis::open_url(&self.url.node_url(seed), self.settings.tls.as_ref()).await?;
                let reply = conn.command(&[b"CLUSTER", b"SLOTS"]).await.map_err(|e| e.to_string())?;
                parse_slots(&reply, seed)
            };
            match tokio::time::timeout(self.settings.connect_timeout, asked).await {
                Ok(Ok(ranges)) => return Ok((ranges, seed.clone())),
                Ok(Err(e)) => last = format!("{seed}: {e}"),
                Err(_) => last = format!("{seed}: timed out"),
            }
        }
        Err(last)
    }

    /// The backend for the master at `addr`: the one met before, or a new one, connected.
    async fn node(&self, addr: &Addr) -> Result<Arc<RedisBackend>, String> {
        let key = addr.to_string();
        let known = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(node) = known {
            return Ok(node);
        }
        let health = (self.health_for)(&format!("{}/{key}", self.name));
        let node = RedisBackend::new(&self.url.node_url(addr), self.settings.clone(), |_| health)
            .map_err(|e| e.to_string())?;
        let node = Arc::new(node);
        node.connect().await;
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, node.clone());
        Ok(node)
    }
}

/// Reads the slot map every `interval`, and at once when a request met `MOVED`. Ends when
/// the member is dropped.
async fn keep_mapped(member: Weak<ClusterBackend>, wake: Arc<Notify>, interval: Duration) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = wake.notified() => {}
        }
        let Some(member) = member.upgrade() else { return };
        if let Err(e) = member.refresh().await {
            tracing::debug!(backend = %member.name, error = %e, "slot map not read");
        }
    }
}
