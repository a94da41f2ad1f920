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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::health::{Health, State};
use super::locate::{self, Addr};
use super::redis::{RedisBackend, Settings};
use super::{Answer, BackendError, Request, Sink, Slot};
use crate::protocol::Upper;
use crate::reply::Reply;

/// Redis Cluster's number of hash slots.
pub const SLOTS: usize = 16384;

/// How many redirections one request may follow before it counts as failed (a map still
/// moving: the next request tries again with a newer one).
const MAX_HOPS: u8 = 3;

/// What Redis Cluster answers a command whose keys are in different slots.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// A `redis+cluster://` URL, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterUrl {
    /// The nodes asked for the slot map until one of the cluster's masters is known.
    pub seeds: Vec<Addr>,
    /// `redis://[user:pass@]` or `rediss://[user:pass@]`: a shard master's URL is this and its
    /// address.
    pub node_prefix: String,
}

impl ClusterUrl {
    /// The URL a shard master at `addr` is reached with (credentials and TLS of the member).
    fn node_url(&self, addr: &Addr) -> String {
        format!("{}{addr}", self.node_prefix)
    }
}

/// Reads `redis+cluster://` and `rediss+cluster://` URLs; `None` for any other scheme, an
/// error for a malformed one. A cluster has database 0 only: a database in the URL is refused.
pub fn cluster_url(url: &str) -> Option<Result<ClusterUrl, String>> {
    let (scheme, rest) = locate::split_scheme(url, "cluster")?;
    Some(read_cluster_url(scheme, rest))
}

fn read_cluster_url(scheme: &str, rest: &str) -> Result<ClusterUrl, String> {
    let (user, seeds, path) = locate::split_hosts(rest, "cluster node")?;
    if !matches!(path, "" | "0") {
        return Err(format!(
            "a Redis Cluster has database 0 only, not '{path}': redis+cluster://host:port[,host:port...]"
        ));
    }
    Ok(ClusterUrl {
        seeds,
        node_prefix: format!("{scheme}://{user}"),
    })
}

/// Redis Cluster's hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key
/// when it has none, modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS as u16
}

/// Redis Cluster's hash tag of a key: the bytes between the first `{` and the first `}` after
/// it, when not empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The one slot all `keys` hash to: `Ok(None)` for no keys, an error when they differ.
pub fn common_slot<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Option<u16>, &'static str> {
    let mut common = None;
    for key in keys {
        let s = slot(key);
        match common {
            Some(c) if c != s => return Err(CROSSSLOT),
            _ => common = Some(s),
        }
    }
    Ok(common)
}

/// Where a request goes within the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// To the shard serving this slot.
    Slot(u16),
    /// To any one shard (a command without keys: `PUBLISH` reaches every node of a cluster).
    Any,
    /// To every shard (scripts are cached per node; a flush flushes all).
    All,
    /// Nowhere: its keys are in different slots.
    CrossSlot,
}

/// The route of a command, from where its keys are.
fn route(args: &[Bytes]) -> Route {
    let Some(name) = args.first() else { return Route::Any };
    // Upper-cased on the stack: this runs for every request to a cluster member.
    let name = Upper::of(name);
    let keys: &[Bytes] = match &*name {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let n = args.get(2).and_then(|n| crate::protocol::whole_number(n)).unwrap_or(0);
            usize::try_from(n).ok().and_then(|n| args.get(3..3 + n)).unwrap_or(&[])
        }
        b"DEL" | b"UNLINK" | b"EXISTS" | b"MGET" | b"TOUCH" | b"WATCH" => &args[1..],
        b"SCRIPT" | b"FLUSHDB" | b"FLUSHALL" | b"FUNCTION" => return Route::All,
        b"PUBLISH" | b"SCAN" | b"PING" | b"INFO" | b"DBSIZE" | b"ECHO" | b"TIME" | b"KEYS" | b"RANDOMKEY" => {
            return Route::Any;
        }
        _ => args.get(1..2).unwrap_or(&[]),
    };
    match common_slot(keys.iter().map(|k| &k[..])) {
        Ok(Some(s)) => Route::Slot(s),
        Ok(None) => Route::Any,
        Err(_) => Route::CrossSlot,
    }
}

