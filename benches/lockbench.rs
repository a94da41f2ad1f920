//! `lockbench`: the project's load generator for `benches/harness.sh`.
//!
//! Speaks raw RESP2 over one TCP connection per worker (no client library in the way, one
//! request in flight per connection, like `redis-benchmark -P 1`) on a single-threaded tokio
//! runtime, and records latencies in HdrHistograms (microseconds, 3 significant digits).
//!
//! ```text
//! lockbench --bench cycle --port P [--workers 50] [--seconds 3] [--release evalsha|eval|none] ...
//!     lock cycles: SET lock:<rand> <token> NX PX <ttl>, then the compare-and-delete release
//!     script; prints one JSON object (locks/s, acquire/release/cycle p50 p99 p999 max)
//! lockbench --bench idle --port P --conns 10000 --ready-file F --release-file G
//!     opens idle client connections (each answers one PING first), writes F when all are
//!     open, holds them until G exists, then checks a sample is still alive
//! lockbench            (no --bench: what `cargo test --all-targets` runs)
//!     a self-test of the generator against an in-process mock server, a fraction of a second
//! lockbench --bench    (`cargo bench`: the same against the mock for 2 s: the generator's ceiling)
//! ```
//!
//! The harness runs the built binary directly (`target/release/deps/lockbench-*`).

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The release script of the Redlock documentation (and of every client library).
const RELEASE: &str =
    "if redis.call(\"get\",KEYS[1]) == ARGV[1] then return redis.call(\"del\",KEYS[1]) else return 0 end";

// ---------------------------------------------------------------------------------------
// RESP2 replies (and, for the mock server, requests)

#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Status(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    fn is_ok(&self) -> bool {
        matches!(self, Resp::Status(s) if s == b"OK")
    }
    fn describe(&self) -> String {
        match self {
            Resp::Status(s) => format!("+{}", String::from_utf8_lossy(s)),
            Resp::Error(s) => format!("-{}", String::from_utf8_lossy(s)),
            Resp::Int(i) => format!(":{i}"),
            Resp::Bulk(None) => "(nil)".into(),
            Resp::Bulk(Some(b)) => format!("${}", String::from_utf8_lossy(b)),
            Resp::Array(None) => "*-1".into(),
            Resp::Array(Some(v)) => format!("*{}", v.len()),
        }
    }
}

fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rel = buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[at..at + rel], at + rel + 2))
}

fn number(bytes: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(bytes)))
}

/// One complete value at `at`: the value and where the next begins; `None` when incomplete.
fn parse(buf: &[u8], at: usize) -> Result<Option<(Resp, usize)>, String> {
    let Some(&kind) = buf.get(at) else { return Ok(None) };
    let Some((head, next)) = line(buf, at + 1) else {
        return Ok(None);
    };
    Ok(Some(match kind {
        b'+' => (Resp::Status(head.to_vec()), next),
        b'-' => (Resp::Error(head.to_vec()), next),
        b':' => (Resp::Int(number(head)?), next),
        b'$' => {
            let len = number(head)?;
            if len < 0 {
                (Resp::Bulk(None), next)
            } else {
                let end = next + len as usize;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                (Resp::Bulk(Some(buf[next..end].to_vec())), end + 2)
            }
        }
        b'*' => {
            let len = number(head)?;
            if len < 0 {
                (Resp::Array(None), next)
            } else {
                let mut items = Vec::with_capacity(len as usize);
                let mut at = next;
                for _ in 0..len {
                    let Some((item, after)) = parse(buf, at)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    at = after;
                }
                (Resp::Array(Some(items)), at)
            }
        }
        other => return Err(format!("unexpected RESP type byte {other:#x}")),
    }))
}

fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(itoa::Buffer::new().format(a.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A client connection with one request in flight at a time.
struct Conn {
    stream: TcpStream,
    read: BytesMut,
    write: Vec<u8>,
}

impl Conn {
    async fn open(port: u16) -> io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            read: BytesMut::with_capacity(512),
            write: Vec::with_capacity(256),
        })
    }

    async fn call(&mut self, args: &[&[u8]]) -> io::Result<Resp> {
        self.write.clear();
        encode(&mut self.write, args);
        self.stream.write_all(&self.write).await?;
        loop {
            match parse(&self.read, 0).map_err(io::Error::other)? {
                Some((reply, used)) => {
                    self.read.advance(used);
                    return Ok(reply);
                }
                None => {
                    if self.stream.read_buf(&mut self.read).await? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Lock cycles

#[derive(Clone, Copy, Debug, PartialEq)]
enum Release {
    Evalsha,
    Eval,
    None,
}

#[derive(Clone, Debug)]
struct CycleOpts {
    port: u16,
    workers: usize,
    seconds: f64,
    warmup: f64,
    ttl_ms: u64,
    keyspace: u64,
    release: Release,
    label: String,
    hist_out: Option<PathBuf>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

#[derive(Debug)]
struct Tally {
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    cycle: Histogram<u64>,
    acquired: u64,
    contended: u64,
    released: u64,
    release_zero: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            acquire: histogram(),
            release: histogram(),
            cycle: histogram(),
            acquired: 0,
            contended: 0,
            released: 0,
            release_zero: 0,
            errors: 0,
            first_error: None,
        }
    }
    fn error(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }
    fn merge(&mut self, other: Tally) {
        self.acquire.add(&other.acquire).expect("same bounds");
        self.release.add(&other.release).expect("same bounds");
        self.cycle.add(&other.cycle).expect("same bounds");
        self.acquired += other.acquired;
        self.contended += other.contended;
        self.released += other.released;
        self.release_zero += other.release_zero;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// xorshift64*: a cheap per-worker random key, as `redis-benchmark -r` draws them.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

async fn worker(id: usize, opts: CycleOpts, sha: Vec<u8>, start: Instant, end: Instant) -> io::Result<Tally> {
    let mut conn = Conn::open(opts.port).await?;
    let mut tally = Tally::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) << 17) ^ std::process::id() as u64);
    let ttl = opts.ttl_ms.to_string();
    let mut n: u64 = 0;
    let mut key = String::with_capacity(24);
    let mut token = String::with_capacity(32);
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        let counted = t0 >= start;
        n += 1;
        key.clear();
        let _ = write!(key, "lock:{:012}", rng.next() % opts.keyspace);
        token.clear();
        let _ = write!(token, "w{id}-{n}-{:x}", rng.next());
        let reply = conn
            .call(&[b"SET", key.as_bytes(), token.as_bytes(), b"NX", b"PX", ttl.as_bytes()])
            .await?;
        let t1 = Instant::now();
        if counted {
            tally.acquire.record(micros(t1 - t0)).expect("in bounds");
        }
        match reply {
            r if r.is_ok() => {
                if counted {
                    tally.acquired += 1;
                }
            }
            Resp::Bulk(None) => {
                if counted {
                    tally.contended += 1;
                }
                continue;
            }
            other => {
                if counted {
                    tally.error(format!("SET NX answered {}", other.describe()));
                }
                continue;
            }
        }
        let reply = match opts.release {
            Release::None => continue,
            Release::Evalsha => {
                conn.call(&[b"EVALSHA", &sha, b"1", key.as_bytes(), token.as_bytes()])
                    .await?
            }
            Release::Eval => {
                conn.call(&[b"EVAL", RELEASE.as_bytes(), b"1", key.as_bytes(), token.as_bytes()])
                    .await?
            }
        };
        let t2 = Instant::now();
        if !counted {
            continue;
        }
        tally.release.record(micros(t2 - t1)).expect("in bounds");
        match reply {
            Resp::Int(1) => {
                tally.released += 1;
                tally.cycle.record(micros(t2 - t0)).expect("in bounds");
            }
            Resp::Int(0) => tally.release_zero += 1,
            other => tally.error(format!("release answered {}", other.describe())),
        }
    }
    Ok(tally)
}

fn percentiles(name: &str, h: &Histogram<u64>) -> String {
    let ms = |v: u64| v as f64 / 1000.0;
    format!(
        "\"{name}\":{{\"count\":{},\"mean_ms\":{:.4},\"p50_ms\":{:.4},\"p90_ms\":{:.4},\"p99_ms\":{:.4},\"p999_ms\":{:.4},\"max_ms\":{:.4}}}",
        h.len(),
        h.mean() / 1000.0,
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.90)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max()),
    )
}

