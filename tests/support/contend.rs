//! Lock clients that contend through proxies while faults play, and what they believed.
//!
//! Each grant is recorded as its client knows it: from the moment the reply reached it to the
//! end of its validity counted from when it *sent* the request (the proxy measures from later,
//! so this is never late: rule 4, `ttl − ttl × 0.01 − 2 ms`), or to the moment it started its
//! release, if earlier. Fencing tokens are recorded with when they were asked for and
//! answered. The tests hand both to the checker (`tests/sim/check.rs`): no two grants of a
//! lock may overlap, and a token must be above every token of the lock answered before its
//! acquisition was sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::Value;

/// One grant, as its client believed it.
#[derive(Clone, Debug)]
pub struct Believed {
    pub key: String,
    pub token: String,
    /// Which proxy granted it (the test's numbering).
    pub proxy: usize,
    /// When the request was sent, the reply read, and the belief ended.
    pub sent: Duration,
    pub from: Duration,
    pub until: Duration,
}

/// A fencing token a client was given.
#[derive(Clone, Debug)]
pub struct Fenced {
    pub key: String,
    pub token: u64,
    pub holder: String,
    pub sent: Duration,
    pub answered: Duration,
}

/// What the clients' requests came to, by reply.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub attempts: u64,
    pub granted: u64,
    /// nil: held by someone else (or not valid in time: undone).
    pub refused: u64,
    /// `-NOQUORUM`: fewer than a quorum could vote.
    pub noquorum: u64,
    /// Other error replies, and broken or timed-out connections.
    pub errors: u64,
}

/// Everything the clients of a run recorded.
#[derive(Debug, Default)]
pub struct Record {
    pub held: Vec<Believed>,
    pub fences: Vec<Fenced>,
    /// Per proxy (the test's numbering).
    pub tallies: Vec<Tally>,
}

impl Record {
    fn tally(&mut self, proxy: usize) -> &mut Tally {
        if self.tallies.len() <= proxy {
            self.tallies.resize(proxy + 1, Tally::default());
        }
        &mut self.tallies[proxy]
    }

    /// Grants through `proxy` whose request was sent at or after `since`.
    pub fn granted_since(&self, proxy: usize, since: Duration) -> usize {
        self.held.iter().filter(|h| h.proxy == proxy && h.sent >= since).count()
    }
}

/// What a client thread shares with the run: its clock, the stop flag, the record.
#[derive(Clone)]
pub struct Ctx {
    pub origin: Instant,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
}

impl Ctx {
    /// Now, on the run's clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Records a grant the client believed in.
    pub fn held(&self, grant: Believed) {
        self.record.lock().expect("record").held.push(grant);
    }

    /// Records a fencing token.
    pub fn fenced(&self, fence: Fenced) {
        self.record.lock().expect("record").fences.push(fence);
    }

    /// Counts one request through `proxy` by its reply.
    pub fn count(&self, proxy: usize, reply: &redis::RedisResult<Value>) {
        let mut record = self.record.lock().expect("record");
        let tally = record.tally(proxy);
        tally.attempts += 1;
        match reply {
            Ok(Value::Okay | Value::Int(_)) => tally.granted += 1,
            Ok(Value::Nil) => tally.refused += 1,
            Err(e) if e.code() == Some("NOQUORUM") => tally.noquorum += 1,
            _ => tally.errors += 1,
        }
    }

    /// Reads the record so far.
    pub fn with_record<T>(&self, f: impl FnOnce(&Record) -> T) -> T {
        f(&self.record.lock().expect("record"))
    }
}

/// The latest a grant can be valid, counted from when its request was sent.
pub fn validity_end(sent: Duration, ttl_ms: u64) -> Duration {
    let ttl = Duration::from_millis(ttl_ms);
    sent + ttl - ttl / 100 - Duration::from_millis(2)
}

/// A connection to `url` whose replies are awaited at most `timeout`.
pub fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

/// The client threads of a run.
pub struct Clients {
    ctx: Ctx,
    threads: Vec<JoinHandle<()>>,
}