/// A redirection a shard answered.
#[derive(Debug, PartialEq, Eq)]
enum Redirection {
    /// `MOVED slot host:port`: the slot is served elsewhere now; the map is out of date.
    Moved,
    /// `ASK slot host:port`: the slot is migrating and this key is at `host:port` already.
    Ask(Addr),
}

impl Redirection {
    fn parse(error: &[u8]) -> Option<Redirection> {
        let text = std::str::from_utf8(error).ok()?;
        let mut words = text.split(' ');
        let kind = words.next()?;
        let _slot = words.next()?;
        let addr = Addr::parse(words.next()?)?;
        match kind {
            "MOVED" => Some(Redirection::Moved),
            "ASK" => Some(Redirection::Ask(addr)),
            _ => None,
        }
    }
}

/// One shard: its master and the slot ranges it serves.
struct Shard {
    addr: Addr,
    node: Arc<RedisBackend>,
    ranges: Vec<(u16, u16)>,
}

/// The slot map: which shard serves each slot.
#[derive(Default)]
struct Map {
    shards: Vec<Shard>,
    /// Per slot, the index of its shard in `shards`; `None` for a slot no master serves.
    slots: Vec<Option<u16>>,
    /// 0 before the first map; one more for each map read since.
    generation: u64,
}

impl Map {
    fn shard(&self, slot: u16) -> Option<&Shard> {
        let index = (*self.slots.get(usize::from(slot))?)?;
        self.shards.get(usize::from(index))
    }