/// The percentile spectrum of one histogram, one `quantile latency_ms` line per step, for plots.
fn spectrum(h: &Histogram<u64>) -> String {
    let mut out = String::from("# quantile latency_ms\n");
    for v in h.iter_quantiles(5) {
        let _ = writeln!(
            out,
            "{:.6} {:.4}",
            v.quantile_iterated_to(),
            v.value_iterated_to() as f64 / 1000.0
        );
    }
    out
}

async fn cycle(opts: CycleOpts) -> io::Result<(String, Tally, f64)> {
    let sha = if opts.release == Release::Evalsha {
        let mut conn = Conn::open(opts.port).await?;
        match conn.call(&[b"SCRIPT", b"LOAD", RELEASE.as_bytes()]).await? {
            Resp::Bulk(Some(sha)) => sha,
            other => return Err(io::Error::other(format!("SCRIPT LOAD answered {}", other.describe()))),
        }
    } else {
        Vec::new()
    };
    let start = Instant::now() + Duration::from_secs_f64(opts.warmup);
    let end = start + Duration::from_secs_f64(opts.seconds);
    let tasks: Vec<_> = (0..opts.workers)
        .map(|id| tokio::spawn(worker(id, opts.clone(), sha.clone(), start, end)))
        .collect();
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(t.await.map_err(io::Error::other)??);
    }
    let elapsed = opts.seconds;
    let cycles = if opts.release == Release::None {
        tally.acquired
    } else {
        tally.released
    };
    let json = format!(
        "{{\"label\":\"{}\",\"port\":{},\"workers\":{},\"seconds\":{},\"release\":\"{:?}\",\"locks_per_s\":{:.1},\"acquire_attempts_per_s\":{:.1},\"acquired\":{},\"contended\":{},\"released\":{},\"release_zero\":{},\"errors\":{},\"first_error\":{},{},{},{}}}",
        opts.label,
        opts.port,
        opts.workers,
        opts.seconds,
        opts.release,
        cycles as f64 / elapsed,
        tally.acquire.len() as f64 / elapsed,
        tally.acquired,
        tally.contended,
        tally.released,
        tally.release_zero,
        tally.errors,
        tally
            .first_error
            .as_deref()
            .map_or("null".to_string(), |e| format!("{e:?}")),
        percentiles("acquire", &tally.acquire),
        percentiles("release", &tally.release),
        percentiles("cycle", &tally.cycle),
    );
    if let Some(path) = &opts.hist_out {
        let main = if opts.release == Release::None {
            &tally.acquire
        } else {
            &tally.cycle
        };
        std::fs::write(path, spectrum(main))?;
    }
    Ok((json, tally, cycles as f64 / elapsed))
}

// ---------------------------------------------------------------------------------------
// Idle connections

struct IdleOpts {
    port: u16,
    conns: usize,
    batch: usize,
    ready_file: Option<PathBuf>,
    release_file: Option<PathBuf>,
    max_hold: f64,
}

async fn open_pinged(port: u16) -> io::Result<Conn> {
    let mut conn = Conn::open(port).await?;
    match conn.call(&[b"PING"]).await? {
        Resp::Status(s) if s == b"PONG" => Ok(conn),
        other => Err(io::Error::other(format!("PING answered {}", other.describe()))),
    }
}

