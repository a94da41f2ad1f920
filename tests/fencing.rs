//! Fencing tokens over real masters (`docs/fencing.md`): the native `LOCK.*` commands,
//! `LOCK.FENCE` for plain `SET NX PX` clients, a paused client's late write refused by a
//! fenced store, and the two ways a master can lose counters: restarting empty, and
//! restarting from a snapshot older than its last write-backs.

mod support;

#[path = "../examples/fenced_store/store.rs"]
mod store;

use std::time::{Duration, Instant};

use redis::Value;
use store::FencedStore;
use support::{ProxyProcess, RedisServer, masters, urls};

/// Two round trips per fenced grant, some with masters paused: a loaded 2-core machine needs
/// more than the default 50 ms per master for the outcome not to depend on the load.
const CONFIG: &str = "backend_timeout_ms = 500";

fn lock_acquire(c: &mut redis::Connection, key: &str, token: &str, ttl_ms: u64) -> redis::RedisResult<Option<u64>> {
    redis::cmd("LOCK.ACQUIRE").arg(key).arg(token).arg(ttl_ms).query(c)
}

fn granted(c: &mut redis::Connection, key: &str, token: &str) -> u64 {
    lock_acquire(c, key, token, 10_000)
        .expect("LOCK.ACQUIRE")
        .unwrap_or_else(|| panic!("{key} not granted to {token}"))
}

fn release(c: &mut redis::Connection, key: &str, token: &str) {
    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(token)
        .query(c)
        .expect("LOCK.RELEASE");
    assert_eq!(released, 1, "{key} released by {token}");
}

/// The counter a master holds for `key`, as `<run_id> <n>`: the number.
fn counter(server: &RedisServer, key: &str) -> Option<u64> {
    let raw = server.get(&format!("redlock-proxy:fence:c:{key}"))?;
    raw.split_once(' ').and_then(|(_, n)| n.parse().ok())
}

