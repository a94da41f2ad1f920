//! Tests of the in-process master against Redis 7's behaviour.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// Unix ms at the test clock's origin, so absolute expiries are predictable.
const ORIGIN_MS: u64 = 1_700_000_000_000;

/// A clock that only moves when told to.
#[derive(Default)]
struct ManualClock {
    ms: AtomicU64,
}

impl ManualClock {
    fn advance(&self, ms: u64) {
        self.ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.ms.load(Ordering::SeqCst))
    }
}

fn backend() -> (EmbeddedBackend, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let backend = EmbeddedBackend::with_origin("test", clock.clone(), ORIGIN_MS);
    (backend, clock)
}

fn request(db: u32, args: &[&str]) -> Request {
    let args = args.iter().map(|arg| Bytes::from(arg.to_string())).collect();
    Request::new(db, args)
}

fn run(backend: &EmbeddedBackend, args: &[&str]) -> Reply {
    backend.execute(&request(0, args))
}

fn run_db(backend: &EmbeddedBackend, db: u32, args: &[&str]) -> Reply {
    backend.execute(&request(db, args))
}

fn bulk(text: &str) -> Reply {
    Reply::bulk(text.to_owned())
}

fn error(text: &str) -> Reply {
    Reply::error(text)
}

/// The text of an error reply, for prefix checks.
fn error_text(reply: &Reply) -> String {
    match reply {
        Reply::Error(text) => String::from_utf8_lossy(text).into_owned(),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A field of `INFO section`, or of the default `INFO` if `section` is empty.
fn info_field_value(backend: &EmbeddedBackend, section: &str, field: &str) -> String {
    let args: &[&str] = if section.is_empty() {
        &["INFO"]
    } else {
        &["INFO", section]
    };
    let Reply::Bulk(text) = run(backend, args) else {
        panic!("INFO is not a bulk string");
    };
    let text = String::from_utf8_lossy(&text).into_owned();
    let prefix = format!("{field}:");
    text.split("\r\n")
        .find_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
        .unwrap_or_else(|| panic!("no {field} in {text}"))
}

// ----- strings and SET options -------------------------------------------------------

#[test]
fn ping_and_echo() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["PING"]), Reply::status("PONG"));
    assert_eq!(run(&b, &["ping", "hi"]), bulk("hi"));
    assert_eq!(
        run(&b, &["ping", "a", "b"]),
        error("ERR wrong number of arguments for 'ping' command")
    );
    assert_eq!(run(&b, &["echo", "x"]), bulk("x"));
}

#[test]
fn set_and_get() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
    assert_eq!(run(&b, &["SET", "k", "v"]), Reply::ok());
    assert_eq!(run(&b, &["get", "k"]), bulk("v"));
    assert_eq!(run(&b, &["SET", "k", "w", "GET"]), bulk("v"));
    assert_eq!(run(&b, &["SET", "new", "w", "GET"]), Reply::Nil);
    assert_eq!(run(&b, &["GET", "k"]), bulk("w"));
}

#[test]
fn set_nx_and_xx() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["SET", "k", "1", "XX"]), Reply::Nil);
    assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
    assert_eq!(run(&b, &["SET", "k", "1", "NX"]), Reply::ok());
    assert_eq!(run(&b, &["SET", "k", "2", "nx"]), Reply::Nil);
    assert_eq!(run(&b, &["GET", "k"]), bulk("1"));
    assert_eq!(run(&b, &["SET", "k", "3", "xX"]), Reply::ok());
    assert_eq!(run(&b, &["GET", "k"]), bulk("3"));
    // NX with GET (allowed since 7.0) returns the value that blocked the write.
    assert_eq!(run(&b, &["SET", "k", "4", "NX", "GET"]), bulk("3"));
    assert_eq!(run(&b, &["SETNX", "k", "5"]), Reply::Int(0));
    assert_eq!(run(&b, &["SETNX", "other", "5"]), Reply::Int(1));
}

#[test]
fn set_options_in_any_order_and_case() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["Set", "k", "v", "pX", "100", "nX"]), Reply::ok());
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(100));
    assert_eq!(run(&b, &["set", "k", "v", "get", "ex", "10", "xx"]), bulk("v"));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(10_000));
    // The same expiry option twice is accepted; the last one wins.
    assert_eq!(run(&b, &["SET", "k", "v", "EX", "1", "EX", "2"]), Reply::ok());
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(2_000));
}

#[test]
fn set_syntax_errors() {
    let (b, _) = backend();
    let syntax = error("ERR syntax error");
    for args in [
        &["SET", "k", "v", "NX", "XX"][..],
        &["SET", "k", "v", "XX", "NX"],
        &["SET", "k", "v", "EX"],
        &["SET", "k", "v", "EX", "10", "PX", "10"],
        &["SET", "k", "v", "KEEPTTL", "EX", "10"],
        &["SET", "k", "v", "PX", "10", "KEEPTTL"],
        &["SET", "k", "v", "BOGUS"],
        // A bad option wins over a bad number, as options are parsed first.
        &["SET", "k", "v", "EX", "abc", "BOGUS"],
    ] {
        assert_eq!(run(&b, args), syntax, "{args:?}");
    }
    assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
}

#[test]
fn set_expire_value_errors() {
    let (b, _) = backend();
    let not_int = error("ERR value is not an integer or out of range");
    let invalid = error("ERR invalid expire time in 'set' command");
    assert_eq!(run(&b, &["SET", "k", "v", "EX", "abc"]), not_int);
    assert_eq!(run(&b, &["SET", "k", "v", "PX", "1.5"]), not_int);
    assert_eq!(run(&b, &["SET", "k", "v", "PX", "+5"]), not_int);
    assert_eq!(run(&b, &["SET", "k", "v", "PX", "05"]), not_int);
    assert_eq!(run(&b, &["SET", "k", "v", "EX", "0"]), invalid);
    assert_eq!(run(&b, &["SET", "k", "v", "PX", "-5"]), invalid);
    assert_eq!(run(&b, &["SET", "k", "v", "EX", "9223372036854775807"]), invalid);
    assert_eq!(run(&b, &["SET", "k", "v", "PX", "9223372036854775807"]), invalid);
    assert_eq!(run(&b, &["SET", "k", "v", "PX", "99999999999999999999"]), not_int);
    assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
}

#[test]
fn set_without_keepttl_clears_the_expiry() {
    let (b, _) = backend();
    run(&b, &["SET", "k", "v", "PX", "1000"]);
    assert_eq!(run(&b, &["SET", "k", "w", "KEEPTTL"]), Reply::ok());
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(1000));
    assert_eq!(run(&b, &["SET", "k", "x"]), Reply::ok());
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
    run(&b, &["SET", "k", "v", "PX", "1000"]);
    assert_eq!(run(&b, &["GETSET", "k", "y"]), bulk("v"));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
}

#[test]
fn absolute_expiry_uses_the_masters_wall_clock() {
    let (b, _) = backend();
    let at = (ORIGIN_MS + 5_000).to_string();
    assert_eq!(run(&b, &["SET", "k", "v", "PXAT", &at]), Reply::ok());
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(5_000));
    let at = (ORIGIN_MS / 1000 + 7).to_string();
    assert_eq!(run(&b, &["SET", "k", "v", "EXAT", &at]), Reply::ok());
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(7_000));
    // An expiry already past stores nothing.
    let past = (ORIGIN_MS - 1).to_string();
    assert_eq!(run(&b, &["SET", "k", "v", "PXAT", &past]), Reply::ok());
    assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
}

#[test]
fn new_derives_the_wall_clock_from_system_time() {
    // The wall clock is read first: the backend's origin is then no earlier, and the key no
    // longer-lived than 10 s (the other order let the millisecond tick in between make 10,001).
    let wall = millis(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default());
    let backend = EmbeddedBackend::new("real", Arc::new(ManualClock::default()));
    let at = (wall + 10_000).to_string();
    backend.execute(&request(0, &["SET", "k", "v", "PXAT", &at]));
    let Reply::Int(left) = backend.execute(&request(0, &["PTTL", "k"])) else {
        panic!("PTTL is not an integer");
    };
    assert!((9_000..=10_000).contains(&left), "{left}");
}

