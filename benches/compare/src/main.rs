//! `lockcompare`: the same lock workload against etcd's lock API and against redlock-proxy,
//! each through a maintained client library (etcd-client; redis-rs), for `benches/compare.sh`.
//!
//! ```text
//! lockcompare cycles   --target etcd|proxy --at ADDRS --clients N --seconds S
//!     lock-and-release cycles on random names (as redis-benchmark's __rand_int__): etcd
//!     `Lock(name, lease)` + `Unlock(key)`, each client with a lease of its own; the proxy
//!     `SET lock:<r> <token> NX PX 10000` + the release script by EVALSHA. Prints one line
//!     of JSON: cycles/s, acquisition p50/p99/p999/max in µs (HdrHistogram), errors.
//! lockcompare hold     --target etcd|proxy --at ADDRS --name NAME --ttl-s T
//!     takes NAME as a lock that lives as long as this process (an etcd lease kept alive; a
//!     proxy session lock, `LOCK.ACQUIRE ... KEEPALIVE`), prints "held", then sleeps
//! lockcompare handover --target etcd|proxy --at ADDRS --name NAME --ttl-s T --holder PID
//!     waits for NAME (etcd `Lock` blocks; the proxy's `LOCK.ACQUIRE ... WAIT`), kills the
//!     holder PID with SIGKILL once its wait has begun, and prints how long after the kill
//!     the lock was granted
//! lockcompare pause    --target etcd|proxy --at ADDRS --clients N --seconds S --kill PID --kill-at-ms M
//!     the cycles above, while PID (the etcd leader, a master) is killed at M ms: prints the
//!     longest time any client went without completing a cycle, and the errors seen
//! lockcompare selftest
//!     checks the argument parsing and the histogram summary; no server needed
//! ```
//!
//! ADDRS: etcd's client URLs, comma-separated (`http://127.0.0.1:2379,...`), or the proxy's
//! `host:port`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client as Etcd, ConnectOptions, LockOptions};
use hdrhistogram::Histogram;

/// The release script of the Redlock documentation (and of every client library).
const RELEASE: &str =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

/// How long each lock of the cycles lives (ms): longer than any cycle, as a client would set it.
const CYCLE_TTL_MS: u64 = 10_000;

/// Every request of the cycles gives up after this long, on both systems, as a production
/// client would: a request stuck on a member that died is then retried (on etcd, the client
/// balances over every member) instead of hanging the client for good.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

fn etcd_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_timeout(REQUEST_TIMEOUT)
        .with_connect_timeout(REQUEST_TIMEOUT)
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Etcd,
    Proxy,
}

