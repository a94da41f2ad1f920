//! Real Redis client libraries against the proxy over five real masters.
//!
//! The client programs live in `tests/compat/` (redis-py, its introspection, python-redis-lock, ioredis,
//! node-redis, the npm `redlock` package, and each lock recipe's commands from redis-py and ioredis); their pinned libraries are installed by `tests/compat/setup.sh`.
//! Without them these tests fail, never skip. The redis-rs (RESP3) and interactive
//! `redis-cli` checks (a session, and the argument hints it shows while typing) are written
//! here.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::RedisResult;

use support::{ProxyProcess, RELEASE, RedisServer, acquire, fencing_ready, holders, masters, urls};

/// How long one client program may run.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

/// The proxy's configuration here: the clients are under test, not the timeouts, so a
/// master's reply that comes late on a loaded machine (2 cores, the tests of this file in
/// parallel, each with its client processes) must not turn into `NOQUORUM`.
const CONFIG: &str = "backend_timeout_ms = 1000";

/// The five masters and the proxy in front of them.
fn cluster() -> (Vec<RedisServer>, ProxyProcess) {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    (servers, proxy)
}

/// Waits (at most a second) until no master holds `key` with `value`: a release is
/// answered once a quorum deleted, the other masters may still be at it.
fn wait_released(servers: &[RedisServer], key: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while holders(servers, key, value) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(holders(servers, key, value), 0, "the release reached every master");
}

fn compat_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("compat")
}

const SETUP_HINT: &str = "run `tests/compat/setup.sh` to install the pinned client libraries";

/// The virtualenv's python, with redis-py installed; fails the test otherwise.
fn venv_python() -> PathBuf {
    let python = compat_dir().join(".venv").join("bin").join("python");
    assert!(python.exists(), "{} is missing: {SETUP_HINT}", python.display());
    let probe = Command::new(&python)
        .args(["-c", "import redis"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): {SETUP_HINT}", python.display()));
    assert!(
        probe.status.success(),
        "redis-py is not installed in tests/compat/.venv ({}): {SETUP_HINT}",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
    python
}

/// Checks that `node` runs and each of `packages` is in tests/compat/node_modules.
fn require_node(packages: &[&str]) {
    let version = Command::new("node")
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run node ({e}): install Node.js, then {SETUP_HINT}"));
    assert!(version.status.success(), "`node --version` failed");
    for package in packages {
        let manifest = compat_dir().join("node_modules").join(package).join("package.json");
        assert!(
            manifest.exists(),
            "npm package `{package}` is not installed in tests/compat/node_modules: {SETUP_HINT}"
        );
    }
}

/// Runs `program args... <proxy port>` in tests/compat, waits (at most
/// [`CLIENT_TIMEOUT`]), and fails the test with the program's output unless it exited 0.
fn run_client(program: &Path, script: &str, port: u16) {
    let mut child = Command::new(program)
        .arg(script)
        .arg(port.to_string())
        .current_dir(compat_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {} {script} ({e})", program.display()));
    let stdout = Captured::start(child.stdout.take().expect("stdout"));
    let stderr = Captured::start(child.stderr.take().expect("stderr"));
    let status = wait_at_most(&mut child, CLIENT_TIMEOUT);
    let (out, err) = (stdout.finish(), stderr.finish());
    match status {
        Some(status) if status.success() => println!("{out}"),
        Some(status) => {
            panic!("{script} failed ({status}) against the proxy on port {port}\n--- stdout\n{out}--- stderr\n{err}")
        }
        None => panic!("{script} did not finish within {CLIENT_TIMEOUT:?}: killed\n--- stdout\n{out}--- stderr\n{err}"),
    }
}

/// Output read on a thread into a shared buffer, as it arrives.
struct Captured {
    buf: Arc<Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Captured {
    fn start(mut from: impl Read + Send + 'static) -> Captured {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = from.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock().expect("output buffer").extend_from_slice(&chunk[..n]);
            }
        });
        Captured { buf, reader }
    }

    /// What was read so far.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf.lock().expect("output buffer")).into_owned()
    }

    /// Everything, once the writer is gone: waits (briefly, in case a leftover child
    /// process still holds the pipe) for the reader to reach the end.
    fn finish(self) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.text()
    }
}

/// Waits for `child` for at most `limit`; kills it and returns `None` past that.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn redis_py_lock() {
    let python = venv_python();
    let (_servers, proxy) = cluster();
    run_client(&python, "redis_py_lock.py", proxy.port);
}

