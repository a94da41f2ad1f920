//! Migration without a stop (docs/migrating-from-setnx.md, "Rolling over without a stop"): old
//! instances lock on the single legacy Redis, upgraded ones through two proxies over three
//! masters, on the same keys, each holder inside a guarded resource that counts overlaps.
//!
//! - With the bridge (`legacy_backend` on both proxies), through a legacy restart (kill -9, its
//!   data kept by its append-only file) and a master killed: 0 overlaps, and both sides hold
//!   the locks in turn (the old code's locks refuse the proxies' clients: counted refusals).
//! - The control, the same run without the bridge: overlaps (each side sees only its server).
//! - A second language: ioredis `SET NX PX` code on the legacy server beside ioredis through the
//!   proxies: 0 double holds.
//!
//! The client programs are `tests/compat/migration.py` and `tests/compat/migration_node.js`
//! (their libraries: `tests/compat/setup.sh`).

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redis::Value;
use support::resp3::{Resp3, push_items};
use support::{ProxyProcess, RedisServer, masters, proxy_with_metrics, query, scrape, total, urls};

/// The proxies' settings: quarantine of a restarted member for `max_ttl_ms` (short here, so the
/// legacy restart's quarantine passes within the run).
const CONFIG: &str = "max_ttl_ms = 3000\ndefault_ttl_ms = 3000\nlegacy_ttl_ms = 3000\nbackend_timeout_ms = 500\n";

/// How many more acquisitions every group must make between two steps of the schedule.
const STEP: u64 = 15;

/// The most a run may take.
const LIMIT: Duration = Duration::from_secs(120);

fn compat_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("compat")
}

/// The legacy server: a single Redis; one that is restarted in the run keeps its data
/// (`appendfsync always`), as a production lock server that may restart should.
fn legacy_server(persistent: bool) -> RedisServer {
    if persistent {
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    } else {
        RedisServer::start()
    }
}

fn bridged(legacy: &RedisServer) -> String {
    format!(
        "{CONFIG}legacy_backend = \"{}\"\nlegacy_keys = [\"lock:*\"]\n",
        legacy.url()
    )
}

/// The rollout's client program, running; its progress lines arrive on `lines`.
struct Rollout {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    last: HashMap<String, u64>,
    overlaps: u64,
}

impl Rollout {
    fn start(legacy: u16, proxies: &[u16]) -> Rollout {
        let python = compat_dir().join(".venv").join("bin").join("python");
        assert!(
            python.exists(),
            "{} is missing: run `bash tests/compat/setup.sh`",
            python.display()
        );
        let ports: Vec<String> = proxies.iter().map(u16::to_string).collect();
        let mut child = Command::new(python)
            .arg("migration.py")
            .arg(legacy.to_string())
            .arg(ports.join(","))
            .current_dir(compat_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start migration.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Rollout {
            child,
            stdin,
            lines,
            last: HashMap::new(),
            overlaps: 0,
        }
    }

    /// Reads progress until every group made `more` acquisitions since `from`, or `until`
    /// says to stop (it sees the overlaps so far); panics after `limit`.
    fn progress(&mut self, more: u64, limit: Duration, until: impl Fn(u64) -> bool) -> HashMap<String, u64> {
        let from = self.last.clone();
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no progress within {limit:?}: {:?}", self.last));
            let Some(json) = line.strip_prefix("progress ") else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(json).expect("progress json");
            self.overlaps = v["overlaps"].as_u64().unwrap_or(0);
            self.last = v["counts"]
                .as_object()
                .map(|m| m.iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0))).collect())
                .unwrap_or_default();
            let groups = 4 + 2 * 2;
            let advanced = self.last.len() == groups
                && self
                    .last
                    .iter()
                    .all(|(k, n)| *n >= from.get(k).copied().unwrap_or(0) + more);
            if advanced || until(self.overlaps) {
                return self.last.clone();
            }
        }
    }

    /// Stops the clients: their last counts, overlaps and errors.
    fn finish(mut self) -> serde_json::Value {
        let _ = writeln!(self.stdin, "stop");
        let deadline = Instant::now() + Duration::from_secs(30);
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).expect("the result line");
            if let Some(json) = line.strip_prefix("result ") {
                break serde_json::from_str(json).expect("result json");
            }
        };
        let _ = self.child.wait();
        result
    }
}