// ----- expiry ------------------------------------------------------------------------

#[test]
fn keys_expire_on_the_clock() {
    let (b, clock) = backend();
    run(&b, &["SET", "k", "v", "PX", "100"]);
    clock.advance(99);
    assert_eq!(run(&b, &["GET", "k"]), bulk("v"));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(1));
    clock.advance(1);
    // Alive through its last millisecond, as in Redis.
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(0));
    clock.advance(1);
    assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
    assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-2));
    assert_eq!(run(&b, &["SET", "k", "w", "NX"]), Reply::ok());
}

#[test]
fn pttl_and_ttl() {
    let (b, clock) = backend();
    assert_eq!(run(&b, &["PTTL", "missing"]), Reply::Int(-2));
    assert_eq!(run(&b, &["TTL", "missing"]), Reply::Int(-2));
    run(&b, &["SET", "forever", "v"]);
    assert_eq!(run(&b, &["PTTL", "forever"]), Reply::Int(-1));
    assert_eq!(run(&b, &["TTL", "forever"]), Reply::Int(-1));
    run(&b, &["SET", "k", "v", "PX", "1499"]);
    assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(1));
    run(&b, &["SET", "k", "v", "PX", "1500"]);
    assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(2));
    clock.advance(1100);
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(400));
    assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(0));
    run(&b, &["SET", "k", "v", "EX", "10"]);
    assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(10));
}

#[test]
fn pexpire_and_expire() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["PEXPIRE", "missing", "100"]), Reply::Int(0));
    run(&b, &["SET", "k", "v"]);
    assert_eq!(run(&b, &["PEXPIRE", "k", "100"]), Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(100));
    assert_eq!(run(&b, &["EXPIRE", "k", "3"]), Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(3000));
    let at = (ORIGIN_MS + 2500).to_string();
    assert_eq!(run(&b, &["PEXPIREAT", "k", &at]), Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(2500));
    let at = (ORIGIN_MS / 1000 + 4).to_string();
    assert_eq!(run(&b, &["EXPIREAT", "k", &at]), Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(4000));
    // Zero or negative deletes the key.
    assert_eq!(run(&b, &["PEXPIRE", "k", "-1"]), Reply::Int(1));
    assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
    run(&b, &["SET", "k", "v"]);
    assert_eq!(run(&b, &["EXPIRE", "k", "0"]), Reply::Int(1));
    assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
}

#[test]
fn expire_conditions() {
    let (b, _) = backend();
    run(&b, &["SET", "k", "v"]);
    assert_eq!(run(&b, &["PEXPIRE", "k", "100", "XX"]), Reply::Int(0));
    assert_eq!(run(&b, &["PEXPIRE", "k", "100", "GT"]), Reply::Int(0));
    assert_eq!(run(&b, &["PEXPIRE", "k", "100", "nx"]), Reply::Int(1));
    assert_eq!(run(&b, &["PEXPIRE", "k", "200", "NX"]), Reply::Int(0));
    assert_eq!(run(&b, &["PEXPIRE", "k", "50", "GT"]), Reply::Int(0));
    assert_eq!(run(&b, &["PEXPIRE", "k", "200", "GT"]), Reply::Int(1));
    assert_eq!(run(&b, &["PEXPIRE", "k", "300", "LT"]), Reply::Int(0));
    assert_eq!(run(&b, &["PEXPIRE", "k", "150", "LT", "XX"]), Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(150));
    run(&b, &["SET", "p", "v"]);
    // No expiry counts as infinite: LT always applies.
    assert_eq!(run(&b, &["PEXPIRE", "p", "150", "LT"]), Reply::Int(1));
}

#[test]
fn expire_errors() {
    let (b, _) = backend();
    run(&b, &["SET", "k", "v"]);
    assert_eq!(
        run(&b, &["PEXPIRE", "k", "100", "NX", "XX"]),
        error("ERR NX and XX, GT or LT options at the same time are not compatible")
    );
    assert_eq!(
        run(&b, &["PEXPIRE", "k", "100", "GT", "LT"]),
        error("ERR GT and LT options at the same time are not compatible")
    );
    assert_eq!(
        run(&b, &["PEXPIRE", "k", "100", "soon"]),
        error("ERR Unsupported option soon")
    );
    assert_eq!(
        run(&b, &["PEXPIRE", "k", "x"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(
        run(&b, &["EXPIRE", "k", "9223372036854775807"]),
        error("ERR invalid expire time in 'expire' command")
    );
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
}

#[test]
fn persist_removes_the_expiry() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["PERSIST", "missing"]), Reply::Int(0));
    run(&b, &["SET", "k", "v", "PX", "100"]);
    assert_eq!(run(&b, &["PERSIST", "k"]), Reply::Int(1));
    assert_eq!(run(&b, &["PERSIST", "k"]), Reply::Int(0));
    assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
}

// ----- other commands ----------------------------------------------------------------

#[test]
fn del_unlink_and_exists_count_keys() {
    let (b, _) = backend();
    run(&b, &["SET", "a", "1"]);
    run(&b, &["SET", "b", "2"]);
    run(&b, &["SET", "c", "3"]);
    assert_eq!(run(&b, &["EXISTS", "a", "a", "b", "x"]), Reply::Int(3));
    assert_eq!(run(&b, &["DEL", "a", "a", "x"]), Reply::Int(1));
    assert_eq!(run(&b, &["UNLINK", "b", "c"]), Reply::Int(2));
    assert_eq!(run(&b, &["EXISTS", "a", "b", "c"]), Reply::Int(0));
}

#[test]
fn incr_and_decr() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["INCR", "n"]), Reply::Int(1));
    assert_eq!(run(&b, &["INCRBY", "n", "41"]), Reply::Int(42));
    assert_eq!(run(&b, &["DECR", "n"]), Reply::Int(41));
    assert_eq!(run(&b, &["DECRBY", "n", "40"]), Reply::Int(1));
    assert_eq!(run(&b, &["GET", "n"]), bulk("1"));
    run(&b, &["PEXPIRE", "n", "500"]);
    run(&b, &["INCR", "n"]);
    assert_eq!(run(&b, &["PTTL", "n"]), Reply::Int(500));
    let not_int = error("ERR value is not an integer or out of range");
    run(&b, &["SET", "s", "abc"]);
    assert_eq!(run(&b, &["INCR", "s"]), not_int);
    assert_eq!(run(&b, &["INCRBY", "n", "x"]), not_int);
    run(&b, &["SET", "big", "9223372036854775807"]);
    assert_eq!(
        run(&b, &["INCR", "big"]),
        error("ERR increment or decrement would overflow")
    );
    assert_eq!(
        run(&b, &["DECRBY", "n", "-9223372036854775808"]),
        error("ERR decrement would overflow")
    );
}

