//! Which Redis server a member is, so that one server never counts as two members (rule 15).
//!
//! A majority is only a majority of *independent* masters: with `backends = [h:p/0, h:p/1,
//! h2:p2]` and `h2` down, the one process at `h:p` would answer for two members and grant
//! every lock alone. Two checks keep one server to one vote:
//!
//! - at start ([`conflicts`], called by config validation and `--check-config`), two members
//!   whose URLs name the same server (same host, with `localhost`, `127.0.0.1` and `::1` read
//!   as one, and port; whatever the database) are refused;
//! - at run time ([`Identities`]), since different URLs can still reach one process (another
//!   address of the same host, a NAT, a relay), a member whose master's `run_id` equals another
//!   member's is kept out of every quorum (see `Health::observed`) until the two differ.

use std::collections::HashMap;
use std::sync::Mutex;

use super::locate::{self, Addr};

/// The servers a member's URL names, as comparable strings: a master's `host:port`; a
/// Sentinel group's master as `service@sentinel` for each of its Sentinels (two members that
/// ask a common Sentinel for the same name get the same master); a cluster's seeds. Hosts are
/// normalized ([`normal_host`]). Empty for a URL that does not parse (validation reports it).
pub fn servers(url: &str) -> Vec<String> {
    if let Some(cluster) = super::url::cluster_url(url) {
        return cluster.map_or_else(|_| Vec::new(), |c| c.seeds.iter().map(server).collect());
    }
    if let Some(group) = locate::sentinel_url(url) {
        return group.map_or_else(
            |_| Vec::new(),
            |g| {
                g.sentinels
                    .iter()
                    .map(|s| format!("{}@{}", g.service, server(s)))
                    .collect()
            },
        );
    }
    super::url::url_addr(url).map(|a| vec![server(&a)]).unwrap_or_default()
}

/// `host:port` with the host normalized.
fn server(addr: &Addr) -> String {
    format!("{}:{}", normal_host(&addr.host), addr.port)
}

/// A host name as the same server is always written: lower case, without IPv6 brackets, and
/// the loopback names (`localhost`, `127.0.0.1`, `::1`) as one.
pub fn normal_host(host: &str) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    match host.as_str() {
        "localhost" | "127.0.0.1" | "::1" | "0:0:0:0:0:0:0:1" => "localhost".to_owned(),
        _ => host,
    }
}

/// The first two members (indexes into `urls`) that name a common server, with that server.
pub fn conflicts(urls: &[String]) -> Option<(usize, usize, String)> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, url) in urls.iter().enumerate() {
        let mut mine = servers(url);
        mine.sort();
        mine.dedup();
        for server in mine {
            if let Some(&first) = seen.get(&server) {
                return Some((first, i, server));
            }
            seen.insert(server, i);
        }
    }
    None
}

/// The `run_id` each member's master last showed, shared by the members' healths: the
/// run-time half of rule 15's "one process, two URLs, counts once".
///
/// Of two members showing the same `run_id`, the one that showed it first keeps its vote; the
/// later one is a duplicate. A member's entry changes only when it sees a new `run_id` (each
/// health checks on every connection and probe), so a duplicate votes again at its first probe
/// after the two differ.
///
/// Cluster shards are not registered: a shard master answers only for its own slots and is
/// never a whole member, and a cluster node cannot also serve as a plain or Sentinel member's
/// master without refusing most keys (`MOVED`), so a shared process there shows as errors, not
/// as a second vote.
#[derive(Default)]
pub struct Identities {
    members: Mutex<HashMap<usize, Seen>>,
    /// Orders first sightings: a lower number was seen earlier.
    sequence: std::sync::atomic::AtomicU64,
}

struct Seen {
    name: String,
    run_id: String,
    /// When this member first showed `run_id` (see [`Identities::sequence`]).
    since: u64,
}

impl Identities {
    /// Member `index` (named `name`) showed `run_id`; returns the member (index and name) it
    /// duplicates: another that showed the same `run_id` first.
    pub fn seen(&self, index: usize, name: &str, run_id: &str) -> Option<(usize, String)> {
        let mut members = self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = members.get(&index).is_none_or(|s| s.run_id != run_id);
        if changed {
            let since = self.sequence.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            members.insert(
                index,
                Seen {
                    name: name.to_owned(),
                    run_id: run_id.to_owned(),
                    since,
                },
            );
        }
        let mine = members.get(&index).map(|s| (s.since, index))?;
        members
            .iter()
            .filter(|&(&j, s)| j != index && s.run_id == run_id && (s.since, j) < mine)
            .min_by_key(|&(&j, s)| (s.since, j))
            .map(|(&j, s)| (j, s.name.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &[&str]) -> Vec<String> {
        list.iter().map(|u| u.to_string()).collect()
    }

    #[test]
    fn the_same_server_under_two_urls_conflicts() {
        let same = |a: &str, b: &str| conflicts(&urls(&[a, "redis://other:1", b])).map(|(i, j, _)| (i, j));
        assert_eq!(same("redis://h:6379/0", "redis://h:6379/1"), Some((0, 2)), "databases");
        assert_eq!(same("redis://h:6379", "redis://h:6379"), Some((0, 2)), "the same URL");
        assert_eq!(same("redis://localhost:7000", "redis://127.0.0.1:7000"), Some((0, 2)));
        assert_eq!(same("redis://[::1]:7000", "redis://LOCALHOST:7000/3"), Some((0, 2)));
        assert_eq!(
            same("redis://H:1", "redis://:pw@h:1"),
            Some((0, 2)),
            "case, credentials"
        );
        assert_eq!(same("redis://h", "redis://h:6379"), Some((0, 2)), "default port");
        assert_eq!(same("redis://h:7000", "rediss://h:7000"), Some((0, 2)), "TLS or not");
        assert_eq!(
            same("redis+sentinel://s1:26379,s2:26379/m", "redis+sentinel://s2:26379/m/1"),
            Some((0, 2)),
            "a Sentinel group's master asked twice"
        );
        assert_eq!(same("redis+cluster://c:7000", "redis://c:7000"), Some((0, 2)));
        assert_eq!(same("redis://h:1", "redis://h:2"), None);
        assert_eq!(same("redis://h:1", "redis://h2:1"), None);
        assert_eq!(
            same("redis+sentinel://s1:26379/a", "redis+sentinel://s1:26379/b"),
            None,
            "two masters of one Sentinel"
        );
        assert_eq!(conflicts(&urls(&["redis://a:1", "redis://b:1", "redis://c:1"])), None);
    }

    #[test]
    fn the_later_member_with_a_run_id_is_the_duplicate() {
        let ids = Identities::default();
        assert_eq!(ids.seen(2, "c", "r1"), None);
        assert_eq!(ids.seen(0, "a", "r1"), Some((2, "c".into())), "seen later");
        assert_eq!(ids.seen(1, "b", "r2"), None);
        assert_eq!(ids.seen(2, "c", "r1"), None, "the first keeps its vote");
        assert_eq!(ids.seen(0, "a", "r1"), Some((2, "c".into())), "still a duplicate");
        assert_eq!(ids.seen(0, "a", "r3"), None, "the run ids differ");
        assert_eq!(
            ids.seen(2, "c", "r3"),
            Some((0, "a".into())),
            "c follows a to r3: now c is later"
        );
    }
}
