//! The `redis+cluster://` URL: its seeds and the URL each shard master is reached with, read,
//! checked and described.

use crate::backend::locate::{self, Addr};

/// A `redis+cluster://` URL, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterUrl {
    /// The nodes asked for the slot map until one of the cluster's masters is known.
    pub seeds: Vec<Addr>,
    /// `redis://[user:pass@]` or `rediss://[user:pass@]`: a shard master's URL is this and its
    /// address.
    pub node_prefix: String,
}

impl ClusterUrl {
    /// The URL a shard master at `addr` is reached with (credentials and TLS of the member).
    pub(super) fn node_url(&self, addr: &Addr) -> String {
        format!("{}{addr}", self.node_prefix)
    }
}

/// Reads `redis+cluster://` and `rediss+cluster://` URLs; `None` for any other scheme, an
/// error for a malformed one. A cluster has database 0 only: a database in the URL is refused.
pub fn cluster_url(url: &str) -> Option<Result<ClusterUrl, String>> {
    let (scheme, rest) = locate::split_scheme(url, "cluster")?;
    Some(read_cluster_url(scheme, rest))
}

fn read_cluster_url(scheme: &str, rest: &str) -> Result<ClusterUrl, String> {
    let (user, seeds, path) = locate::split_hosts(rest, "cluster node")?;
    if !matches!(path, "" | "0") {
        return Err(format!(
            "a Redis Cluster has database 0 only, not '{path}': redis+cluster://host:port[,host:port...]"
        ));
    }
    Ok(ClusterUrl {
        seeds,
        node_prefix: format!("{scheme}://{user}"),
    })
}

/// What kind of member `url` names, in words (for `--check-config`).
pub fn describe(url: &ClusterUrl) -> String {
    let seeds: Vec<String> = url.seeds.iter().map(Addr::to_string).collect();
    format!(
        "Redis Cluster (seeds: {}); each key goes to the shard serving its hash slot, a shard's new master quarantined after a failover",
        seeds.join(", ")
    )
}

/// Whether the shard masters' URLs (credentials) parse.
pub fn check(url: &ClusterUrl) -> Result<(), String> {
    crate::backend::redis::check_url(&url.node_url(&url.seeds[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls() {
        let url = cluster_url("redis+cluster://u:p@a:1,b:2")
            .expect("scheme")
            .expect("valid");
        assert_eq!(url.seeds.len(), 2);
        assert_eq!(url.node_url(&url.seeds[1]), "redis://u:p@b:2");
        let tls = cluster_url("rediss+cluster://a:1/").expect("scheme").expect("valid");
        assert_eq!(tls.node_prefix, "rediss://");
        assert!(cluster_url("redis+cluster://a:1/3").expect("scheme").is_err());
        assert!(cluster_url("redis+cluster://a").expect("scheme").is_err());
        assert!(cluster_url("redis://a:1").is_none());
    }
}
