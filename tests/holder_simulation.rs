//! A simulation of rule 13 in virtual time: a holder's lock stays its own until it lets it go or
//! is told. The proxy runs over embedded masters (in-process, beside the real-master tests of
//! `tests/sessions.rs`), with tokio's paused clock, so thousands of seconds of keepalives run in
//! a moment and every run replays from its seed.
//!
//! Each run: holder A takes a session lock (`SET k A NX`, or `LOCK.ACQUIRE k A ttl KEEPALIVE`)
//! on a RESP3 connection that other callers share (a multiplexing client); then random steps:
//! another caller on A's connection sends a command that must fail or only read (a stale
//! token's release script, `LOCK.RELEASE`, `DELEX IFEQ`, `SET IFEQ`, a read-only script,
//! `GET`, `PTTL`, `LOCK.INFO`, a discarded `MULTI`, a refused `SET NX`, a short `WAIT` for the
//! held lock, a `BLPOP` on a signal list), some pipelined together; a contender on its own
//! connection tries `SET k C NX PX`; virtual time passes (several TTLs); rarely, a caller on A's
//! connection or the contender deletes, overwrites or re-times the key without A's token.
//! Properties:
//!
//! 1. while A believes it holds the lock (it has not released it and was not told it is lost),
//!    the contender is never granted;
//! 2. a delete, overwrite or `PEXPIRE` without A's token, on any connection, is told to A at
//!    once: the `lock-lost` push is the next frame A reads;
//! 3. when A releases the lock, or its connection ends, the contender gets it.
//!
//! `HOLDER_SIM_RUNS` sets the number of runs (default 150; the long run of record in docs/safety.md).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis_protocol::resp3::decode::complete::decode_bytes_mut;
use redis_protocol::resp3::types::BytesFrame;
use redlock_proxy::config::Config;
use redlock_proxy::connection::Connection;
use redlock_proxy::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

const RELEASE: &str = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

/// A client over an in-memory stream.
struct Client {
    stream: DuplexStream,
    buf: BytesMut,
}

impl Client {
    async fn connect(proxy: &Arc<Proxy>, resp3: bool) -> Client {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (_, shutdown) = watch::channel(false);
        let connection = Connection::new(Box::new(theirs), "sim".into(), proxy.clone(), shutdown);
        tokio::spawn(connection.run());
        let mut client = Client {
            stream: ours,
            buf: BytesMut::new(),
        };
        if resp3 {
            assert!(matches!(client.call(&["HELLO", "3"]).await, BytesFrame::Map { .. }));
        }
        client
    }

    async fn send(&mut self, args: &[&str]) {
        let mut wire = format!("*{}\r\n", args.len());
        for a in args {
            wire.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.stream.write_all(wire.as_bytes()).await.expect("write");
    }

    async fn next(&mut self) -> BytesFrame {
        // A reply that never comes is a failure, not a hang (in virtual time: at once).
        tokio::time::timeout(Duration::from_secs(600), self.frame())
            .await
            .expect("no reply within 600 s of virtual time")
    }

    async fn frame(&mut self) -> BytesFrame {
        loop {
            // RESP2 replies read as RESP3 too, but for the null bulk: the contender speaks
            // RESP3 as well, so every frame here is RESP3.
            if let Some((frame, _, _)) = decode_bytes_mut(&mut self.buf).expect("RESP3") {
                return frame;
            }
            let n = self.stream.read_buf(&mut self.buf).await.expect("read");
            assert!(n > 0, "the connection closed");
        }
    }

    async fn call(&mut self, args: &[&str]) -> BytesFrame {
        self.send(args).await;
        self.next().await
    }
}

fn is_push(frame: &BytesFrame) -> bool {
    matches!(frame, BytesFrame::Push { .. })
}

fn granted(frame: &BytesFrame) -> bool {
    matches!(frame, BytesFrame::SimpleString { .. })
}

/// The commands another caller on the holder's connection sends: each fails or only reads.
fn meddling(rng: &mut StdRng, ttl: &str) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<String>>();
    match rng.random_range(0..13) {
        0 => vec![s(&["EVAL", RELEASE, "1", "k", "stale"])],
        1 => vec![s(&["LOCK.RELEASE", "k", "stale"])],
        2 => vec![s(&["DELEX", "k", "IFEQ", "stale"])],
        3 => vec![s(&["SET", "k", "x", "IFEQ", "stale", "PX", ttl])],
        4 => vec![s(&["EVAL", "return redis.call('pttl',KEYS[1])", "1", "k"])],
        5 => vec![s(&["GET", "k"])],
        6 => vec![s(&["PTTL", "k"])],
        7 => vec![s(&["LOCK.INFO", "k"])],
        8 => vec![s(&["MULTI"]), s(&["DEL", "k"]), s(&["SET", "k", "x"]), s(&["DISCARD"])],
        9 => vec![s(&["SET", "k", "stale", "NX", "PX", ttl])],
        10 => vec![s(&["LOCK.ACQUIRE", "k", "stale", ttl, "WAIT", "50"])],
        11 => vec![s(&["BLPOP", "lock-signal:k", "0.05"])],
        _ => vec![s(&[
            "EVALSHA",
            "0000000000000000000000000000000000000000",
            "1",
            "k",
            "stale",
        ])],
    }
}

