//! Redis Cluster members, on real processes: each member is a cluster of three shards
//! (`redis-server --cluster-enabled yes`, joined with `redis-cli --cluster create`), with a
//! replica per shard where a failover is tested.
//!
//! The proxies here use `quarantine = "restarts"`: the clusters are started with the test,
//! so under `"always"` every node would be quarantined at first sight for its short uptime,
//! which would also hide whether a failover is what quarantines a shard.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use support::sentinel::wait_until;
use support::shards::{Cluster, slot};
use support::{ProxyProcess, backend_line, query};

/// The proxy's `max_ttl_ms`, and the TTL of the tests' locks.
const MAX_TTL_MS: u64 = 10_000;

fn proxy_over(urls: &[String], extra: &str) -> ProxyProcess {
    let limits = format!("max_ttl_ms = {MAX_TTL_MS}\nlegacy_ttl_ms = {MAX_TTL_MS}\ndefault_ttl_ms = {MAX_TTL_MS}");
    ProxyProcess::start(urls, &format!("{limits}\n{extra}"))
}

fn urls(clusters: &[Cluster]) -> Vec<String> {
    clusters.iter().map(Cluster::url).collect()
}

/// `SET key token NX PX MAX_TTL_MS` through `c`.
fn set_nx(c: &mut redis::Connection, key: &str, token: &str) -> Option<String> {
    support::acquire(c, key, token, MAX_TTL_MS)
}

/// The `shardN=master;state;slots` fields of a member's line: (master port, state, slots).
fn shards_of(line: &str) -> Vec<(u16, String, String)> {
    line.split(',')
        .filter(|f| f.starts_with("shard") && !f.starts_with("shards="))
        .filter_map(|f| {
            let (_, value) = f.split_once('=')?;
            let mut parts = value.split(';');
            let port = parts.next()?.rsplit(':').next()?.parse().ok()?;
            Some((port, parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect()
}

fn slot_count(ranges: &str) -> usize {
    ranges
        .split('+')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0) - a.parse::<usize>().unwrap_or(0) + 1,
            None => 1,
        })
        .sum()
}

/// A key whose slot the master at `port` serves, per `cluster` now.
fn key_on(cluster: &Cluster, port: u16, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| cluster.master_for(k).port == port)
        .expect("some key lands there")
}

#[test]
fn cluster_members_spread_locks_over_every_shard() {
    let clusters: Vec<Cluster> = (0..3).map(|_| Cluster::start(3, false)).collect();
    let proxy = proxy_over(&urls(&clusters), "quarantine = \"restarts\"");
    let mut c = proxy.client();
    let keys: Vec<String> = (0..30).map(|i| format!("lock:{i}")).collect();
    for key in &keys {
        assert_eq!(set_nx(&mut c, key, &format!("t-{key}")).as_deref(), Some("OK"), "{key}");
    }
    for (m, cluster) in clusters.iter().enumerate() {
        let mut shards_used = std::collections::HashSet::new();
        for key in &keys {
            let master = cluster.master_for(key);
            assert_eq!(master.get(key), Some(format!("t-{key}")), "member {m}, {key}");
            shards_used.insert(master.port);
        }
        assert_eq!(shards_used.len(), 3, "member {m}: the locks landed on every shard");
        let line = backend_line(&proxy, m);
        assert!(
            line.contains("kind=cluster") && line.contains("state=up") && line.contains("shards=3"),
            "{line}"
        );
        let shards = shards_of(&line);
        assert_eq!(shards.len(), 3, "{line}");
        let mut ports: Vec<u16> = shards.iter().map(|s| s.0).collect();
        ports.sort_unstable();
        let mut masters = cluster.master_ports();
        masters.sort_unstable();
        assert_eq!(ports, masters, "{line}");
        assert_eq!(shards.iter().map(|s| slot_count(&s.2)).sum::<usize>(), 16384, "{line}");
    }
    for key in &keys {
        assert_eq!(set_nx(&mut c, key, "intruder"), None, "{key} is held");
        assert_eq!(support::release(&mut c, key, &format!("t-{key}")), 1, "{key}");
        assert_eq!(
            set_nx(&mut c, key, "next").as_deref(),
            Some("OK"),
            "{key} is free again"
        );
    }
    // The proxy's own release (the reentrant give-back script: the lock and its holds hash,
    // one slot) on keys spread over every shard.
    for key in &keys {
        let released = query(&mut c, &["LOCK.RELEASE", key, "next"]).expect("LOCK.RELEASE");
        assert_eq!(released, redis::Value::Int(1), "LOCK.RELEASE {key}");
    }
    let backends = query(&mut c, &["PROXY", "BACKENDS"]).expect("PROXY BACKENDS");
    assert!(format!("{backends:?}").contains("kind=cluster"), "{backends:?}");
    // Acquisitions queued together on a shard's connection, keys in different slots: each in
    // a transaction of its own there (one shared by keys of several slots is refused by a
    // cluster node, `CROSSSLOT`, and would fail them all).
    let keys: Vec<String> = (0..60).map(|i| format!("lock:queued:{i}")).collect();
    let replies = support::acquire_pipelined(&mut c, &keys, "t", MAX_TTL_MS).expect("every queued acquisition granted");
    assert!(replies.iter().all(|r| *r == redis::Value::Okay), "{replies:?}");
}

