//! The lock command set with majority meaning: GET, EXISTS, PTTL, DEL, PEXPIRE, the SET
//! family, SETNX, GETSET, DELEX, SET IFEQ, extension scripts with validity, transactions
//! and SELECT, against five real masters.

mod support;

use std::time::Duration;

use support::{DelayRelay, ProxyProcess, RedisServer, holders, masters, urls};

fn cmd(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut command = redis::cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command
        .query(c)
        .unwrap_or_else(|e| redis::Value::SimpleString(format!("ERROR {e}")))
}

fn ok() -> redis::Value {
    redis::Value::Okay
}

fn bulk(s: &str) -> redis::Value {
    redis::Value::BulkString(s.as_bytes().to_vec())
}

fn int(i: i64) -> redis::Value {
    redis::Value::Int(i)
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(&mut server.client()).expect("PTTL")
}

fn setup() -> (Vec<RedisServer>, ProxyProcess, redis::Connection) {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "legacy_ttl_ms = 20000");
    let c = proxy.client();
    (servers, proxy, c)
}

#[test]
fn get_is_the_value_a_majority_holds() {
    let (servers, _p, mut c) = setup();
    for s in &servers[..3] {
        s.set("k", "a");
    }
    servers[3].set("k", "b");
    assert_eq!(cmd(&mut c, &["GET", "k"]), bulk("a"));
    servers[2].set("k", "b");
    assert_eq!(cmd(&mut c, &["GET", "k"]), redis::Value::Nil, "no value on 3 of 5");
    assert_eq!(cmd(&mut c, &["EXISTS", "k", "nope"]), int(1));
    assert_eq!(cmd(&mut c, &["DEL", "k"]), int(1));
    assert_eq!(cmd(&mut c, &["EXISTS", "k"]), int(0));
}

#[test]
fn pttl_is_what_a_majority_guarantees_and_pexpire_extends() {
    let (servers, _p, mut c) = setup();
    assert_eq!(cmd(&mut c, &["SET", "lock:t", "me", "NX", "PX", "10000"]), ok());
    let redis::Value::Int(ttl) = cmd(&mut c, &["PTTL", "lock:t"]) else {
        panic!()
    };
    assert!((9000..=10_000).contains(&ttl), "{ttl}");
    assert_eq!(cmd(&mut c, &["PEXPIRE", "lock:t", "20000"]), int(1));
    assert!(pttl(&servers[0], "lock:t") > 19_000);
    assert_eq!(cmd(&mut c, &["EXPIRE", "lock:t", "30"]), int(1));
    assert!(pttl(&servers[0], "lock:t") > 29_000);
    let too_long = cmd(&mut c, &["PEXPIRE", "lock:t", "999999999"]);
    assert!(format!("{too_long:?}").contains("exceeds max_ttl_ms"), "{too_long:?}");
    let redis::Value::Int(ttl) = cmd(&mut c, &["TTL", "lock:t"]) else {
        panic!()
    };
    assert!((29..=30).contains(&ttl), "{ttl}");
}

#[test]
fn set_family_always_writes_a_ttl() {
    let (servers, _p, mut c) = setup();
    assert_eq!(cmd(&mut c, &["SET", "plain", "v"]), ok());
    let ttl = pttl(&servers[0], "plain");
    assert!(
        (19_000..=20_000).contains(&ttl),
        "legacy_ttl_ms applies to a SET without TTL: {ttl}"
    );
    assert_eq!(cmd(&mut c, &["SET", "plain", "w", "XX", "GET"]), bulk("v"));
    assert_eq!(cmd(&mut c, &["SET", "absent", "w", "XX"]), redis::Value::Nil);
    let refused = cmd(&mut c, &["SET", "plain", "v", "KEEPTTL"]);
    assert!(
        format!("{refused:?}").contains("KEEPTTL is not supported"),
        "{refused:?}"
    );
    let at = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 5000)
        .to_string();
    assert_eq!(cmd(&mut c, &["SET", "lock:at", "t", "NX", "PXAT", &at]), ok());
    let ttl = pttl(&servers[0], "lock:at");
    assert!((4000..=5000).contains(&ttl), "PXAT converted to a TTL: {ttl}");
    // SET NX GET: nil when taken, the holder's value when refused.
    assert_eq!(
        cmd(&mut c, &["SET", "lock:g", "t1", "NX", "GET", "PX", "5000"]),
        redis::Value::Nil
    );
    assert_eq!(
        cmd(&mut c, &["SET", "lock:g", "t2", "NX", "GET", "PX", "5000"]),
        bulk("t1")
    );
}