/// redis-py's command introspection (`command()`, `command_count()`, `command_list()`,
/// `command_getkeys()`): the proxy's command table, native commands included.
#[test]
fn redis_py_introspection() {
    let python = venv_python();
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    run_client(&python, "redis_py_introspection.py", proxy.port);
}

/// python-redis-lock 4.0.1: blocking acquire waits with `BLPOP` on a signal list, woken by
/// the release script's `LPUSH` through the proxy; `auto_renewal`; failure values kept.
#[test]
fn python_redis_lock() {
    let python = venv_python();
    let (_servers, proxy) = cluster();
    run_client(&python, "python_redis_lock.py", proxy.port);
}

#[test]
fn node_ioredis() {
    require_node(&["ioredis"]);
    let (_servers, proxy) = cluster();
    run_client(Path::new("node"), "node_ioredis.js", proxy.port);
}

#[test]
fn node_redis() {
    require_node(&["redis", "@redis/client"]);
    let (_servers, proxy) = cluster();
    run_client(Path::new("node"), "node_redis.js", proxy.port);
}

#[test]
fn node_redlock() {
    require_node(&["redlock", "ioredis"]);
    let (_servers, proxy) = cluster();
    run_client(Path::new("node"), "node_redlock.js", proxy.port);
}

/// A semaphore from redis-py (`execute_command`), RESP3 and RESP2: permits, the fixed count,
/// a waiter handed a permit by a release, `SEM.INFO`, extension and release.
#[test]
fn redis_py_semaphore() {
    let python = venv_python();
    let (_servers, proxy) = cluster();
    run_client(&python, "recipes_semaphore.py", proxy.port);
}

/// The same semaphore from ioredis (`call`).
#[test]
fn node_ioredis_semaphore() {
    require_node(&["ioredis"]);
    let (_servers, proxy) = cluster();
    run_client(Path::new("node"), "recipes_semaphore.js", proxy.port);
}

/// A redis-rs connection to the proxy speaking RESP3 (`HELLO 3` on connect).
fn resp3_connection(proxy: &ProxyProcess) -> redis::Connection {
    redis::Client::open(format!("{}/?protocol=resp3", proxy.url()))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("RESP3 connection to the proxy")
}

/// A semaphore from redis-rs (`redis::cmd`), RESP3: the replies read as Rust types.
#[test]
fn redis_rs_semaphore() {
    let (_servers, proxy) = cluster();
    let mut a = resp3_connection(&proxy);
    let mut b = resp3_connection(&proxy);
    let acquire = |c: &mut redis::Connection, token: &str| -> Option<(u32, u64)> {
        redis::cmd("SEM.ACQUIRE")
            .arg("jobs:rs")
            .arg(token)
            .arg(1)
            .arg(10_000)
            .query(c)
            .expect("SEM.ACQUIRE")
    };
    let (slot, fence) = acquire(&mut a, "rs-a").expect("the one permit");
    assert_eq!(slot, 0);
    assert_eq!(acquire(&mut b, "rs-b"), None, "a second holder of 1 permit is refused");
    let info: HashMap<String, redis::Value> = redis::cmd("SEM.INFO").arg("jobs:rs").query(&mut b).expect("SEM.INFO");
    assert_eq!(info.get("holders"), Some(&redis::Value::Int(1)), "{info:?}");
    let released: i64 = redis::cmd("SEM.RELEASE")
        .arg("jobs:rs")
        .arg("rs-a")
        .query(&mut a)
        .expect("SEM.RELEASE");
    assert_eq!(released, 1);
    let (_, next) = acquire(&mut b, "rs-b").expect("the freed permit");
    assert!(next > fence, "the slot's token rises: {next} > {fence}");
}

/// A read-write lock from redis-rs (`redis::cmd`), RESP3.
#[test]
fn redis_rs_rwlock() {
    let (_servers, proxy) = cluster();
    fencing_ready(&proxy);
    let mut c = resp3_connection(&proxy);
    let mut take = |mode: &str, token: &str| -> Option<u64> {
        redis::cmd(mode)
            .arg("doc:rs")
            .arg(token)
            .arg(10_000)
            .query(&mut c)
            .expect(mode)
    };
    let r1 = take("RWLOCK.READ", "r1").expect("a reader");
    let r2 = take("RWLOCK.READ", "r2").expect("a second reader shares");
    assert!(r2 > r1, "every grant's token rises: {r2} > {r1}");
    assert_eq!(take("RWLOCK.WRITE", "w1"), None, "no writer beside readers");
    let mut other = resp3_connection(&proxy);
    for reader in ["r1", "r2"] {
        let released: i64 = redis::cmd("RWLOCK.RELEASE")
            .arg("doc:rs")
            .arg(reader)
            .query(&mut other)
            .expect("RWLOCK.RELEASE");
        assert_eq!(released, 1);
    }
    let w = take("RWLOCK.WRITE", "w1").expect("the writer, once the readers left");
    assert!(w > r2, "the writer's token is above the readers': {w} > {r2}");
    assert_eq!(take("RWLOCK.READ", "r3"), None, "no reader beside the writer");
}