/// One run; panics on a broken property. Returns the steps it took.
async fn run(seed: u64) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let config =
        Config::parse("embedded_backends = 3\nmin_keepalive_ttl_ms = 50\ndefault_ttl_ms = 300\n").expect("config");
    let proxy = Proxy::start(config).await.expect("proxy");
    let ttl_ms = rng.random_range(100..600u64);
    let ttl = ttl_ms.to_string();
    let mut a = Client::connect(&proxy, true).await;
    let mut c = Client::connect(&proxy, true).await;
    let taken = if rng.random_bool(0.5) {
        granted(&a.call(&["SET", "k", "A", "NX"]).await)
    } else {
        matches!(
            a.call(&["LOCK.ACQUIRE", "k", "A", &ttl, "KEEPALIVE"]).await,
            BytesFrame::Number { .. }
        )
    };
    assert!(taken, "seed {seed}: the holder's first acquisition");
    let mut believes = true;
    let steps = rng.random_range(5..40);
    for step in 0..steps {
        let action = rng.random_range(0..10);
        if std::env::var("HOLDER_SIM_TRACE").is_ok() {
            eprintln!("step {step}: action {action} at {:?}", tokio::time::Instant::now());
        }
        match action {
            // Another caller on A's connection, one command or several pipelined.
            0..=4 => {
                let batch: Vec<Vec<String>> = (0..rng.random_range(1..4))
                    .flat_map(|_| meddling(&mut rng, &ttl))
                    .collect();
                if std::env::var("HOLDER_SIM_TRACE").is_ok() {
                    eprintln!("  {batch:?}");
                }
                for command in &batch {
                    let args: Vec<&str> = command.iter().map(String::as_str).collect();
                    a.send(&args).await;
                }
                for command in &batch {
                    let reply = a.next().await;
                    assert!(
                        !is_push(&reply),
                        "seed {seed} step {step}: {command:?} ended the lock: {reply:?}"
                    );
                }
            }
            // The contender.
            5..=6 => {
                let reply = c.call(&["SET", "k", "C", "NX", "PX", &ttl]).await;
                if granted(&reply) {
                    assert!(
                        !believes,
                        "seed {seed} step {step}: the contender was granted while A holds"
                    );
                    return step;
                }
            }
            // Time passes: up to three TTLs.
            7..=8 => tokio::time::sleep(Duration::from_millis(rng.random_range(0..3 * ttl_ms))).await,
            // Rarely, a caller on A's connection, or the contender on its own, deletes,
            // overwrites or re-times the key without A's token: A is told either way, and at
            // once (the next frame A reads, with nothing else asked of it).
            _ if rng.random_bool(0.2) && believes => {
                let clobber: &[&str] = match rng.random_range(0..3) {
                    0 => &["DEL", "k"],
                    1 => &["SET", "k", "x", "PX", &ttl],
                    _ => &["PEXPIRE", "k", "1"],
                };
                if rng.random_bool(0.5) {
                    let reply = a.call(clobber).await;
                    assert!(!is_push(&reply), "seed {seed}: {reply:?}");
                } else {
                    c.call(clobber).await;
                }
                let told = a.next().await;
                match &told {
                    BytesFrame::Push { data, .. } => assert_eq!(data.len(), 4, "seed {seed}: {told:?}"),
                    other => panic!("seed {seed} step {step}: {clobber:?} not told at once: {other:?}"),
                }
                believes = false;
            }
            _ => {}
        }
    }
    // Property 3: A lets go (release, or its connection ends): the contender gets it. (After a
    // clobber, the clobbering value's TTL runs out first.)
    if !believes {
        tokio::time::sleep(Duration::from_millis(ttl_ms + 10)).await;
    } else {
        if rng.random_bool(0.5) {
            let released = a.call(&["LOCK.RELEASE", "k", "A"]).await;
            assert!(
                matches!(released, BytesFrame::Number { data: 1, .. }),
                "seed {seed}: {released:?}"
            );
        } else {
            drop(a);
            // Give the proxy's end of the stream its turn.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let reply = c.call(&["SET", "k", "C", "NX", "PX", &ttl]).await;
    assert!(
        granted(&reply),
        "seed {seed}: the lock was not free after the holder let go: {reply:?}"
    );
    steps
}

#[test]
fn a_holders_lock_stays_its_own_until_it_lets_go_or_is_told() {
    let runs: u64 = std::env::var("HOLDER_SIM_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(150);
    let base: u64 = std::env::var("HOLDER_SIM_SEED")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    let mut steps = 0;
    for seed in base..base + runs {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        steps += runtime.block_on(run(seed));
    }
    println!("{runs} runs, {steps} steps, 0 violations");
    assert!(
        steps >= runs as usize * 3,
        "only {steps} steps: the simulation saw too little"
    );
}