#[test]
fn arity_and_unknown_command_errors() {
    let (b, _) = backend();
    assert_eq!(
        run(&b, &["GET"]),
        error("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        run(&b, &["Set", "k"]),
        error("ERR wrong number of arguments for 'set' command")
    );
    assert_eq!(
        run(&b, &["DBSIZE", "x"]),
        error("ERR wrong number of arguments for 'dbsize' command")
    );
    assert_eq!(
        run(&b, &["FOO", "a", "b"]),
        error("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
    );
    assert_eq!(
        run(&b, &["nope"]),
        error("ERR unknown command 'nope', with args beginning with: ")
    );
    assert_eq!(
        b.execute(&Request::new(0, Vec::new())),
        error("ERR unknown command '', with args beginning with: ")
    );
    let long = "x".repeat(300);
    let text = error_text(&run(&b, &["FOO", &long, "more"]));
    assert!(text.ends_with(&format!("'{}' ", "x".repeat(128))), "{text}");
}

#[test]
fn databases_are_separate() {
    let (b, _) = backend();
    run_db(&b, 0, &["SET", "k", "zero"]);
    run_db(&b, 1, &["SET", "k", "one"]);
    assert_eq!(run_db(&b, 0, &["GET", "k"]), bulk("zero"));
    assert_eq!(run_db(&b, 1, &["GET", "k"]), bulk("one"));
    assert_eq!(run_db(&b, 2, &["GET", "k"]), Reply::Nil);
    assert_eq!(run_db(&b, 1, &["DBSIZE"]), Reply::Int(1));
    assert_eq!(run_db(&b, 1, &["FLUSHDB"]), Reply::ok());
    assert_eq!(run_db(&b, 1, &["GET", "k"]), Reply::Nil);
    assert_eq!(run_db(&b, 0, &["GET", "k"]), bulk("zero"));
    run_db(&b, 5, &["SET", "k", "five"]);
    assert_eq!(run_db(&b, 0, &["FLUSHALL", "ASYNC"]), Reply::ok());
    assert_eq!(run_db(&b, 5, &["DBSIZE"]), Reply::Int(0));
    assert_eq!(run(&b, &["FLUSHALL", "later"]), error("ERR syntax error"));
}

#[test]
fn info_reports_version_run_id_uptime_and_role() {
    let (b, clock) = backend();
    assert_eq!(info_field_value(&b, "server", "redis_version"), "7.0.0");
    assert_eq!(info_field_value(&b, "server", "redis_mode"), "standalone");
    let run_id = info_field_value(&b, "server", "run_id");
    assert_eq!(run_id.len(), 40);
    assert!(run_id.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    clock.advance(3_500);
    assert_eq!(info_field_value(&b, "server", "uptime_in_seconds"), "3");
    assert_eq!(info_field_value(&b, "server", "uptime_in_milliseconds"), "3500");
    assert_eq!(info_field_value(&b, "", "role"), "master");
    assert_eq!(info_field_value(&b, "replication", "role"), "master");
    run_db(&b, 2, &["SET", "k", "v", "PX", "100"]);
    assert_eq!(info_field_value(&b, "keyspace", "db2"), "keys=1,expires=1,avg_ttl=0");
    let Reply::Bulk(server_only) = run(&b, &["INFO", "SERVER"]) else {
        panic!("INFO is not a bulk string");
    };
    assert!(server_only.starts_with(b"# Server\r\n"));
    assert!(!server_only.windows(5).any(|w| w == b"role:"));
    assert_eq!(run(&b, &["INFO", "nosuchsection"]), bulk(""));
    assert_eq!(
        run(&b, &["ROLE"]),
        Reply::Array(vec![bulk("master"), Reply::Int(0), Reply::Array(vec![])])
    );
}

#[test]
fn restart_loses_keys_and_scripts_and_changes_run_id() {
    let (b, clock) = backend();
    run(&b, &["SET", "k", "v"]);
    let Reply::Bulk(sha) = run(&b, &["SCRIPT", "LOAD", "return 1"]) else {
        panic!("SCRIPT LOAD gives no sha");
    };
    let sha = String::from_utf8_lossy(&sha).into_owned();
    let before = info_field_value(&b, "server", "run_id");
    clock.advance(5_000);
    b.restart();
    assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
    assert_eq!(
        run(&b, &["EVALSHA", &sha, "0"]),
        error("NOSCRIPT No matching script. Please use EVAL.")
    );
    assert_ne!(info_field_value(&b, "server", "run_id"), before);
    assert_eq!(info_field_value(&b, "server", "uptime_in_milliseconds"), "0");
    clock.advance(1_000);
    assert_eq!(info_field_value(&b, "server", "uptime_in_seconds"), "1");
}

#[test]
fn a_promoted_replica_is_another_long_running_process_missing_some_keys() {
    let (b, clock) = backend();
    clock.advance(10_000);
    run(&b, &["SET", "kept", "1"]);
    run(&b, &["SET", "missed", "2", "PX", "60000"]);
    run_db(&b, 3, &["SET", "kept:too", "3"]);
    let Reply::Bulk(sha) = run(&b, &["SCRIPT", "LOAD", "return 1"]) else {
        panic!("SCRIPT LOAD gives no sha");
    };
    let sha = String::from_utf8_lossy(&sha).into_owned();
    let before = info_field_value(&b, "server", "run_id");
    let replid = info_field_value(&b, "replication", "master_replid");
    let lost = b.promote_replica(Duration::from_secs(3_600), |key| key.starts_with(b"kept"));
    assert_eq!(lost, 1);
    assert_ne!(info_field_value(&b, "server", "run_id"), before);
    assert_ne!(info_field_value(&b, "replication", "master_replid"), replid);
    assert_eq!(
        info_field_value(&b, "server", "uptime_in_milliseconds"),
        "3600000",
        "the replica's own uptime, not the master's, nor zero"
    );
    clock.advance(1_500);
    assert_eq!(info_field_value(&b, "server", "uptime_in_seconds"), "3601");
    assert_eq!(run(&b, &["GET", "kept"]), bulk("1"));
    assert_eq!(run(&b, &["GET", "missed"]), Reply::Nil);
    assert_eq!(run_db(&b, 3, &["GET", "kept:too"]), bulk("3"));
    assert_eq!(
        run(&b, &["EVALSHA", &sha, "0"]),
        error("NOSCRIPT No matching script. Please use EVAL.")
    );
}

#[tokio::test]
async fn backend_trait_always_answers() {
    let (b, _) = backend();
    let b = Arc::new(b);
    assert_eq!(b.name(), "test");
    let reply = crate::backend::call(&b, &request(0, &["SET", "k", "v"]), None).await;
    assert_eq!(reply, Ok(Reply::ok()));
    let reply = crate::backend::call(&b, &request(0, &["BOGUS"]), None).await;
    assert!(matches!(reply, Ok(Reply::Error(_))));
}

#[tokio::test]
async fn calls_run_on_spawned_tasks() {
    async fn via_trait<B: Backend>(backend: Arc<B>, request: Request) -> Reply {
        match crate::backend::call(&backend, &request, None).await {
            Ok(reply) => reply,
            Err(error) => panic!("an embedded master always answers: {error}"),
        }
    }
    let (b, _) = backend();
    let b = Arc::new(b);
    let set = tokio::spawn(via_trait(b.clone(), request(0, &["SET", "k", "v"])));
    assert_eq!(set.await.expect("the task ran"), Reply::ok());
    assert_eq!(via_trait(b, request(0, &["GET", "k"])).await, bulk("v"));
}

// ----- scripts from real clients -----------------------------------------------------

const RELEASE: &str =
    r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;

/// redis-py's `Lock.extend` script.
const REDIS_PY_EXTEND: &str = r#"
    local token = redis.call('get', KEYS[1])
    if not token or token ~= ARGV[1] then
        return 0
    end
    local expiration = redis.call('pttl', KEYS[1])
    if not expiration then
        expiration = 0
    end
    if expiration < 0 then
        return 0
    end
    local newttl = ARGV[2]
    if ARGV[3] == "0" then
        newttl = ARGV[2] + expiration
    end
    redis.call('pexpire', KEYS[1], newttl)
    return 1
"#;

/// node-redlock's multi-key acquire.
const NODE_REDLOCK_ACQUIRE: &str = r#"
    for _, key in ipairs(KEYS) do
        if redis.call("exists", key) == 1 then
            return 0
        end
    end
    for _, key in ipairs(KEYS) do
        redis.call("set", key, ARGV[1], "PX", ARGV[2])
    end
    return #KEYS
"#;

/// redsync's release, which tells a missing key (-1) from a foreign one (0).
const REDSYNC_RELEASE: &str = r#"
    local val = redis.call("GET", KEYS[1])
    if val == ARGV[1] then
        return redis.call("DEL", KEYS[1])
    elseif val == false then
        return -1
    else
        return 0
    end
"#;

#[test]
fn canonical_release_script() {
    let (b, _) = backend();
    run(&b, &["SET", "lock", "token", "PX", "30000"]);
    assert_eq!(run(&b, &["EVAL", RELEASE, "1", "lock", "other"]), Reply::Int(0));
    assert_eq!(run(&b, &["GET", "lock"]), bulk("token"));
    assert_eq!(run(&b, &["EVAL", RELEASE, "1", "lock", "token"]), Reply::Int(1));
    assert_eq!(run(&b, &["GET", "lock"]), Reply::Nil);
    assert_eq!(run(&b, &["EVAL", RELEASE, "1", "lock", "token"]), Reply::Int(0));
}

#[test]
fn redis_py_extend_script() {
    let (b, clock) = backend();
    run(&b, &["SET", "lock", "token", "PX", "10000"]);
    clock.advance(4_000);
    // Additive extend: 6000 left + 5000.
    let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "token", "5000", "0"]);
    assert_eq!(reply, Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "lock"]), Reply::Int(11_000));
    // Replacing extend.
    let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "token", "5000", "1"]);
    assert_eq!(reply, Reply::Int(1));
    assert_eq!(run(&b, &["PTTL", "lock"]), Reply::Int(5_000));
    let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "stolen", "5000", "1"]);
    assert_eq!(reply, Reply::Int(0));
    run(&b, &["PERSIST", "lock"]);
    let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "token", "5000", "1"]);
    assert_eq!(reply, Reply::Int(0));
    let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "gone", "token", "5000", "1"]);
    assert_eq!(reply, Reply::Int(0));
}