/// A reentrant lock and a set of locks from redis-rs, RESP3.
#[test]
fn redis_rs_reentrant_lock_and_several_locks() {
    let (_servers, proxy) = cluster();
    fencing_ready(&proxy);
    let mut c = resp3_connection(&proxy);
    let mut acquire = |token: &str, reentrant: bool| -> Option<u64> {
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg("lock:rs-r").arg(token).arg(10_000);
        if reentrant {
            cmd.arg("REENTRANT");
        }
        cmd.query(&mut c).expect("LOCK.ACQUIRE")
    };
    let first = acquire("me", true).expect("the lock");
    assert_eq!(acquire("me", true), Some(first), "taken again: the same token");
    assert_eq!(acquire("you", false), None);
    let mut c = resp3_connection(&proxy);
    let mut release = |key: &str| -> i64 {
        redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg("me")
            .query(&mut c)
            .expect("LOCK.RELEASE")
    };
    assert_eq!(release("lock:rs-r"), 1, "one hold given back");
    let holds: HashMap<String, redis::Value> = redis::cmd("LOCK.INFO")
        .arg("lock:rs-r")
        .query(&mut resp3_connection(&proxy))
        .expect("LOCK.INFO");
    assert_eq!(holds.get("holds"), Some(&redis::Value::Int(1)), "{holds:?}");
    assert_eq!(release("lock:rs-r"), 1, "the last hold: the lock is free");

    let mut c = resp3_connection(&proxy);
    let tokens: Option<Vec<u64>> = redis::cmd("LOCK.ACQUIREALL")
        .arg("set-token")
        .arg(10_000)
        .arg(3)
        .arg(&["rs:a", "rs:b", "rs:c"])
        .query(&mut c)
        .expect("LOCK.ACQUIREALL");
    assert_eq!(tokens.map(|t| t.len()), Some(3), "a fencing token per key");
    let overlapping: Option<Vec<u64>> = redis::cmd("LOCK.ACQUIREALL")
        .arg("other")
        .arg(10_000)
        .arg(2)
        .arg(&["rs:c", "rs:d"])
        .query(&mut c)
        .expect("LOCK.ACQUIREALL");
    assert_eq!(overlapping, None, "a set overlapping a held one is refused whole");
    let released: i64 = redis::cmd("LOCK.RELEASEALL")
        .arg("set-token")
        .arg(3)
        .arg(&["rs:a", "rs:b", "rs:c"])
        .query(&mut c)
        .expect("LOCK.RELEASEALL");
    assert_eq!(released, 3);
}