async fn idle(opts: IdleOpts) -> io::Result<String> {
    let began = Instant::now();
    let mut conns: Vec<Conn> = Vec::with_capacity(opts.conns);
    while conns.len() < opts.conns {
        let n = opts.batch.min(opts.conns - conns.len());
        let opening: Vec<_> = (0..n).map(|_| tokio::spawn(open_pinged(opts.port))).collect();
        for o in opening {
            conns.push(o.await.map_err(io::Error::other)??);
        }
    }
    let open_secs = began.elapsed().as_secs_f64();
    if let Some(f) = &opts.ready_file {
        std::fs::write(f, format!("{}\n", conns.len()))?;
    }
    let hold_until = Instant::now() + Duration::from_secs_f64(opts.max_hold);
    let released = loop {
        if opts.release_file.as_ref().is_some_and(|f| f.exists()) {
            break true;
        }
        if Instant::now() >= hold_until {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Every connection must still be served after being idle.
    let step = (conns.len() / 100).max(1);
    let mut alive = 0;
    let mut checked = 0;
    for conn in conns.iter_mut().step_by(step) {
        checked += 1;
        if matches!(conn.call(&[b"PING"]).await, Ok(Resp::Status(s)) if s == b"PONG") {
            alive += 1;
        }
    }
    Ok(format!(
        "{{\"opened\":{},\"open_seconds\":{open_secs:.2},\"released_by_file\":{released},\"checked\":{checked},\"alive\":{alive}}}",
        conns.len()
    ))
}

// ---------------------------------------------------------------------------------------
// Self-test: a mock server that answers like a master that grants every lock

async fn mock_client(stream: TcpStream) -> io::Result<()> {
    let mut stream = stream;
    stream.set_nodelay(true)?;
    let mut read = BytesMut::with_capacity(512);
    let mut out = Vec::with_capacity(128);
    loop {
        out.clear();
        while let Some((req, used)) = parse(&read, 0).map_err(io::Error::other)? {
            read.advance(used);
            let name = match &req {
                Resp::Array(Some(args)) => match args.first() {
                    Some(Resp::Bulk(Some(n))) => n.to_ascii_uppercase(),
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            match name.as_slice() {
                b"PING" => out.extend_from_slice(b"+PONG\r\n"),
                b"SET" => out.extend_from_slice(b"+OK\r\n"),
                b"EVAL" | b"EVALSHA" => out.extend_from_slice(b":1\r\n"),
                b"SCRIPT" => out.extend_from_slice(b"$40\r\n0123456789012345678901234567890123456789\r\n"),
                _ => out.extend_from_slice(b"-ERR unknown command\r\n"),
            }
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
        }
        if stream.read_buf(&mut read).await? == 0 {
            return Ok(());
        }
    }
}

async fn self_test(seconds: f64) -> io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(mock_client(stream));
        }
    });
    let base = CycleOpts {
        port,
        workers: 8,
        seconds,
        warmup: 0.0,
        ttl_ms: 10_000,
        keyspace: 1_000_000,
        release: Release::Evalsha,
        label: "mock".into(),
        hist_out: None,
    };
    for release in [Release::Evalsha, Release::Eval, Release::None] {
        let (json, tally, rate) = cycle(CycleOpts {
            release,
            ..base.clone()
        })
        .await?;
        println!("{json}");
        assert_eq!(tally.errors, 0, "the mock grants and releases every lock");
        assert!(tally.acquired > 0, "no lock cycle completed");
        assert!(rate > 0.0);
        if release != Release::None {
            assert_eq!(tally.released, tally.acquired, "every acquired lock is released");
        }
    }
    let report = idle(IdleOpts {
        port,
        conns: 64,
        batch: 16,
        ready_file: None,
        release_file: None,
        max_hold: 0.0,
    })
    .await?;
    println!("{report}");
    assert!(report.contains("\"opened\":64"), "{report}");
    // The parser against split and nested replies.
    let whole = b"*2\r\n$3\r\nabc\r\n:7\r\n+OK\r\n";
    let (value, used) = parse(whole, 0).expect("valid").expect("complete");
    for cut in 0..used {
        assert_eq!(parse(&whole[..cut], 0), Ok(None), "incomplete at {cut}");
    }
    assert_eq!(
        value,
        Resp::Array(Some(vec![Resp::Bulk(Some(b"abc".to_vec())), Resp::Int(7)]))
    );
    assert_eq!(
        parse(whole, used),
        Ok(Some((Resp::Status(b"OK".to_vec()), whole.len())))
    );
    println!("lockbench self-test: ok");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Command line

fn usage() -> ! {
    eprintln!(
        "usage: lockbench --bench cycle --port P [--workers N] [--seconds S] [--warmup S] [--ttl MS]\n\
         \x20                 [--keyspace K] [--release evalsha|eval|none] [--label L] [--hist FILE]\n\
         \x20      lockbench --bench idle --port P [--conns N] [--batch B] [--ready-file F]\n\
         \x20                 [--release-file G] [--max-hold S]\n\
         \x20      lockbench [--bench]   (self-test against a mock server)"
    );
    std::process::exit(2)
}

fn value<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        eprintln!("lockbench: {} needs a valid value", args[i]);
        usage()
    })
}

