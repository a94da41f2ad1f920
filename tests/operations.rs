//! What operators see: Prometheus metrics after traffic, INFO sections, PROXY admin
//! commands, `--check-config`, JSON logs.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use support::{ProxyProcess, free_port, masters, query as cmd, scrape, urls};

#[test]
fn metrics_endpoint_serves_the_series_after_traffic() {
    let servers = masters(3);
    let metrics_port = free_port();
    let config = format!("metrics_listen = \"127.0.0.1:{metrics_port}\"\nrequirepass = \"pw\"");
    let proxy = ProxyProcess::start(&urls(&servers), &config);
    let mut c = redis::Client::open(format!("redis://:pw@127.0.0.1:{}", proxy.port))
        .unwrap()
        .get_connection()
        .unwrap();
    cmd(&mut c, &["SET", "lock:m", "t", "NX", "PX", "10000"]).unwrap();
    cmd(&mut c, &["SET", "lock:m", "u", "NX", "PX", "10000"]).unwrap();
    let release = r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;
    cmd(&mut c, &["EVAL", release, "1", "lock:m", "t"]).unwrap();
    cmd(&mut c, &["PEXPIRE", "lock:none", "1000"]).unwrap();
    let mut wrong = proxy.raw();
    wrong.write_all(b"AUTH nope\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&mut wrong).read_line(&mut line).unwrap();
    assert!(line.starts_with("-WRONGPASS"));
    // The state gauges are refreshed every 250 ms: wait for them rather than for a time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut body = scrape(metrics_port);
    while !body.contains("redlock_backend_state{") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        body = scrape(metrics_port);
    }
    for series in [
        "redlock_commands_total{command=\"set_nx\",outcome=\"acquired\"} 1",
        "redlock_commands_total{command=\"set_nx\",outcome=\"contended\"} 1",
        "redlock_commands_total{command=\"eval\",outcome=\"ok\"} 1",
        "redlock_acquire_seconds_bucket{le=",
        "redlock_release_seconds_count 1",
        "redlock_extend_seconds_count 1",
        "redlock_backend_request_seconds_bucket{backend=\"127.0.0.1:",
        "redlock_backend_state{backend=\"127.0.0.1:",
        "redlock_backend_quarantine_remaining_seconds{backend=",
        "redlock_client_connections",
        "redlock_auth_failures_total 1",
    ] {
        assert!(body.contains(series), "missing {series} in:\n{body}");
    }
    assert!(!body.contains("pw"), "a password leaked into the metrics");
}

#[test]
fn info_sections_and_admin_commands() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "requirepass = \"s3cret\"");
    let mut c = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}", proxy.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").query(&mut c).unwrap();
    for section in ["# Server", "# Clients", "# Stats", "# Backends", "# Quorum"] {
        assert!(info.contains(section), "INFO lacks {section}");
    }
    assert!(info.contains("quorum:2") && info.contains("backends:3"), "{info}");
    assert_eq!(info.matches(",state=up,run_id=").count(), 3, "{info}");
    assert!(!info.contains("s3cret"), "INFO shows the password");

    let config: String = redis::cmd("PROXY").arg("CONFIG").query(&mut c).unwrap();
    assert!(
        config.contains("requirepass = \"***\"") && !config.contains("s3cret"),
        "{config}"
    );
    let lines: Vec<String> = redis::cmd("PROXY").arg("BACKENDS").query(&mut c).unwrap();
    assert_eq!(lines.len(), 3);

    // An operator quarantines two of three masters: no quorum until lifted.
    for i in ["0", "1"] {
        let _: () = redis::cmd("PROXY").arg("QUARANTINE").arg(i).query(&mut c).unwrap();
    }
    let info: String = redis::cmd("INFO").arg("backends").query(&mut c).unwrap();
    assert_eq!(info.matches("state=quarantined").count(), 2, "{info}");
    let err = cmd(&mut c, &["SET", "lock:o", "t", "NX", "PX", "1000"]).unwrap_err();
    assert_eq!(err.code(), Some("NOQUORUM"));
    let _: () = redis::cmd("PROXY")
        .arg("QUARANTINE")
        .arg(format!("127.0.0.1:{}", servers[0].port))
        .arg("LIFT")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        cmd(&mut c, &["SET", "lock:o", "t", "NX", "PX", "1000"]).unwrap(),
        redis::Value::Okay
    );
    let err = cmd(&mut c, &["PROXY", "QUARANTINE", "9"]).unwrap_err();
    assert!(err.to_string().contains("no such backend"), "{err}");
}

