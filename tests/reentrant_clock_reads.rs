//! A reentrant lock's holds hash is its lock's however long the master takes between the reads
//! of one script (`redlock_proxy::recipes::reentrant::lua`), and an undo deletes its attempt's
//! write however long (`redlock_proxy::lua::own::UNDO`), on real masters.
//!
//! A master descheduled in the middle of a script (a loaded machine) reads its clock (`TIME`)
//! and the lock's `PTTL` milliseconds apart. When the scripts dated the lock by one `TIME +
//! PTTL` and recognised its holds hash within 1 ms, such a reading made a live hash look stale:
//! a release then deleted the lock on that master while its holder kept extra holds, and with
//! the lock on a bare quorum the lock was lost (the fault checker's overlap of a reentrant
//! holder and a fenced client, once in CI). Here the scripts' `PTTL` reads come 3 ms after the
//! clock reading before them, which the scheduler does rarely and this does every time:
//! - on Redis 7.0 (Debian's), every one: the scripts read the expiry with `PEXPIRETIME`, which
//!   no pause moves;
//! - on Redis 6.2 (the clock tests' build), which has no `PEXPIRETIME`, the first of each
//!   script: the scripts bracket the `PTTL` between two clock readings and read again while the
//!   bracket is open (a master descheduled at each of three readings in a row is not covered).

mod support;

use redlock_proxy::lua::own::UNDO;
use redlock_proxy::recipes::reentrant::lua::{ADD_HOLD, GIVE_BACK, GIVE_BACK_ALL, REENTER, holds_key};
use support::RedisServer;
use support::clock::{Version, plain_master};

/// Which `PTTL` reads of a script come late.
#[derive(Clone, Copy)]
enum Pause {
    /// Every one.
    Each,
    /// The first of the script.
    First,
}

/// `script` with its `PTTL` reads made 3 ms after the clock reading before them (`pause`), as on
/// a master descheduled between the two.
fn descheduled(script: &str, pause: Pause) -> String {
    let once = match pause {
        Pause::Each => "false",
        Pause::First => "true",
    };
    let slow = format!(
        "local paused, once = false, {once} \
         local function slow_pttl(k) \
           if not (once and paused) then paused = true local a = redis.call('time') \
             repeat local b = redis.call('time') until (b[1] - a[1]) * 1000000 + (b[2] - a[2]) >= 3000 end \
           return redis.call('pttl', k) end "
    );
    let body = script.replace("redis.call('pttl', ", "slow_pttl(");
    assert_ne!(body, script, "the script reads no PTTL: the test no longer tests it");
    format!("{slow}{body}")
}

fn eval(c: &mut redis::Connection, script: &str, keys: &[&str], args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c).expect("EVAL")
}

fn bulk(s: &str) -> redis::Value {
    redis::Value::BulkString(s.as_bytes().to_vec())
}

/// The lock `key` held by `t` with one extra hold `h1`, placed by a master descheduled
/// between its reads as `slow_stamp` says.
fn held_twice(c: &mut redis::Connection, key: &str, holds: &str, slow_stamp: Option<Pause>) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("t")
        .arg("PX")
        .arg(10_000)
        .query(c)
        .expect("SET");
    let add = slow_stamp.map_or_else(|| ADD_HOLD.to_owned(), |pause| descheduled(ADD_HOLD, pause));
    assert_eq!(eval(c, &add, &[key, holds], &["t", "h1"]), redis::Value::Int(1));
}