fn main() -> io::Result<()> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let bench = raw.iter().any(|a| a == "--bench");
    // Whatever else the test harness passes (filters, --nocapture, ...) is ignored in self-test mode.
    let args: Vec<String> = raw.into_iter().filter(|a| a != "--bench").collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Without --bench (`cargo test --all-targets`) it is always the quick self-test.
    let mode = if bench { args.first().map(String::as_str) } else { None };
    match mode {
        Some("cycle") => {
            let mut o = CycleOpts {
                port: 0,
                workers: 50,
                seconds: 3.0,
                warmup: 0.5,
                ttl_ms: 10_000,
                keyspace: 1_000_000,
                release: Release::Evalsha,
                label: String::new(),
                hist_out: None,
            };
            let mut i = 1;
            while i < args.len() {
                match args[i].as_str() {
                    "--port" => o.port = value(&args, i),
                    "--workers" => o.workers = value(&args, i),
                    "--seconds" => o.seconds = value(&args, i),
                    "--warmup" => o.warmup = value(&args, i),
                    "--ttl" => o.ttl_ms = value(&args, i),
                    "--keyspace" => o.keyspace = value(&args, i),
                    "--label" => o.label = value(&args, i),
                    "--hist" => o.hist_out = Some(value(&args, i)),
                    "--release" => {
                        o.release = match value::<String>(&args, i).as_str() {
                            "evalsha" => Release::Evalsha,
                            "eval" => Release::Eval,
                            "none" => Release::None,
                            _ => usage(),
                        }
                    }
                    _ => usage(),
                }
                i += 2;
            }
            if o.port == 0 || o.workers == 0 || o.keyspace == 0 || o.seconds <= 0.0 {
                usage();
            }
            let (json, _, _) = runtime.block_on(cycle(o))?;
            println!("{json}");
        }
        Some("idle") => {
            let mut o = IdleOpts {
                port: 0,
                conns: 10_000,
                batch: 100,
                ready_file: None,
                release_file: None,
                max_hold: 60.0,
            };
            let mut i = 1;
            while i < args.len() {
                match args[i].as_str() {
                    "--port" => o.port = value(&args, i),
                    "--conns" => o.conns = value(&args, i),
                    "--batch" => o.batch = value(&args, i),
                    "--ready-file" => o.ready_file = Some(value(&args, i)),
                    "--release-file" => o.release_file = Some(value(&args, i)),
                    "--max-hold" => o.max_hold = value(&args, i),
                    _ => usage(),
                }
                i += 2;
            }
            if o.port == 0 || o.batch == 0 {
                usage();
            }
            println!("{}", runtime.block_on(idle(o))?);
        }
        _ => runtime.block_on(self_test(if bench { 2.0 } else { 0.2 }))?,
    }
    Ok(())
}
