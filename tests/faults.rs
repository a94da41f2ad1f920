//! Masters dying: a minority down changes nothing; a majority down is `-NOQUORUM`.

mod support;

use support::{ProxyProcess, masters, urls};

fn acquire(
    c: &mut redis::Connection,
    key: &str,
    token: &str,
) -> redis::RedisResult<Option<String>> {
    redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query(c)
}

#[test]
fn two_of_five_killed_still_locks() {
    let mut servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(
        acquire(&mut c, "lock:warm", "t").unwrap().as_deref(),
        Some("OK")
    );
    servers[0].kill();
    servers[1].kill();
    for i in 0..20 {
        let key = format!("lock:k{i}");
        assert_eq!(
            acquire(&mut c, &key, "t").unwrap().as_deref(),
            Some("OK"),
            "{key}"
        );
        assert_eq!(acquire(&mut c, &key, "u").unwrap(), None, "{key} held");
    }
}

#[test]
fn three_of_five_killed_is_noquorum() {
    let mut servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(
        acquire(&mut c, "lock:warm", "t").unwrap().as_deref(),
        Some("OK")
    );
    for s in &mut servers[..3] {
        s.kill();
    }
    for _ in 0..3 {
        let err = acquire(&mut c, "lock:q", "t").unwrap_err();
        assert_eq!(err.code(), Some("NOQUORUM"), "{err}");
        assert_eq!(err.detail(), Some("2 of 5 backends answered"));
    }
    assert_eq!(
        servers[3].get("lock:q"),
        None,
        "the failed attempt was undone on the survivors"
    );
}

#[test]
fn killed_master_rejoins_after_restart() {
    let mut servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    servers[0].kill();
    servers[1].kill();
    assert!(acquire(&mut c, "lock:r", "t").is_err());
    servers[0].restart();
    // The proxy reconnects in the background; poll until it does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match acquire(&mut c, "lock:r", "t") {
            Ok(Some(_)) => break,
            _ if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => panic!("never recovered: {other:?}"),
        }
    }
}
