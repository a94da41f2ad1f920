//! The newcomer's path: with no backends configured, the proxy runs embedded masters and
//! locks work end to end (what `cargo run --release` serves on a fresh machine).

mod support;

use support::{ProxyProcess, RELEASE};

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