#[derive(Debug, PartialEq)]
struct Args {
    mode: String,
    target: Target,
    at: String,
    clients: usize,
    seconds: f64,
    name: String,
    ttl_s: i64,
    holder: Option<u32>,
    kill: Option<u32>,
    kill_at_ms: u64,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut args = Args {
        mode: argv
            .first()
            .cloned()
            .ok_or("a mode: cycles, hold, handover, pause or selftest")?,
        target: Target::Proxy,
        at: String::new(),
        clients: 1,
        seconds: 5.0,
        name: "lock:compare".into(),
        ttl_s: 5,
        holder: None,
        kill: None,
        kill_at_ms: 2_000,
    };
    let mut rest = argv[1..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().ok_or(format!("{flag} needs a value"))?;
        let number = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{what}: not a number: {value}"))
        };
        match flag.as_str() {
            "--target" => {
                args.target = match value.as_str() {
                    "etcd" => Target::Etcd,
                    "proxy" => Target::Proxy,
                    other => return Err(format!("--target etcd|proxy, not {other}")),
                }
            }
            "--at" => args.at = value.clone(),
            "--clients" => args.clients = checked(number("--clients")?, "--clients")?,
            "--seconds" => {
                args.seconds = value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                    .ok_or(format!("--seconds: a number of seconds up to a day, not {value}"))?
            }
            "--name" => args.name = value.clone(),
            "--ttl-s" => args.ttl_s = checked(number("--ttl-s")?, "--ttl-s")?,
            "--holder" => args.holder = Some(checked(number("--holder")?, "--holder")?),
            "--kill" => args.kill = Some(checked(number("--kill")?, "--kill")?),
            "--kill-at-ms" => args.kill_at_ms = number("--kill-at-ms")?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

/// `n` as the type a flag needs, or why not (no value is truncated).
fn checked<T: TryFrom<u64>>(n: u64, flag: &str) -> Result<T, String> {
    T::try_from(n).map_err(|_| format!("{flag}: {n} is out of range"))
}

/// One client of either system, able to take and give back a lock.
enum Locker {
    Etcd {
        // Boxed: etcd's client is 1.6 KB, the proxy's connection a few words.
        client: Box<Etcd>,
        lease: i64,
    },
    Proxy {
        conn: redis::aio::MultiplexedConnection,
        release: redis::Script,
    },
}

/// What a held lock needs to be given back.
enum Held {
    Etcd(Vec<u8>),
    Proxy(String, String),
}

impl Locker {
    /// `waits`: a client that waits for a held lock (etcd's `Lock` blocks until it is free),
    /// whose requests must not time out.
    async fn connect(target: Target, at: &str, lease_ttl_s: i64, waits: bool) -> Result<Locker, Error> {
        match target {
            Target::Etcd => {
                let endpoints: Vec<&str> = at.split(',').collect();
                let options = if waits { None } else { Some(etcd_options()) };
                let mut client = Etcd::connect(endpoints, options).await?;
                let lease = client.lease_grant(lease_ttl_s, None).await?.id();
                Ok(Locker::Etcd {
                    client: Box::new(client),
                    lease,
                })
            }
            Target::Proxy => {
                let client = redis::Client::open(format!("redis://{at}/"))?;
                let conn = client.get_multiplexed_async_connection().await?;
                Ok(Locker::Proxy {
                    conn,
                    release: redis::Script::new(RELEASE),
                })
            }
        }
    }

    /// Takes `name`, waiting for it on etcd (its `Lock` always waits); `None` when the
    /// proxy answered that someone else holds it.
    async fn lock(&mut self, name: &str, token: &str) -> Result<Option<Held>, Error> {
        match self {
            Locker::Etcd { client, lease } => {
                let options = LockOptions::new().with_lease(*lease);
                let response = client.lock(name, Some(options)).await?;
                Ok(Some(Held::Etcd(response.key().to_vec())))
            }
            Locker::Proxy { conn, .. } => {
                let reply: Option<String> = redis::cmd("SET")
                    .arg(name)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(CYCLE_TTL_MS)
                    .query_async(conn)
                    .await?;
                Ok(reply.map(|_| Held::Proxy(name.to_owned(), token.to_owned())))
            }
        }
    }

    async fn unlock(&mut self, held: Held) -> Result<(), Error> {
        match (self, held) {
            (Locker::Etcd { client, .. }, Held::Etcd(key)) => {
                client.unlock(key).await?;
            }
            (Locker::Proxy { conn, release }, Held::Proxy(key, token)) => {
                let freed: i64 = release.key(key).arg(token).invoke_async(conn).await?;
                if freed != 1 {
                    return Err("the release freed nothing".into());
                }
            }
            _ => return Err("a lock given back to the other system".into()),
        }
        Ok(())
    }
}

/// What one run of cycles saw.
struct Cycles {
    acquire_us: Histogram<u64>,
    cycles: u64,
    errors: u64,
    /// The longest time one client went without completing a cycle.
    longest_gap: Duration,
}

/// `clients` loops of lock-and-release on random names for `seconds`.
async fn cycles(args: &Args) -> Result<Cycles, Error> {
    let deadline = Instant::now() + Duration::try_from_secs_f64(args.seconds)?;
    let seed = Arc::new(AtomicU64::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id())));
    let mut workers = Vec::new();
    for worker in 0..args.clients {
        let mut locker = Locker::connect(args.target, &args.at, 60, false).await?;
        let seed = seed.clone();
        workers.push(tokio::spawn(async move {
            let mut acquire = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let (mut cycles, mut errors) = (0u64, 0u64);
            let mut last = Instant::now();
            let mut longest = Duration::ZERO;
            while Instant::now() < deadline {
                let r = seed
                    .fetch_add(0x9e37_79b9, Ordering::Relaxed)
                    .wrapping_mul(6_364_136_223_846_793_005)
                    >> 33;
                let name = format!("lock:{:06}", r % 1_000_000);
                let token = format!("w{worker}-{cycles}");
                let started = Instant::now();
                let locked = tokio::time::timeout(REQUEST_TIMEOUT, locker.lock(&name, &token)).await;
                let done = match locked {
                    Ok(Ok(Some(held))) => {
                        let took = started.elapsed();
                        acquire.saturating_record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
                        let unlocked = tokio::time::timeout(REQUEST_TIMEOUT, locker.unlock(held)).await;
                        matches!(unlocked, Ok(Ok(())))
                    }
                    Ok(Ok(None) | Err(_)) | Err(_) => false,
                };
                if done {
                    cycles += 1;
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                } else {
                    errors += 1;
                    // An error from a member that is gone comes back at once: do not spin.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            longest = longest.max(last.elapsed());
            Cycles {
                acquire_us: acquire,
                cycles,
                errors,
                longest_gap: longest,
            }
        }));
    }
    let mut all = Cycles {
        acquire_us: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        cycles: 0,
        errors: 0,
        longest_gap: Duration::ZERO,
    };
    for worker in workers {
        let one = worker.await?;
        all.acquire_us.add(&one.acquire_us)?;
        all.cycles += one.cycles;
        all.errors += one.errors;
        all.longest_gap = all.longest_gap.max(one.longest_gap);
    }
    Ok(all)
}

fn summary(args: &Args, c: &Cycles) -> String {
    let q = |p: f64| c.acquire_us.value_at_quantile(p);
    format!(
        "{{\"target\":\"{:?}\",\"clients\":{},\"seconds\":{},\"cycles\":{},\"cycles_per_s\":{:.0},\"acquire_p50_us\":{},\"acquire_p99_us\":{},\"acquire_p999_us\":{},\"acquire_max_us\":{},\"errors\":{},\"longest_gap_ms\":{}}}",
        args.target,
        args.clients,
        args.seconds,
        c.cycles,
        c.cycles as f64 / args.seconds,
        q(0.5),
        q(0.99),
        q(0.999),
        c.acquire_us.max(),
        c.errors,
        c.longest_gap.as_millis()
    )
}

fn sigkill(pid: u32) -> Result<(), Error> {
    let status = std::process::Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()?;
    if !status.success() {
        return Err(format!("kill -9 {pid} failed").into());
    }
    Ok(())
}

/// Takes the lock for as long as this process lives.
async fn hold(args: &Args) -> Result<(), Error> {
    match args.target {
        Target::Etcd => {
            let mut client = Etcd::connect(args.at.split(',').collect::<Vec<_>>(), None).await?;
            let lease = client.lease_grant(args.ttl_s, None).await?.id();
            let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
            client
                .lock(args.name.as_str(), Some(LockOptions::new().with_lease(lease)))
                .await?;
            println!("held");
            // As etcd's own session does: a keep-alive at a third of the TTL.
            let every = Duration::from_secs(u64::try_from(args.ttl_s)?) / 3;
            loop {
                keeper.keep_alive().await?;
                answers.message().await?;
                tokio::time::sleep(every).await;
            }
        }
        Target::Proxy => {
            let client = redis::Client::open(format!("redis://{}/", args.at))?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let ttl = args.ttl_s.checked_mul(1000).ok_or("--ttl-s: too long")?.to_string();
            let fence: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(&args.name)
                .arg("holder")
                .arg(&ttl)
                .arg("KEEPALIVE")
                .query_async(&mut conn)
                .await?;
            println!("held {fence}");
            loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
    }
}

/// Waits for the lock the holder has, kills the holder, and times the grant.
async fn handover(args: &Args) -> Result<Duration, Error> {
    let holder = args.holder.ok_or("--holder PID")?;
    let mut locker = Locker::connect(args.target, &args.at, args.ttl_s, true).await?;
    let name = args.name.clone();
    let wait = async move {
        match &mut locker {
            Locker::Etcd { .. } => locker.lock(&name, "waiter").await.map(|_| ()),
            Locker::Proxy { conn, .. } => {
                let granted: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                    .arg(&name)
                    .arg("waiter")
                    .arg(CYCLE_TTL_MS)
                    .arg("WAIT")
                    .arg(60_000)
                    .query_async(conn)
                    .await?;
                granted.map(|_| ()).ok_or_else(|| "not granted in 60 s".into())
            }
        }
    };
    let waiting = tokio::spawn(wait);
    // The wait has begun once its request is out: give it that long, then kill.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if waiting.is_finished() {
        return Err("granted while the holder was alive".into());
    }
    sigkill(holder)?;
    let killed = Instant::now();
    waiting.await??;
    Ok(killed.elapsed())
}

/// Cycles while `--kill` is killed at `--kill-at-ms`.
async fn pause(args: &Args) -> Result<Cycles, Error> {
    let victim = args.kill.ok_or("--kill PID")?;
    let at = Duration::from_millis(args.kill_at_ms);
    let killer = tokio::spawn(async move {
        tokio::time::sleep(at).await;
        sigkill(victim)
    });
    let seen = cycles(args).await?;
    killer.await??;
    Ok(seen)
}

fn selftest() -> Result<(), Error> {
    let argv: Vec<String> = [
        "cycles",
        "--target",
        "etcd",
        "--at",
        "http://a:1,http://b:2",
        "--clients",
        "50",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let args = parse(&argv)?;
    assert_eq!(
        (args.target, args.clients, args.at.split(',').count()),
        (Target::Etcd, 50, 2)
    );
    assert!(parse(&["cycles".into(), "--target".into(), "zk".into()]).is_err());
    for (flag, bad) in [
        ("--holder", "99999999999"),
        ("--seconds", "NaN"),
        ("--seconds", "1e20"),
        ("--clients", "-1"),
    ] {
        assert!(
            parse(&["cycles".into(), flag.into(), bad.into()]).is_err(),
            "{flag} {bad}"
        );
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for us in [10, 20, 30, 1_000] {
        h.record(us)?;
    }
    let c = Cycles {
        acquire_us: h,
        cycles: 4,
        errors: 0,
        longest_gap: Duration::from_millis(7),
    };
    let line = summary(&args, &c);
    assert!(
        line.contains("\"cycles\":4") && line.contains("\"acquire_p50_us\":20"),
        "{line}"
    );
    println!("selftest ok");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("lockcompare: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = match args.mode.as_str() {
        "cycles" => cycles(&args).await.map(|c| println!("{}", summary(&args, &c))),
        "pause" => pause(&args).await.map(|c| println!("{}", summary(&args, &c))),
        "hold" => hold(&args).await,
        "handover" => handover(&args).await.map(|d| {
            println!(
                "{{\"target\":\"{:?}\",\"handover_ms\":{:.1}}}",
                args.target,
                d.as_secs_f64() * 1e3
            )
        }),
        "selftest" => selftest(),
        other => Err(format!("unknown mode {other}").into()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockcompare: {e}");
            ExitCode::FAILURE
        }
    }
}