#[test]
fn keys_in_different_slots_are_refused_before_any_member_runs_them() {
    let cluster = Cluster::start(3, false);
    let masters = support::masters(2);
    let mut members = vec![cluster.url()];
    members.extend(support::urls(&masters));
    let proxy = proxy_over(&members, "quarantine = \"restarts\"");
    let mut c = proxy.client();
    assert_ne!(slot("a"), slot("b"));
    let write_both = "redis.call('set', KEYS[1], ARGV[1], 'PX', 10000) \
                      redis.call('set', KEYS[2], ARGV[1], 'PX', 10000) return 1";
    let crossed = query(&mut c, &["EVAL", write_both, "2", "a", "b", "v"]);
    let error = format!("{crossed:?}");
    assert!(crossslot(&error), "{error}");
    for m in &masters {
        assert_eq!(
            m.get("a"),
            None,
            "a single master ran the script a cluster member refuses"
        );
    }
    let tagged = query(&mut c, &["EVAL", write_both, "2", "{x}a", "{x}b", "v"]);
    assert_eq!(tagged, Ok(redis::Value::Int(1)), "hash-tagged keys share a slot");
    assert_eq!(cluster.master_for("{x}b").get("{x}b").as_deref(), Some("v"));
    let del = format!("{:?}", query(&mut c, &["DEL", "a", "b"]));
    assert!(crossslot(&del), "{del}");

    // A transaction's keys, watched and queued, must share a slot too.
    assert_eq!(query(&mut c, &["MULTI"]), Ok(redis::Value::Okay));
    let queued = query(&mut c, &["SET", "a", "1", "PX", "10000"]);
    assert_eq!(queued, Ok(redis::Value::SimpleString("QUEUED".into())));
    let other = format!("{:?}", query(&mut c, &["SET", "b", "1", "PX", "10000"]));
    assert!(crossslot(&other), "{other}");
    let exec = format!("{:?}", query(&mut c, &["EXEC"]));
    assert!(exec.contains("ExecAbort"), "{exec}");
    assert_eq!(masters[0].get("a"), None, "the aborted transaction ran nowhere");
    assert_eq!(query(&mut c, &["WATCH", "a"]), Ok(redis::Value::Okay));
    let watch = format!("{:?}", query(&mut c, &["WATCH", "b"]));
    assert!(crossslot(&watch), "{watch}");
}

