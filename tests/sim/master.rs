//! A simulated Redis master: the crate's in-process master on a drifting clock, which can
//! crash (every connection to it breaks, nothing answers) and restart empty, fail over to a
//! replica that missed some writes, and be cut off from the network.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use redlock_proxy::backend::embedded::EmbeddedBackend;
use redlock_proxy::backend::health::parse_identity;
use redlock_proxy::backend::redis::Greeting;
use redlock_proxy::backend::{BackendError, Request};
use redlock_proxy::keys::{COUNTER_PREFIX, EPOCH_KEY};
use redlock_proxy::quorum::Answer;
use redlock_proxy::reply::Reply;

use super::clock::DriftClock;
use super::config::{SEMAPHORE_PERMITS, semaphores};
use super::recipes::{election_key, rw_names};

/// How long a replica promoted by a failover has been running: far beyond any `max_ttl`, so
/// that its uptime alone would never get it quarantined.
pub const REPLICA_UPTIME: Duration = Duration::from_secs(3_600);

/// Locks a mutex, ignoring poisoning: a panicking test thread has already failed the test,
/// and every value guarded here is written whole.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One master.
pub struct SimMaster {
    /// Its position in the configuration, for messages.
    pub index: usize,
    store: EmbeddedBackend,
    state: Mutex<State>,
}

/// What can happen to a master besides its keyspace.
#[derive(Debug)]
struct State {
    up: bool,
    /// Which run of the process this is: a connection opened to one run is dead for any
    /// other, so requests in flight across a crash never reach the restarted process.
    epoch: u64,
    /// Cut off from every proxy: messages to and from it are lost.
    partitioned: bool,
}

impl SimMaster {
    /// A fresh, empty master whose clock runs at `rate`.
    pub fn new(index: usize, rate: f64) -> SimMaster {
        SimMaster {
            index,
            store: EmbeddedBackend::new(format!("m{index}"), Arc::new(DriftClock::new(rate))),
            state: Mutex::new(State {
                up: true,
                epoch: 0,
                partitioned: false,
            }),
        }
    }

    /// Whether the process is running.
    pub fn is_up(&self) -> bool {
        lock(&self.state).up
    }

    /// Whether it is running and reachable over the network.
    pub fn is_reachable(&self) -> bool {
        let state = lock(&self.state);
        state.up && !state.partitioned
    }

    /// Whether the network cuts it off.
    pub fn is_partitioned(&self) -> bool {
        lock(&self.state).partitioned
    }

    /// The process dies: all connections break and nothing answers until [`Self::restart`].
    pub fn crash(&self) {
        let mut state = lock(&self.state);
        state.up = false;
        state.epoch += 1;
    }

    /// A crashed master comes back without persistence: no keys, a new run id, uptime zero.
    /// Returns false (and does nothing) when it is running.
    pub fn restart(&self) -> bool {
        let mut state = lock(&self.state);
        if state.up {
            return false;
        }
        self.store.restart();
        state.up = true;
        state.epoch += 1;
        true
    }

    /// A failover, as a Sentinel group or a cluster shard does it: a replica that has run for
    /// [`REPLICA_UPTIME`] takes the master's place at its address. Every connection to the old
    /// process breaks (as in a crash), and replication being asynchronous, the replica holds
    /// only the keys for which `keep` is true. Returns how many keys it lacks, or `None` (and
    /// does nothing) when the master is down: there is nothing to fail over from.
    pub fn fail_over(&self, keep: impl FnMut(&[u8]) -> bool) -> Option<usize> {
        let mut state = lock(&self.state);
        if !state.up {
            return None;
        }
        let lost = self.store.promote_replica(REPLICA_UPTIME, keep);
        state.epoch += 1;
        Some(lost)
    }

    /// Cuts it off from, or reconnects it to, the network. Returns whether that changed.
    pub fn set_partitioned(&self, partitioned: bool) -> bool {
        let mut state = lock(&self.state);
        let changed = state.partitioned != partitioned;
        state.partitioned = partitioned;
        changed
    }

