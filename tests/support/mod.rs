//! Test support: real `redis-server` masters and real proxy processes on free loopback
//! ports, killed when dropped; and a relay that delays a master's replies.
//!
//! Nothing here is a mock: masters are `redis-server` processes (the tests fail, loudly,
//! when it is not installed) and the proxy is the built `redlock-proxy` binary.

#![allow(dead_code)]

pub mod clock;
pub mod contend;
pub mod netns;
pub mod recipes;
pub mod resp3;
pub mod rust_source;
pub mod sentinel;
pub mod shards;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The canonical Redlock release: delete the key only if it holds the caller's token.
pub const RELEASE: &str =
    r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;

/// `SET key token NX PX ttl_ms` through `c`: `Some("OK")` when acquired, `None` when held.
/// `SET key token NX PX ttl_ms` for each of `keys`, in one pipeline: the proxy reads them in
/// one turn, so each master connection queues them together.
pub fn acquire_pipelined(
    c: &mut redis::Connection,
    keys: &[String],
    token: &str,
    ttl_ms: u64,
) -> redis::RedisResult<Vec<redis::Value>> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("SET").arg(key).arg(token).arg("NX").arg("PX").arg(ttl_ms);
    }
    pipe.query(c)
}

pub fn acquire(c: &mut redis::Connection, key: &str, token: &str, ttl_ms: u64) -> Option<String> {
    redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query(c)
        .expect("SET NX PX")
}

/// `INFO backends`'s line for member `index` of `proxy`.
pub fn backend_line(proxy: &ProxyProcess, index: usize) -> String {
    let text: String = redis::cmd("INFO")
        .arg("backends")
        .query(&mut proxy.client())
        .expect("INFO backends");
    let prefix = format!("backend{index}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_default()
        .to_owned()
}

/// The release script through `c`: 1 when released, else 0.
pub fn release(c: &mut redis::Connection, key: &str, token: &str) -> i64 {
    redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg(key)
        .arg(token)
        .query(c)
        .expect("EVAL release")
}

/// Runs one command given as strings (the reply, or the error the server answered).
pub fn query(c: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut command = redis::cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command.query(c)
}

/// `args` sent on `c`, whose reply must be an integer (else the test fails, naming both).
pub fn int(c: &mut redis::Connection, args: &[&str]) -> i64 {
    match query(c, args) {
        Ok(redis::Value::Int(n)) => n,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// The first fenced command of a database assigns the fencing epochs, which needs every master
/// to answer within the backend timeout; on a loaded machine one may not, and a client retries,
/// as lock clients do. Tests that start with `LOCK.ACQUIRE` do that retry here first.
pub fn fencing_ready(proxy: &ProxyProcess) {
    let mut c = proxy.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match query(&mut c, &["LOCK.ACQUIRE", "warm-up", "warm-up", "1000"]) {
            Ok(redis::Value::Int(_)) => break,
            other => assert!(Instant::now() < deadline, "no fencing token: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = query(&mut c, &["LOCK.RELEASE", "warm-up", "warm-up"]);
}

/// How long a process may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A free TCP port on loopback (bound, then released).
/// `GET /metrics` on a proxy's `metrics_listen` port: the body. HTTP/1.0, so that the body
/// comes whole, not in chunks.
pub fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut response = String::new();
    s.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    body.to_owned()
}

/// A proxy over `backends` with `/metrics` on a port of its own; returns it and that port.
pub fn proxy_with_metrics(backends: &[String], extra: &str) -> (ProxyProcess, u16) {
    let port = free_port();
    let proxy = ProxyProcess::start(backends, &format!("metrics_listen = \"127.0.0.1:{port}\"\n{extra}"));
    (proxy, port)
}

/// The sum of every sample whose series starts with `prefix` (a name, or a name and
/// labels): `redlock_wait_seconds_sum` adds up every `outcome`.
pub fn total(body: &str, prefix: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
        })
        .map(|(_, value)| value.parse::<f64>().expect("a sample value"))
        .sum()
}

/// The quorum rounds of acquisitions the proxy with `/metrics` on `metrics` has timed
/// (`redlock_acquire_seconds_count`): a waiting request adds one per try, when the try is over.
/// A refused try is over only once every master has answered it (or a backend timeout has
/// passed), so after this count moves, the try's scripts have all been served.
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn acquisition_rounds(metrics: u16) -> i64 {
    total(&scrape(metrics), "redlock_acquire_seconds_count") as i64
}

/// Waits (up to 10 s) until the proxy with `/metrics` on `metrics` has timed `n` acquisition
/// rounds: a waiter's first try is then over on every master (`PROXY LOCKS` and `*.INFO` show
/// a waiter from its enqueueing, before that try is sent).
#[allow(dead_code, reason = "not every test binary uses it")]
pub fn until_rounds(metrics: u16, n: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rounds = acquisition_rounds(metrics);
        if rounds >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{rounds} acquisition rounds, never {n}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("no free loopback port")
        .port()
}

/// Sends a signal to a process with `kill`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill could not run");
    assert!(status.success(), "kill {sig} {pid} failed");
}

/// How many times a process is started on fresh ports when it exits at start: a port drawn
/// by [`free_port`] is released before the process binds it, and another test's process or
/// an outgoing connection may take it in between.
const START_ATTEMPTS: usize = 5;

/// Where a test process runs: under a command prefix (`ip netns exec <ns>`: in a network
/// namespace), bound to `host`. The default is no prefix, on 127.0.0.1.
#[derive(Clone, Debug)]
pub struct Placement {
    pub prefix: Vec<String>,
    pub host: String,
}

impl Default for Placement {
    fn default() -> Placement {
        Placement {
            prefix: Vec::new(),
            host: "127.0.0.1".into(),
        }
    }
}

impl Placement {
    /// `program` under the prefix.
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let Some((first, rest)) = self.prefix.split_first() else {
            return Command::new(program);
        };
        let mut command = Command::new(first);
        command.args(rest).arg(program);
        command
    }
}

