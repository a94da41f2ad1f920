//! Session locks on real masters: a lock taken with `LOCK.ACQUIRE ... KEEPALIVE` (or with
//! `SET key token NX` and no TTL) lives as long as the connection that took it, is released
//! at once when that connection ends, however it ends, is held at most `max_hold_ms`, and is
//! reported lost (a RESP3 push, a RESP2 error) when a quorum stops extending it.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use redis::Value;
use redis_protocol::resp3::decode::complete::decode_bytes_mut;
use redis_protocol::resp3::types::BytesFrame;
use support::{ProxyProcess, fencing_ready, holders, masters, query as cmd, urls};

/// Whether another client can take `key` now (it releases it again at once).
fn free(proxy: &ProxyProcess, key: &str) -> bool {
    let mut c = proxy.client();
    let took = cmd(&mut c, &["SET", key, "other", "NX", "PX", "10000"]).expect("SET NX") == Value::Okay;
    if took {
        cmd(&mut c, &["LOCK.RELEASE", key, "other"]).expect("LOCK.RELEASE");
    }
    took
}

/// Asserts that `key` stays held for `span` (checked every 50 ms by another client).
fn stays_held(proxy: &ProxyProcess, key: &str, span: Duration) {
    let start = Instant::now();
    while start.elapsed() < span {
        assert!(!free(proxy, key), "{key} was free after {:?}", start.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until another client can take `key`; returns how long that took.
fn until_free(proxy: &ProxyProcess, key: &str) -> Duration {
    let start = Instant::now();
    while !free(proxy, key) {
        assert!(start.elapsed() < Duration::from_secs(10), "{key} never became free");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// A raw client speaking RESP3 (after `HELLO 3`), to read push messages.
struct Resp3 {
    stream: TcpStream,
    buf: BytesMut,
}

impl Resp3 {
    fn connect(proxy: &ProxyProcess) -> Resp3 {
        let mut c = Resp3 {
            stream: proxy.raw(),
            buf: BytesMut::new(),
        };
        c.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        assert!(matches!(c.call(&["HELLO", "3"]), BytesFrame::Map { .. }));
        c
    }

    fn send(&mut self, args: &[&str]) {
        let mut wire = format!("*{}\r\n", args.len());
        for a in args {
            wire.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.stream.write_all(wire.as_bytes()).expect("write");
    }

    /// The next frame from the proxy (a reply or a push).
    fn next(&mut self) -> BytesFrame {
        loop {
            if let Some((frame, _, _)) = decode_bytes_mut(&mut self.buf).expect("RESP3") {
                return frame;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("read (timed out?)");
            assert!(n > 0, "the proxy closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn call(&mut self, args: &[&str]) -> BytesFrame {
        self.send(args);
        self.next()
    }
}

/// The text items of a push message.
fn push_items(frame: &BytesFrame) -> Vec<String> {
    match frame {
        BytesFrame::Push { data, .. } => data
            .iter()
            .map(|f| match f {
                BytesFrame::BlobString { data, .. } => String::from_utf8_lossy(data).into_owned(),
                other => format!("{other:?}"),
            })
            .collect(),
        other => panic!("not a push message: {other:?}"),
    }
}

#[test]
fn a_keepalive_lock_lives_as_long_as_its_connection() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    let token = cmd(&mut holder, &["LOCK.ACQUIRE", "lock:k", "me", "300", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    // Four TTLs later it is still held: the proxy extends it.
    stays_held(&proxy, "lock:k", Duration::from_millis(1200));
    // The holder releases it as usual; the keepalive stops.
    assert_eq!(cmd(&mut holder, &["LOCK.RELEASE", "lock:k", "me"]), Ok(Value::Int(1)));
    assert!(free(&proxy, "lock:k"));
    assert_eq!(holders(&servers, "lock:k", "me"), 0);
}

#[test]
fn a_session_lock_is_released_when_its_connection_ends_however_it_ends() {
    // QUIT, RESET, end of stream, CLIENT KILL, the idle timeout.
    let servers = masters(3);
    // A 30 s TTL: without the session, each lock would stay for 30 s.
    let proxy = ProxyProcess::start(&urls(&servers), "timeout = 1");
    fencing_ready(&proxy);
    let take = |c: &mut redis::Connection, key: &str| {
        let token = cmd(c, &["LOCK.ACQUIRE", key, "me", "30000", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
        assert!(matches!(token, Value::Int(_)), "{token:?}");
    };
    // QUIT.
    let mut c = proxy.client();
    take(&mut c, "lock:quit");
    assert_eq!(cmd(&mut c, &["QUIT"]), Ok(Value::Okay));
    assert!(until_free(&proxy, "lock:quit") < Duration::from_secs(1));
    // RESET (the connection stays, its session locks end).
    let mut c = proxy.client();
    take(&mut c, "lock:reset");
    assert_eq!(cmd(&mut c, &["RESET"]), Ok(Value::SimpleString("RESET".into())));
    assert!(until_free(&proxy, "lock:reset") < Duration::from_secs(1));
    // End of stream: the client goes away.
    let mut c = proxy.client();
    take(&mut c, "lock:eof");
    drop(c);
    assert!(until_free(&proxy, "lock:eof") < Duration::from_secs(1));
    // An operator's CLIENT KILL ID closes it.
    let mut c = proxy.client();
    take(&mut c, "lock:kill");
    let Ok(Value::Int(id)) = cmd(&mut c, &["CLIENT", "ID"]) else {
        panic!("CLIENT ID");
    };
    let mut admin = proxy.client();
    assert_eq!(
        cmd(&mut admin, &["CLIENT", "KILL", "ID", &id.to_string()]),
        Ok(Value::Int(1))
    );
    assert!(until_free(&proxy, "lock:kill") < Duration::from_secs(1));
    assert!(cmd(&mut c, &["PING"]).is_err(), "the killed connection is closed");
    assert_eq!(cmd(&mut admin, &["CLIENT", "KILL", "ID", "999999"]), Ok(Value::Int(0)));
    // The idle timeout (1 s) closes the connection.
    let mut c = proxy.client();
    take(&mut c, "lock:idle");
    let waited = until_free(&proxy, "lock:idle");
    assert!(
        (Duration::from_millis(700)..Duration::from_millis(2500)).contains(&waited),
        "freed after {waited:?}"
    );
    drop(c);
}

#[test]
fn a_lock_taken_without_a_ttl_is_a_session_lock() {
    let servers = masters(3);
    // redis-py's Lock(timeout=None) sends SET key token NX: held until released, not for
    // default_ttl_ms (here 300 ms).
    let proxy = ProxyProcess::start(&urls(&servers), "default_ttl_ms = 300");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert_eq!(cmd(&mut holder, &["SET", "lock:n", "me", "NX"]), Ok(Value::Okay));
    stays_held(&proxy, "lock:n", Duration::from_millis(1000));
    // Released by its holder's own script: the keepalive stops, the lock is free.
    let release = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
    assert_eq!(
        cmd(&mut holder, &["EVAL", release, "1", "lock:n", "me"]),
        Ok(Value::Int(1))
    );
    assert!(free(&proxy, "lock:n"));
    // Taken again and the holder disconnects: free at once.
    assert_eq!(cmd(&mut holder, &["SET", "lock:n", "me", "NX"]), Ok(Value::Okay));
    drop(holder);
    assert!(until_free(&proxy, "lock:n") < Duration::from_millis(300));
}

#[test]
fn a_session_lock_is_held_at_most_max_hold_ms() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "max_hold_ms = 600");
    fencing_ready(&proxy);
    let mut holder = Resp3::connect(&proxy);
    let start = Instant::now();
    assert!(matches!(
        holder.call(&["LOCK.ACQUIRE", "lock:h", "me", "200", "KEEPALIVE"]),
        BytesFrame::Number { .. }
    ));
    let push = holder.next();
    let held = start.elapsed();
    assert_eq!(push_items(&push), ["lock-lost", "lock:h", "me", "max-hold"]);
    assert!(held >= Duration::from_millis(550), "lost after {held:?}");
    assert!(free(&proxy, "lock:h"), "released at max_hold_ms");
}

#[test]
fn a_lost_session_lock_is_reported_by_push_or_by_error() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    // RESP3: a push message as soon as it is lost.
    let mut resp3 = Resp3::connect(&proxy);
    assert!(matches!(
        resp3.call(&["LOCK.ACQUIRE", "lock:p3", "me", "400", "KEEPALIVE"]),
        BytesFrame::Number { .. }
    ));
    // RESP2: an error for its next LOCK.* command on the key.
    let mut resp2 = proxy.client();
    let token = cmd(&mut resp2, &["LOCK.ACQUIRE", "lock:p2", "me", "400", "KEEPALIVE"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    // A quorum of masters paused past the validity: no extension can count.
    servers[1].pause();
    servers[2].pause();
    let push = resp3.next();
    assert_eq!(push_items(&push), ["lock-lost", "lock:p3", "me", "not-extended"]);
    // By now lock:p2 (same TTL, taken just after) is lost too, or about to be.
    let deadline = Instant::now() + Duration::from_secs(5);
    let error = loop {
        // Until the loss, LOCK.INFO answers NOQUORUM (two masters are paused).
        match cmd(&mut resp2, &["LOCK.INFO", "lock:p2"]) {
            Err(e) if e.code() == Some("LOCKLOST") => break e,
            _ => {
                assert!(Instant::now() < deadline, "the RESP2 client was never told");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(error.to_string().contains("not-extended"), "{error}");
    servers[1].resume();
    servers[2].resume();
}