    /// A request that reached the master over a connection to run `epoch`: executed, or
    /// a broken connection when that run is gone.
    pub fn deliver(&self, request: &Request, epoch: u64) -> Answer {
        let state = lock(&self.state);
        if !state.up || state.epoch != epoch {
            return Err(BackendError::Io("connection reset by peer".into()));
        }
        // The embedded store shares the simulation's clock: its readings need no judging.
        Ok(self.store.answer(request, None))
    }

    /// What a proxy reads when it connects: the run (epoch), and `INFO server`'s `run_id`
    /// and uptime, parsed by the proxy's own parser.
    pub fn identity(&self) -> (u64, String, Duration) {
        let state = lock(&self.state);
        let info = self.store.execute(&request(&["INFO", "server"]));
        let Reply::Bulk(text) = info else {
            panic!("m{}: INFO server answered {info:?}", self.index);
        };
        let (run_id, uptime) =
            parse_identity(&String::from_utf8_lossy(&text)).expect("INFO server has run_id and uptime");
        (state.epoch, run_id, uptime)
    }

    /// Runs `greeting` on a new connection to the process `run_id`, as the proxy's backend
    /// does before the connection carries any request (fencing's epoch check, F3).
    pub fn greet(&self, greeting: &dyn Greeting, run_id: &str) {
        let args = greeting.command(run_id);
        let reply = self.store.execute(&Request::new(0, args));
        let name = format!("m{}", self.index);
        if let Err(e) = greeting.accept(reply, &name, 0) {
            panic!("{name}: {e}");
        }
    }

    /// Ground truth, bypassing the network: whether `key` holds `token` now.
    pub fn holds(&self, key: &str, token: &str) -> bool {
        self.store.execute(&request(&["GET", key])) == Reply::Bulk(Bytes::copy_from_slice(token.as_bytes()))
    }

    /// Ground truth: the value of `key`, if any.
    pub fn value(&self, key: &str) -> Option<String> {
        match self.store.execute(&request(&["GET", key])) {
            Reply::Bulk(value) => Some(String::from_utf8_lossy(&value).into_owned()),
            _ => None,
        }
    }

    /// Ground truth: how many of the keys that never expire (the fencing epoch, the counters
    /// of locks `lock:0` to `lock:{keys - 1}` (also the keys of the sets taken at once), of
    /// the semaphores' slots, of the read-write lock and of the election's lock, the
    /// semaphores' counts) database 0 holds.
    pub fn fence_key_count(&self, keys: usize) -> i64 {
        let mut args = vec!["EXISTS".to_owned(), EPOCH_KEY.to_owned()];
        args.extend((0..keys).map(|k| format!("{COUNTER_PREFIX}lock:{k}")));
        for names in semaphores() {
            args.push(String::from_utf8_lossy(&names.permits()).into_owned());
            let slots = (0..SEMAPHORE_PERMITS).map(|i| names.slot(i));
            args.extend(slots.map(|slot| format!("{COUNTER_PREFIX}{}", String::from_utf8_lossy(&slot))));
        }
        args.push(String::from_utf8_lossy(&rw_names().counter()).into_owned());
        args.push(format!("{COUNTER_PREFIX}{}", election_key()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match self.store.execute(&request(&args)) {
            Reply::Int(n) => n,
            other => panic!("m{}: EXISTS answered {other:?}", self.index),
        }
    }

    /// Ground truth: how many live keys database 0 holds.
    pub fn key_count(&self) -> i64 {
        match self.store.execute(&request(&["DBSIZE"])) {
            Reply::Int(n) => n,
            other => panic!("m{}: DBSIZE answered {other:?}", self.index),
        }
    }
}

/// A request for database 0.
pub fn request(args: &[&str]) -> Request {
    Request::new(0, args.iter().map(|a| Bytes::copy_from_slice(a.as_bytes())).collect())
}