#[test]
fn setnx_and_getset_are_majority_decisions() {
    let (servers, _p, mut c) = setup();
    assert_eq!(cmd(&mut c, &["SETNX", "lock.foo", "100"]), int(1));
    assert_eq!(cmd(&mut c, &["SETNX", "lock.foo", "200"]), int(0));
    assert!(pttl(&servers[0], "lock.foo") > 0, "SETNX keys get legacy_ttl_ms");
    assert_eq!(cmd(&mut c, &["GETSET", "lock.foo", "300"]), bulk("100"));
    // A split: no old value on a majority. GETSET must not report an old value that only a
    // minority held; the caller sees its own value ("someone holds it").
    servers[0].set("lock.foo", "x");
    servers[1].set("lock.foo", "y");
    servers[2].set("lock.foo", "x");
    assert_eq!(cmd(&mut c, &["GETSET", "lock.foo", "400"]), bulk("400"));
    assert_eq!(holders(&servers, "lock.foo", "400"), 5);
}

#[test]
fn delex_and_set_ifeq_for_redis_8_4_clients() {
    let (servers, _p, mut c) = setup();
    assert_eq!(cmd(&mut c, &["SET", "lock:d", "me", "NX", "PX", "10000"]), ok());
    assert_eq!(
        cmd(&mut c, &["SET", "lock:d", "me", "IFEQ", "other", "PX", "20000"]),
        redis::Value::Nil
    );
    assert_eq!(cmd(&mut c, &["SET", "lock:d", "me", "IFEQ", "me", "PX", "20000"]), ok());
    assert!(pttl(&servers[0], "lock:d") > 19_000, "extended");
    assert_eq!(cmd(&mut c, &["DELEX", "lock:d", "IFEQ", "other"]), int(0));
    assert_eq!(cmd(&mut c, &["DELEX", "lock:d", "IFNE", "me"]), int(0));
    assert_eq!(cmd(&mut c, &["DELEX", "lock:d", "IFEQ", "me"]), int(1));
    assert_eq!(holders(&servers, "lock:d", "me"), 0);
}

const REDIS_PY_EXTEND: &str = "local token = redis.call('get', KEYS[1])
if not token or token ~= ARGV[1] then return 0 end
local expiration = redis.call('pttl', KEYS[1])
if not expiration then expiration = 0 end
if expiration < 0 then return 0 end
local newttl = ARGV[2]
if ARGV[3] == \"0\" then newttl = ARGV[2] + expiration end
redis.call('pexpire', KEYS[1], newttl)
return 1";

#[test]
fn extension_scripts_count_only_within_the_new_validity() {
    let servers = masters(5);
    let relays: Vec<DelayRelay> = servers[..3].iter().map(|s| DelayRelay::start(s.port)).collect();
    let mut backends: Vec<String> = relays.iter().map(DelayRelay::url).collect();
    backends.extend(servers[3..].iter().map(RedisServer::url));
    // drift = 300 × 0.4 + 2 ms: a 300 ms extension is valid only if a majority confirms it within 178 ms.
    let proxy = ProxyProcess::start(&backends, "drift_factor = 0.4\nbackend_timeout_ms = 1000");
    let mut c = proxy.client();
    assert_eq!(cmd(&mut c, &["SET", "lock:x", "me", "NX", "PX", "10000"]), ok());
    let extend = |c: &mut redis::Connection, ms: &str| cmd(c, &["EVAL", REDIS_PY_EXTEND, "1", "lock:x", "me", ms, "1"]);
    assert_eq!(extend(&mut c, "300"), int(1), "control: fast masters extend");
    assert_eq!(
        cmd(&mut c, &["EVAL", REDIS_PY_EXTEND, "1", "lock:x", "other", "300", "1"]),
        int(0),
        "not the owner"
    );
    for relay in &relays {
        relay.set_delay(Duration::from_millis(220));
    }
    // Rule 7 withholds the script's success; it cannot know the script's failure value, so
    // the reply is an error, never a value the script did not return.
    let withheld = format!("{:?}", extend(&mut c, "300"));
    assert!(
        withheld.contains("withheld"),
        "a majority confirmed after the new validity ran out: {withheld}"
    );
    assert_eq!(
        cmd(&mut c, &["PEXPIRE", "lock:x", "300"]),
        int(0),
        "PEXPIRE is checked the same way"
    );
}