#[test]
fn check_config_names_each_member_kind() {
    let config = "backends = [\"redis+sentinel://u:secret@10.0.0.1:26379,10.0.0.2:26379/locks\", \
                  \"redis://10.0.0.3:6379\", \"redis+cluster://u:secret@10.0.0.5:6379,10.0.0.6:6379\"]\n";
    let (code, stdout, stderr) = check_config(config);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("member 0: Sentinel group 'locks' (2 Sentinels: 10.0.0.1:26379, 10.0.0.2:26379)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("member 1: single master redis://10.0.0.3:6379"),
        "{stderr}"
    );
    assert!(
        stderr.contains("member 2: Redis Cluster (seeds: 10.0.0.5:6379, 10.0.0.6:6379)"),
        "{stderr}"
    );
    assert!(!stdout.contains("secret") && stdout.contains("u:***@"), "{stdout}");
    assert!(!stderr.contains("secret"), "{stderr}");
    let (code, _, stderr) = check_config("backends = [\"redis+cluster://10.0.0.5:6379/3\"]\n");
    assert_ne!(code, 0, "a cluster has database 0 only");
    assert!(stderr.contains("database 0 only"), "{stderr}");
}

/// Runs `redlock-proxy --check-config` on a config text; returns (exit code, stdout, stderr).
fn check_config(text: &str) -> (i32, String, String) {
    let path = std::env::temp_dir().join(format!("redlock-check-{}-{}.toml", std::process::id(), free_port()));
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .arg("--config")
        .arg(&path)
        .arg("--check-config")
        .output()
        .expect("run --check-config");
    let _ = std::fs::remove_file(&path);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_catches_each_misconfiguration() {
    let (code, stdout, stderr) =
        check_config("backends = [\"redis://u:hunter2@127.0.0.1:1\"]\nrequirepass = \"hunter2\"");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("listen = \"127.0.0.1:7379\"") && !stdout.contains("hunter2"),
        "{stdout}"
    );
    assert!(stderr.contains("configuration OK"));
    // The session lock bounds, and the keepalive load they allow.
    assert!(
        stderr.contains("session locks: at most 100 per connection, 1000 per user, 10000 in all; their keepalives at most 30000 requests/s per master (300 for one connection's)"),
        "{stderr}"
    );
    let (code, _, stderr) = check_config("min_keepalive_ttl_ms = 50000");
    assert_eq!(code, 2);
    assert!(stderr.contains("min_keepalive_ttl_ms"), "{stderr}");

    let (code, _, stderr) = check_config("embedded_backends = 4");
    assert_eq!(code, 0);
    assert!(stderr.contains("warning: backends: 4 masters"), "{stderr}");

    let (_, _, stderr) = check_config("backend_timeout_ms = 5000");
    assert!(stderr.contains("warning: backend_timeout_ms"), "{stderr}");

    let (_, _, stderr) = check_config("drift_factor = 0.3");
    assert!(stderr.contains("warning: drift_factor"), "{stderr}");

    let (code, _, stderr) = check_config("drift_factor = 2.0");
    assert_eq!(code, 2);
    assert!(
        stderr.contains("drift_factor") && stderr.lines().count() == 1,
        "{stderr}"
    );

    // Rule 15: one server is never two quorum members, whatever the database or the name of
    // the loopback host.
    for backends in [
        r#""redis://:pw@h:6379/0", "redis://h:6379/1", "redis://h2:6379/0""#,
        r#""redis://h:6379", "redis://h2:6379", "redis://h:6379""#,
        r#""redis://localhost:7000", "redis://127.0.0.1:7000", "redis://h2:7000""#,
    ] {
        let (code, _, stderr) = check_config(&format!("backends = [{backends}]"));
        assert_eq!(code, 2, "{backends}: {stderr}");
        assert!(
            stderr.contains("backends: '") && stderr.contains("the same Redis server") && !stderr.contains("pw@"),
            "{stderr}"
        );
    }
}

