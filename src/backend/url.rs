//! A member's URL: a plain master (`redis://`, `rediss://`), a Sentinel group
//! (`redis+sentinel://`) or a Redis Cluster (`redis+cluster://`, its seeds and the URL each
//! shard master is reached with): read, checked, described and masked for logs.

use redis::{Client, ConnectionAddr};

use super::locate::{self, Addr};

/// Whether `url` names a member the proxy can reach: a master, or a Sentinel group.
pub fn check_url(url: &str) -> Result<(), String> {
    if !url.contains("://") {
        return Err(format!(
            "no scheme: write redis://{url} (or rediss://, redis+sentinel://, redis+cluster://)"
        ));
    }
    if let Some(cluster) = cluster_url(url) {
        return check_cluster(&cluster?);
    }
    let sentinel = locate::sentinel_url(url).transpose()?;
    let url = sentinel.as_ref().map_or(url, |s| s.master_url.as_str());
    Client::open(plain_url(url).as_str())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A backend URL with its password replaced, for logs and error messages.
pub fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

/// What kind of member `url` names, in words (for `--check-config`); the URL is valid.
pub fn describe_url(url: &str) -> String {
    if let Some(Ok(cluster)) = cluster_url(url) {
        return describe_cluster(&cluster);
    }
    match locate::sentinel_url(url) {
        Some(Ok(group)) => {
            let sentinels: Vec<String> = group.sentinels.iter().map(Addr::to_string).collect();
            format!(
                "Sentinel group '{}' ({} Sentinels: {}); the master they name, quarantined after each failover",
                group.service,
                sentinels.len(),
                sentinels.join(", ")
            )
        }
        _ => format!("single master {}", mask_url(url)),
    }
}

/// The address a plain master's URL names (`None` when it does not parse as one).
pub fn url_addr(url: &str) -> Option<Addr> {
    match Client::open(plain_url(url).as_str()).ok()?.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) => Some(Addr {
            host: host.clone(),
            port: *port,
        }),
        _ => None,
    }
}

/// The URL with `rediss://` read as `redis://` (the `redis` crate parses it; TLS is ours).
pub fn plain_url(url: &str) -> String {
    match url.strip_prefix("rediss://") {
        Some(rest) => format!("redis://{rest}"),
        None => url.to_owned(),
    }
}

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
    pub(crate) fn node_url(&self, addr: &Addr) -> String {
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
pub fn describe_cluster(url: &ClusterUrl) -> String {
    let seeds: Vec<String> = url.seeds.iter().map(Addr::to_string).collect();
    format!(
        "Redis Cluster (seeds: {}); each key goes to the shard serving its hash slot, a shard's new master quarantined after a failover",
        seeds.join(", ")
    )
}

/// Whether the shard masters' URLs (credentials) parse.
pub fn check_cluster(url: &ClusterUrl) -> Result<(), String> {
    check_url(&url.node_url(&url.seeds[0]))
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