#[test]
fn node_redlock_multi_key_acquire() {
    let (b, _) = backend();
    let acquire = |keys: &[&str]| {
        let mut args = vec!["EVAL", NODE_REDLOCK_ACQUIRE];
        let numkeys = keys.len().to_string();
        args.push(&numkeys);
        args.extend_from_slice(keys);
        args.extend_from_slice(&["token", "2000"]);
        run(&b, &args)
    };
    assert_eq!(acquire(&["a", "b", "c"]), Reply::Int(3));
    assert_eq!(run(&b, &["GET", "b"]), bulk("token"));
    assert_eq!(run(&b, &["PTTL", "c"]), Reply::Int(2000));
    assert_eq!(acquire(&["d", "c"]), Reply::Int(0));
    assert_eq!(run(&b, &["EXISTS", "d"]), Reply::Int(0));
}

#[test]
fn redsync_release_script() {
    let (b, _) = backend();
    assert_eq!(
        run(&b, &["EVAL", REDSYNC_RELEASE, "1", "lock", "token"]),
        Reply::Int(-1)
    );
    run(&b, &["SET", "lock", "other"]);
    assert_eq!(run(&b, &["EVAL", REDSYNC_RELEASE, "1", "lock", "token"]), Reply::Int(0));
    run(&b, &["SET", "lock", "token"]);
    assert_eq!(run(&b, &["EVAL", REDSYNC_RELEASE, "1", "lock", "token"]), Reply::Int(1));
}

#[test]
fn scripts_run_in_the_requests_database() {
    let (b, _) = backend();
    let script = "return redis.call('set', KEYS[1], ARGV[1])";
    assert_eq!(run_db(&b, 3, &["EVAL", script, "1", "k", "v"]), Reply::ok());
    assert_eq!(run_db(&b, 3, &["GET", "k"]), bulk("v"));
    assert_eq!(run_db(&b, 0, &["GET", "k"]), Reply::Nil);
}

// ----- script cache ------------------------------------------------------------------

#[test]
fn eval_caches_the_script_for_evalsha() {
    let (b, _) = backend();
    let sha = sha1_hex(RELEASE.as_bytes());
    assert_eq!(
        run(&b, &["EVALSHA", &sha, "1", "lock", "token"]),
        error("NOSCRIPT No matching script. Please use EVAL.")
    );
    run(&b, &["EVAL", RELEASE, "1", "lock", "token"]);
    run(&b, &["SET", "lock", "token"]);
    let upper = sha.to_ascii_uppercase();
    assert_eq!(run(&b, &["evalsha", &upper, "1", "lock", "token"]), Reply::Int(1));
}

#[test]
fn script_load_exists_and_flush() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["SCRIPT", "EXISTS", "abc"]), Reply::Array(vec![Reply::Int(0)]));
    let sha = sha1_hex(b"return 'hi'");
    assert_eq!(run(&b, &["SCRIPT", "LOAD", "return 'hi'"]), bulk(&sha));
    assert_eq!(
        run(&b, &["script", "exists", &sha, "nope"]),
        Reply::Array(vec![Reply::Int(1), Reply::Int(0)])
    );
    assert_eq!(run(&b, &["EVALSHA", &sha, "0"]), bulk("hi"));
    assert_eq!(run(&b, &["SCRIPT", "FLUSH", "ASYNC"]), Reply::ok());
    assert_eq!(
        run(&b, &["EVALSHA", &sha, "0"]),
        error("NOSCRIPT No matching script. Please use EVAL.")
    );
    assert_eq!(
        run(&b, &["SCRIPT", "FLUSH", "NOW"]),
        error("ERR SCRIPT FLUSH only support SYNC|ASYNC option")
    );
    assert_eq!(
        run(&b, &["SCRIPT", "LOAD"]),
        error("ERR wrong number of arguments for 'script|load' command")
    );
    assert_eq!(
        run(&b, &["SCRIPT", "nope"]),
        error("ERR unknown subcommand 'nope'. Try SCRIPT HELP.")
    );
    assert_eq!(
        run(&b, &["SCRIPT", "KILL"]),
        error("NOTBUSY No scripts in execution right now.")
    );
}

#[test]
fn script_flush_drops_lua_globals() {
    let (b, _) = backend();
    run(&b, &["EVAL", "leftover = 42", "0"]);
    assert_eq!(run(&b, &["EVAL", "return leftover", "0"]), Reply::Int(42));
    run(&b, &["SCRIPT", "FLUSH"]);
    assert_eq!(run(&b, &["EVAL", "return leftover", "0"]), Reply::Nil);
}