/// Leader election from redis-rs: a campaign, the leader read by anyone, a long-polling
/// observer told of the next leader when the first resigns.
#[test]
fn redis_rs_election() {
    let (_servers, proxy) = cluster();
    fencing_ready(&proxy);
    let mut leader = resp3_connection(&proxy);
    let term: u64 = redis::cmd("ELECT.CAMPAIGN")
        .arg("svc:rs")
        .arg("10.0.0.1:80")
        .arg(10_000)
        .query(&mut leader)
        .expect("ELECT.CAMPAIGN");
    let seen: Option<(String, u64)> = redis::cmd("ELECT.LEADER")
        .arg("svc:rs")
        .query(&mut proxy.client())
        .expect("ELECT.LEADER");
    assert_eq!(seen, Some(("10.0.0.1:80".to_owned(), term)));
    let port = proxy.port;
    // The standby's connection is handed back with its term: its leadership is a session
    // lock, which ends when the connection closes (the observer must find it still leading).
    let standby = std::thread::spawn(move || -> (u64, redis::Connection) {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection())
            .expect("standby");
        let term = redis::cmd("ELECT.CAMPAIGN")
            .arg("svc:rs")
            .arg("10.0.0.2:80")
            .arg(10_000)
            .arg("WAIT")
            .arg(10_000)
            .query(&mut c)
            .expect("the standby's campaign");
        (term, c)
    });
    let observer = std::thread::spawn(move || -> Option<(String, u64)> {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection())
            .expect("observer");
        let mut after = term;
        // The long poll answers when the term differs from `after`: nil (no leader) may come
        // between the resignation and the standby's grant, and, while the resignation reaches
        // the masters, a reading may still find the old leader (its term tells it is the old).
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let seen: Option<(String, u64)> = redis::cmd("ELECT.OBSERVE")
                .arg("svc:rs")
                .arg("AFTER")
                .arg(after)
                .arg("TIMEOUT")
                .arg(10_000)
                .query(&mut c)
                .expect("ELECT.OBSERVE");
            match seen {
                Some((value, t)) if t > term => return Some((value, t)),
                Some((_, t)) => after = t,
                None => after = 0,
            }
        }
        None
    });
    let resigned: i64 = redis::cmd("ELECT.RESIGN")
        .arg("svc:rs")
        .arg("10.0.0.1:80")
        .query(&mut leader)
        .expect("ELECT.RESIGN");
    assert_eq!(resigned, 1);
    let (next, _leading) = standby.join().expect("standby");
    assert!(next > term, "the next term is above the last: {next} > {term}");
    assert_eq!(
        observer.join().expect("observer"),
        Some(("10.0.0.2:80".to_owned(), next))
    );
}

#[test]
fn redis_rs_resp3_acquire_contend_release() {
    let (servers, proxy) = cluster();
    let mut a = resp3_connection(&proxy);
    let mut b = resp3_connection(&proxy);

    let info: String = redis::cmd("CLIENT").arg("INFO").query(&mut a).expect("CLIENT INFO");
    assert!(info.contains(" resp=3"), "the connection negotiated RESP3: {info}");

    let since = Instant::now();
    assert_eq!(acquire(&mut a, "lock:rs", "tA", 10_000).as_deref(), Some("OK"));
    assert!(holders(&servers, "lock:rs", "tA") >= 3);
    assert_eq!(
        acquire(&mut b, "lock:rs", "tB", 10_000),
        None,
        "a held lock is refused with a RESP3 null"
    );
    let value: Option<String> = redis::cmd("GET").arg("lock:rs").query(&mut b).expect("GET");
    assert_eq!(value.as_deref(), Some("tA"));
    let pttl: i64 = redis::cmd("PTTL").arg("lock:rs").query(&mut b).expect("PTTL");
    let spent = since.elapsed().as_millis() as i64;
    assert!(
        (10_000 - spent - 25..=10_005).contains(&pttl),
        "PTTL {pttl}: 10000 less at most the {spent} ms spent"
    );

    // Release with EVAL: the non-owner gets 0, the owner 1.
    let eval = |c: &mut redis::Connection, token: &str| -> i64 {
        redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg("lock:rs")
            .arg(token)
            .query(c)
            .expect("EVAL release")
    };
    assert_eq!(eval(&mut b, "tB"), 0, "a non-owner cannot release");
    assert!(holders(&servers, "lock:rs", "tA") >= 3);
    assert_eq!(eval(&mut a, "tA"), 1);
    wait_released(&servers, "lock:rs", "tA");

    // The other connection gets it now; redis-rs' Script (EVALSHA, SCRIPT LOAD on NOSCRIPT)
    // releases it.
    assert_eq!(acquire(&mut b, "lock:rs", "tB", 10_000).as_deref(), Some("OK"));
    let script = redis::Script::new(RELEASE);
    let released: i64 = script
        .key("lock:rs")
        .arg("tA")
        .invoke(&mut a)
        .expect("Script release by non-owner");
    assert_eq!(released, 0);
    let released: i64 = script
        .key("lock:rs")
        .arg("tB")
        .invoke(&mut b)
        .expect("Script release by owner");
    assert_eq!(released, 1);
    wait_released(&servers, "lock:rs", "tB");
    let exists: i64 = redis::cmd("EXISTS").arg("lock:rs").query(&mut a).expect("EXISTS");
    assert_eq!(exists, 0);
}