/// Waits until `port` answers `PING` with `+PONG`. When the process exits first: `Err` with
/// its status and what it wrote to stderr (and `log`, a log file, when given).
fn wait_for_pong(port: u16, child: &mut Child, what: &str, log: Option<&PathBuf>) -> Result<(), String> {
    wait_for_pong_at(("127.0.0.1", port), child, what, log)
}

/// [`wait_for_pong`] on `host:port`.
fn wait_for_pong_at(
    (host, port): (&str, u16),
    child: &mut Child,
    what: &str,
    log: Option<&PathBuf>,
) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut out = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut out);
            }
            if let Some(text) = log.and_then(|path| std::fs::read_to_string(path).ok()) {
                out.push_str(&text);
            }
            return Err(format!("{what} exited at start on port {port} ({status}): {out}"));
        }
        if ping_at(host, port) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not answer PING on port {port} within {START_TIMEOUT:?}");
}

/// Runs `attempt` until it succeeds, up to [`START_ATTEMPTS`] times; panics with the last error.
fn with_fresh_ports<T>(mut attempt: impl FnMut() -> Result<T, String>) -> T {
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        match attempt() {
            Ok(started) => return started,
            Err(e) => last = e,
        }
    }
    panic!("{last}");
}

/// Whether `port` answers `PING` (a `-NOAUTH` refusal counts: the server is up).
pub fn ping(port: u16) -> bool {
    ping_at("127.0.0.1", port)
}

/// Whether `host:port` answers `PING`.
pub fn ping_at(host: &str, port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect((host, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).is_ok() && (line == "+PONG\r\n" || line.starts_with("-NOAUTH"))
}

/// A real `redis-server` master without persistence, on a free loopback port.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    /// Extra `redis-server` arguments (e.g. `--requirepass`).
    extra: Vec<String>,
    /// The current run's working directory (see `fresh_dir`).
    dir: Option<PathBuf>,
    /// The binary to run (`redis-server` on the `PATH` unless another build is wanted).
    program: PathBuf,
    /// Extra environment variables of the process (e.g. `LD_PRELOAD`).
    env: Vec<(String, String)>,
    placement: Placement,
}

