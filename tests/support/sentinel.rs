//! Sentinel groups on real processes: a master, its replica and a Sentinel
//! (`redis-server --sentinel`), on free loopback ports, killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisServer, free_port};

/// How long Sentinel waits before it calls a silent master down.
pub const DOWN_AFTER_MS: u64 = 500;

/// A `redis-server --sentinel` watching one master as `mymaster`.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl Sentinel {
    pub fn start(master_port: u16) -> Sentinel {
        super::with_fresh_ports(|| Sentinel::try_start(master_port))
    }

    /// Starts a Sentinel on a fresh port, once: `Err` when it exits at start.
    fn try_start(master_port: u16) -> Result<Sentinel, String> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("redlock-proxy-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // Sentinel rewrites its configuration file: it must be its own and writable.
        let config = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
             sentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster {DOWN_AFTER_MS}\n\
             sentinel failover-timeout mymaster 5000\n",
            dir = dir.display()
        );
        let path = dir.join("sentinel.conf");
        std::fs::write(&path, config).expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&path)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server --sentinel ({e}): install it, e.g. `apt-get install -y redis-server`")
            });
        let mut child = child;
        let started = super::wait_for_pong(port, &mut child, "Sentinel", None);
        let sentinel = Sentinel { port, child, dir };
        started.map(|()| sentinel)
    }

    /// A connection to this Sentinel. Tried again for up to 10 s: a Sentinel busy with a
    /// failover on a loaded machine can miss one 2 s connect (and the failover checker polls it
    /// every few milliseconds); one that never answers still fails the test.
    pub fn client(&self) -> redis::Connection {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let connected = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)));
            match connected {
                Ok(connection) => return connection,
                Err(e) if std::time::Instant::now() >= deadline => panic!("connection to Sentinel: {e}"),
                // A pause between tries, not a wait for an event: a refused connect returns at once.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// The port of the master Sentinel names now.
    pub fn master_port(&self) -> u16 {
        let (_, port): (String, String) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster")
            .query(&mut self.client())
            .expect("SENTINEL get-master-addr-by-name");
        port.parse().expect("port")
    }

    /// Whether Sentinel knows a healthy replica (a failover needs one).
    pub fn knows_a_replica(&self) -> bool {
        let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("replicas")
            .arg("mymaster")
            .query(&mut self.client())
            .unwrap_or_default();
        replicas.iter().any(|fields| {
            let flags = fields
                .windows(2)
                .find(|kv| kv[0] == "flags")
                .map(|kv| kv[1].clone())
                .unwrap_or_default();
            flags == "slave"
        })
    }

    /// `redis+sentinel://127.0.0.1:<port>/mymaster`.
    pub fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/mymaster", self.port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One member: a master, its replica (writable, so a test can make it miss a write), and a
/// Sentinel.
pub struct Group {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: Sentinel,
}

impl Group {
    pub fn start() -> Group {
        let master = RedisServer::start();
        let of = format!("127.0.0.1 {}", master.port);
        let replica = RedisServer::start_with(&["--replicaof", &of, "--replica-read-only", "no"]);
        wait_until("the replica's link to its master", || {
            info(&replica, "replication").contains("master_link_status:up")
        });
        let sentinel = Sentinel::start(master.port);
        wait_until("Sentinel to know the replica", || sentinel.knows_a_replica());
        Group {
            master,
            replica,
            sentinel,
        }
    }

    /// Writes `key` on the master, waits until the replica has it, then deletes it on the
    /// replica alone: the write a promoted replica lacks.
    pub fn replica_misses(&self, key: &str) {
        let _: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(2000)
            .query(&mut self.master.client())
            .expect("WAIT");
        assert!(self.replica.get(key).is_some(), "{key} did not reach the replica");
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query(&mut self.replica.client())
            .expect("DEL on the replica");
    }
}

pub fn info(server: &RedisServer, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut server.client())
        .unwrap_or_default()
}

/// Polls `done` until it holds (an event the test cannot be told of), or fails after 30 s.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