#[test]
fn redis_rs_resp3_async_race_has_one_winner() {
    let (_servers, proxy) = cluster();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = redis::Client::open(format!("{}/?protocol=resp3", proxy.url())).expect("client");
        let mut a = client
            .get_multiplexed_async_connection()
            .await
            .expect("async RESP3 connection A");
        let mut b = client
            .get_multiplexed_async_connection()
            .await
            .expect("async RESP3 connection B");
        // Never both win. When neither does (a master answered too late for either to
        // reach a majority, which Redlock allows), both try again, as a client would.
        for i in 0..20 {
            let key = format!("lock:rs:race:{i}");
            let mut winner = None;
            for attempt in 1..=5 {
                let take = |token: &str| {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(&key).arg(token).arg("NX").arg("PX").arg(10_000);
                    cmd
                };
                let (take_a, take_b) = (take("tA"), take("tB"));
                let (ra, rb): (RedisResult<Option<String>>, RedisResult<Option<String>>) =
                    tokio::join!(take_a.query_async(&mut a), take_b.query_async(&mut b));
                let (ra, rb) = (ra.expect("SET A"), rb.expect("SET B"));
                assert!(
                    !(ra.is_some() && rb.is_some()),
                    "race {i}, attempt {attempt}: both got the lock: A {ra:?}, B {rb:?}"
                );
                for reply in [&ra, &rb].into_iter().flatten() {
                    assert_eq!(reply, "OK", "race {i}: a granted SET NX answers OK");
                }
                winner = match (ra, rb) {
                    (Some(_), None) => Some("tA"),
                    (None, Some(_)) => Some("tB"),
                    _ => None,
                };
                if winner.is_some() {
                    break;
                }
            }
            let winner = winner.unwrap_or_else(|| panic!("race {i}: no winner in 5 attempts"));
            let held: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut a).await.expect("GET");
            assert_eq!(held.as_deref(), Some(winner), "race {i}: the winner holds it");
            let released: i64 = redis::cmd("EVAL")
                .arg(RELEASE)
                .arg(1)
                .arg(&key)
                .arg(winner)
                .query_async(&mut b)
                .await
                .expect("EVAL release");
            assert_eq!(released, 1, "race {i}: the winner's release answers 1");
        }
    });
}

/// `redis-cli -p PORT` in an interactive session: a pseudo-terminal (made by `script`)
/// so that it prompts, edits lines and prints replies as a person sees them.
struct InteractiveCli {
    child: Child,
    screen: Captured,
}

impl InteractiveCli {
    fn start(port: u16) -> InteractiveCli {
        // A pseudo-terminal starts with no size; redis-cli's line editor would then ask
        // the terminal for it and wait for an answer, so give it one first.
        let inner = format!("stty cols 200 rows 50; exec redis-cli -p {port}");
        let mut child = Command::new("script")
            .args(["-qfc", &inner, "/dev/null"])
            .env("TERM", "xterm")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run `script` ({e}): install util-linux (bsdutils) and redis-tools"));
        let screen = Captured::start(child.stdout.take().expect("stdout"));
        let cli = InteractiveCli { child, screen };
        cli.wait_for(0, &format!("127.0.0.1:{port}> "));
        cli
    }

    fn screen(&self) -> String {
        self.screen.text()
    }

    fn len(&self) -> usize {
        self.screen.buf.lock().expect("screen").len()
    }

