//! The newcomer's path: with no backends configured, the proxy runs embedded masters and
//! locks work end to end (what `cargo run --release` serves on a fresh machine).

mod support;

use redis::Value;
use support::{ProxyProcess, RELEASE, fencing_ready, int, query};

/// A fencing token (`Some`) or nil (`None`); anything else (`-NOQUORUM` where the masters
/// lacked a command) fails the test.
fn token(c: &mut redis::Connection, args: &[&str]) -> Option<i64> {
    match query(c, args) {
        Ok(Value::Int(token)) => Some(token),
        Ok(Value::Nil) => None,
        other => panic!("{args:?}: {other:?}"),
    }
}

#[test]
fn embedded_masters_take_and_release_locks() {
    let proxy = ProxyProcess::start(&[], "");
    let mut c = proxy.client();
    let set = |c: &mut redis::Connection, token: &str| -> Option<String> {
        redis::cmd("SET")
            .arg("lock:a")
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query(c)
            .unwrap()
    };
    assert_eq!(set(&mut c, "t1").as_deref(), Some("OK"));
    assert_eq!(set(&mut c, "t2"), None);
    let not_owner: i64 = redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg("lock:a")
        .arg("t2")
        .query(&mut c)
        .unwrap();
    assert_eq!(not_owner, 0);
    let released: i64 = redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg("lock:a")
        .arg("t1")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(set(&mut c, "t2").as_deref(), Some("OK"));
    let info: String = redis::cmd("INFO").arg("backends").query(&mut c).unwrap();
    assert_eq!(info.matches("kind=embedded").count(), 5, "{info}");
}

#[test]
fn embedded_masters_expire_locks() {
    let proxy = ProxyProcess::start(&[], "");
    let mut c = proxy.client();
    let ok: Option<String> = redis::cmd("SET")
        .arg("lock:e")
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(5_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(ok.as_deref(), Some("OK"));
    let pttl: i64 = redis::cmd("PTTL").arg("lock:e").query(&mut c).unwrap();
    assert!((4_000..=5_000).contains(&pttl), "pttl {pttl}");
}

/// Read-write locks keep their readers in sorted sets on the masters: the embedded masters
/// serve them as Redis does.
#[test]
fn embedded_masters_serve_read_write_locks() {
    let proxy = ProxyProcess::start(&[], "");
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let r1 = token(&mut c, &["RWLOCK.READ", "doc:1", "r1", "10000"]).expect("free: read");
    let r2 = token(&mut c, &["RWLOCK.READ", "doc:1", "r2", "10000"]).expect("readers share");
    assert!(r2 > r1, "tokens rise: {r1} then {r2}");
    assert_eq!(
        token(&mut c, &["RWLOCK.WRITE", "doc:1", "w1", "10000"]),
        None,
        "readers hold it"
    );
    assert_eq!(int(&mut c, &["RWLOCK.RELEASE", "doc:1", "r1"]), 1);
    assert_eq!(
        token(&mut c, &["RWLOCK.WRITE", "doc:1", "w1", "10000"]),
        None,
        "r2 still reads"
    );
    assert_eq!(int(&mut c, &["RWLOCK.RELEASE", "doc:1", "r2"]), 1);
    let w = token(&mut c, &["RWLOCK.WRITE", "doc:1", "w1", "10000"]).expect("no reader left");
    assert!(w > r2);
    assert_eq!(
        token(&mut c, &["RWLOCK.READ", "doc:1", "r3", "10000"]),
        None,
        "a writer holds it"
    );
    assert_eq!(int(&mut c, &["RWLOCK.RELEASE", "doc:1", "w1"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.RELEASE", "doc:1", "w1"]), 0, "released already");
    assert!(token(&mut c, &["RWLOCK.READ", "doc:1", "r3", "10000"]).is_some());
}

/// Reentrant holds are counted in hashes on the masters.
#[test]
fn embedded_masters_serve_reentrant_locks() {
    let proxy = ProxyProcess::start(&[], "");
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let acquire = ["LOCK.ACQUIRE", "lock:r", "me", "10000", "REENTRANT"];
    let first = token(&mut c, &acquire).expect("free: taken");
    assert_eq!(token(&mut c, &acquire), Some(first), "counted up, same token");
    assert_eq!(token(&mut c, &["LOCK.ACQUIRE", "lock:r", "you", "10000"]), None);
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "lock:r", "me"]), 1);
    assert_eq!(
        token(&mut c, &["LOCK.ACQUIRE", "lock:r", "you", "10000"]),
        None,
        "one hold left"
    );
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "lock:r", "me"]), 1);
    let next = token(&mut c, &["LOCK.ACQUIRE", "lock:r", "you", "10000"]).expect("freed with its last hold");
    assert!(next > first);
}