/// Takes `lock:x` for A on members 0 and 1 only (member 2 lost it), empties the replica of
/// member 0's shard for it, fails that shard over with `fail_over`, waits until the proxy's map
/// shows the replica as its master, and returns what B gets for the same lock, and whether a
/// lock on another shard of member 0 still got member 0's vote.
fn second_grant_after_shard_failover(quarantine: &str, fail_over: fn(&mut Cluster, u16)) -> (Option<String>, bool) {
    let mut clusters = vec![
        Cluster::start(3, true),
        Cluster::start(3, false),
        Cluster::start(3, false),
    ];
    let proxy = proxy_over(&urls(&clusters), &format!("quarantine = \"{quarantine}\""));
    let mut c = proxy.client();
    let key = "lock:x";
    assert_eq!(set_nx(&mut c, key, "A").as_deref(), Some("OK"));
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query(&mut clusters[2].master_for(key).client())
        .expect("DEL");
    let old = clusters[0].master_for(key).port;
    let promoted = clusters[0].replica_of(old).port;
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut clusters[0].server(old).client())
        .expect("WAIT");
    // The writes the promoted replica lacks (asynchronous replication loses the last ones).
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut clusters[0].server(promoted).client())
        .expect("FLUSHALL on the replica");
    let failed_over = Instant::now();
    fail_over(&mut clusters[0], old);
    wait_until("the proxy to map the promoted replica", || {
        shards_of(&backend_line(&proxy, 0))
            .iter()
            .any(|(port, state, _)| *port == promoted && state != "down")
    });
    let shards = shards_of(&backend_line(&proxy, 0));
    for (port, state, slots) in &shards {
        if quarantine == "off" || *port != promoted {
            assert_eq!(state, "up", "shard {port} ({slots})");
            continue;
        }
        let remaining: u64 = state
            .strip_prefix("quarantined:")
            .and_then(|ms| ms.strip_suffix("ms"))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("the promoted shard is quarantined: {state}"));
        // max_ttl_ms + drift (10.102 s), from when the proxy read the new map.
        let least = 10_101u64.saturating_sub(failed_over.elapsed().as_millis() as u64);
        assert!((least..=10_102).contains(&remaining), "{state}: at least {least}");
    }
    let second = set_nx(&mut c, key, "B");
    let elsewhere = clusters[0]
        .master_ports()
        .into_iter()
        .find(|&p| p != promoted)
        .expect("another shard");
    let other = key_on(&clusters[0], elsewhere, "lock:other:");
    let voted = set_nx(&mut c, &other, "C").as_deref() == Some("OK")
        && clusters[0].server(elsewhere).get(&other).as_deref() == Some("C");
    (second, voted)
}

/// `CLUSTER FAILOVER FORCE` on the replica: promoted without its master's agreement; the old
/// master becomes its replica and takes its data.
fn forced(cluster: &mut Cluster, master: u16) {
    let replica = cluster.replica_of(master).port;
    let reply = query(&mut cluster.server(replica).client(), &["CLUSTER", "FAILOVER", "FORCE"]);
    assert_eq!(reply, Ok(redis::Value::Okay), "CLUSTER FAILOVER FORCE");
    wait_until("the replica to be master", || {
        cluster.nodes().iter().any(|n| n.port == replica && n.master)
    });
    cluster.wait_settled();
}

/// `kill -9` of the master: the cluster promotes its replica after `cluster-node-timeout`.
fn killed(cluster: &mut Cluster, master: u16) {
    let replica = cluster.replica_of(master).port;
    cluster.server_mut(master).kill();
    wait_until("the replica to be promoted", || {
        cluster
            .nodes()
            .iter()
            .any(|n| n.port == replica && n.master && !n.slots.is_empty())
    });
    cluster.wait_settled();
}

#[test]
fn a_forced_shard_failover_quarantines_that_shard_only() {
    let (second, voted) = second_grant_after_shard_failover("restarts", forced);
    assert_eq!(
        second, None,
        "the lock is still held: the promoted replica must not vote"
    );
    assert!(voted, "the member's other shards still vote");
}

#[test]
fn a_killed_shard_master_fails_over_and_its_replica_is_quarantined() {
    let (second, voted) = second_grant_after_shard_failover("restarts", killed);
    assert_eq!(
        second, None,
        "the lock is still held: the promoted replica must not vote"
    );
    assert!(voted, "the member's other shards still vote");
}

#[test]
fn without_the_quarantine_a_shard_failover_grants_a_held_lock_twice() {
    let (second, _) = second_grant_after_shard_failover("off", forced);
    assert_eq!(
        second.as_deref(),
        Some("OK"),
        "the control: the steps above do lose the lock"
    );
}

