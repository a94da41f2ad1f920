//! Sentinel groups as quorum members, on real processes: each member is a master, a replica
//! and a Sentinel (`redis-server --sentinel`), all started on free loopback ports.
//!
//! The failover tests put a lock on a bare majority that includes member 0, make member 0's
//! replica miss it (as asynchronous replication can), fail member 0 over (`SENTINEL FAILOVER`,
//! or `kill -9` of its master), and try to take the lock again. With the quarantine, the
//! promoted replica does not vote; switched off, the same steps grant the lock twice.

mod support;

use std::time::Instant;

use support::sentinel::{Group, info, wait_until};
use support::{ProxyProcess, backend_line, query};

/// The proxy's `max_ttl_ms`, and the TTL of the tests' locks. The failover tests wait until
/// the replicas have run longer than this, so that a quarantine counted from the promoted
/// replica's start (as a restart's once was) would already be over.
const MAX_TTL_MS: u64 = 10_000;

/// `SET key token NX PX MAX_TTL_MS` through `c`.
fn set_nx(c: &mut redis::Connection, key: &str, token: &str) -> Option<String> {
    support::acquire(c, key, token, MAX_TTL_MS)
}

fn start_groups() -> Vec<Group> {
    (0..3).map(|_| Group::start()).collect()
}

fn proxy_over(groups: &[Group], extra: &str) -> ProxyProcess {
    let urls: Vec<String> = groups.iter().map(|g| g.sentinel.url()).collect();
    let limits = format!("max_ttl_ms = {MAX_TTL_MS}\nlegacy_ttl_ms = {MAX_TTL_MS}\ndefault_ttl_ms = {MAX_TTL_MS}");
    ProxyProcess::start(&urls, &format!("{limits}\n{extra}"))
}

#[test]
fn sentinel_members_take_and_release_locks_and_show_their_master() {
    let groups = start_groups();
    let proxy = proxy_over(&groups, "");
    let mut c = proxy.client();
    assert_eq!(set_nx(&mut c, "lock:a", "A").as_deref(), Some("OK"));
    for (i, g) in groups.iter().enumerate() {
        assert_eq!(g.master.get("lock:a").as_deref(), Some("A"), "member {i}'s master");
        let line = backend_line(&proxy, i);
        assert!(line.contains("kind=sentinel"), "{line}");
        assert!(line.contains("state=up"), "{line}");
        assert!(line.contains(&format!("master=127.0.0.1:{}", g.master.port)), "{line}");
        assert!(
            line.contains(&format!("addr=mymaster@127.0.0.1:{}", g.sentinel.port)),
            "{line}"
        );
    }
    assert_eq!(set_nx(&mut c, "lock:a", "B"), None, "held");
    assert_eq!(support::release(&mut c, "lock:a", "A"), 1);
    assert_eq!(set_nx(&mut c, "lock:a", "B").as_deref(), Some("OK"));
}