/// A release on a master whose reads of the lock's expiry are `pause`d.
fn a_release_keeps_the_lock(master: &RedisServer, pause: Pause) {
    let mut c = master.client();
    let get =
        |c: &mut redis::Connection, key: &str| -> Option<String> { redis::cmd("GET").arg(key).query(c).expect("GET") };
    for (case, slow_stamp, slow_release) in [
        ("hold placed on a descheduled master", true, false),
        ("released on a descheduled master", false, true),
        ("both", true, true),
    ] {
        let key = format!("lock:{}", case.replace(' ', "-"));
        let holds = String::from_utf8(holds_key(key.as_bytes()).to_vec()).expect("utf-8");
        held_twice(&mut c, &key, &holds, slow_stamp.then_some(pause));
        let give_back = if slow_release {
            descheduled(GIVE_BACK, pause)
        } else {
            GIVE_BACK.to_owned()
        };
        assert_eq!(
            eval(&mut c, &give_back, &[&key, &holds], &["t"]),
            redis::Value::Array(vec![bulk("holds"), bulk("h1")]),
            "{case}: the extra hold is reported, nothing is released"
        );
        assert_eq!(get(&mut c, &key).as_deref(), Some("t"), "{case}: the lock is kept");
        // `LOCK.RELEASEALL`'s script judges the hash the same way.
        let all = if slow_release {
            descheduled(GIVE_BACK_ALL, pause)
        } else {
            GIVE_BACK_ALL.to_owned()
        };
        assert_eq!(
            eval(&mut c, &all, &[&key, &holds], &["t"]),
            redis::Value::Array(vec![redis::Value::Array(vec![bulk("holds"), bulk("h1")])]),
            "{case}: LOCK.RELEASEALL reports the extra hold too"
        );
        assert_eq!(get(&mut c, &key).as_deref(), Some("t"), "{case}: the lock is kept");
    }
}

/// A count-up on a master whose reads of the lock's expiry are `pause`d.
fn a_count_up_keeps_the_holds_placed_before(master: &RedisServer, pause: Pause) {
    let mut c = master.client();
    let (key, holds) = (
        "lock:count-up",
        String::from_utf8(holds_key(b"lock:count-up").to_vec()).expect("utf-8"),
    );
    held_twice(&mut c, key, &holds, None);
    // The second count-up, on a master descheduled between its reads: `h1` must stay.
    let counter = format!("redlock-proxy:fence:c:{key}");
    let reply = eval(
        &mut c,
        &descheduled(REENTER, pause),
        &[key, &counter, "redlock-proxy:fence:epoch", &holds],
        &["t", "10000", "h2"],
    );
    assert!(format!("{reply:?}").contains("reentered"), "{reply:?}");
    let mut fields: Vec<String> = redis::cmd("HKEYS").arg(&holds).query(&mut c).expect("HKEYS");
    fields.retain(|f| f != "owner" && f != "at");
    fields.sort();
    assert_eq!(fields, ["h1", "h2"], "the holds placed before the count-up are kept");
}

/// Rule 5a's undo on a master whose reads of the key's expiry are `pause`d: the attempt's write,
/// named by its token and the expiry read with it (`SET` and `TIME` in one transaction, as an
/// acquisition reads it), is still deleted. Read as one `TIME + PTTL`, the paused reading missed
/// the named expiry by the pause, and the key stayed until its TTL.
fn an_undo_deletes_its_write(master: &RedisServer, pause: Pause) {
    let mut c = master.client();
    let (_, time): (redis::Value, (String, String)) = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("lock:undo")
        .arg("t")
        .arg("PX")
        .arg(10_000)
        .cmd("TIME")
        .query(&mut c)
        .expect("MULTI SET TIME EXEC");
    let (secs, micros): (i64, i64) = (time.0.parse().expect("seconds"), time.1.parse().expect("micros"));
    let expiry = (secs * 1000 + micros / 1000 + 10_000).to_string();
    assert_eq!(
        eval(&mut c, &descheduled(UNDO, pause), &["lock:undo"], &["t", &expiry]),
        redis::Value::Int(1),
        "the attempt's write is undone"
    );
}

#[test]
fn an_undo_on_a_descheduled_master_deletes_its_write() {
    an_undo_deletes_its_write(&RedisServer::start(), Pause::Each);
}

#[test]
fn without_pexpiretime_an_undo_deletes_its_write_through_a_pause() {
    an_undo_deletes_its_write(&plain_master(Version::V6_2), Pause::First);
}

#[test]
fn a_release_keeps_the_lock_of_a_holder_with_extra_holds_on_a_descheduled_master() {
    a_release_keeps_the_lock(&RedisServer::start(), Pause::Each);
}

#[test]
fn a_count_up_on_a_descheduled_master_keeps_the_holds_placed_before() {
    a_count_up_keeps_the_holds_placed_before(&RedisServer::start(), Pause::Each);
}

#[test]
fn without_pexpiretime_a_release_keeps_the_lock_through_a_pause() {
    a_release_keeps_the_lock(&plain_master(Version::V6_2), Pause::First);
}

#[test]
fn without_pexpiretime_a_count_up_keeps_the_holds_through_a_pause() {
    a_count_up_keeps_the_holds_placed_before(&plain_master(Version::V6_2), Pause::First);
}