/// `--check-config` prints the configuration on stdout and `configuration OK` on stderr; seen
/// together (a terminal, `2>&1`), the verdict is a line of its own after the configuration's
/// last line, also when `metrics_listen` (the last field when set) is absent.
#[test]
fn check_config_ends_the_config_before_configuration_ok() {
    let dir = std::env::temp_dir();
    let tag = format!("{}-{}", std::process::id(), free_port());
    let config = dir.join(format!("redlock-check-nl-{tag}.toml"));
    let combined = dir.join(format!("redlock-check-nl-{tag}.out"));
    // No metrics_listen, and no trailing newline in the file either.
    std::fs::write(&config, "embedded_backends = 3\nlog_format = \"text\"").expect("write config");
    let out = std::fs::File::create(&combined).expect("output file");
    let status = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .stdout(Stdio::from(out.try_clone().expect("clone output file")))
        .stderr(Stdio::from(out))
        .status()
        .expect("run --check-config");
    let text = std::fs::read_to_string(&combined).expect("read output");
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&combined);
    assert!(status.success(), "{text}");
    assert!(!text.contains("metrics_listen"), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"configuration OK"), "{text:?}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("configuration OK")).count(),
        1,
        "{text:?}"
    );
    assert!(text.ends_with("\nconfiguration OK\n"), "{text:?}");

    // stdout alone ends with a newline.
    let (code, stdout, stderr) = check_config("embedded_backends = 3");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.ends_with('\n') && !stdout.contains("metrics_listen"),
        "{stdout:?}"
    );
    assert_eq!(stderr.lines().last(), Some("configuration OK"), "{stderr:?}");
}

#[test]
fn json_logs_on_request() {
    let port = free_port();
    // Not in the repository, whose config.toml would be read (and its metrics port bound).
    let mut child = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .current_dir(std::env::temp_dir())
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
            "--log-level",
            "info",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    for line in [&first, &second] {
        assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
    }
    assert!(first.contains("\"level\":\"INFO\""), "{first}");
    assert!(
        first.contains("starting: built-in defaults (no --config, and no config.toml in the working directory")
            && first.contains("), 3 flag(s) over it"),
        "the first line says where the configuration came from: {first}"
    );
    assert!(second.contains("\"level\":\"WARN\""), "{second}");
    assert!(second.contains("EMBEDDED"), "{second}");
}

/// Item 8b of the issue: the startup quarantine of a master first seen young runs from the
/// master's start, so every proxy computes the same end. It ran from each proxy's own start:
/// masters up for 7 s were quarantined for the full 303 s, and a proxy started a minute later
/// let the same master vote a minute later.
#[test]
fn every_proxy_quarantines_a_young_master_until_the_same_end() {
    let servers = masters(3);
    let config = "quarantine = \"always\"\nmax_ttl_ms = 30000\ndefault_ttl_ms = 10000\nlegacy_ttl_ms = 30000";
    let remaining = |proxy: &ProxyProcess| -> u64 {
        let line = support::backend_line(proxy, 0);
        line.split(',')
            .find_map(|f| f.strip_prefix("quarantine_remaining_ms="))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("not quarantined: {line}"))
    };
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let first = ProxyProcess::start(&urls(&servers), config);
    let first_left = remaining(&first);
    // 30 s + drift, less the ~2 s the master has run.
    assert!(first_left < 29_500, "counted from this proxy's start: {first_left} ms");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let later = ProxyProcess::start(&urls(&servers), config);
    let (first_left, later_left) = (remaining(&first), remaining(&later));
    // Redis reports its uptime in whole seconds: the ends agree within about a second.
    assert!(
        first_left.abs_diff(later_left) < 1_200,
        "two proxies, two ends: {first_left} ms and {later_left} ms"
    );
}

/// Runs the binary with `args` in `dir`: (exit code, stdout, stderr).
fn run_in(dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run redlock-proxy");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh directory of its own under the temp dir.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("redlock-{name}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.canonicalize().expect("scratch dir path")
}