/// Retries `LOCK.ACQUIRE` until granted: after a master is resumed, the proxy's probe must
/// see it up again before it is asked.
fn granted_eventually(c: &mut redis::Connection, key: &str, token: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock_acquire(c, key, token, 10_000) {
            Ok(Some(t)) => return t,
            other if Instant::now() > deadline => panic!("{key} never granted to {token}: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The first fenced command of a database assigns the genesis epochs, which needs every
/// master to answer within the backend timeout; on a loaded machine one may not, and the
/// client retries, as lock clients do.
fn first_grant(c: &mut redis::Connection, key: &str, token: &str) -> u64 {
    granted_eventually(c, key, token)
}

fn info(c: &mut redis::Connection, key: &str) -> Vec<Value> {
    match redis::cmd("LOCK.INFO").arg(key).query(c).expect("LOCK.INFO") {
        Value::Array(items) => items,
        other => panic!("LOCK.INFO answered {other:?}"),
    }
}

#[test]
fn native_commands_and_fence_for_set_nx_clients() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    let mut c = proxy.client();
    let t1 = first_grant(&mut c, "lock:n", "a");
    assert_eq!(
        lock_acquire(&mut c, "lock:n", "b", 10_000).expect("reply"),
        None,
        "held: nil"
    );
    // LOCK.INFO: holder, validity, last token (a flat array in RESP2).
    let items = info(&mut c, "lock:n");
    assert_eq!(items[0], Value::BulkString(b"holder".to_vec()));
    assert_eq!(items[1], Value::BulkString(b"a".to_vec()));
    match items[3] {
        Value::Int(ms) => assert!((9_000..10_000).contains(&ms), "{ms}"),
        ref other => panic!("validity {other:?}"),
    }
    assert_eq!(items[5], Value::Int(t1 as i64));
    let left: i64 = redis::cmd("LOCK.EXTEND")
        .arg("lock:n")
        .arg("a")
        .arg(20_000)
        .query(&mut c)
        .expect("EXTEND");
    assert!((19_000..20_000).contains(&left), "{left}");
    let not_mine: i64 = redis::cmd("LOCK.EXTEND")
        .arg("lock:n")
        .arg("b")
        .arg(20_000)
        .query(&mut c)
        .expect("EXTEND");
    assert_eq!(not_mine, 0);
    release(&mut c, "lock:n", "a");
    let t2 = granted(&mut c, "lock:n", "b");
    assert!(t2 > t1);
    release(&mut c, "lock:n", "b");

    // A client of plain SET NX PX asks for the token of its grant.
    let ok: Option<String> = redis::cmd("SET")
        .arg("lock:n")
        .arg("plain")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query(&mut c)
        .expect("SET");
    assert_eq!(ok.as_deref(), Some("OK"));
    let t3: Option<u64> = redis::cmd("LOCK.FENCE")
        .arg("lock:n")
        .arg("plain")
        .query(&mut c)
        .expect("FENCE");
    assert!(t3.expect("holder gets a token") > t2);
    let none: Option<u64> = redis::cmd("LOCK.FENCE")
        .arg("lock:n")
        .arg("other")
        .query(&mut c)
        .expect("FENCE");
    assert_eq!(none, None, "not the holder: nil");
    // The lock itself is untouched: the plain release script still works.
    let released: i64 = redis::cmd("EVAL")
        .arg("if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end")
        .arg(1)
        .arg("lock:n")
        .arg("plain")
        .query(&mut c)
        .expect("EVAL");
    assert_eq!(released, 1);
    let err = lock_acquire(&mut c, "lock:n", "a", 0).unwrap_err();
    assert_eq!(err.code(), Some("ERR"));
    assert_eq!(err.detail(), Some("invalid expire time in 'lock.acquire' command"));
}

/// The example's story with real masters: A is paused past its validity, B takes the lock
/// and writes; A's late write is refused by the fenced store and would have overwritten B's
/// data in a store without fencing.
#[test]
fn a_paused_clients_late_write_is_refused() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    let (mut a, mut b) = (proxy.client(), proxy.client());
    let (mut fenced, mut plain) = (FencedStore::new(), FencedStore::unfenced());
    first_grant(&mut b, "lock:warm", "w");
    let token_a = lock_acquire(&mut a, "lock:res", "client-a", 300)
        .expect("reply")
        .expect("A granted");
    // A stalls. B retries, as lock clients do, until A's lock has expired.
    let token_b = granted_eventually(&mut b, "lock:res", "client-b");
    assert!(token_b > token_a);
    for store in [&mut fenced, &mut plain] {
        store.write("balance", "B", token_b).expect("B writes");
    }
    // A wakes up, still believing it holds the lock, and writes.
    let late = fenced.write("balance", "A (late)", token_a);
    assert_eq!(late.map_err(|s| (s.token, s.highest)), Err((token_a, token_b)));
    assert_eq!(fenced.read("balance"), Some("B"));
    plain.write("balance", "A (late)", token_a).expect("no check");
    assert_eq!(
        plain.read("balance"),
        Some("A (late)"),
        "without tokens, B's write is lost"
    );
}

/// The case of `docs/fencing.md`: a token lands on exactly 3 of 5 masters; one of those 3
/// restarts empty; the next quorum is that master and the 2 that missed the token. Their
/// counters would give a smaller token; the restarted master must not vote on tokens until
/// a write-back has rewritten its counter.
#[test]
fn a_master_restarted_empty_does_not_vote_on_tokens() {
    let mut servers = masters(5);
    // The quarantine would keep the restarted master out of every quorum for max_ttl_ms;
    // off, so that fencing's own rule is what is tested.
    let proxy = ProxyProcess::start(&urls(&servers), &format!("{CONFIG}\nquarantine = \"off\""));
    let mut c = proxy.client();
    let first = first_grant(&mut c, "lock:r", "t0");
    release(&mut c, "lock:r", "t0");
    // 3 and 4 miss the next grants: 0, 1, 2 hold a higher counter.
    servers[3].pause();
    servers[4].pause();
    let mut last = first;
    for i in 0..5 {
        let t = granted(&mut c, "lock:r", &format!("x{i}"));
        assert!(t > last);
        last = t;
        release(&mut c, "lock:r", &format!("x{i}"));
    }
    servers[3].resume();
    servers[4].resume();
    let stale: Vec<u64> = [3, 4]
        .iter()
        .map(|&i| counter(&servers[i], "lock:r").expect("counter"))
        .collect();
    assert!(stale.iter().all(|&s| s < last), "3 and 4 missed {last}: {stale:?}");
    // Master 2 restarts empty; 0 and 1 become unreachable.
    servers[2].restart();
    servers[0].pause();
    servers[1].pause();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Masters 2, 3, 4 grant the lock, but only 3 and 4 vouch for their counters, whose
        // maximum plus one would be a token below `last`: refused, and undone.
        match lock_acquire(&mut c, "lock:r", "late", 10_000) {
            Err(e) if e.code() == Some("NOQUORUM") && e.to_string().contains("fencing: 2 of 5") => break,
            other if Instant::now() > deadline => panic!("expected the fencing refusal, got {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    assert_eq!(servers[3].get("lock:r"), None, "the refused grant was undone");
    assert!(
        servers[2]
            .get("redlock-proxy:fence:epoch")
            .is_some_and(|e| e.starts_with("r ")),
        "the restarted master rejoined with a rejoin epoch"
    );
    servers[0].resume();
    servers[1].resume();
    let t = granted_eventually(&mut c, "lock:r", "late");
    assert!(t > last, "{t} after {last}");
    // Master 2 may answer after the quorum (the grant does not wait for it); its write-back,
    // or the repair the proxy runs in the background, rewrites its counter.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&servers[2], "lock:r") < Some(t) {
        assert!(Instant::now() < deadline, "master 2 never rewritten");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A master killed and restarted from a snapshot taken before its last write-backs comes
/// back with an epoch of its previous run: on the first connection the proxy demotes it, so
/// its old counters are not trusted.
#[test]
fn a_master_restored_from_an_old_snapshot_does_not_vote_on_tokens() {
    let dir = std::env::temp_dir().join(format!("redlock-proxy-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let dir_arg = dir.to_string_lossy().into_owned();
    let mut servers = vec![
        RedisServer::start_with(&["--dir", &dir_arg, "--dbfilename", "m0.rdb"]),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let proxy = ProxyProcess::start(&urls(&servers), &format!("{CONFIG}\nquarantine = \"off\""));
    let mut c = proxy.client();
    let first = first_grant(&mut c, "lock:s", "t0");
    release(&mut c, "lock:s", "t0");
    let _: () = redis::cmd("SAVE").query(&mut servers[0].client()).expect("SAVE");
    // Master 2 misses the next grants; 0 and 1 vouch for `last`.
    servers[2].pause();
    let mut last = first;
    for i in 0..3 {
        last = granted(&mut c, "lock:s", &format!("x{i}"));
        release(&mut c, "lock:s", &format!("x{i}"));
    }
    servers[2].resume();
    // Master 0 crashes and restarts from its snapshot: its counter is `first` again, under
    // the epoch of its previous run.
    servers[0].restart();
    assert_eq!(
        counter(&servers[0], "lock:s"),
        Some(first),
        "restored from the snapshot"
    );
    servers[1].pause();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock_acquire(&mut c, "lock:s", "late", 10_000) {
            Err(e) if e.code() == Some("NOQUORUM") && e.to_string().contains("fencing: 1 of 3") => break,
            other if Instant::now() > deadline => panic!("expected the fencing refusal, got {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    assert!(
        servers[0]
            .get("redlock-proxy:fence:epoch")
            .is_some_and(|e| e.starts_with("r ")),
        "demoted on reconnection"
    );
    servers[1].resume();
    let t = granted_eventually(&mut c, "lock:s", "late");
    assert!(t > last, "{t} after {last}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rolling restart of every master, each empty, while one lock stays unused: each
/// restarted master is repaired from the others (counters copied, then promoted to a genesis
/// epoch) before the next one restarts, so the idle lock's next token is above its last.
#[test]
fn a_rolling_restart_keeps_idle_locks_fenced() {
    let mut servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), &format!("{CONFIG}\nquarantine = \"off\""));
    let mut c = proxy.client();
    let last = first_grant(&mut c, "lock:idle", "a");
    release(&mut c, "lock:idle", "a");
    for (i, server) in servers.iter_mut().enumerate() {
        server.restart();
        // Fenced commands on another lock meet the restarted master; the proxy repairs it
        // in the background. Wait until it is promoted.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut n = 0;
        while !server
            .get("redlock-proxy:fence:epoch")
            .is_some_and(|e| e.starts_with("g "))
        {
            assert!(Instant::now() < deadline, "master {i} never repaired");
            n += 1;
            let token = format!("w{i}-{n}");
            if let Ok(Some(_)) = lock_acquire(&mut c, "lock:work", &token, 10_000) {
                release(&mut c, "lock:work", &token);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            counter(server, "lock:idle"),
            Some(last),
            "master {i} got the idle lock's counter"
        );
    }
    let t = granted(&mut c, "lock:idle", "b");
    assert!(t > last, "{t} after {last}");
}

/// F4 with a member away at the first fenced command: the counters wait for it, and the
/// refusal and the log say so (which member, why, that `SET NX` is unaffected) instead of a
/// bare count; once it answers, fenced locks start.
#[test]
fn a_new_database_waits_for_every_master_and_says_which() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), CONFIG);
    let mut c = proxy.client();
    servers[2].pause();
    let refused = lock_acquire(&mut c, "lock:first", "a", 10_000).expect_err("no counters yet");
    let said = refused.to_string();
    assert!(
        said.contains("no fencing counters yet") && said.contains("member 2 did not"),
        "{said}"
    );
    assert_eq!(
        support::acquire(&mut c, "lock:plain", "a", 10_000).as_deref(),
        Some("OK"),
        "SET NX is not affected"
    );
    let log = proxy.log();
    assert_eq!(
        log.matches("fencing cannot start in this database").count(),
        1,
        "said once: {log}"
    );
    let _ = lock_acquire(&mut c, "lock:first", "a", 10_000);
    assert_eq!(proxy.log().matches("fencing cannot start").count(), 1, "not again");
    servers[2].resume();
    granted_eventually(&mut c, "lock:first", "a");
}

/// Item 8a of the issue: after the README's way out for new masters (lift 2 of 3), `SET NX`
/// worked but every fenced command answered `NOQUORUM fencing: ... start only when every
/// master answers (member 2 did not ...)` until the third left its quarantine, though it was
/// answering. A quarantined master that answers says it holds no epoch: the counters start
/// with the two that vote, and the third rejoins (F5) when it votes again.
#[test]
fn fencing_starts_when_two_of_three_new_masters_are_lifted() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), &format!("{CONFIG}\nquarantine = \"always\""));
    let mut c = proxy.client();
    for member in ["0", "1"] {
        assert_eq!(
            redis::cmd("PROXY")
                .arg("QUARANTINE")
                .arg(member)
                .arg("LIFT")
                .query::<Value>(&mut c),
            Ok(Value::Okay)
        );
    }
    let first = granted(&mut c, "lock:new", "a");
    release(&mut c, "lock:new", "a");
    assert!(
        support::backend_line(&proxy, 2).contains("quarantined"),
        "the third is still quarantined"
    );
    assert_eq!(
        redis::cmd("PROXY")
            .arg("QUARANTINE")
            .arg("2")
            .arg("LIFT")
            .query::<Value>(&mut c),
        Ok(Value::Okay)
    );
    // The third votes again: it rejoins, and tokens go on rising.
    let second = granted(&mut c, "lock:new", "b");
    assert!(second > first, "{second} after {first}");
}