impl RedisServer {
    /// Starts a master; panics (the test fails) when `redis-server` is not installed.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a master with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        with_fresh_ports(|| RedisServer::try_start_with(extra))
    }

    /// Starts a master on a fresh port, once: `Err` when it exits at start (its port taken).
    pub fn try_start_with(extra: &[&str]) -> Result<RedisServer, String> {
        let mut server = RedisServer {
            port: free_port(),
            child: None,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            dir: None,
            program: PathBuf::from("redis-server"),
            env: Vec::new(),
            placement: Placement::default(),
        };
        server.try_spawn()?;
        Ok(server)
    }

    /// Starts `program` (another build of the server) with the extra environment `env`, on a
    /// fresh port.
    pub fn start_program(program: &std::path::Path, env: &[(String, String)]) -> RedisServer {
        with_fresh_ports(|| {
            let mut server = RedisServer {
                port: free_port(),
                child: None,
                extra: Vec::new(),
                dir: None,
                program: program.to_path_buf(),
                env: env.to_vec(),
                placement: Placement::default(),
            };
            server.try_spawn()?;
            Ok(server)
        })
    }

    /// Starts a master placed by `placement` on `port` (in a namespace of its own, any port
    /// is free).
    pub fn start_placed(placement: Placement, port: u16, extra: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            port,
            child: None,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            dir: None,
            program: PathBuf::from("redis-server"),
            env: Vec::new(),
            placement,
        };
        server.spawn();
        server
    }

    /// Starts the server on its port (a restart: the same port, so a failure is the test's).
    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let dir = self.fresh_dir();
        self.try_spawn_in(&dir)
    }

    /// Starts the server with `dir` as its working directory (and its data's).
    fn try_spawn_in(&mut self, dir: &Path) -> Result<(), String> {
        let log = dir.join("redis.log");
        let mut child = self
            .placement
            .command(&self.program)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["--port", &self.port.to_string(), "--bind", &self.placement.host])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            // A replica's full sync goes through a file in `dir`, which a server would load at
            // start: each run of each server gets a fresh, empty directory of its own.
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it, e.g. `apt-get install -y redis-server`")
            });
        wait_for_pong_at(
            (&self.placement.host, self.port),
            &mut child,
            "redis-server",
            Some(&log),
        )?;
        self.child = Some(child);
        Ok(())
    }

    /// An empty directory for this run of the server (the last run's is removed).
    fn fresh_dir(&mut self) -> PathBuf {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        if let Some(old) = self.dir.take() {
            let _ = std::fs::remove_dir_all(old);
        }
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "redlock-proxy-redis-{}-{}-{run}",
            std::process::id(),
            self.port
        ));
        std::fs::create_dir_all(&dir).expect("temp dir for redis-server");
        self.dir = Some(dir.clone());
        dir
    }

    /// `redis://<host>:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.placement.host, self.port)
    }

    /// A direct connection to this master (not through the proxy).
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("direct connection to redis-server")
    }

    /// `GET key` directly on this master.
    pub fn get(&self, key: &str) -> Option<String> {
        redis::cmd("GET").arg(key).query(&mut self.client()).expect("GET")
    }

    /// `SET key value PX 60000` directly on this master: a lock someone else holds (with a
    /// TTL, as every key written through a proxy has one).
    pub fn set(&self, key: &str, value: &str) {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query(&mut self.client())
            .expect("SET");
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// `kill -9`: the master dies, losing every key.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `kill -9`, and starts it again on the same port with the files it wrote: a restart
    /// *with* its data, for a server started with persistence (`--appendonly yes`).
    pub fn restart_keeping_data(&mut self) {
        self.kill();
        let dir = self.dir.clone().expect("a server that ran has a directory");
        if let Err(e) = self.try_spawn_in(&dir) {
            panic!("{e}");
        }
    }

    /// Kills and starts it again on the same port, empty (no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the process stays, its socket accepts, nothing answers.
    pub fn pause(&self) {
        signal(self.pid(), "-STOP");
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        signal(self.pid(), "-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused process must be continued to die cleanly.
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
        }
        self.kill();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `n` masters.
pub fn masters(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

/// The URLs of `servers`.
pub fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// How many of `servers` hold `key` with `value`.
pub fn holders(servers: &[RedisServer], key: &str, value: &str) -> usize {
    servers.iter().filter(|s| s.get(key).as_deref() == Some(value)).count()
}

/// A `redlock-proxy` process (the built binary) on a free port.
pub struct ProxyProcess {
    pub port: u16,
    child: Child,
    dir: PathBuf,
    host: String,
}

impl ProxyProcess {
    /// Starts a proxy over `backends` (URLs; empty for embedded masters) with extra
    /// `config.toml` lines.
    pub fn start(backends: &[String], extra_config: &str) -> ProxyProcess {
        ProxyProcess::start_with_env(backends, extra_config, &[])
    }

    /// Starts a proxy with extra environment variables.
    pub fn start_with_env(backends: &[String], extra_config: &str, env: &[(&str, &str)]) -> ProxyProcess {
        with_fresh_ports(|| ProxyProcess::try_start(backends, extra_config, env, &Placement::default(), free_port()))
    }

    /// Starts a proxy placed by `placement`, listening on `port`.
    pub fn start_placed(placement: &Placement, port: u16, backends: &[String], extra_config: &str) -> ProxyProcess {
        ProxyProcess::try_start(backends, extra_config, &[], placement, port).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a proxy on `port`, once: `Err` when it exits at start.
    fn try_start(
        backends: &[String],
        extra_config: &str,
        env: &[(&str, &str)],
        placement: &Placement,
        port: u16,
    ) -> Result<ProxyProcess, String> {
        static STARTS: AtomicU64 = AtomicU64::new(0);
        let start = STARTS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("redlock-proxy-test-{}-{port}-{start}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let list: Vec<String> = backends.iter().map(|u| format!("{u:?}")).collect();
        // The test masters are fresh: no lock can predate them, so masters first seen young
        // are trusted; restarts during a test are still quarantined. Tests of the startup
        // quarantine set `quarantine` themselves.
        let quarantine = if extra_config.contains("quarantine") {
            ""
        } else {
            "quarantine = \"restarts\"\n"
        };
        // Tests keep session locks short (a few hundred ms) to stay fast; tests of the floor
        // set it themselves.
        let floor = if extra_config.contains("min_keepalive_ttl_ms") {
            ""
        } else {
            "min_keepalive_ttl_ms = 50\n"
        };
        let config = format!(
            "listen = \"{}:{port}\"\nbackends = [{}]\nlog_level = \"warn\"\n{quarantine}{floor}{extra_config}\n",
            placement.host,
            list.join(", ")
        );
        let path = dir.join("config.toml");
        std::fs::write(&path, config).expect("write config");
        // The log goes to a file, never a pipe nobody reads until the end: a proxy that
        // logged more than a pipe holds (64 KiB of warnings in a long fault run) would block.
        let log = dir.join("proxy.log");
        let mut child = placement
            .command(env!("CARGO_BIN_EXE_redlock-proxy"))
            .arg("--config")
            .arg(&path)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("proxy log file"))
            .spawn()
            .expect("start redlock-proxy");
        let started = wait_for_pong_at((&placement.host, port), &mut child, "redlock-proxy", Some(&log));
        let host = placement.host.clone();
        let proxy = ProxyProcess { port, child, dir, host };
        started.map(|()| proxy)
    }

    /// `redis://<host>:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.host, self.port)
    }

    /// A client connection to the proxy.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connection to the proxy")
    }

    /// A raw socket to the proxy, for byte-level tests.
    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect((self.host.as_str(), self.port)).expect("raw connection to the proxy");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        s
    }

    /// The process id, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
        signal(self.child.id(), "-TERM");
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// [`ProxyProcess::terminate`], and what the proxy logged (warnings and errors).
    pub fn terminate_logged(&mut self) -> (bool, String) {
        let clean = self.terminate();
        (clean, self.log())
    }

    /// What the proxy has logged so far (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("proxy.log")).unwrap_or_default()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("KEEP_PROXY_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A TCP relay in front of a master that holds every reply back by a settable delay:
/// a slow network or a slow master, as the proxy sees it.
pub struct DelayRelay {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    /// What the relay holds back ([`Cut`]), as TCP does across a partition: nothing is lost,
    /// it is delivered when the cut heals (unless a side gave up on the connection first).
    cut: Arc<tokio::sync::watch::Sender<Cut>>,
    /// Bytes clients sent through the relay to the master.
    sent: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl DelayRelay {
    /// A relay to `target_port` with no delay yet.
    pub fn start(target_port: u16) -> DelayRelay {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("relay runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("relay listener");
        let port = listener.local_addr().expect("relay addr").port();
        let (delay_ms, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let cut = Arc::new(tokio::sync::watch::Sender::new(Cut::None));
        let links = Links {
            delay_ms: delay_ms.clone(),
            sent: sent.clone(),
            cut: cut.clone(),
        };
        runtime.spawn(relay_accept(listener, target_port, links));
        DelayRelay {
            port,
            delay_ms,
            cut,
            sent,
            _runtime: runtime,
        }
    }

    /// Holds every reply back by `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Cuts the link from now on (a partition), or heals it with [`Cut::None`].
    pub fn set_cut(&self, cut: Cut) {
        self.cut.send_replace(cut);
    }

    /// `redis://127.0.0.1:<relay port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// How many bytes clients have sent through the relay so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

/// What a [`DelayRelay`] holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cut {
    /// Nothing: a healthy link.
    None,
    /// The master's replies: requests arrive and run, their answers do not come back.
    Replies,
    /// Both ways: a partition.
    Both,
}

/// The settings a relay's connections share.
#[derive(Clone)]
struct Links {
    delay_ms: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    cut: Arc<tokio::sync::watch::Sender<Cut>>,
}

async fn relay_accept(listener: tokio::net::TcpListener, target: u16, links: Links) {
    while let Ok((client, _)) = listener.accept().await {
        let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let requests = Direction {
            delay_ms: None,
            counter: Some(links.sent.clone()),
            cut: links.cut.subscribe(),
            held_from: Cut::Both,
        };
        let replies = Direction {
            delay_ms: Some(links.delay_ms.clone()),
            counter: None,
            cut: links.cut.subscribe(),
            held_from: Cut::Replies,
        };
        tokio::spawn(pipe(client_read, server_write, requests));
        tokio::spawn(pipe(server_read, client_write, replies));
    }
}

/// One direction of a relayed connection.
struct Direction {
    delay_ms: Option<Arc<AtomicU64>>,
    counter: Option<Arc<AtomicU64>>,
    cut: tokio::sync::watch::Receiver<Cut>,
    /// The least cut that holds this direction back.
    held_from: Cut,
}

/// Copies bytes from `from` to `to`; with a delay, each chunk is written `delay` after it
/// was read, without holding back the chunks behind it any longer than that. While the link
/// is cut in this direction, chunks wait, in order, until it heals.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, way: Direction) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let Direction {
        delay_ms,
        counter,
        mut cut,
        held_from,
    } = way;
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            // Not through the timer when nothing is held back: a timer costs up to a
            // millisecond of its wheel's resolution per chunk.
            if due > tokio::time::Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if cut.wait_for(|cut| *cut < held_from).await.is_err() {
                return;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(counter) = &counter {
            counter.fetch_add(n as u64, Ordering::SeqCst);
        }
        let delay = delay_ms.as_ref().map_or(0, |d| d.load(Ordering::SeqCst));
        let due = tokio::time::Instant::now() + Duration::from_millis(delay);
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Sends raw bytes and reads exactly as many bytes as `expected` has (or until the read
/// times out), returning what came back, for an `assert_eq!` against `expected`.
pub fn roundtrip(stream: &mut TcpStream, request: &[u8], expected: &str) -> String {
    stream.write_all(request).expect("write");
    let mut got = vec![0u8; expected.len()];
    let mut filled = 0;
    while filled < got.len() {
        match stream.read(&mut got[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => filled += n,
        }
    }
    got.truncate(filled);
    String::from_utf8_lossy(&got).into_owned()
}

/// Sends raw bytes and asserts that exactly `expected` comes back.
pub fn expect_reply(stream: &mut TcpStream, request: &[u8], expected: &str) {
    assert_eq!(
        roundtrip(stream, request, expected),
        expected,
        "reply to {:?}",
        String::from_utf8_lossy(request)
    );
}

/// One field of `LOCK.INFO key` through `c`.
pub fn lock_info(c: &mut redis::Connection, key: &str, name: &str) -> redis::Value {
    let Ok(redis::Value::Array(items)) = query(c, &["LOCK.INFO", key]) else {
        panic!("LOCK.INFO")
    };
    let at = items
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == name.as_bytes()))
        .unwrap_or_else(|| panic!("no {name} in LOCK.INFO"));
    items[at + 1].clone()
}
