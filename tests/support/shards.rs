//! A real Redis Cluster for the tests: `redis-server --cluster-enabled yes` shards (each
//! optionally with a replica) on free loopback ports, joined with `redis-cli --cluster create`.

use std::process::Command;

use super::RedisServer;
use super::sentinel::{info, wait_until};

/// One node as `CLUSTER NODES` describes it.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// A replica's master's id.
    pub master_id: Option<String>,
    /// A master's slot ranges.
    pub slots: Vec<(u16, u16)>,
}

/// A cluster of `shards` masters, each with an optional replica.
pub struct Cluster {
    /// Every node, masters first as started (a failover changes which is which: ask
    /// [`Cluster::nodes`]).
    pub servers: Vec<RedisServer>,
}

impl Cluster {
    /// Starts and joins the cluster, and returns once every node says `cluster_state:ok` and
    /// every replica's link to its master is up.
    pub fn start(shards: usize, replicas: bool) -> Cluster {
        let count = if replicas { shards * 2 } else { shards };
        let servers: Vec<RedisServer> = (0..count)
            .map(|_| {
                // The bus port is drawn again with each attempt, like the server's own.
                super::with_fresh_ports(|| {
                    let bus = super::free_port().to_string();
                    RedisServer::try_start_with(&[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                        "--cluster-port",
                        &bus,
                        // So that a test can empty a replica (`FLUSHALL`): the writes its master
                        // took and a promoted replica lacks.
                        "--replica-read-only",
                        "no",
                    ])
                })
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for s in &servers {
            create.arg(format!("127.0.0.1:{}", s.port));
        }
        create.args(["--cluster-replicas", if replicas { "1" } else { "0" }, "--cluster-yes"]);
        let out = create.output().expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { servers };
        cluster.wait_settled();
        cluster
    }

    /// Waits until every live node says `cluster_state:ok`, agrees on the masters, and every
    /// replica's link is up.
    pub fn wait_settled(&self) {
        wait_until("the cluster to settle", || {
            let views: Vec<Vec<Node>> = self.live().map(|s| nodes_of(s.port)).collect();
            let same = views.windows(2).all(|w| masters_of(&w[0]) == masters_of(&w[1]));
            same && self.live().all(|s| {
                let cluster = query_text(s.port, &["CLUSTER", "INFO"]);
                let replication = info(s, "replication");
                cluster.contains("cluster_state:ok")
                    && (replication.contains("role:master") || replication.contains("master_link_status:up"))
            })
        });
    }

    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.servers.iter().filter(|s| super::ping(s.port))
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.servers.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The nodes as a live node sees them.
    pub fn nodes(&self) -> Vec<Node> {
        let any = self.live().next().expect("a live node");
        nodes_of(any.port)
    }

    /// The server that is master of `key`'s slot now.
    pub fn master_for(&self, key: &str) -> &RedisServer {
        let slot = slot(key);
        let port = self
            .nodes()
            .into_iter()
            .find(|n| n.master && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| n.port)
            .expect("a master serves the slot");
        self.server(port)
    }

    /// The replica of the master at `port`.
    pub fn replica_of(&self, port: u16) -> &RedisServer {
        let nodes = self.nodes();
        let id = &nodes.iter().find(|n| n.port == port).expect("the master").id;
        let replica = nodes
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id))
            .expect("a replica");
        self.server(replica.port)
    }

    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .expect("a node of this cluster")
    }

    pub fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .expect("a node of this cluster")
    }

    /// The masters' ports.
    pub fn master_ports(&self) -> Vec<u16> {
        self.nodes()
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .map(|n| n.port)
            .collect()
    }

    /// Moves `slot` from the master at `from` to the master at `to` while clients keep using it:
    /// `IMPORTING`/`MIGRATING`, then `migrate` (called with each batch of keys still on the
    /// source, before it is moved), then `SETSLOT NODE` everywhere.
    pub fn move_slot(&self, slot: u16, from: u16, to: u16, mut before_batch: impl FnMut()) {
        let (from_id, to_id) = (self.id_of(from), self.id_of(to));
        let s = slot.to_string();
        expect_ok(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
        expect_ok(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1)
                .query(&mut self.server(from).client())
                .expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            before_batch();
            let _: redis::Value = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut self.server(from).client())
                .expect("MIGRATE");
        }
        for port in self.master_ports().into_iter().chain([from, to]) {
            expect_ok(port, &["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        }
        self.wait_settled();
    }

    fn id_of(&self, port: u16) -> String {
        query_text(port, &["CLUSTER", "MYID"])
    }
}

fn expect_ok(port: u16, args: &[&str]) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("connection");
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let reply: redis::Value = cmd.query(&mut c).unwrap_or_else(|e| panic!("{args:?} on {port}: {e}"));
    assert_eq!(reply, redis::Value::Okay, "{args:?} on {port}");
}

fn query_text(port: u16, args: &[&str]) -> String {
    let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}")).and_then(|c| c.get_connection()) else {
        return String::new();
    };
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut c).unwrap_or_default()
}

/// `CLUSTER NODES` as the node at `port` sees it.
pub fn nodes_of(port: u16) -> Vec<Node> {
    query_text(port, &["CLUSTER", "NODES"])
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 8 || f[2].contains("fail") || f[2].contains("noaddr") {
                return None;
            }
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .filter_map(|r| match r.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => r.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(Node {
                id: f[0].to_owned(),
                port,
                master: f[2].contains("master"),
                master_id: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

fn masters_of(nodes: &[Node]) -> Vec<(u16, Vec<(u16, u16)>)> {
    let mut m: Vec<(u16, Vec<(u16, u16)>)> = nodes
        .iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .map(|n| (n.port, n.slots.clone()))
        .collect();
    m.sort();
    m
}

/// Redis Cluster's hash slot of `key` (the proxy's own routing function).
pub fn slot(key: &str) -> u16 {
    redlock_proxy::backend::cluster::slot(key.as_bytes())
}