/// Takes `lock:x` for A on members 0 and 1 only (member 2 lost it), makes member 0's
/// replica miss it, fails member 0 over with `fail_over`, waits until the proxy follows, and
/// returns what B gets for the same lock, and whether a fresh lock can still be taken.
fn second_grant_after_failover(quarantine: &str, fail_over: impl FnOnce(&mut Group)) -> (Option<String>, bool) {
    let mut groups = start_groups();
    let old = MAX_TTL_MS / 1000 + 2;
    wait_until("the replicas to have run longer than max_ttl_ms", || {
        groups.iter().all(|g| {
            let uptime = info(&g.replica, "server")
                .lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .and_then(|s| s.trim().parse::<u64>().ok());
            uptime.is_some_and(|s| s >= old)
        })
    });
    let proxy = proxy_over(&groups, &format!("quarantine = \"{quarantine}\""));
    let mut c = proxy.client();
    assert_eq!(set_nx(&mut c, "lock:x", "A").as_deref(), Some("OK"));
    let _: i64 = redis::cmd("DEL")
        .arg("lock:x")
        .query(&mut groups[2].master.client())
        .expect("DEL");
    groups[0].replica_misses("lock:x");
    let promoted = groups[0].replica.port;
    let failed_over = Instant::now();
    fail_over(&mut groups[0]);
    wait_until("Sentinel to name the replica", || {
        groups[0].sentinel.master_port() == promoted
    });
    let master = format!("master=127.0.0.1:{promoted}");
    wait_until("the proxy to follow the failover", || {
        let line = backend_line(&proxy, 0);
        line.contains(&master) && !line.contains("state=down")
    });
    let line = backend_line(&proxy, 0);
    if quarantine != "off" {
        assert!(line.contains("state=quarantined"), "{line}");
        let remaining: u64 = line
            .split(',')
            .find_map(|f| f.strip_prefix("quarantine_remaining_ms="))
            .and_then(|ms| ms.parse().ok())
            .expect("quarantine_remaining_ms");
        // max_ttl_ms + drift (10.102 s), counted from when the proxy learnt of the switch,
        // which was after `failed_over`: not from the replica's start.
        let least = 10_101u64.saturating_sub(failed_over.elapsed().as_millis() as u64);
        assert!((least..=10_102).contains(&remaining), "{line}: at least {least}");
    }
    let second = b_while_a_holds(&mut c, &groups[1]);
    let available = set_nx(&mut c, "lock:fresh", "C").as_deref() == Some("OK");
    (second, available)
}

/// B's attempts at `lock:x`, up to `B_ATTEMPTS` of them, each while A's key is still on
/// member 1's master (so A still holds the lock, and a grant to B is a second holder): the
/// first grant, or `None` if none was granted. Several attempts, not one: a vote can still
/// fail just after the proxy follows the failover (a timeout under load, the demoted master's
/// `READONLY`), and a failed vote is never a grant, so one nil alone would let the control
/// below fail for a reason other than the quarantine.
fn b_while_a_holds(c: &mut redis::Connection, member1: &Group) -> Option<String> {
    const B_ATTEMPTS: usize = 10;
    for _ in 0..B_ATTEMPTS {
        let answer = set_nx(c, "lock:x", "B");
        assert_eq!(
            member1.master.get("lock:x").as_deref(),
            Some("A"),
            "A's key left member 1 before B's attempts were over: the test proves nothing"
        );
        if answer.is_some() {
            return answer;
        }
        // A back-off between attempts, not a synchronisation: nothing outside the proxy
        // says when a member's next vote will succeed.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

/// `SENTINEL FAILOVER`: the old master is demoted (its writes answer READONLY) and the
/// replica promoted.
fn forced(group: &mut Group) {
    let reply = query(&mut group.sentinel.client(), &["SENTINEL", "FAILOVER", "mymaster"]);
    assert_eq!(reply, Ok(redis::Value::Okay), "SENTINEL FAILOVER");
}

/// `kill -9` of the master: Sentinel finds it down and promotes the replica.
fn killed(group: &mut Group) {
    group.master.kill();
}

#[test]
fn a_forced_failover_quarantines_the_promoted_replica() {
    let (second, available) = second_grant_after_failover("restarts", forced);
    assert_eq!(second, None, "B was granted the lock A holds");
    assert!(available, "members 1 and 2 still grant other locks");
}

#[test]
fn a_killed_master_fails_over_and_the_promoted_replica_is_quarantined() {
    let (second, available) = second_grant_after_failover("restarts", killed);
    assert_eq!(second, None, "B was granted the lock A holds");
    assert!(available, "members 1 and 2 still grant other locks");
}

/// The control: the same steps with the quarantine off grant A's lock to B, so the tests
/// above can fail.
#[test]
fn without_the_quarantine_a_failover_grants_a_held_lock_twice() {
    let (second, _) = second_grant_after_failover("off", forced);
    assert_eq!(
        second.as_deref(),
        Some("OK"),
        "the promoted replica and member 2 should have granted it"
    );
}
