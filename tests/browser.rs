//! The status page in a real browser: headless Chromium, driven by Selenium
//! (`tests/browser/status_page.py`), against a proxy over three real masters with one paused.
//!
//! Needs Debian's `chromium` and `chromium-driver`, and the pinned Selenium that
//! `tests/browser/setup.sh` installs; without them the test fails, never skips.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{ProxyProcess, RedisServer, free_port, masters, query, urls};

const SETUP_HINT: &str =
    "install the browser (`apt-get install -y chromium chromium-driver`), then run `tests/browser/setup.sh`";

/// How long one run of the browser script may take.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

const PASSWORD: &str = "page-pw-0d1e";
/// A lock's token: whoever has it can release the lock, so the page must never show it.
const TOKEN: &str = "tok-5b2e8a-secret";
/// A key a client chose, with markup in it: the page must show it as text.
const KEY: &str = "lock:<b>bold</b>&amp;\"q\"";

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("browser")
}

/// The virtualenv's python with Selenium, and the browser and its driver; fails otherwise.
fn require_browser() -> PathBuf {
    for tool in ["chromium", "chromedriver"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "`{tool} --version` does not run: {SETUP_HINT}");
    }
    let python = browser_dir().join(".venv").join("bin").join("python");
    assert!(python.exists(), "{} is missing: {SETUP_HINT}", python.display());
    let probe = Command::new(&python)
        .args(["-c", "import selenium"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): {SETUP_HINT}", python.display()));
    assert!(
        probe.status.success(),
        "Selenium is not installed in tests/browser/.venv ({}): {SETUP_HINT}",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
    python
}

/// Runs the browser script with `args`; fails the test with its output unless it exited 0.
fn run_script(python: &Path, args: &[String]) {
    let mut child = Command::new(python)
        .arg("status_page.py")
        .args(args)
        .current_dir(browser_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start status_page.py ({e})"));
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("script output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "status_page.py {args:?} failed ({})\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    println!("{stdout}");
}

fn name(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port)
}

/// The first fenced command assigns the fencing epochs, which needs every master to answer
/// within the backend timeout: on a loaded machine one may not, and a client retries.
fn fencing_ready(c: &mut redis::Connection) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(
        query(c, &["LOCK.ACQUIRE", "warm-up", "warm-up", "1000"]),
        Ok(redis::Value::Int(_))
    ) {
        assert!(Instant::now() < deadline, "no fencing token");
        std::thread::sleep(Duration::from_millis(20));
    }
    query(c, &["LOCK.RELEASE", "warm-up", "warm-up"]).expect("release the warm-up lock");
}

#[test]
fn status_page_in_a_browser_shows_a_paused_master_down() {
    let python = require_browser();
    let servers = masters(3);
    let port = free_port();
    let config = format!("metrics_listen = \"127.0.0.1:{port}\"\nrequirepass = \"{PASSWORD}\"\nmax_ttl_ms = 60000");
    let proxy = ProxyProcess::start(&urls(&servers), &config);
    let mut holder = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}", proxy.port))
        .unwrap()
        .get_connection()
        .unwrap();
    fencing_ready(&mut holder);
    let fence = query(&mut holder, &["LOCK.ACQUIRE", KEY, TOKEN, "5000", "KEEPALIVE"]);
    assert!(matches!(fence, Ok(redis::Value::Int(_))), "{fence:?}");
    servers[1].pause();

    let url = format!("http://127.0.0.1:{port}/");
    let screenshot = std::env::temp_dir().join(format!("redlock-proxy-status-{}.png", std::process::id()));
    let common = |extra: &[String]| -> Vec<String> {
        let mut args: Vec<String> = ["--url", &url, "--key", KEY, "--forbid", TOKEN, "--forbid", PASSWORD]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend_from_slice(extra);
        args
    };
    run_script(
        &python,
        &common(&[
            "--down".into(),
            name(&servers[1]),
            "--up".into(),
            name(&servers[0]),
            "--up".into(),
            name(&servers[2]),
            "--screenshot".into(),
            screenshot.display().to_string(),
        ]),
    );

    // A quarantine: shown, and counting down. The paused master comes back first, so the
    // session lock keeps a quorum of voters (0 and 1) while 2 is out and is still listed.
    servers[1].resume();
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = |c: &mut redis::Connection| match query(c, &["INFO", "backends"]) {
        Ok(redis::Value::BulkString(text)) => String::from_utf8_lossy(&text)
            .lines()
            .any(|l| l.starts_with("backend1:") && l.contains("state=up")),
        _ => false,
    };
    while !up(&mut holder) {
        assert!(Instant::now() < deadline, "master 1 never seen up again");
        std::thread::sleep(Duration::from_millis(20));
    }
    query(&mut holder, &["PROXY", "QUARANTINE", "2"]).unwrap();
    run_script(
        &python,
        &common(&[
            "--up".into(),
            name(&servers[1]),
            "--up".into(),
            name(&servers[0]),
            "--quarantined".into(),
            name(&servers[2]),
            "--screenshot".into(),
            screenshot.with_extension("quarantined.png").display().to_string(),
        ]),
    );
}