/// Which configuration is in force is never a guess: `--check-config` (and the start log)
/// names the file read, also the `config.toml` found in the working directory without
/// `--config`, and says when none was.
#[test]
fn check_config_names_the_file_it_read() {
    let dir = scratch_dir("which-config");
    let (code, _, stderr) = run_in(&dir, &["--check-config"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "configuration from built-in defaults (no --config, and no config.toml in the working directory {})",
            dir.display()
        )),
        "{stderr}"
    );
    std::fs::write(dir.join("config.toml"), "embedded_backends = 3\n").expect("write config");
    let (code, stdout, stderr) = run_in(&dir, &["--check-config"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("embedded_backends = 3"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "configuration from config file {}/config.toml (found in the working directory; --config names another",
            dir.display()
        )),
        "{stderr}"
    );
    std::fs::write(dir.join("other.toml"), "embedded_backends = 5\n").expect("write config");
    let (code, _, stderr) = run_in(&dir, &["--config", "other.toml", "--check-config"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "configuration from config file {}/other.toml\n",
            dir.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--metrics-listen off` (or `''`) turns off the listener a file turned on; a taken port
/// names the key and the file it came from.
#[test]
fn metrics_listen_off_and_a_taken_port_named() {
    let dir = scratch_dir("metrics-off");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let taken_port = taken.local_addr().expect("addr").port();
    std::fs::write(
        dir.join("config.toml"),
        format!("embedded_backends = 3\nmetrics_listen = \"127.0.0.1:{taken_port}\"\n"),
    )
    .expect("write config");
    for off in ["off", ""] {
        let (code, stdout, stderr) = run_in(&dir, &["--metrics-listen", off, "--check-config"]);
        assert_eq!(code, 0, "--metrics-listen '{off}': {stderr}");
        assert!(!stdout.contains("metrics_listen"), "--metrics-listen '{off}': {stdout}");
    }
    // Started for real with the listener off, it serves although the file's port is taken.
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .current_dir(&dir)
        .args(["--metrics-listen", "off", "--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !support::ping(port) {
        assert!(std::time::Instant::now() < deadline, "the proxy never answered");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    // With the file's listener on, the taken port fails the start, naming key and file.
    let (code, _, stderr) = run_in(&dir, &["--listen", &format!("127.0.0.1:{}", free_port())]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{taken_port} (`metrics_listen`)"))
            && stderr.contains(&format!(
                "(configuration from config file {}/config.toml",
                dir.display()
            )),
        "{stderr}"
    );
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A proxy process started by a test, killed when the test ends (also when it fails).
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary over `servers` with `args` (`--quarantine restarts` unless they set
/// it), its stderr going to `stderr`, and waits until it answers on `port`.
fn start_logging(servers: &[support::RedisServer], port: u16, args: &[&str], stderr: Stdio) -> Started {
    let mut all: Vec<String> = vec!["--listen".into(), format!("127.0.0.1:{port}")];
    if !args.contains(&"--quarantine") {
        all.extend(["--quarantine".to_owned(), "restarts".to_owned()]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    for url in urls(servers) {
        all.extend(["--backend".to_owned(), url]);
    }
    let child = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .current_dir(std::env::temp_dir())
        .args(&all)
        .stderr(stderr)
        .spawn()
        .expect("start");
    let started = Started(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !support::ping(port) {
        assert!(std::time::Instant::now() < deadline, "the proxy never answered");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    started
}

/// The log in a file (stderr not a terminal) carries no colour codes.
#[test]
fn the_log_in_a_file_has_no_escape_codes() {
    let servers = masters(3);
    let dir = scratch_dir("log-file");
    let path = dir.join("proxy.log");
    let port = free_port();
    let file = std::fs::File::create(&path).expect("log file");
    let proxy = start_logging(&servers, port, &["--log-level", "info"], Stdio::from(file));
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("client");
    assert_eq!(
        cmd(&mut c, &["SET", "lock:log", "t", "NX", "PX", "1000"]),
        Ok(redis::Value::Okay)
    );
    drop(proxy);
    let log = std::fs::read_to_string(&path).expect("log");
    assert!(log.contains("redlock-proxy ready"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in the log file: {log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stderr nobody reads (a pipe, full at 64 KiB) never blocks the proxy: its log lines are
/// dropped (and counted), its clients answered. Each connection reset by its client logs a
/// line at `debug`; 20,000 of them fill the pipe and the proxy's backlog of 16,384 lines,
/// and a client is answered throughout.
#[test]
fn a_blocked_stderr_does_not_block_requests() {
    let servers = masters(3);
    let (port, metrics_port) = (free_port(), free_port());
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut proxy = start_logging(
        &servers,
        port,
        &["--log-level", "debug", "--metrics-listen", &metrics],
        Stdio::piped(),
    );
    // Held open, never read.
    let _unread = proxy.0.stderr.take();
    let mut client = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_secs(2)))
        .expect("client");
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .expect("timeout");
    for round in 0..20 {
        for _ in 0..1000 {
            let mut gone = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            gone.set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .expect("timeout");
            // Pipelined PINGs, one reply read, the others left unread: closing a socket with
            // unread data resets the connection, which the proxy logs (at `debug`).
            gone.write_all(&b"*1\r\n$4\r\nPING\r\n".repeat(2)).expect("write");
            let mut pong = [0u8; 7];
            std::io::Read::read_exact(&mut gone, &mut pong)
                .unwrap_or_else(|e| panic!("round {round}: no reply ({e}): the proxy is blocked"));
        }
        let token = format!("t{round}");
        assert_eq!(
            cmd(&mut client, &["SET", "lock:blocked-log", &token, "NX", "PX", "60000"]),
            Ok(redis::Value::Okay),
            "round {round}: the proxy stopped answering while its stderr was full"
        );
        assert_eq!(cmd(&mut client, &["DEL", "lock:blocked-log"]), Ok(redis::Value::Int(1)));
    }
    // The lines it could not write are counted (the counter is read every 5 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if support::total(&scrape(metrics_port), "redlock_log_lines_dropped_total") > 0.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no dropped log line counted");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `--help` names the flags as the README uses them: `--backend` (one master, repeatable),
/// never `--backends`.
#[test]
fn help_names_the_backend_flag_as_the_readme_does() {
    let (code, stdout, _) = run_in(&std::env::temp_dir(), &["--help"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains(" --backend ") && !stdout.contains("--backends"),
        "{stdout}"
    );
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md");
    assert!(readme.contains("--backend redis://"), "the README's flag");
}

/// The quoted lines of docs/operations.md's log table (`...`: what varies).
fn documented_log_lines() -> Vec<String> {
    let doc = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
        .expect("docs/operations.md");
    let mut lines = doc.lines().skip_while(|l| !l.starts_with("| line | level | when |"));
    assert!(lines.next().is_some(), "docs/operations.md has no log table");
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.split('|')
                .nth(1)
                .unwrap_or_default()
                .trim()
                .trim_matches('`')
                .to_owned()
        })
        .collect()
}