/// Moves the slot of twenty held locks between two masters of member 0 and of member 1, a key at
/// a time, while contenders ask for the locks and other clients take and release locks of the
/// same slot. The held locks sit on a bare majority (member 2 lost them), so a vote lost in
/// the move would grant one of them twice.
#[test]
fn a_live_resharding_loses_no_lock() {
    let clusters: Vec<Cluster> = (0..3).map(|_| Cluster::start(3, false)).collect();
    let proxy = proxy_over(&urls(&clusters), "quarantine = \"restarts\"");
    let mut c = proxy.client();
    let held: Vec<String> = (0..20).map(|i| format!("{{moving}}:held:{i}")).collect();
    for key in &held {
        assert_eq!(set_nx(&mut c, key, "holder").as_deref(), Some("OK"), "{key}");
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query(&mut clusters[2].master_for(key).client())
            .expect("DEL");
    }
    let moving = slot("{moving}");
    let stop = AtomicBool::new(false);
    let (intrusions, churned) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut c = proxy.client();
            while !stop.load(Ordering::Relaxed) {
                for key in &held {
                    if set_nx(&mut c, key, "intruder").is_some() {
                        intrusions.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        s.spawn(|| {
            let mut c = proxy.client();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{{moving}}:churn:{}", i % 50);
                if set_nx(&mut c, &key, "churn").is_some() {
                    churned.fetch_add(1, Ordering::Relaxed);
                    support::release(&mut c, &key, "churn");
                }
                i += 1;
            }
        });
        for cluster in &clusters[..2] {
            let from = cluster.master_for("{moving}").port;
            let to = cluster
                .master_ports()
                .into_iter()
                .find(|&p| p != from)
                .expect("another master");
            cluster.move_slot(moving, from, to, || {
                std::thread::sleep(std::time::Duration::from_millis(5))
            });
            assert_eq!(cluster.master_for("{moving}").port, to);
        }
        // Until the proxy's maps show both moves: the last requests went through `MOVED`.
        wait_until("the proxy to map the moved slot", || {
            (0..2).all(|m| {
                let to = clusters[m].master_for("{moving}").port;
                shards_of(&backend_line(&proxy, m))
                    .iter()
                    .any(|(port, _, slots)| *port == to && covers(slots, moving))
            })
        });
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(intrusions.load(Ordering::Relaxed), 0, "a held lock was granted again");
    assert!(
        churned.load(Ordering::Relaxed) > 0,
        "the slot's locks were taken during the move"
    );
    for m in 0..2 {
        let line = backend_line(&proxy, m);
        assert!(line.contains("state=up"), "a resharding quarantines nothing: {line}");
    }
    for key in &held {
        assert_eq!(
            support::release(&mut c, key, "holder"),
            1,
            "{key} still held by its holder"
        );
    }
}

/// Whether a reply (as the `redis` crate shows it) is Redis Cluster's `CROSSSLOT` error.
fn crossslot(reply: &str) -> bool {
    reply.contains("CrossSlot: Keys in request don't hash to the same slot")
}

fn covers(ranges: &str, slot: u16) -> bool {
    ranges.split('+').any(|r| match r.split_once('-') {
        Some((a, b)) => a.parse().is_ok_and(|a: u16| a <= slot) && b.parse().is_ok_and(|b: u16| slot <= b),
        None => r.parse() == Ok(slot),
    })
}

#[test]
fn a_transaction_without_watch_runs_on_the_shard_of_its_keys() {
    // One member a 3-shard cluster, two single masters. A MULTI/EXEC without WATCH declares
    // its queued keys: the cluster member runs it on their shard, for every shard (before,
    // it went to one shard, failed on the others, and the single masters carried the reply).
    let cluster = Cluster::start(3, false);
    let singles = support::masters(2);
    let mut backends = vec![cluster.url()];
    backends.extend(support::urls(&singles));
    let proxy = proxy_over(&backends, "quarantine = \"restarts\"");
    let mut c = proxy.client();
    let mut shards_used = std::collections::HashSet::new();
    for tag in 0..12 {
        let (a, b) = (format!("{{t{tag}}}a"), format!("{{t{tag}}}b"));
        assert_eq!(query(&mut c, &["MULTI"]), Ok(redis::Value::Okay));
        for key in [&a, &b] {
            let queued = query(&mut c, &["SET", key, "v", "PX", "5000"]);
            assert_eq!(queued, Ok(redis::Value::SimpleString("QUEUED".into())), "{key}");
        }
        let done = query(&mut c, &["EXEC"]).expect("EXEC");
        assert_eq!(
            done,
            redis::Value::Array(vec![redis::Value::Okay, redis::Value::Okay]),
            "{a}"
        );
        for key in [&a, &b] {
            let master = cluster.master_for(key);
            assert_eq!(master.get(key).as_deref(), Some("v"), "{key} on its shard");
            shards_used.insert(master.port);
        }
    }
    assert_eq!(shards_used.len(), 3, "the transactions covered every shard");
}