#[test]
fn watch_multi_exec_as_stackexchange_redis_releases() {
    let (servers, _p, mut c) = setup();
    assert_eq!(cmd(&mut c, &["SET", "lock:w", "me", "NX", "PX", "10000"]), ok());
    // The conditional release: WATCH, GET (client compares), MULTI, DEL, EXEC.
    assert_eq!(cmd(&mut c, &["WATCH", "lock:w"]), ok());
    assert_eq!(cmd(&mut c, &["GET", "lock:w"]), bulk("me"));
    assert_eq!(cmd(&mut c, &["MULTI"]), ok());
    assert_eq!(
        cmd(&mut c, &["DEL", "lock:w"]),
        redis::Value::SimpleString("QUEUED".into())
    );
    assert_eq!(cmd(&mut c, &["EXEC"]), redis::Value::Array(vec![int(1)]));
    assert_eq!(holders(&servers, "lock:w", "me"), 0);

    // The watched value changes (the lock expired and someone else took it): EXEC is nil.
    assert_eq!(cmd(&mut c, &["SET", "lock:w", "me", "NX", "PX", "10000"]), ok());
    assert_eq!(cmd(&mut c, &["WATCH", "lock:w"]), ok());
    for s in &servers {
        s.set("lock:w", "other");
    }
    assert_eq!(cmd(&mut c, &["MULTI"]), ok());
    assert_eq!(
        cmd(&mut c, &["PEXPIRE", "lock:w", "5000"]),
        redis::Value::SimpleString("QUEUED".into())
    );
    assert_eq!(cmd(&mut c, &["EXEC"]), redis::Value::Nil);
    assert_eq!(
        holders(&servers, "lock:w", "other"),
        5,
        "the aborted transaction changed nothing"
    );

    // Errors while queueing abort the transaction.
    assert_eq!(cmd(&mut c, &["MULTI"]), ok());
    assert!(format!("{:?}", cmd(&mut c, &["NOSUCH"])).contains("unknown command"));
    let abort = format!("{:?}", cmd(&mut c, &["EXEC"]));
    assert!(
        abort.contains("Transaction discarded because of previous errors"),
        "{abort}"
    );
    assert!(format!("{:?}", cmd(&mut c, &["EXEC"])).contains("EXEC without MULTI"));
}

/// A transaction that ran on every master is not told as aborted because the masters'
/// answers differ as whole arrays (each its own PTTL): each position is combined by the rule,
/// and `EXEC` is nil only when a quorum saw a watched key change.
#[test]
fn exec_that_ran_everywhere_answers_each_position_by_the_rule() {
    let (servers, _p, mut c) = setup();
    for (i, s) in servers.iter().enumerate() {
        redis::cmd("SET")
            .arg("lock:d")
            .arg("me")
            .arg("PX")
            .arg(10_000 * (i + 1))
            .query::<()>(&mut s.client())
            .expect("SET");
    }
    assert_eq!(cmd(&mut c, &["WATCH", "lock:d"]), ok());
    assert_eq!(cmd(&mut c, &["MULTI"]), ok());
    for queued in [&["PTTL", "lock:d"][..], &["TTL", "lock:d"], &["GET", "lock:d"]] {
        assert_eq!(cmd(&mut c, queued), redis::Value::SimpleString("QUEUED".into()));
    }
    let redis::Value::Array(positions) = cmd(&mut c, &["EXEC"]) else {
        panic!("EXEC did not run")
    };
    // The TTL a quorum (3 of 5) still guarantees: the third largest, 30 s less the time since.
    let [redis::Value::Int(pttl), redis::Value::Int(ttl), get] = positions.as_slice() else {
        panic!("EXEC answered {positions:?}")
    };
    assert!((25_000..=30_000).contains(pttl), "PTTL {pttl}");
    assert!((25..=30).contains(ttl), "TTL {ttl}");
    assert_eq!(get, &bulk("me"));
}

