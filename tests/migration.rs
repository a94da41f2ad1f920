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

use support::{ProxyProcess, RedisServer, masters, proxy_with_metrics, scrape, total, urls};

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