impl Clients {
    pub fn new() -> Clients {
        Clients {
            ctx: Ctx {
                origin: Instant::now(),
                stop: Arc::new(AtomicBool::new(false)),
                record: Arc::new(Mutex::new(Record::default())),
            },
            threads: Vec::new(),
        }
    }

    /// The run's shared state, for the test's own checks.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Starts a client thread running `client`.
    pub fn spawn(&mut self, client: impl FnOnce(Ctx) + Send + 'static) {
        let ctx = self.ctx.clone();
        self.threads.push(std::thread::spawn(move || client(ctx)));
    }

    /// Starts a [`contender`] through `url` (proxy number `proxy`) on `keys`.
    pub fn contender(&mut self, url: String, proxy: usize, name: String, keys: &[&str], fenced: bool) {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        self.spawn(move |ctx| contender(&ctx, &url, proxy, &name, &keys, fenced));
    }

    /// Stops the clients, waits for them, and returns what they recorded.
    pub fn stop(self) -> Record {
        self.ctx.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("client thread");
        }
        std::mem::take(&mut *self.ctx.record.lock().expect("record"))
    }
}

impl Default for Clients {
    fn default() -> Clients {
        Clients::new()
    }
}

/// A client that takes one of `keys` again and again through `url`: `SET key token NX PX ttl`,
/// or `LOCK.ACQUIRE key token ttl` when `fenced`, with TTLs from 80 to 580 ms. A grant is held
/// for a moment and released; every eighth is held to the end of its validity and left to
/// expire (the next holder then depends on the validity the proxy promised, not on a release).
/// A refusal waits 2 ms, an error 20 ms; a broken connection is opened again.
pub fn contender(ctx: &Ctx, url: &str, proxy: usize, name: &str, keys: &[String], fenced: bool) {
    let mut conn: Option<redis::Connection> = None;
    let mut i = 0u64;
    let seed = name.bytes().map(u64::from).sum::<u64>();
    while !ctx.stopped() {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match connect(url, Duration::from_secs(3)) {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    ctx.count(proxy, &Err(e));
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        i += 1;
        let key = &keys[((i * 7 + seed) % keys.len() as u64) as usize];
        let token = format!("{name}-{i}");
        let ttl_ms = 80 + (i * 37 + seed) % 500;
        let sent = ctx.now();
        let acquire = if fenced {
            let mut cmd = redis::cmd("LOCK.ACQUIRE");
            cmd.arg(key).arg(&token).arg(ttl_ms);
            cmd
        } else {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(&token).arg("NX").arg("PX").arg(ttl_ms);
            cmd
        };
        let reply: redis::RedisResult<Value> = acquire.query(c);
        ctx.count(proxy, &reply);
        match reply {
            Ok(ref granted @ (Value::Okay | Value::Int(_))) => {
                let from = ctx.now();
                if let Value::Int(fence) = granted {
                    ctx.fenced(Fenced {
                        key: key.clone(),
                        token: *fence as u64,
                        holder: token.clone(),
                        sent,
                        answered: from,
                    });
                }
                let until = validity_end(sent, ttl_ms);
                let end = if i.is_multiple_of(8) {
                    // Works to the end of its validity; the lock expires.
                    std::thread::sleep(until.saturating_sub(ctx.now()));
                    until
                } else {
                    std::thread::sleep(Duration::from_millis(i % 4));
                    let release_at = ctx.now();
                    let released: redis::RedisResult<Value> = if fenced {
                        redis::cmd("LOCK.RELEASE").arg(key).arg(&token).query(c)
                    } else {
                        redis::cmd("EVAL")
                            .arg(super::RELEASE)
                            .arg(1)
                            .arg(key)
                            .arg(&token)
                            .query(c)
                    };
                    if released.as_ref().is_err_and(|e| e.is_io_error() || e.is_timeout()) {
                        conn = None;
                    }
                    release_at.min(until)
                };
                ctx.held(Believed {
                    key: key.clone(),
                    token,
                    proxy,
                    sent,
                    from,
                    until: end,
                });
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    conn = None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