#[test]
fn numkeys_errors() {
    let (b, _) = backend();
    assert_eq!(
        run(&b, &["EVAL", "return 1", "2", "k"]),
        error("ERR Number of keys can't be greater than number of args")
    );
    assert_eq!(
        run(&b, &["EVAL", "return 1", "-1"]),
        error("ERR Number of keys can't be negative")
    );
    assert_eq!(
        run(&b, &["EVAL", "return 1", "one"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(
        run(&b, &["EVAL", "return 1"]),
        error("ERR wrong number of arguments for 'eval' command")
    );
    let reply = run(&b, &["EVAL", "return {KEYS[1], ARGV[1], #KEYS, #ARGV}", "1", "k", "a"]);
    assert_eq!(
        reply,
        Reply::Array(vec![bulk("k"), bulk("a"), Reply::Int(1), Reply::Int(1)])
    );
}

#[test]
fn compile_errors() {
    let (b, _) = backend();
    let text = error_text(&run(&b, &["EVAL", "return = 1", "0"]));
    assert!(
        text.starts_with("ERR Error compiling script (new function): user_script:1: "),
        "{text}"
    );
    let text = error_text(&run(&b, &["SCRIPT", "LOAD", "x x"]));
    assert!(text.starts_with("ERR Error compiling script"), "{text}");
}

// ----- conversions -------------------------------------------------------------------

fn eval(b: &EmbeddedBackend, script: &str) -> Reply {
    run(b, &["EVAL", script, "0"])
}

#[test]
fn lua_to_redis_conversions() {
    let (b, _) = backend();
    assert_eq!(eval(&b, "return true"), Reply::Int(1));
    assert_eq!(eval(&b, "return false"), Reply::Nil);
    assert_eq!(eval(&b, "return nil"), Reply::Nil);
    assert_eq!(eval(&b, "return"), Reply::Nil);
    assert_eq!(eval(&b, "return 3.99"), Reply::Int(3));
    assert_eq!(eval(&b, "return -3.99"), Reply::Int(-3));
    assert_eq!(eval(&b, "return 'x'"), bulk("x"));
    assert_eq!(eval(&b, "return 1, 2"), Reply::Int(1));
    assert_eq!(
        eval(&b, "return {1, 'two', 3.5, nil, 5}"),
        Reply::Array(vec![Reply::Int(1), bulk("two"), Reply::Int(3)])
    );
    assert_eq!(
        eval(&b, "return {1, {true, false}, {}}"),
        Reply::Array(vec![
            Reply::Int(1),
            Reply::Array(vec![Reply::Int(1), Reply::Nil]),
            Reply::Array(vec![]),
        ])
    );
    assert_eq!(eval(&b, "return {ok = 'FINE'}"), Reply::status("FINE"));
    assert_eq!(eval(&b, "return {err = 'BAD thing'}"), error("BAD thing"));
    assert_eq!(eval(&b, "return {err = 'BAD', ok = 'x'}"), error("BAD"));
    assert_eq!(
        eval(&b, "return {1, 2, ok = 3}"),
        Reply::Array(vec![Reply::Int(1), Reply::Int(2)])
    );
    assert_eq!(eval(&b, "return redis.status_reply('DONE')"), Reply::status("DONE"));
    assert_eq!(eval(&b, "return redis.error_reply('MY error')"), error("MY error"));
    assert_eq!(eval(&b, "return redis.error_reply('boom')"), error("ERR boom"));
    assert_eq!(eval(&b, "return redis.error_reply('-WRONG x')"), error("WRONG x"));
    assert_eq!(
        eval(&b, "return redis.error_reply()"),
        error("ERR wrong number or type of arguments")
    );
    assert_eq!(eval(&b, "return function() end"), Reply::Nil);
}

#[test]
fn redis_to_lua_conversions() {
    let (b, _) = backend();
    run(&b, &["SET", "s", "v"]);
    assert_eq!(eval(&b, "return type(redis.call('get', 'missing'))"), bulk("boolean"));
    assert_eq!(eval(&b, "return redis.call('get', 'missing') == false"), Reply::Int(1));
    assert_eq!(eval(&b, "return type(redis.call('exists', 's'))"), bulk("number"));
    assert_eq!(eval(&b, "return redis.call('ping').ok"), bulk("PONG"));
    assert_eq!(eval(&b, "return redis.call('ping')"), Reply::status("PONG"));
    assert_eq!(eval(&b, "return redis.call('get', 's')"), bulk("v"));
    assert_eq!(
        eval(&b, "return redis.pcall('incr', 's').err"),
        bulk("ERR value is not an integer or out of range")
    );
    assert_eq!(
        eval(&b, "local r = redis.call('role') return {type(r), r[1], r[2], #r[3]}"),
        Reply::Array(vec![bulk("table"), bulk("master"), Reply::Int(0), Reply::Int(0)])
    );
    // Numbers become arguments without a fraction.
    assert_eq!(eval(&b, "return redis.call('set', 'n', 10 * 3)"), Reply::ok());
    assert_eq!(run(&b, &["GET", "n"]), bulk("30"));
    assert_eq!(eval(&b, "return redis.call('echo', 2.5)"), bulk("2.5"));
}

#[test]
fn redis_helpers() {
    let (b, _) = backend();
    assert_eq!(
        eval(&b, "return redis.sha1hex('')"),
        bulk("da39a3ee5e6b4b0d3255bfef95601890afd80709")
    );
    assert_eq!(
        eval(&b, "redis.log(redis.LOG_WARNING, 'hi') return redis.LOG_NOTICE"),
        Reply::Int(2)
    );
    assert_eq!(
        eval(&b, "return {redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_WARNING}"),
        Reply::Array(vec![Reply::Int(0), Reply::Int(1), Reply::Int(3)])
    );
    assert_eq!(
        eval(&b, "return tonumber('12') + #string.format('%d', 7)"),
        Reply::Int(13)
    );
    assert_eq!(eval(&b, "return select('#', unpack({1, 2, 3}))"), Reply::Int(3));
    assert_eq!(eval(&b, "return math.floor(7.9) + table.getn({1})"), Reply::Int(8));
    let text = error_text(&eval(&b, "return redis.sha1hex()"));
    assert!(text.starts_with("ERR wrong number of arguments script: "), "{text}");
}

// ----- errors in scripts -------------------------------------------------------------

#[test]
fn call_raises_and_pcall_returns_errors() {
    let (b, _) = backend();
    run(&b, &["SET", "s", "text"]);
    let script = "redis.call('incr', KEYS[1])\nreturn 'not reached'";
    let sha = sha1_hex(script.as_bytes());
    assert_eq!(
        run(&b, &["EVAL", script, "1", "s"]),
        error(&format!(
            "ERR value is not an integer or out of range script: {sha}, on @user_script:1."
        ))
    );
    assert_eq!(
        eval(&b, "return redis.pcall('incr', 's')"),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(
        eval(
            &b,
            "local r = redis.pcall('incr', 's') return r.err ~= nil and 'caught' or 'no'"
        ),
        bulk("caught")
    );
    // A script's own pcall catches redis.call's error as a table, as in Redis 7.
    assert_eq!(
        eval(
            &b,
            "local ok, e = pcall(redis.call, 'incr', 's') return {tostring(ok), type(e), e.err}"
        ),
        Reply::Array(vec![
            bulk("false"),
            bulk("table"),
            bulk("ERR value is not an integer or out of range")
        ])
    );
    assert_eq!(
        eval(
            &b,
            "return select(2, xpcall(function() redis.call('incr', 's') end, function(e) return e.err end))"
        ),
        bulk("ERR value is not an integer or out of range")
    );
    assert_eq!(
        eval(&b, "return {pcall(function(...) return ... end, 1, nil, 3)}"),
        Reply::Array(vec![Reply::Int(1), Reply::Int(1)])
    );
    assert_eq!(
        eval(&b, "return {pcall(error, 'plain')}"),
        Reply::Array(vec![Reply::Nil, bulk("plain")])
    );
    // The error aborted the script: nothing after it ran.
    let script = "redis.call('set', 'before', '1')\nredis.call('incr', 's')\nredis.call('set', 'after', '1')";
    let text = error_text(&eval(&b, script));
    assert!(text.ends_with("on @user_script:2."), "{text}");
    assert_eq!(run(&b, &["EXISTS", "before", "after"]), Reply::Int(1));
}

#[test]
fn script_only_command_errors() {
    let (b, _) = backend();
    assert_eq!(
        eval(&b, "return redis.pcall('nosuch')"),
        error("ERR Unknown Redis command called from script")
    );
    assert_eq!(
        eval(&b, "return redis.pcall('get')"),
        error("ERR Wrong number of args calling Redis command from script")
    );
    assert_eq!(
        eval(&b, "return redis.pcall('eval', 'return 1', '0')"),
        error("ERR This Redis command is not allowed from script")
    );
    assert_eq!(
        eval(&b, "return redis.pcall('get', {})"),
        error("ERR Lua redis lib command arguments must be strings or integers")
    );
    assert_eq!(
        eval(&b, "return redis.pcall()"),
        error("ERR Please specify at least one argument for this redis lib call")
    );
    // A tail call still names the script line.
    let sha = sha1_hex(b"\nreturn redis.call('nosuch')");
    assert_eq!(
        eval(&b, "\nreturn redis.call('nosuch')"),
        error(&format!(
            "ERR Unknown Redis command called from script script: {sha}, on @user_script:2."
        ))
    );
}

#[test]
fn runtime_errors_name_the_script_line() {
    let (b, _) = backend();
    let script = "local x = 1\nerror('boom')";
    let sha = sha1_hex(script.as_bytes());
    assert_eq!(
        eval(&b, script),
        error(&format!("ERR user_script:2: boom script: {sha}, on @user_script:2."))
    );
    let text = error_text(&eval(&b, "return nil + 1"));
    assert!(
        text.starts_with("ERR user_script:1: attempt to perform arithmetic"),
        "{text}"
    );
    let text = error_text(&eval(&b, "error({err = 'CUSTOM failure'})"));
    assert!(text.starts_with("CUSTOM failure script: "), "{text}");
    let text = error_text(&eval(&b, "error(42)"));
    assert!(text.starts_with("ERR user_script:1: 42"), "{text}");
    let text = error_text(&eval(&b, "error(true)"));
    assert!(text.starts_with("ERR true script: "), "{text}");
    let text = error_text(&eval(&b, "error()"));
    assert!(text.starts_with("ERR nil"), "{text}");
}

#[test]
fn sandbox_has_no_file_access_or_bytecode() {
    let (b, _) = backend();
    assert_eq!(
        eval(
            &b,
            "return {type(os), type(io), type(debug), type(package), type(require), type(loadfile), type(dofile), type(newproxy)}"
        ),
        Reply::Array(vec![bulk("nil"); 8])
    );
    let bytecode = "\u{1b}Lua\u{51}\u{0}";
    let text = error_text(&run(&b, &["EVAL", bytecode, "0"]));
    assert!(text.starts_with("ERR Error compiling script"), "{text}");
    assert_eq!(
        eval(
            &b,
            "local f, e = loadstring(string.dump(function() return 1 end)) return {type(f), e}"
        ),
        Reply::Array(vec![bulk("nil"), bulk("loading bytecode is not allowed")])
    );
    assert_eq!(eval(&b, "return loadstring('return 7')()"), Reply::Int(7));
    assert_eq!(
        eval(
            &b,
            "local parts = {'return ', '8'} local i = 0 return load(function() i = i + 1 return parts[i] end)()"
        ),
        Reply::Int(8)
    );
    assert_eq!(eval(&b, "print('not to stdout') return 1"), Reply::Int(1));
}

// ----- runaway scripts ---------------------------------------------------------------

fn killed(b: &EmbeddedBackend, script: &str) {
    let started = Instant::now();
    assert_eq!(
        eval(b, script),
        error("ERR script killed: ran longer than 50 ms"),
        "{script}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn runaway_scripts_are_killed() {
    let (b, _) = backend();
    b.set_script_time_limit(Duration::from_millis(50));
    killed(&b, "while true do end");
    killed(&b, "local function f() return f() end return f()");
    // Catching the kill with pcall doesn't buy another instruction.
    killed(&b, "while true do pcall(function() while true do end end) end");
    killed(&b, "local co = coroutine.wrap(function() while true do end end) co()");
    killed(&b, "while true do redis.call('incr', 'spin') end");
    // The backend goes on working: a script runs to its end (with room for a loaded machine:
    // at 50 ms the 100,000 steps of a debug build were once killed with the load at 13).
    b.set_script_time_limit(Duration::from_secs(5));
    assert_eq!(
        eval(&b, "local n = 0 for i = 1, 100000 do n = n + i end return n"),
        Reply::Int(5_000_050_000)
    );
    assert!(matches!(run(&b, &["GET", "spin"]), Reply::Bulk(_)));
}

#[test]
fn the_default_time_limit_is_five_seconds() {
    let (b, _) = backend();
    assert_eq!(b.lock().script_time_limit, Duration::from_millis(5000));
    assert_eq!(
        Reply::from(CommandError::ScriptKilled(SCRIPT_TIME_LIMIT.as_millis())),
        error("ERR script killed: ran longer than 5000 ms")
    );
}

#[test]
fn hostile_scripts_get_errors_not_crashes() {
    let (b, _) = backend();
    let text = error_text(&eval(&b, "return string.rep('x', 1e10)"));
    assert!(text.contains("not enough memory"), "{text}");
    assert_eq!(
        eval(&b, "local t = {} t[1] = t t[2] = t return t"),
        error("ERR reply from script is too large")
    );
    let Reply::Array(outer) = eval(&b, "local t = {} t[1] = t return t") else {
        panic!("not an array");
    };
    assert_eq!(outer.len(), 1);
    let text = error_text(&eval(&b, "local function f() f() end f()"));
    assert!(text.contains("stack overflow"), "{text}");
    // Still healthy.
    assert_eq!(eval(&b, "return 1"), Reply::Int(1));
}

#[test]
fn self_referencing_table_is_cut_at_the_stack_limit() {
    let mut reply = ReplyBuilder::new().reply(&Value::Nil);
    assert_eq!(reply, Reply::Nil);
    let lua = Lua::new();
    let table: Table = lua.load("local t = {} t[1] = t return t").eval().expect("a table");
    reply = ReplyBuilder::new().reply(&Value::Table(table));
    let mut depth = 0;
    while let Reply::Array(items) = reply {
        depth += 1;
        reply = items.into_iter().next().expect("one item");
    }
    assert_eq!(depth, MAX_REPLY_DEPTH);
    assert_eq!(reply, error("ERR reached lua stack limit"));
}

#[test]
fn parse_i64_follows_redis() {
    // The rule itself is tested on `protocol::whole_number`; here the master's error.
    assert_eq!(parse_i64(b"-12"), Ok(-12));
    assert_eq!(parse_i64(b"1e3"), Err(CommandError::NotAnInteger));
}

// ---------------------------------------------------------------------------------------------
// Hashes and sorted sets, as the proxy's scripts use them. Expected replies are Redis 7.0's.
// ---------------------------------------------------------------------------------------------

fn bulks(items: &[&str]) -> Reply {
    Reply::Array(items.iter().map(|item| bulk(item)).collect())
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

#[test]
fn hash_commands() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["hset", "h", "owner", "t1", "at", "5"]), Reply::Int(2));
    assert_eq!(run(&b, &["hset", "h", "owner", "t2", "n", "1"]), Reply::Int(1));
    assert_eq!(run(&b, &["hget", "h", "owner"]), bulk("t2"));
    assert_eq!(run(&b, &["hget", "h", "nope"]), Reply::Nil);
    assert_eq!(run(&b, &["hget", "nope", "owner"]), Reply::Nil);
    // Fields in the order they were first set, as a small Redis hash lists them.
    assert_eq!(run(&b, &["hkeys", "h"]), bulks(&["owner", "at", "n"]));
    assert_eq!(run(&b, &["hgetall", "h"]), bulks(&["owner", "t2", "at", "5", "n", "1"]));
    assert_eq!(run(&b, &["hkeys", "nope"]), Reply::Array(Vec::new()));
    assert_eq!(run(&b, &["hexists", "h", "at"]), Reply::Int(1));
    assert_eq!(run(&b, &["hexists", "h", "x"]), Reply::Int(0));
    assert_eq!(run(&b, &["hexists", "nope", "x"]), Reply::Int(0));
    assert_eq!(run(&b, &["hlen", "h"]), Reply::Int(3));
    assert_eq!(run(&b, &["hlen", "nope"]), Reply::Int(0));
    assert_eq!(run(&b, &["hincrby", "h", "n", "2"]), Reply::Int(3));
    assert_eq!(run(&b, &["hincrby", "h", "new", "-3"]), Reply::Int(-3));
    assert_eq!(run(&b, &["hincrby", "fresh", "f", "1"]), Reply::Int(1));
    assert_eq!(run(&b, &["type", "h"]), Reply::status("hash"));
    assert_eq!(run(&b, &["hdel", "h", "at", "x", "at"]), Reply::Int(1));
    assert_eq!(run(&b, &["hkeys", "h"]), bulks(&["owner", "n", "new"]));
    assert_eq!(run(&b, &["hdel", "nope", "a"]), Reply::Int(0));
}

#[test]
fn hash_errors() {
    let (b, _) = backend();
    assert_eq!(
        run(&b, &["hset", "h", "a"]),
        error("ERR wrong number of arguments for 'hset' command")
    );
    assert_eq!(
        run(&b, &["hset", "h", "a", "1", "b"]),
        error("ERR wrong number of arguments for 'hset' command")
    );
    run(&b, &["hset", "h", "a", "1", "s", "abc"]);
    assert_eq!(
        run(&b, &["hincrby", "h", "a", "x"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(
        run(&b, &["hincrby", "h", "s", "1"]),
        error("ERR hash value is not an integer")
    );
    assert_eq!(
        run(&b, &["hincrby", "h", "a", "9223372036854775807"]),
        error("ERR increment or decrement would overflow")
    );
    // A bad increment creates nothing.
    assert_eq!(
        run(&b, &["hincrby", "other", "a", "1.5"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(run(&b, &["exists", "other"]), Reply::Int(0));
}

#[test]
fn emptied_hash_and_sorted_set_are_deleted() {
    let (b, _) = backend();
    run(&b, &["hset", "h", "a", "1", "b", "2"]);
    assert_eq!(run(&b, &["hdel", "h", "a", "b"]), Reply::Int(2));
    assert_eq!(run(&b, &["exists", "h"]), Reply::Int(0));
    assert_eq!(run(&b, &["type", "h"]), Reply::status("none"));
    run(&b, &["zadd", "z", "1", "a", "2", "b"]);
    assert_eq!(run(&b, &["zrem", "z", "a", "b", "c"]), Reply::Int(2));
    assert_eq!(run(&b, &["exists", "z"]), Reply::Int(0));
    run(&b, &["zadd", "z", "1", "a", "2", "b"]);
    assert_eq!(run(&b, &["zremrangebyscore", "z", "-inf", "+inf"]), Reply::Int(2));
    assert_eq!(run(&b, &["exists", "z"]), Reply::Int(0));
    // A new value after the deletion starts without the old expiry.
    run(&b, &["hset", "h", "a", "1"]);
    run(&b, &["pexpire", "h", "1000"]);
    run(&b, &["hdel", "h", "a"]);
    run(&b, &["hset", "h", "a", "1"]);
    assert_eq!(run(&b, &["pttl", "h"]), Reply::Int(-1));
}

#[test]
fn sorted_set_commands() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["zadd", "z", "1.5", "a", "10", "b", "-0", "c"]), Reply::Int(3));
    assert_eq!(run(&b, &["zscore", "z", "a"]), bulk("1.5"));
    assert_eq!(run(&b, &["zscore", "z", "b"]), bulk("10"));
    assert_eq!(run(&b, &["zscore", "z", "c"]), bulk("0"));
    assert_eq!(run(&b, &["zscore", "z", "nope"]), Reply::Nil);
    assert_eq!(run(&b, &["zscore", "nope", "a"]), Reply::Nil);
    assert_eq!(run(&b, &["zcard", "z"]), Reply::Int(3));
    assert_eq!(run(&b, &["zcard", "nope"]), Reply::Int(0));
    assert_eq!(run(&b, &["type", "z"]), Reply::status("zset"));
    // Ordered by score, then by member.
    run(&b, &["zadd", "z", "10", "a2"]);
    assert_eq!(run(&b, &["zrange", "z", "0", "-1"]), bulks(&["c", "a", "a2", "b"]));
    assert_eq!(run(&b, &["zrange", "z", "-1", "-1", "WITHSCORES"]), bulks(&["b", "10"]));
    assert_eq!(run(&b, &["zrange", "z", "-100", "1"]), bulks(&["c", "a"]));
    assert_eq!(run(&b, &["zrange", "z", "5", "1"]), bulks(&[]));
    assert_eq!(run(&b, &["zrange", "z", "0", "0", "rev"]), bulks(&["b"]));
    assert_eq!(run(&b, &["zrange", "nope", "0", "-1"]), bulks(&[]));
    assert_eq!(
        run(&b, &["zrange", "z", "(1.5", "+inf", "BYSCORE", "LIMIT", "1", "5"]),
        bulks(&["b"])
    );
    assert_eq!(
        run(&b, &["zrange", "z", "+inf", "(1.5", "BYSCORE", "REV"]),
        bulks(&["b", "a2"])
    );
    assert_eq!(
        run(&b, &["zrangebyscore", "z", "1.5", "+inf", "WITHSCORES"]),
        bulks(&["a", "1.5", "a2", "10", "b", "10"])
    );
    assert_eq!(
        run(
            &b,
            &["zrangebyscore", "z", "-inf", "+inf", "withscores", "limit", "1", "-1"]
        ),
        bulks(&["a", "1.5", "a2", "10", "b", "10"])
    );
    assert_eq!(
        run(&b, &["zrangebyscore", "z", "-inf", "+inf", "limit", "-1", "5"]),
        bulks(&[])
    );
    assert_eq!(run(&b, &["zrem", "z", "a2", "x"]), Reply::Int(1));
    assert_eq!(run(&b, &["zremrangebyscore", "z", "-inf", "(1.5"]), Reply::Int(1));
    assert_eq!(run(&b, &["zrange", "z", "0", "-1"]), bulks(&["a", "b"]));
}

#[test]
fn zadd_options() {
    let (b, _) = backend();
    assert_eq!(run(&b, &["zadd", "z", "xx", "1", "a"]), Reply::Int(0));
    assert_eq!(
        run(&b, &["exists", "z"]),
        Reply::Int(0),
        "XX on a missing key creates nothing"
    );
    assert_eq!(run(&b, &["zadd", "z", "NX", "5", "a"]), Reply::Int(1));
    assert_eq!(run(&b, &["zadd", "z", "NX", "6", "a"]), Reply::Int(0));
    assert_eq!(run(&b, &["zscore", "z", "a"]), bulk("5"));
    assert_eq!(run(&b, &["zadd", "z", "XX", "7", "a", "1", "new"]), Reply::Int(0));
    assert_eq!(run(&b, &["zscore", "z", "a"]), bulk("7"));
    assert_eq!(run(&b, &["zscore", "z", "new"]), Reply::Nil);
    assert_eq!(run(&b, &["zadd", "z", "ch", "8", "a", "3", "new"]), Reply::Int(2));
    assert_eq!(run(&b, &["zadd", "z", "gt", "ch", "1", "a"]), Reply::Int(0));
    assert_eq!(run(&b, &["zadd", "z", "lt", "ch", "1", "a"]), Reply::Int(1));
    assert_eq!(run(&b, &["zadd", "z", "incr", "2", "a"]), bulk("3"));
    assert_eq!(run(&b, &["zadd", "z", "nx", "incr", "2", "a"]), Reply::Nil);
    assert_eq!(run(&b, &["zadd", "z", "incr", "-inf", "a"]), bulk("-inf"));
    assert_eq!(
        run(&b, &["zadd", "z", "incr", "inf", "a"]),
        error("ERR resulting score is not a number (NaN)")
    );
}

#[test]
fn sorted_set_errors() {
    let (b, _) = backend();
    let syntax = error("ERR syntax error");
    assert_eq!(run(&b, &["zadd", "z", "1", "a", "2"]), syntax);
    assert_eq!(
        run(&b, &["zadd", "z", "1"]),
        error("ERR wrong number of arguments for 'zadd' command")
    );
    assert_eq!(
        run(&b, &["zadd", "z", "abc", "x"]),
        error("ERR value is not a valid float")
    );
    assert_eq!(
        run(&b, &["zadd", "z", "nan", "x"]),
        error("ERR value is not a valid float")
    );
    assert_eq!(
        run(&b, &["zadd", "z", "1", "a", "x", "b"]),
        error("ERR value is not a valid float")
    );
    assert_eq!(run(&b, &["exists", "z"]), Reply::Int(0), "a bad score writes nothing");
    assert_eq!(
        run(&b, &["zadd", "z", "nx", "xx", "1", "a"]),
        error("ERR XX and NX options at the same time are not compatible")
    );
    let gt_lt_nx = error("ERR GT, LT, and/or NX options at the same time are not compatible");
    assert_eq!(run(&b, &["zadd", "z", "gt", "lt", "1", "a"]), gt_lt_nx);
    assert_eq!(run(&b, &["zadd", "z", "nx", "gt", "1", "a"]), gt_lt_nx);
    assert_eq!(
        run(&b, &["zadd", "z", "incr", "1", "a", "2", "b"]),
        error("ERR INCR option supports a single increment-element pair")
    );
    run(&b, &["zadd", "z", "1", "a"]);
    assert_eq!(
        run(&b, &["zrangebyscore", "z", "(1", "x"]),
        error("ERR min or max is not a float")
    );
    assert_eq!(
        run(&b, &["zremrangebyscore", "z", "a", "1"]),
        error("ERR min or max is not a float")
    );
    assert_eq!(
        run(&b, &["zrange", "z", "a", "b"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(run(&b, &["zrange", "z", "0", "-1", "limit", "0"]), syntax);
    assert_eq!(
        run(&b, &["zrange", "z", "0", "-1", "limit", "0", "1"]),
        error("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX")
    );
    assert_eq!(run(&b, &["zrangebyscore", "z", "0", "1", "rev"]), syntax);
}

#[test]
fn scores_are_formatted_as_redis_7_0_does() {
    let (b, _) = backend();
    run(
        &b,
        &[
            "zadd",
            "z",
            "1.1",
            "a",
            "0.1",
            "b",
            "123456789012345678",
            "c",
            "1e20",
            "d",
            "0.00001",
            "e",
            "1e-300",
            "f",
            "5e300",
            "g",
            "inf",
            "h",
            "1700000000123",
            "i",
        ],
    );
    for (member, score) in [
        ("a", "1.1000000000000001"),
        ("b", "0.10000000000000001"),
        ("c", "1.2345678901234568e+17"),
        ("d", "1e+20"),
        ("e", "1.0000000000000001e-05"),
        ("f", "1e-300"),
        ("g", "5.0000000000000003e+300"),
        ("h", "inf"),
        ("i", "1700000000123"),
    ] {
        assert_eq!(run(&b, &["zscore", "z", member]), bulk(score), "{member}");
    }
}

#[test]
fn other_types_answer_wrongtype() {
    let (b, _) = backend();
    run(&b, &["set", "s", "1"]);
    run(&b, &["hset", "h", "f", "1"]);
    run(&b, &["zadd", "z", "1", "m"]);
    let wrong = error(WRONGTYPE);
    for command in [
        &["hget", "s", "f"][..],
        &["hset", "z", "f", "1"],
        &["hkeys", "s"],
        &["hdel", "z", "f"],
        &["hexists", "s", "f"],
        &["hincrby", "z", "f", "1"],
        &["hlen", "s"],
        &["zadd", "h", "1", "m"],
        &["zscore", "s", "m"],
        &["zrem", "h", "m"],
        &["zrange", "s", "0", "-1"],
        &["zrangebyscore", "h", "0", "1"],
        &["zremrangebyscore", "s", "0", "1"],
        &["zcard", "h"],
        &["get", "h"],
        &["getset", "z", "v"],
        &["incr", "h"],
        &["set", "z", "v", "GET"],
    ] {
        assert_eq!(run(&b, command), wrong, "{command:?}");
    }
    // `MGET` answers nil for them; `SET` replaces them; `DEL`, `EXISTS`, `TYPE` take any type.
    assert_eq!(
        run(&b, &["mget", "s", "h", "z"]),
        Reply::Array(vec![bulk("1"), Reply::Nil, Reply::Nil])
    );
    assert_eq!(run(&b, &["exists", "s", "h", "z"]), Reply::Int(3));
    assert_eq!(run(&b, &["type", "s"]), Reply::status("string"));
    assert_eq!(run(&b, &["set", "z", "v"]), Reply::ok());
    assert_eq!(run(&b, &["get", "z"]), bulk("v"));
    assert_eq!(run(&b, &["del", "h", "z", "nope"]), Reply::Int(2));
    assert_eq!(run(&b, &["type", "h"]), Reply::status("none"));
}

#[test]
fn hashes_and_sorted_sets_expire_like_strings() {
    let (b, clock) = backend();
    run(&b, &["hset", "h", "f", "1"]);
    run(&b, &["zadd", "z", "1", "m"]);
    assert_eq!(run(&b, &["pttl", "h"]), Reply::Int(-1));
    assert_eq!(run(&b, &["pexpire", "h", "100"]), Reply::Int(1));
    assert_eq!(run(&b, &["pexpire", "z", "200"]), Reply::Int(1));
    // Writes to an existing hash or set keep its expiry.
    run(&b, &["hset", "h", "g", "2"]);
    run(&b, &["hincrby", "h", "f", "1"]);
    run(&b, &["zadd", "z", "2", "n"]);
    run(&b, &["zrem", "z", "n"]);
    clock.advance(50);
    assert_eq!(run(&b, &["pttl", "h"]), Reply::Int(50));
    assert_eq!(run(&b, &["pttl", "z"]), Reply::Int(150));
    clock.advance(51);
    assert_eq!(run(&b, &["exists", "h"]), Reply::Int(0));
    assert_eq!(run(&b, &["hget", "h", "f"]), Reply::Nil);
    assert_eq!(run(&b, &["zscore", "z", "m"]), bulk("1"));
    clock.advance(100);
    assert_eq!(run(&b, &["zcard", "z"]), Reply::Int(0));
    assert_eq!(run(&b, &["pttl", "z"]), Reply::Int(-2));
    // An expired key of another type is no obstacle to a new one.
    run(&b, &["set", "s", "1", "PX", "10"]);
    clock.advance(11);
    assert_eq!(run(&b, &["hset", "s", "f", "1"]), Reply::Int(1));
}

#[test]
fn scripts_see_redis_lua_conversions() {
    let (b, _) = backend();
    run(&b, &["zadd", "z", "1.5", "a", "7", "b"]);
    run(&b, &["hset", "h", "owner", "t", "at", "5"]);
    // ZSCORE is a bulk string, so a Lua string; a missing member is false.
    assert_eq!(
        eval(
            &b,
            "return {type(redis.call('zscore', 'z', 'a')), redis.call('zscore', 'z', 'a')}"
        ),
        bulks(&["string", "1.5"])
    );
    assert_eq!(
        eval(&b, "return tostring(redis.call('zscore', 'z', 'x'))"),
        bulk("false")
    );
    // HKEYS and ZRANGE ... WITHSCORES are arrays of strings.
    assert_eq!(
        eval(&b, "local k = redis.call('hkeys', 'h') return {#k, k[1], k[2]}"),
        Reply::Array(vec![Reply::Int(2), bulk("owner"), bulk("at")])
    );
    assert_eq!(
        eval(
            &b,
            "local r = redis.call('zrange', 'z', -1, -1, 'WITHSCORES') return {r[1], type(r[2]), tonumber(r[2]) + 1}"
        ),
        Reply::Array(vec![bulk("b"), bulk("string"), Reply::Int(8)])
    );
    // Lua numbers are sent as integers where integral, as the scripts pass expiries.
    assert_eq!(
        eval(&b, "return redis.call('zadd', 'z', 'XX', 1000 + 0.5 * 2, 'a')"),
        Reply::Int(0)
    );
    assert_eq!(run(&b, &["zscore", "z", "a"]), bulk("1001"));
    // A type error raised by `redis.call` ends the script with Redis' error.
    let text = error_text(&eval(&b, "return redis.call('hget', 'z', 'a')"));
    assert!(text.starts_with(&format!("{WRONGTYPE} script: ")), "{text}");
}
