//! The HTTP listener on `metrics_listen`: `/metrics` as before, the status page's JSON over
//! real masters (one paused), and requests it must refuse without ceasing to serve.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::sentinel::Group;
use support::shards::Cluster;
use support::{ProxyProcess, RedisServer, free_port, masters, query, urls};

/// A raw HTTP exchange: sends `request`, reads until the server closes.
fn exchange(port: u16, request: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("status listener");
    s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    s.write_all(request).expect("request");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("response");
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET path`: the status line, and the body.
fn get(port: u16, path: &str) -> (String, String) {
    let text = exchange(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    );
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// `/status.json`, parsed.
fn status(port: u16) -> (Value, String) {
    let (line, body) = get(port, "/status.json");
    assert_eq!(line, "HTTP/1.1 200 OK", "{body}");
    (serde_json::from_str(&body).expect("status.json is JSON"), body)
}

/// Polls `/status.json` until `ready` holds (at most 10 s).
fn status_when(port: u16, what: &str, ready: impl Fn(&Value) -> bool) -> (Value, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = status(port);
        if ready(&status) {
            return (status, body);
        }
        assert!(Instant::now() < deadline, "never {what}: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn state(status: &Value, index: usize) -> &str {
    status["masters"][index]["state"].as_str().unwrap_or_default()
}

/// The first fenced command assigns the fencing epochs, which needs every master to answer
/// within the backend timeout: on a loaded machine one may not, and a client retries
/// (`support::fencing_ready`, with this file's password).
fn fencing_ready(proxy: &ProxyProcess) {
    let mut c = client(proxy);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(
        query(&mut c, &["LOCK.ACQUIRE", "warm-up", "warm-up", "1000"]),
        Ok(redis::Value::Int(_))
    ) {
        assert!(Instant::now() < deadline, "no fencing token");
        std::thread::sleep(Duration::from_millis(20));
    }
    query(&mut c, &["LOCK.RELEASE", "warm-up", "warm-up"]).expect("release the warm-up lock");
}

fn config(metrics_port: u16) -> String {
    format!("metrics_listen = \"127.0.0.1:{metrics_port}\"\nrequirepass = \"s3cret-pass\"")
}

fn client(proxy: &ProxyProcess) -> redis::Connection {
    redis::Client::open(format!("redis://:s3cret-pass@127.0.0.1:{}", proxy.port))
        .and_then(|c| c.get_connection())
        .expect("connection to the proxy")
}

#[test]
fn metrics_are_prometheus_text_as_before() {
    let servers = masters(3);
    let port = free_port();
    let proxy = ProxyProcess::start(&urls(&servers), &config(port));
    let mut c = client(&proxy);
    query(&mut c, &["SET", "lock:m", "t", "NX", "PX", "10000"]).unwrap();
    let text = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("\r\nContent-Type: text/plain; version=0.0.4"), "{text}");
    for series in [
        "# TYPE redlock_commands_total counter",
        "redlock_commands_total{command=\"set_nx\",outcome=\"acquired\"} 1",
        "# TYPE redlock_acquire_seconds histogram",
        // The buckets are still the proxy's own (100 µs first), not the exporter's defaults.
        "redlock_acquire_seconds_bucket{le=\"0.0001\"}",
        "redlock_backend_request_seconds_bucket{backend=\"127.0.0.1:",
    ] {
        assert!(text.contains(series), "missing {series} in:\n{text}");
    }
    assert!(!text.contains("s3cret-pass"), "a password leaked into the metrics");
}

/// One master paused (SIGSTOP): the page shows it down, with why, and the others up; a
/// session lock's key with its waiter, the busiest key first, never its token nor its holder's
/// address; a lock lost under its holder; the configuration with every secret masked.
#[test]
fn status_shows_a_paused_master_down_and_locks_without_tokens() {
    let servers = masters(3);
    let port = free_port();
    let users = "\n[[users]]\nname = \"ops\"\npassword_sha256 = \"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\"\nadmin = true\n";
    let proxy = ProxyProcess::start(&urls(&servers), &(config(port) + users));
    let (up, _) = status_when(port, "every master up", |s| (0..3).all(|i| state(s, i) == "up"));
    assert_eq!(up["proxy"]["members"], 3);
    assert_eq!(up["proxy"]["quorum"], 2);
    assert_eq!(up["masters"][1]["name"], format!("127.0.0.1:{}", servers[1].port));
    assert!(
        up["masters"][0]["run_id"].as_str().is_some_and(|r| r.len() == 40),
        "{up}"
    );

    const TOKEN: &str = "tok-7f3a9c1e-never-shown";
    fencing_ready(&proxy);
    // Session locks: held while their connection stays open.
    let mut holder = client(&proxy);
    let fence = query(&mut holder, &["LOCK.ACQUIRE", "lock:busy", TOKEN, "5000", "KEEPALIVE"]);
    assert!(matches!(fence, Ok(redis::Value::Int(_))), "{fence:?}");
    query(&mut holder, &["LOCK.ACQUIRE", "lock:quiet", TOKEN, "5000", "KEEPALIVE"]).unwrap();
    // A request waiting for lock:busy: that key is the busiest.
    let waiter_port = proxy.port;
    let waiter = std::thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://:s3cret-pass@127.0.0.1:{waiter_port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        query(
            &mut c,
            &["LOCK.ACQUIRE", "lock:busy", "other-token", "5000", "WAIT", "20000"],
        )
    });
    // A session lock lost under its holder: another connection deletes its key.
    query(&mut holder, &["SET", "lock:lost", TOKEN, "NX"]).unwrap();
    let mut other = client(&proxy);
    query(&mut other, &["DEL", "lock:lost"]).unwrap();

    servers[0].pause();
    let (s, body) = status_when(port, "the paused master down, its key waited for", |s| {
        state(s, 0) == "down"
            && s["locks"]["keys"][0]["waiting"] == 1
            && s["lost"].as_array().is_some_and(|l| !l.is_empty())
    });
    assert_eq!(state(&s, 1), "up", "{body}");
    assert_eq!(state(&s, 2), "up", "{body}");
    assert_eq!(s["proxy"]["up"], 2, "{body}");
    assert!(
        s["masters"][0]["why"].as_str().is_some_and(|w| w.contains("timed out")),
        "why it is down: {body}"
    );
    assert!(s["masters"][1]["why"].is_null(), "{body}");

    let keys = s["locks"]["keys"].as_array().expect("keys");
    assert_eq!(keys[0]["key"], "lock:busy", "the busiest key first: {body}");
    assert_eq!(keys[0]["held"], true);
    assert!(keys[0]["client_id"].is_u64(), "{body}");
    assert!(
        keys.iter().any(|k| k["key"] == "lock:quiet" && k["waiting"] == 0),
        "{body}"
    );
    assert!(keys.iter().all(|k| k["key"] != "lock:lost"), "{body}");
    assert_eq!(s["locks"]["waiting_total"], 1, "{body}");
    assert_eq!(s["proxy"]["session_locks"], 2, "{body}");
    let lost = &s["lost"][0];
    assert_eq!(lost["key"], "lock:lost", "{body}");
    assert_eq!(lost["reason"], "deleted", "{body}");

    // Never a token, a client's address, or a secret.
    assert!(!body.contains(TOKEN), "a token is on the page: {body}");
    assert!(!body.contains("other-token"), "a token is on the page: {body}");
    assert!(!body.contains("s3cret-pass"), "a password is on the page: {body}");
    assert!(
        !body.contains("5e884898da28"),
        "a password digest is on the page: {body}"
    );
    assert!(!body.contains("\"client_addr\""), "{body}");
    let config = s["config"].as_str().expect("config");
    assert!(config.contains("requirepass = \"***\""), "{config}");
    assert!(config.contains("backend_timeout_ms = 50"), "{config}");
    // The holder's connection's local port is the address the proxy saw: not on the page.
    let holder_port = local_ports(&proxy);
    assert!(!holder_port.is_empty(), "the clients' ports are known");
    assert!(
        !holder_port.iter().any(|p| body.contains(&format!("127.0.0.1:{p}"))),
        "{body}"
    );

    // Released: the waiter gets it.
    query(&mut holder, &["LOCK.RELEASE", "lock:busy", TOKEN]).unwrap();
    let granted = waiter.join().expect("waiter thread");
    assert!(matches!(granted, Ok(redis::Value::Int(_))), "{granted:?}");
    servers[0].resume();
}

/// The ports of this test's connections to the proxy (the clients' addresses the proxy
/// sees), read from the kernel's table of TCP sockets.
fn local_ports(proxy: &ProxyProcess) -> Vec<u16> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let target = format!("{:04X}", proxy.port);
    tcp.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let remote = fields.next()?;
            (remote.ends_with(&format!(":{target}")))
                .then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())
                .flatten()
        })
        .collect()
}

#[test]
fn quarantine_shows_its_reason_and_time_left() {
    let servers = masters(3);
    let port = free_port();
    let proxy = ProxyProcess::start(&urls(&servers), &(config(port) + "\nmax_ttl_ms = 60000"));
    status_when(port, "every master up", |s| (0..3).all(|i| state(s, i) == "up"));
    let mut c = client(&proxy);
    query(&mut c, &["PROXY", "QUARANTINE", "2"]).unwrap();
    let (s, body) = status(port);
    assert_eq!(state(&s, 2), "quarantined", "{body}");
    let left = s["masters"][2]["quarantine_remaining_ms"].as_u64().expect("time left");
    assert!(left > 50_000 && left <= 60_700, "{body}");
    assert!(
        s["masters"][2]["why"].as_str().is_some_and(|w| w.contains("operator")),
        "{body}"
    );
    assert!(s["masters"][0]["quarantine_remaining_ms"].is_null(), "{body}");
}

/// A Sentinel group's member shows the master the Sentinels name now; a cluster member shows
/// each shard master with its slots and state.
#[test]
fn sentinel_master_and_cluster_shards_are_shown() {
    let group = Group::start();
    let cluster = Cluster::start(3, false);
    let plain = RedisServer::start();
    let port = free_port();
    let _proxy = ProxyProcess::start(&[group.sentinel.url(), cluster.url(), plain.url()], &config(port));
    let (s, body) = status_when(port, "every member up", |s| (0..3).all(|i| state(s, i) == "up"));
    let sentinel = &s["masters"][0];
    assert_eq!(sentinel["kind"], "sentinel", "{body}");
    assert_eq!(sentinel["master"], format!("127.0.0.1:{}", group.master.port), "{body}");
    let member = &s["masters"][1];
    assert_eq!(member["kind"], "cluster", "{body}");
    assert!(member["master"].is_null(), "{body}");
    let shards = member["shards"].as_array().expect("shards");
    let mut shown: Vec<u64> = shards
        .iter()
        .map(|shard| {
            assert_eq!(shard["state"], "up", "{body}");
            let master = shard["master"].as_str().expect("shard master");
            master.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port")
        })
        .collect();
    shown.sort_unstable();
    let mut ports: Vec<u64> = cluster.master_ports().into_iter().map(u64::from).collect();
    ports.sort_unstable();
    assert_eq!(shown, ports, "{body}");
    let slots: u64 = shards
        .iter()
        .map(|shard| shard["slot_count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(slots, 16384, "{body}");
    assert_eq!(s["masters"][2]["kind"], "redis", "{body}");
    assert!(s["masters"][2]["shards"].is_null(), "{body}");
}

#[test]
fn bad_requests_are_refused_and_the_listener_keeps_serving() {
    let servers = masters(3);
    let port = free_port();
    let _proxy = ProxyProcess::start(&urls(&servers), &config(port));

    let post = exchange(
        port,
        b"POST /status.json HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    );
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");

    let huge = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let refused = exchange(port, huge.as_bytes());
    assert!(
        refused.starts_with("HTTP/1.1 431 "),
        "{}",
        &refused[..refused.len().min(200)]
    );

    let (line, _) = get(port, "/nope");
    assert_eq!(line, "HTTP/1.1 404 Not Found");
    let garbage = exchange(port, b"\x16\x03\x01 hello\r\n\r\n");
    assert!(garbage.starts_with("HTTP/1.1 400 "), "{garbage}");

    let head = exchange(port, b"HEAD /status HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
    let (line, page) = get(port, "/");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(page.contains("<script src=\"/status.js\""), "{page}");
    let (line, script) = get(port, "/status.js");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(script.contains("/status.json"), "{script}");

    // A client that sends half a request and stops holds a connection only until the read
    // timeout; meanwhile the others are served.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET /status.json HTTP/1.1\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let started = Instant::now();
    let (line, _) = get(port, "/status.json");
    assert_eq!(line, "HTTP/1.1 200 OK", "served while a slow request is open");
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("the slow request is answered");
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());

    // Connections are limited: with every slot held by an idle client, one more is answered
    // 503; once they go, the listener serves again.
    let idle: Vec<TcpStream> = (0..32)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let busy = exchange(port, b"GET /status.json HTTP/1.1\r\n\r\n");
    assert!(busy.starts_with("HTTP/1.1 503 "), "{busy}");
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (line, _) = get(port, "/status.json");
        if line == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(Instant::now() < deadline, "not serving again: {line}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