#[test]
fn select_keeps_databases_apart() {
    let (servers, _p, mut c) = setup();
    assert_eq!(cmd(&mut c, &["SELECT", "3"]), ok());
    assert_eq!(cmd(&mut c, &["SET", "lock:db", "t3", "NX", "PX", "10000"]), ok());
    assert_eq!(cmd(&mut c, &["SELECT", "0"]), ok());
    assert_eq!(
        cmd(&mut c, &["SET", "lock:db", "t0", "NX", "PX", "10000"]),
        ok(),
        "db 0 is a different lock"
    );
    let in_db3 = servers
        .iter()
        .filter(|s| {
            let mut m = s.client();
            let _: () = redis::cmd("SELECT").arg(3).query(&mut m).unwrap();
            redis::cmd("GET")
                .arg("lock:db")
                .query::<Option<String>>(&mut m)
                .unwrap()
                .as_deref()
                == Some("t3")
        })
        .count();
    assert!(in_db3 >= 3, "db 3 holds t3 on a majority");
    assert!(holders(&servers, "lock:db", "t0") >= 3, "db 0 holds t0");
    assert!(format!("{:?}", cmd(&mut c, &["SELECT", "16"])).contains("DB index is out of range"));
}

/// In the spirit of redis-semaphore's acquire: drop expired holders, count the others, join
/// if fewer than the limit. KEYS: the semaphore; ARGV: limit, holder, expired before, now, ttl.
const SEMAPHORE_ACQUIRE: &str = "redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[3]) \
    if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then \
      redis.call('zadd', KEYS[1], ARGV[4], ARGV[2]) redis.call('pexpire', KEYS[1], ARGV[5]) return 1 \
    end return 0";

/// Rule 14: a majority bounds one holder, not k. Two holders of a 2-permit semaphore over five
/// masters, each on a bare majority (A on masters 0-2, B on 2-4: as partitions leave them), and
/// a third asks: four masters count one holder, below the limit, so a majority vote would admit
/// it, three holders of two permits. The proxy refuses counting scripts instead, naming the
/// safe alternative; `ZREM` (a holder leaving) is served like `DEL`.
#[test]
fn counting_scripts_are_refused_and_zrem_releases() {
    let servers = masters(5);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    let now = 1_000_000.to_string();
    for (i, s) in servers.iter().enumerate() {
        let mut direct = s.client();
        for (holder, on) in [("A", i <= 2), ("B", i >= 2)] {
            if on {
                let _: i64 = redis::cmd("ZADD")
                    .arg("sem")
                    .arg(&now)
                    .arg(holder)
                    .query(&mut direct)
                    .expect("ZADD");
            }
        }
        let _: i64 = redis::cmd("PEXPIRE")
            .arg("sem")
            .arg(60_000)
            .query(&mut direct)
            .expect("PEXPIRE");
    }
    let acquire = ["EVAL", SEMAPHORE_ACQUIRE, "1", "sem", "2", "C", "0", &now, "10000"];
    let reply = cmd(&mut c, &acquire);
    let text = format!("{reply:?}");
    assert!(
        text.contains("script refused: it calls zcard") && text.contains("use SEM.ACQUIRE name token k ttl_ms"),
        "a third holder of two permits: {text}"
    );
    let loaded = cmd(&mut c, &["SCRIPT", "LOAD", SEMAPHORE_ACQUIRE]);
    assert!(format!("{loaded:?}").contains("script refused"), "{loaded:?}");
    for s in &servers {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg("sem")
            .arg(0)
            .arg(-1)
            .query(&mut s.client())
            .expect("ZRANGE");
        assert!(!members.contains(&"C".to_owned()), "no master admitted C: {members:?}");
    }
    // A mutex's scripts still run.
    assert_eq!(
        cmd(&mut c, &["SET", "lock:m", "t", "NX", "PX", "10000"]),
        redis::Value::Okay
    );
    assert_eq!(
        cmd(&mut c, &["EVAL", support::RELEASE, "1", "lock:m", "t"]),
        redis::Value::Int(1)
    );
    // A holder leaves: removed on the majority that had it.
    assert_eq!(cmd(&mut c, &["ZREM", "sem", "A"]), redis::Value::Int(1));
    assert_eq!(cmd(&mut c, &["ZREM", "sem", "nobody"]), redis::Value::Int(0));
    for s in &servers {
        let score: Option<String> = redis::cmd("ZSCORE")
            .arg("sem")
            .arg("A")
            .query(&mut s.client())
            .expect("ZSCORE");
        assert_eq!(score, None, "A left every master");
    }
}