/// Waits (up to 10 s) until `PROXY LEGACY` shows the legacy member in `state`.
fn until_legacy_state(proxy: &ProxyProcess, state: &str) {
    let mut c = proxy.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = format!("{:?}", support::query(&mut c, &["PROXY", "LEGACY"]));
        if lines.contains(&format!("state={state}")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the legacy member never became {state}: {lines}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn old_and_new_code_exclude_each_other_through_the_bridge_across_a_legacy_restart_and_a_master_kill() {
    let mut servers = masters(3);
    let mut legacy = legacy_server(true);
    let config = bridged(&legacy);
    let (a, metrics_a) = proxy_with_metrics(&urls(&servers), &config);
    let b = ProxyProcess::start(&urls(&servers), &config);
    let mut run = Rollout::start(legacy.port, &[a.port, b.port]);
    let started = Instant::now();
    // Every group holds the locks in turn before any fault.
    run.progress(STEP, LIMIT, |_| false);
    // The legacy server restarts (kill -9; its append-only file keeps every lock written there).
    // The proxies see a new run_id and quarantine it (rule 8): nothing on a bridged key is
    // granted until it ends, and the old code carries on alone.
    legacy.restart_keeping_data();
    until_legacy_state(&a, "quarantined");
    run.progress(STEP, LIMIT, |_| false);
    // A master dies for good: two of three still grant.
    servers[0].kill();
    run.progress(STEP, LIMIT, |_| false);
    let result = run.finish();
    println!(
        "bridged run: {:.1} s, counts {}",
        started.elapsed().as_secs_f64(),
        result["counts"]
    );
    assert_eq!(
        result["overlap_count"], 0,
        "overlaps with the bridge: {}\nerrors: {}",
        result["overlaps"], result["errors"]
    );
    // The two sides met: the old code's locks refused the proxies' clients.
    let refusals = total(&scrape(metrics_a), "redlock_legacy_refusals_total");
    assert!(refusals > 0.0, "no acquisition was refused by an old-code lock");
    let legacy_lines = support::query(&mut a.client(), &["PROXY", "LEGACY"]);
    println!("PROXY LEGACY: {legacy_lines:?}");
}

#[test]
fn without_the_bridge_old_and_new_code_both_hold_the_lock() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let a = ProxyProcess::start(&urls(&servers), CONFIG);
    let b = ProxyProcess::start(&urls(&servers), CONFIG);
    let mut run = Rollout::start(legacy.port, &[a.port, b.port]);
    // Each side sees only its own server: it takes little for two holders to meet.
    run.progress(u64::MAX / 2, Duration::from_secs(60), |overlaps| overlaps > 0);
    let result = run.finish();
    let overlaps = result["overlap_count"].as_u64().unwrap_or(0);
    println!("control run: {overlaps} overlaps, counts {}", result["counts"]);
    assert!(overlaps > 0, "the control found no overlap: {result}");
}

#[test]
fn a_node_client_on_the_legacy_server_and_node_clients_of_the_proxies_never_hold_at_once() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let config = bridged(&legacy);
    let (a, metrics_a) = proxy_with_metrics(&urls(&servers), &config);
    let b = ProxyProcess::start(&urls(&servers), &config);
    let manifest = compat_dir().join("node_modules").join("ioredis").join("package.json");
    assert!(
        manifest.exists(),
        "ioredis is not installed: run `bash tests/compat/setup.sh`"
    );
    let out = Command::new("node")
        .arg("migration_node.js")
        .arg(legacy.port.to_string())
        .arg(format!("{},{}", a.port, b.port))
        .arg("4")
        .current_dir(compat_dir())
        .output()
        .expect("run node (install Node.js, then `bash tests/compat/setup.sh`)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "migration_node.js failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = stdout
        .lines()
        .find_map(|l| l.strip_prefix("result "))
        .expect("a result line");
    let result: serde_json::Value = serde_json::from_str(json).expect("result json");
    println!("node run: {result}");
    assert_eq!(result["doubleHolds"], 0, "double holds: {result}");
    for who in ["old-1", "old-2", "new-0", "new-1"] {
        assert!(
            result["counts"][who].as_u64().unwrap_or(0) > 0,
            "{who} never held the lock: {result}"
        );
    }
    let refusals = total(&scrape(metrics_a), "redlock_legacy_refusals_total");
    assert!(refusals > 0.0, "no acquisition was refused by an old-code lock");
}

/// A direct command on a server.
fn on(server: &RedisServer, args: &[&str]) -> Value {
    query(&mut server.client(), args).expect("direct command")
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[test]
fn a_grant_is_held_on_the_legacy_server_in_the_form_the_client_wrote_and_released_there() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let proxy = ProxyProcess::start(&urls(&servers), &bridged(&legacy));
    let mut c = proxy.client();
    // SET NX PX: the token, with the TTL, on the legacy server too.
    assert_eq!(
        query(&mut c, &["SET", "lock:a", "tok-a", "NX", "PX", "2000"]),
        Ok(Value::Okay)
    );
    assert_eq!(on(&legacy, &["GET", "lock:a"]), bulk("tok-a"));
    let Value::Int(pttl) = on(&legacy, &["PTTL", "lock:a"]) else {
        panic!("PTTL")
    };
    assert!((1..=2000).contains(&pttl), "{pttl}");
    // The release script deletes it there too.
    let release = r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;
    assert_eq!(
        query(&mut c, &["EVAL", release, "1", "lock:a", "tok-a"]),
        Ok(Value::Int(1))
    );
    assert_eq!(on(&legacy, &["EXISTS", "lock:a"]), Value::Int(0));
    // The legacy server's script cache flushed (as by a restart): the take is sent by source.
    on(&legacy, &["SCRIPT", "FLUSH"]);
    // SETNX: the expiry-timestamp value the old code reads, with legacy_ttl_ms.
    assert_eq!(
        query(&mut c, &["SETNX", "lock:b", "1764370000.5:new"]),
        Ok(Value::Int(1))
    );
    assert_eq!(on(&legacy, &["GET", "lock:b"]), bulk("1764370000.5:new"));
    // DEL (the pattern's release) deletes it there too, and only the bridged keys it names.
    on(&legacy, &["SET", "cache:other-data", "kept"]);
    assert_eq!(query(&mut c, &["DEL", "lock:b", "cache:other-data"]), Ok(Value::Int(1)));
    assert_eq!(on(&legacy, &["EXISTS", "lock:b"]), Value::Int(0));
    assert_eq!(
        on(&legacy, &["GET", "cache:other-data"]),
        bulk("kept"),
        "an unbridged key touched"
    );
    // A key the bridge does not cover never reaches the legacy server.
    assert_eq!(
        query(&mut c, &["SET", "cache:c", "v", "NX", "PX", "2000"]),
        Ok(Value::Okay)
    );
    assert_eq!(on(&legacy, &["EXISTS", "cache:c"]), Value::Int(0));
    // Nor do the proxy's own keys (the fencing counters of a fenced lock).
    let Ok(Value::Int(_)) = query(&mut c, &["LOCK.ACQUIRE", "lock:f", "tok-f", "2000"]) else {
        panic!("LOCK.ACQUIRE")
    };
    assert_eq!(on(&legacy, &["GET", "lock:f"]), bulk("tok-f"));
    // A reentrant hold taken again finds its own token there: granted, and released there only
    // with its last hold.
    for _ in 0..2 {
        let Ok(Value::Int(_)) = query(&mut c, &["LOCK.ACQUIRE", "lock:r", "tok-r", "2000", "REENTRANT"]) else {
            panic!("LOCK.ACQUIRE REENTRANT")
        };
    }
    query(&mut c, &["LOCK.RELEASE", "lock:r", "tok-r"]).expect("release one hold");
    assert_eq!(
        on(&legacy, &["GET", "lock:r"]),
        bulk("tok-r"),
        "still held: one hold left"
    );
    query(&mut c, &["LOCK.RELEASE", "lock:r", "tok-r"]).expect("release the last hold");
    assert_eq!(on(&legacy, &["EXISTS", "lock:r"]), Value::Int(0));
    let Value::Array(keys) = on(&legacy, &["KEYS", "redlock-proxy:*"]) else {
        panic!("KEYS")
    };
    assert!(keys.is_empty(), "the proxy's own keys on the legacy server: {keys:?}");
}

#[test]
fn a_lock_the_old_code_holds_refuses_the_proxy_leaves_the_masters_clean_and_shows_as_the_legacy_servers() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let (proxy, metrics) = proxy_with_metrics(&urls(&servers), &bridged(&legacy));
    let mut c = proxy.client();
    // An equal value is not the proxy client's: old code writing the same timestamp holds its
    // own lock, and the client's SET NX is refused, as on a single Redis (rule 5a).
    on(&legacy, &["SETNX", "lock:same", "1764370000"]);
    assert_eq!(query(&mut c, &["SETNX", "lock:same", "1764370000"]), Ok(Value::Int(0)));
    assert_eq!(
        query(&mut c, &["SET", "lock:same", "1764370000", "NX", "PX", "2000"]),
        Ok(Value::Nil)
    );
    assert_eq!(
        on(&legacy, &["PTTL", "lock:same"]),
        Value::Int(-1),
        "the old code's key untouched"
    );
    // The old code's SETNX-pattern lock: an expiry timestamp, no TTL.
    on(&legacy, &["SETNX", "lock:old", "4102444800:old"]);
    assert_eq!(
        query(&mut c, &["SET", "lock:old", "t", "NX", "PX", "2000"]),
        Ok(Value::Nil)
    );
    assert_eq!(query(&mut c, &["SETNX", "lock:old", "t"]), Ok(Value::Int(0)));
    // The masters granted, then undid (rule 5): nothing left there.
    for server in &servers {
        assert_eq!(server.get("lock:old"), None);
    }
    // The old code's value, for the pattern's staleness check, and LOCK.INFO says where.
    assert_eq!(query(&mut c, &["GET", "lock:old"]), Ok(bulk("4102444800:old")));
    let info = format!("{:?}", query(&mut c, &["LOCK.INFO", "lock:old"]));
    assert!(
        info.contains("held_by") && info.contains("legacy") && info.contains("4102444800:old"),
        "{info}"
    );
    // A stale one (its timestamp past) is stolen through the proxy at most once.
    on(&legacy, &["SET", "lock:stale", "1000:old"]);
    let mut d = proxy.client();
    assert_eq!(
        query(&mut c, &["GETSET", "lock:stale", "4102444800:c"]),
        Ok(bulk("1000:old"))
    );
    // The second sees the first's value, not the stale one: it did not win.
    assert_eq!(
        query(&mut d, &["GETSET", "lock:stale", "4102444800:d"]),
        Ok(bulk("4102444800:c"))
    );
    // PROXY LEGACY names the old code's lock within a watch round.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines = format!("{:?}", query(&mut c, &["PROXY", "LEGACY"]));
        if lines.contains("old code holds db=0 key=lock:old pttl_ms=-1") {
            break;
        }
        assert!(Instant::now() < deadline, "{lines}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The status page shows it too, by key (never by value: a value is a lock's token).
    let status = status_json(metrics);
    let legacy_view = &status["legacy"];
    assert_eq!(legacy_view["state"], "up", "{legacy_view}");
    let keys: Vec<&str> = legacy_view["old_code_keys"]
        .as_array()
        .expect("old_code_keys")
        .iter()
        .filter_map(|k| k["key"].as_str())
        .collect();
    assert!(keys.contains(&"lock:old"), "{legacy_view}");
    assert!(
        !legacy_view.to_string().contains("4102444800"),
        "a value on the page: {legacy_view}"
    );
}

/// `/status.json` of the proxy with its page on `port`.
fn status_json(port: u16) -> serde_json::Value {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("status page");
    s.write_all(b"GET /status.json HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut response = String::new();
    std::io::Read::read_to_string(&mut s, &mut response).expect("response");
    let (_, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    serde_json::from_str(body).expect("status.json is JSON")
}

#[test]
fn an_attempt_the_masters_refuse_is_undone_on_the_legacy_server_and_a_silent_one_fails_closed() {
    let servers = masters(3);
    let mut legacy = legacy_server(false);
    let proxy = ProxyProcess::start(&urls(&servers), &bridged(&legacy));
    let mut c = proxy.client();
    // Another holder on two masters: the attempt is refused, and its write on the legacy
    // server is taken back (rule 5a: by its token and expiry).
    servers[0].set("lock:m", "other");
    servers[1].set("lock:m", "other");
    assert_eq!(
        query(&mut c, &["SET", "lock:m", "t", "NX", "PX", "2000"]),
        Ok(Value::Nil)
    );
    assert_eq!(on(&legacy, &["EXISTS", "lock:m"]), Value::Int(0));
    // The legacy server gone: nothing bridged is granted, and the client is told why.
    legacy.kill();
    let refused = query(&mut c, &["SET", "lock:n", "t", "NX", "PX", "2000"]).expect_err("NOQUORUM");
    assert_eq!(refused.code(), Some("NOQUORUM"), "{refused}");
    assert!(refused.to_string().contains("legacy member"), "{refused}");
    for server in &servers {
        assert_eq!(server.get("lock:n"), None, "undone on the masters");
    }
    // Keys it does not bridge are granted as ever.
    assert_eq!(
        query(&mut c, &["SET", "cache:n", "t", "NX", "PX", "2000"]),
        Ok(Value::Okay)
    );
}

#[test]
fn a_session_lock_the_old_code_takes_over_on_the_legacy_server_is_told_lost_at_once() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let proxy = ProxyProcess::start(&urls(&servers), &bridged(&legacy));
    let mut holder = Resp3::connect(&proxy);
    // A session lock: kept alive while the connection is open, on the legacy server too.
    let granted = holder.call(&["SET", "lock:s", "me", "NX"]);
    assert!(format!("{granted:?}").contains("OK"), "{granted:?}");
    // The old code takes the key there (as after the legacy server lost it): the next
    // extension finds another value, and the holder is told at once.
    on(&legacy, &["SET", "lock:s", "old", "PX", "60000"]);
    let push = holder.next();
    assert_eq!(push_items(&push), ["lock-lost", "lock:s", "me", "lost-on-legacy"]);
}

#[test]
fn a_waiter_through_the_proxy_gets_the_lock_once_the_old_codes_lock_on_the_legacy_server_ends() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let proxy = ProxyProcess::start(&urls(&servers), &bridged(&legacy));
    let mut c = proxy.client();
    // The old code holds it for 600 ms on the legacy server; the masters know nothing of it.
    on(&legacy, &["SET", "lock:w", "old", "PX", "600"]);
    let asked = Instant::now();
    let token = query(&mut c, &["LOCK.ACQUIRE", "lock:w", "new", "2000", "WAIT", "3000"]).expect("LOCK.ACQUIRE");
    let waited = asked.elapsed();
    assert!(matches!(token, Value::Int(_)), "not granted within the wait: {token:?}");
    // Not before the old code's lock ended there, and not long after (its PTTL told when).
    assert!(
        waited >= Duration::from_millis(500),
        "granted while the old code held it: {waited:?}"
    );
    assert!(waited < Duration::from_millis(2000), "granted {waited:?} after asking");
    assert_eq!(on(&legacy, &["GET", "lock:w"]), bulk("new"));
}

#[test]
fn a_transaction_on_bridged_keys_runs_on_the_legacy_server_too_and_one_on_mixed_keys_is_refused() {
    let servers = masters(3);
    let legacy = legacy_server(false);
    let proxy = ProxyProcess::start(&urls(&servers), &bridged(&legacy));
    let mut c = proxy.client();
    assert_eq!(
        query(&mut c, &["SET", "lock:t", "tok", "NX", "PX", "2000"]),
        Ok(Value::Okay)
    );
    // The .NET client's release: WATCH, GET, MULTI, DEL, EXEC.
    assert_eq!(query(&mut c, &["WATCH", "lock:t"]), Ok(Value::Okay));
    assert_eq!(query(&mut c, &["GET", "lock:t"]), Ok(bulk("tok")));
    assert_eq!(query(&mut c, &["MULTI"]), Ok(Value::Okay));
    query(&mut c, &["DEL", "lock:t"]).expect("DEL queued");
    assert_eq!(query(&mut c, &["EXEC"]), Ok(Value::Array(vec![Value::Int(1)])));
    assert_eq!(on(&legacy, &["EXISTS", "lock:t"]), Value::Int(0), "released there too");
    // A write with a TTL in a transaction is written there too.
    assert_eq!(query(&mut c, &["MULTI"]), Ok(Value::Okay));
    query(&mut c, &["SET", "lock:t", "tok2", "PX", "2000"]).expect("SET queued");
    assert_eq!(query(&mut c, &["EXEC"]), Ok(Value::Array(vec![Value::Okay])));
    assert_eq!(on(&legacy, &["GET", "lock:t"]), bulk("tok2"));
    // One naming a bridged key and another is refused: it would touch the legacy server beyond
    // the lock keys.
    assert_eq!(query(&mut c, &["MULTI"]), Ok(Value::Okay));
    query(&mut c, &["DEL", "lock:t"]).expect("DEL queued");
    query(&mut c, &["DEL", "cache:t"]).expect("DEL queued");
    let refused = query(&mut c, &["EXEC"]).expect_err("mixed keys");
    assert!(refused.to_string().contains("bridged"), "{refused}");
    assert_eq!(on(&legacy, &["GET", "lock:t"]), bulk("tok2"), "nothing ran");
}