    fn node_at(&self, addr: &Addr) -> Option<&Arc<RedisBackend>> {
        self.shards.iter().find(|s| s.addr == *addr).map(|s| &s.node)
    }
}

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
        check(&url)?;
        let settings = Settings {
            // A cluster has database 0 only, and the fencing epoch check names a key that
            // lives on one shard: no greeting (fencing needs single masters: README).
            databases: 1,
            greeting: None,
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

    /// Sends `request` to the shard its keys route to; its answer completes `slot`.
    pub fn send(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, slot: Slot) {
        // Both answers are error replies, which the engine counts as failed votes, never as
        // refusals or grants. The proxy refuses commands across slots before the fan-out
        // (`Proxy::slot_of`), so that no other member runs what this one cannot.
        if request.db != 0 {
            let error = Bytes::from_static(b"ERR SELECT is not allowed in cluster mode");
            return slot.complete(Ok(Reply::Error(error)));
        }
        match route(&request.args) {
            Route::Slot(s) => self.send_to_slot(s, request, fallback, slot, 0),
            Route::Any => self.send_to_any(request, fallback, slot),
            Route::All => self.send_to_all(request, fallback, slot),
            Route::CrossSlot => slot.complete(Ok(Reply::Error(Bytes::from_static(CROSSSLOT.as_bytes())))),
        }
    }

    /// To the master of slot `s`, as the map says now; a redirection is followed from there.
    fn send_to_slot(self: &Arc<Self>, s: u16, request: &Request, fallback: Option<&Request>, slot: Slot, hops: u8) {
        let map = self.map();
        let Some(shard) = map.shard(s) else {
            return slot.complete(Err(BackendError::Io(format!("no master serves slot {s}"))));
        };
        let redirect = self.redirect(request, fallback, slot, hops);
        shard.node.send(request, fallback, redirect);
    }

    /// To the first shard that is up (or the first shard).
    fn send_to_any(&self, request: &Request, fallback: Option<&Request>, slot: Slot) {
        let map = self.map();
        let up = map.shards.iter().find(|s| s.node.health().state() == State::Up);
        match up.or(map.shards.first()) {
            Some(shard) => shard.node.send(request, fallback, slot),
            None => slot.complete(Err(BackendError::Down)),
        }
    }

    /// To every shard; the answer is the first failure, else the first shard's.
    fn send_to_all(&self, request: &Request, fallback: Option<&Request>, slot: Slot) {
        let map = self.map();
        if map.shards.is_empty() {
            return slot.complete(Err(BackendError::Down));
        }
        let gather = Arc::new(Gather {
            slot: Pending::new(slot),
            answers: Mutex::new(vec![None; map.shards.len()]),
            left: AtomicUsize::new(map.shards.len()),
        });
        for (i, shard) in map.shards.iter().enumerate() {
            shard.node.send(request, fallback, Slot::new(gather.clone(), i));
        }
    }

    /// A slot that hands the shard's answer on, or follows the redirection it is.
    fn redirect(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, slot: Slot, hops: u8) -> Slot {
        let sink = Arc::new(Redirect {
            member: self.clone(),
            request: request.clone(),
            fallback: fallback.cloned(),
            slot: Pending::new(slot),
            hops,
        });
        Slot::new(sink, 0)
    }

    /// Follows `redirection`. `MOVED`: the map is out of date; the request waits for a new
    /// one and goes where it says, never straight to the node `MOVED` names: that node may be
    /// a replica promoted a moment ago, which must be quarantined before it votes (rule 8),
    /// and only reading the map decides that. `ASK`: the key is at a master of the current
    /// map already (a slot being migrated between two trusted masters): sent there, after
    /// `ASKING`.
    fn follow(self: &Arc<Self>, redirection: Redirection, sink: &Redirect, slot: Slot) {
        let hops = sink.hops + 1;
        if hops > MAX_HOPS {
            let why = format!("still redirected after {MAX_HOPS} redirections");
            return slot.complete(Err(BackendError::Io(why)));
        }
        let (request, fallback) = (sink.request.clone(), sink.fallback.clone());
        match redirection {
            Redirection::Moved => {
                let member = self.clone();
                tokio::spawn(async move {
                    member.newer_map().await;
                    match route(&request.args) {
                        Route::Slot(s) if slot.is_open() => {
                            member.send_to_slot(s, &request, fallback.as_ref(), slot, hops);
                        }
                        _ => slot.complete(Err(BackendError::Io("moved".into()))),
                    }
                });
            }
            Redirection::Ask(addr) => {
                let map = self.map();
                let Some(node) = map.node_at(&addr) else {
                    self.wake.notify_one();
                    let why = format!("asked to go to {addr}, which is no master in the slot map");
                    return slot.complete(Err(BackendError::Io(why)));
                };
                let redirect = self.redirect(&request, fallback.as_ref(), slot, hops);
                node.send_asking(&request, fallback.as_ref(), redirect);
            }
        }
    }

    /// Asks for a new map and waits until one is read (at most a request timeout).
    async fn newer_map(&self) {
        let mut generation = self.generation.subscribe();
        let seen = *generation.borrow_and_update();
        self.wake.notify_one();
        let newer = generation.wait_for(|g| *g > seen);
        let _ = tokio::time::timeout(self.settings.request_timeout, newer).await;
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

    /// Rule 8 for one shard of a new map: its master is quarantined from now when it was no
    /// master in the previous map (a promoted replica), or when its replication id changed
    /// since it was last asked (it was a replica in between, and took its data from a master
    /// that may have lacked the last writes). The first map has no previous one: each master
    /// is judged as any master first seen (`Health::observed`, when its connection opened).
    async fn judge(&self, shard: &Shard, previous: &Map) {
        let key = shard.addr.to_string();
        let replid = shard.node.replication_id().await;
        let before = {
            let mut replids = self.replids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &replid {
                Some(id) => replids.insert(key.clone(), id.clone()),
                None => replids.get(&key).cloned(),
            }
        };
        if previous.generation == 0 {
            return;
        }
        let was_master = previous.node_at(&shard.addr).is_some();
        let history_changed = matches!((&before, &replid), (Some(b), Some(r)) if b != r);
        if !was_master || history_changed {
            let (start, _) = shard.ranges.first().copied().unwrap_or_default();
            let from = previous
                .shard(start)
                .map_or_else(|| "none".to_owned(), |s| s.addr.to_string());
            shard.node.health().switched(&from, &key);
        }
    }

    /// The slot ranges and their masters, from the first node that answers `CLUSTER SLOTS`:
    /// the masters of the current map first, then the seeds.
    async fn read_slots(&self) -> Result<(Vec<(u16, u16, Addr)>, Addr), String> {
        let mut last = "no node to ask".to_owned();
        for shard in &self.map().shards {
            match shard.node.command(&[b"CLUSTER", b"SLOTS"]).await {
                Ok(reply) => match parse_slots(&reply, &shard.addr) {
                    Ok(ranges) => return Ok((ranges, shard.addr.clone())),
                    Err(e) => last = format!("{}: {e}", shard.addr),
                },
                Err(e) => last = format!("{}: {e}", shard.addr),
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

/// `CLUSTER SLOTS`: `[start, end, [host, port, id, ...], replicas...]` per range. An empty
/// host is the node that was asked.
fn parse_slots(reply: &Reply, asked: &Addr) -> Result<Vec<(u16, u16, Addr)>, String> {
    let Reply::Array(ranges) = reply else {
        return Err(format!("CLUSTER SLOTS: unexpected reply {reply:?}"));
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let parsed = match range {
            Reply::Array(items) => match items.as_slice() {
                [Reply::Int(start), Reply::Int(end), Reply::Array(master), ..] => {
                    let addr = match master.as_slice() {
                        [Reply::Bulk(host), Reply::Int(port), ..] => {
                            let host = String::from_utf8_lossy(host);
                            let host = if host.is_empty() || host == "?" {
                                asked.host.clone()
                            } else {
                                host.into_owned()
                            };
                            u16::try_from(*port).ok().map(|port| Addr { host, port })
                        }
                        _ => None,
                    };
                    match (u16::try_from(*start), u16::try_from(*end), addr) {
                        (Ok(start), Ok(end), Some(addr)) if start <= end && usize::from(end) < SLOTS => {
                            Some((start, end, addr))
                        }
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        };
        out.push(parsed.ok_or_else(|| format!("CLUSTER SLOTS: unreadable range {range:?}"))?);
    }
    Ok(out)
}

/// The fan-out's slot, held until a shard's answer is handed on (once).
struct Pending(Mutex<Option<Slot>>);

impl Pending {
    fn new(slot: Slot) -> Pending {
        Pending(Mutex::new(Some(slot)))
    }

    fn take(&self) -> Option<Slot> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    fn is_open(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(Slot::is_open)
    }
}

/// Where a shard's answer goes: on to the fan-out's slot, unless it is a redirection.
struct Redirect {
    member: Arc<ClusterBackend>,
    request: Request,
    fallback: Option<Request>,
    slot: Pending,
    hops: u8,
}

impl Sink for Redirect {
    fn complete(&self, _: usize, answer: Answer) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        if let Ok(Reply::Error(error)) = &answer
            && let Some(redirection) = Redirection::parse(error)
        {
            return self.member.follow(redirection, self, slot);
        }
        slot.complete(answer);
    }

    fn is_open(&self, _: usize) -> bool {
        self.slot.is_open()
    }
}

/// Collects every shard's answer to a request sent to all; completes the fan-out's slot
/// with the first failure, or else the first shard's answer.
struct Gather {
    slot: Pending,
    answers: Mutex<Vec<Option<Answer>>>,
    left: AtomicUsize,
}

impl Sink for Gather {
    fn complete(&self, index: usize, answer: Answer) {
        let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(place) = answers.get_mut(index) {
            *place = Some(answer);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let answers = std::mem::take(&mut *answers);
        let failed = answers
            .iter()
            .flatten()
            .find(|a| matches!(a, Err(_) | Ok(Reply::Error(_))))
            .cloned();
        let first = answers.into_iter().flatten().next();
        let answer = failed.or(first).unwrap_or(Err(BackendError::Down));
        if let Some(slot) = self.slot.take() {
            slot.complete(answer);
        }
    }

    fn is_open(&self, _: usize) -> bool {
        self.slot.is_open()
    }
}

/// What kind of member `url` names, in words (for `--check-config`).
pub fn describe(url: &ClusterUrl) -> String {
    let seeds: Vec<String> = url.seeds.iter().map(Addr::to_string).collect();
    format!(
        "Redis Cluster (seeds: {}); each key goes to the shard serving its hash slot, a shard's new master quarantined after a failover",
        seeds.join(", ")
    )
}

/// Whether the shard masters' URLs (credentials) parse.
pub fn check(url: &ClusterUrl) -> Result<(), String> {
    super::redis::check_url(&url.node_url(&url.seeds[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    fn args(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn routes() {
        assert_eq!(route(&args(&["SET", "foo", "v", "NX"])), Route::Slot(12182));
        assert_eq!(
            route(&args(&["evalsha", "x", "2", "{a}1", "{a}2", "t"])),
            Route::Slot(slot(b"a"))
        );
        assert_eq!(route(&args(&["EVAL", "x", "2", "foo", "bar"])), Route::CrossSlot);
        assert_eq!(route(&args(&["EVAL", "x", "0"])), Route::Any);
        assert_eq!(route(&args(&["DEL", "foo", "bar"])), Route::CrossSlot);
        assert_eq!(route(&args(&["SCRIPT", "LOAD", "x"])), Route::All);
        assert_eq!(route(&args(&["PUBLISH", "c", "m"])), Route::Any);
    }

    #[test]
    fn redirections() {
        assert_eq!(
            Redirection::parse(b"MOVED 3999 127.0.0.1:6381"),
            Some(Redirection::Moved)
        );
        assert_eq!(
            Redirection::parse(b"ASK 3999 127.0.0.1:6381"),
            Some(Redirection::Ask(Addr {
                host: "127.0.0.1".into(),
                port: 6381
            }))
        );
        assert_eq!(Redirection::parse(b"ERR MOVED"), None);
        assert_eq!(Redirection::parse(b"WRONGTYPE Operation"), None);
    }

    #[test]
    fn cluster_urls() {
        let url = cluster_url("redis+cluster://u:p@a:1,b:2")
            .expect("scheme")
            .expect("valid");
        assert_eq!(url.seeds.len(), 2);
        assert_eq!(url.node_url(&url.seeds[1]), "redis://u:p@b:2");
        let tls = cluster_url("rediss+cluster://a:1/").expect("scheme").expect("valid");
        assert_eq!(tls.node_prefix, "rediss://");
        assert!(cluster_url("redis+cluster://a:1/3").expect("scheme").is_err());
        assert!(cluster_url("redis+cluster://a").expect("scheme").is_err());
        assert!(cluster_url("redis://a:1").is_none());
    }

    #[test]
    fn slot_maps() {
        let asked = Addr::parse("10.0.0.9:7000").expect("addr");
        let reply = Reply::Array(vec![Reply::Array(vec![
            Reply::Int(0),
            Reply::Int(5460),
            Reply::Array(vec![Reply::Bulk(Bytes::from("")), Reply::Int(7001)]),
        ])]);
        let ranges = parse_slots(&reply, &asked).expect("parsed");
        assert_eq!(ranges, vec![(0, 5460, Addr::parse("10.0.0.9:7001").expect("addr"))]);
        assert!(parse_slots(&Reply::Nil, &asked).is_err());
    }
}