/// Whether `text` has the quoted `line`: its pieces between `...`, in order.
fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| {
        let mut rest = l;
        line.split("...")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .all(|piece| match rest.find(piece) {
                Some(at) => {
                    rest = &rest[at + piece.len()..];
                    true
                }
                None => false,
            })
    })
}

/// The proxy's source as its string literals read: a literal continued with `\` on the next
/// line is joined.
fn source_text() -> String {
    fn walk(dir: &std::path::Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).expect("src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source");
                let mut joined = String::new();
                let mut lines = text.lines();
                while let Some(line) = lines.next() {
                    let mut line = line.to_owned();
                    while let Some(head) = line.strip_suffix('\\') {
                        let next = lines.next().unwrap_or_default().trim_start();
                        line = format!("{head}{next}");
                    }
                    joined.push_str(&line);
                    joined.push('\n');
                }
                out.push_str(&joined);
            }
        }
    }
    let mut out = String::new();
    walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out
}

/// Every log line docs/operations.md quotes is one the proxy writes, word for word: a
/// proxy over three real masters goes through a start without a quorum, lifts, a quarantine
/// that ends, an operator's quarantine, a master killed and restarted, and a shutdown, and each
/// quoted line is found in its log. The lines no such run can produce (a client dropped, a
/// Sentinel failover, fencing that cannot start) are found in the code.
#[test]
fn the_log_lines_the_docs_quote_are_the_ones_the_proxy_writes() {
    const IN_THE_CODE_ONLY: [&str; 3] = [
        "client dropped: past",
        "failover: the master moved",
        "fencing cannot start",
    ];
    let mut servers = masters(3);
    let dir = scratch_dir("log-lines");
    let path = dir.join("proxy.log");
    let port = free_port();
    let file = std::fs::File::create(&path).expect("log file");
    let args = [
        "--log-level",
        "info",
        "--quarantine",
        "always",
        "--max-ttl-ms",
        "3000",
        "--default-ttl-ms",
        "1000",
        "--legacy-ttl-ms",
        "1000",
        "--backend-timeout-ms",
        "100",
        "--probe-interval-ms",
        "100",
    ];
    // Master 2 is down at start.
    servers[2].kill();
    let mut proxy = start_logging(&servers, port, &args, Stdio::from(file));
    let log = || std::fs::read_to_string(&path).expect("log");
    let until = |what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !has_line(&log(), what) {
            assert!(
                std::time::Instant::now() < deadline,
                "never logged {what:?}:\n{}",
                log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("client");
    // Fresh masters: quarantined at start, the third unreachable, no quorum. Two lifted: a
    // quorum again.
    until("only 0 of 3 masters vote");
    until("backend unreachable");
    for member in ["0", "1"] {
        assert_eq!(
            cmd(&mut c, &["PROXY", "QUARANTINE", member, "LIFT"]),
            Ok(redis::Value::Okay)
        );
    }
    until("quorum reached: 2 of 3 masters vote");
    // Lifting a master that is not quarantined is an error, and logs nothing.
    let lifts = log().matches("quarantine lifted by an operator").count();
    assert!(cmd(&mut c, &["PROXY", "QUARANTINE", "0", "LIFT"]).is_err());
    assert_eq!(log().matches("quarantine lifted by an operator").count(), lifts);
    // The third master starts: young, quarantined until its quarantine runs out.
    servers[2].restart();
    until("backend reachable; quarantined, it votes again in");
    until("backend's quarantine is over: up, it votes again");
    // Paused, it is down; resumed (the same run), up at once.
    servers[2].pause();
    until("backend down");
    servers[2].resume();
    until("backend up");
    // An operator's quarantine of 0 and master 1 killed: the quorum lost.
    assert_eq!(cmd(&mut c, &["PROXY", "QUARANTINE", "0"]), Ok(redis::Value::Okay));
    servers[1].kill();
    until("quorum lost: only 1 of 3 masters vote");
    until("backend connection lost");
    // Restarted (a new run id): quarantined; lifted with 0, a quorum again.
    servers[1].restart();
    until("backend restarted or failed over (new run_id): quarantined for");
    for member in ["0", "1"] {
        assert_eq!(
            cmd(&mut c, &["PROXY", "QUARANTINE", member, "LIFT"]),
            Ok(redis::Value::Okay)
        );
    }
    until("quorum reached: 3 of 3 masters vote");
    support::signal(proxy.0.id(), "-TERM");
    let _ = proxy.0.wait();
    // A start with a quorum, for its line.
    let second_path = dir.join("second.log");
    let second_file = std::fs::File::create(&second_path).expect("log file");
    let second = start_logging(
        &servers,
        free_port(),
        &["--log-level", "info"],
        Stdio::from(second_file),
    );
    let second_log = || std::fs::read_to_string(&second_path).expect("second log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !has_line(&second_log(), "redlock-proxy ready") {
        assert!(std::time::Instant::now() < deadline, "{}", second_log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(second);
    let written = log() + &second_log();
    let code = source_text();
    let quoted = documented_log_lines();
    assert!(quoted.len() >= 15, "{quoted:?}");
    for line in &quoted {
        if IN_THE_CODE_ONLY.iter().any(|only| line.starts_with(only)) {
            assert!(
                has_line(&code, line),
                "docs/operations.md quotes {line:?}, which no code writes"
            );
        } else {
            assert!(
                has_line(&written, line),
                "docs/operations.md quotes {line:?}, not in the log:\n{written}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