    /// Waits until `expected` shows on the screen after byte `from`; returns where it ends.
    fn wait_for(&self, from: usize, expected: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let screen = self.screen.buf.lock().expect("screen").clone();
            let tail = String::from_utf8_lossy(&screen[from.min(screen.len())..]).into_owned();
            if let Some(at) = tail.find(expected) {
                return from + at + expected.len();
            }
            assert!(
                Instant::now() < deadline,
                "redis-cli did not show {expected:?}; the screen after the command:\n{tail}\nthe whole screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Types `line` and Enter; returns the screen from that point on once `reply` and the
    /// next prompt showed.
    fn type_line(&mut self, line: &str, reply: &str, prompt: &str) -> String {
        let from = self.len();
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(format!("{line}\r").as_bytes())
            .and_then(|()| stdin.flush())
            .expect("type into redis-cli");
        // The echo of the typed line comes first, then the reply on a line of its own,
        // then a new prompt.
        let echoed = self.wait_for(from, line);
        let after_reply = self.wait_for(echoed, &format!("\r\n{reply}\r\n"));
        self.wait_for(after_reply, prompt);
        let screen = self.screen.buf.lock().expect("screen").clone();
        String::from_utf8_lossy(&screen[from..]).into_owned()
    }
}

impl Drop for InteractiveCli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-cli` shows an argument hint while a command is typed, read from the proxy's
/// `COMMAND DOCS` when it starts: for the native commands too. (With the empty `COMMAND DOCS`
/// the proxy answered before, no hint showed at all.)
#[test]
fn redis_cli_shows_hints_while_typing() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    let mut cli = InteractiveCli::start(proxy.port);
    for (typed, hint) in [
        ("LOCK.ACQUIRE ", "key token ttl_ms [WAIT ms] [KEEPALIVE] [REENTRANT]"),
        ("lock.acquire lock:a t1 ", "ttl_ms [WAIT ms] [KEEPALIVE] [REENTRANT]"),
        ("PROXY QUARANTINE ", "master [LIFT]"),
        ("set lock:a t1 ", "[NX|XX|IFEQ comparison-value] [GET]"),
    ] {
        let from = cli.len();
        let stdin = cli.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(typed.as_bytes())
            .and_then(|()| stdin.flush())
            .expect("type");
        cli.wait_for(from, hint);
        // Ctrl-U: the line editor clears the line.
        let stdin = cli.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"\x15")
            .and_then(|()| stdin.flush())
            .expect("clear the line");
    }
    let stdin = cli.child.stdin.as_mut().expect("stdin");
    stdin.write_all(b"quit\r").expect("type quit");
    stdin.flush().expect("flush");
    let status = wait_at_most(&mut cli.child, Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "redis-cli ended after `quit` ({status:?})"
    );
}

#[test]
fn redis_cli_interactive_session() {
    let (servers, proxy) = cluster();
    let prompt = format!("127.0.0.1:{}> ", proxy.port);
    let mut cli = InteractiveCli::start(proxy.port);

    let first = cli.type_line("SET lock:i t NX PX 10000", "OK", &prompt);
    assert!(
        holders(&servers, "lock:i", "t") >= 3,
        "the lock taken from redis-cli is held by a majority; screen:\n{first}"
    );
    let second = cli.type_line("SET lock:i t NX PX 10000", "(nil)", &prompt);
    assert!(
        !second.contains("OK"),
        "the second SET NX was refused; screen:\n{second}"
    );
    cli.type_line("GET lock:i", "\"t\"", &prompt);

    // The session ends as a person ends it.
    let stdin = cli.child.stdin.as_mut().expect("stdin");
    stdin.write_all(b"quit\r").expect("type quit");
    stdin.flush().expect("flush");
    let status = wait_at_most(&mut cli.child, Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "redis-cli ended after `quit` ({status:?}); screen:\n{}",
        cli.screen()
    );
}

/// Reentrant locks and several locks at once through redis-py's `execute_command`
/// (docs/commands.md, "Reentrant locks", "Several locks at once").
#[test]
fn redis_py_recipes_locks() {
    let python = venv_python();
    let (_servers, proxy) = cluster();
    fencing_ready(&proxy);
    run_client(&python, "recipes_locks.py", proxy.port);
}

/// Reentrant locks and several locks at once through ioredis' `call`.
#[test]
fn node_ioredis_recipes_locks() {
    require_node(&["ioredis"]);
    let (_servers, proxy) = cluster();
    fencing_ready(&proxy);
    run_client(Path::new("node"), "recipes_locks.js", proxy.port);
}

/// A read-write lock (`RWLOCK.*`) from redis-py with `execute_command`, in RESP3 and RESP2:
/// readers share, a writer excluded and handed the lock by a release, no upgrade, KEEPALIVE.
#[test]
fn redis_py_rwlock() {
    let python = venv_python();
    let (_servers, proxy) = cluster();
    run_client(&python, "recipes_rwlock.py", proxy.port);
}

/// The same read-write lock from ioredis with `call`.
#[test]
fn node_ioredis_rwlock() {
    require_node(&["ioredis"]);
    let (_servers, proxy) = cluster();
    run_client(Path::new("node"), "recipes_rwlock.js", proxy.port);
}

/// Leader election from redis-py (`execute_command`): campaign, leader, resign, and observers
/// told by RESP3 push and by long poll (tests/compat/recipes_election.py).
#[test]
fn recipes_election_redis_py() {
    let python = venv_python();
    let (_servers, proxy) = cluster();
    run_client(&python, "recipes_election.py", proxy.port);
}

/// Leader election from ioredis (`call`): campaign, leader, resign, and an observer's long poll
/// (tests/compat/recipes_election.js).
#[test]
fn recipes_election_ioredis() {
    require_node(&["ioredis"]);
    let (_servers, proxy) = cluster();
    run_client(Path::new("node"), "recipes_election.js", proxy.port);
}
