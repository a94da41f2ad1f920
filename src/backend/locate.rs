//! Where a member's master is: a fixed address, or whichever master a Sentinel group names.
//!
//! A member given as `redis+sentinel://[user:pass@]s1:26379,s2:26379/mymaster[/db]` (or
//! `rediss+sentinel://` for TLS to Sentinels and masters alike) asks its Sentinels for the
//! current master of `mymaster` at start and then every probe interval, and moves its
//! connections when the answer changes. The move is a failover, and for Redlock a failover is
//! a restart with data loss (the promoted replica may lack the last writes: replication is
//! asynchronous), so the member is quarantined from the moment the proxy learns of it
//! ([`super::health::Health::switched`], rule 8).

use std::fmt;
use std::time::Duration;

use tokio_rustls::TlsConnector;

use super::pipeline::Pipeline;
use crate::reply::Reply;

/// A TCP address as Redis and Sentinel give it: host (a name or an IP) and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addr {
    /// Host name or IP, without brackets (also the name TLS verifies).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Addr {
    /// Reads `host:port` (or `[v6]:port`).
    pub fn parse(text: &str) -> Option<Addr> {
        let (host, port) = text.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return None;
        }
        Some(Addr {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

impl fmt::Display for Addr {
    /// `host:port`, with an IPv6 host in brackets: what a socket connects to.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A `redis+sentinel://` URL, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The Sentinels to ask, in order.
    pub sentinels: Vec<Addr>,
    /// The name the Sentinels monitor the master under.
    pub service: String,
    /// The same URL in the form the masters are reached with (`redis[s]://[user:pass@]h:p/db`,
    /// the first Sentinel standing in for the master): credentials, database and TLS are read
    /// from it as for a plain master.
    pub master_url: String,
}

/// Reads `redis+sentinel://` and `rediss+sentinel://` URLs; `None` for any other scheme,
/// an error for a malformed one.
pub fn sentinel_url(url: &str) -> Option<Result<SentinelUrl, String>> {
    let (scheme, rest) = split_scheme(url, "sentinel")?;
    Some(read_sentinel_url(scheme, rest))
}

/// `redis+<kind>://rest` or `rediss+<kind>://rest` → (`redis` or `rediss`, rest).
pub fn split_scheme<'a>(url: &'a str, kind: &str) -> Option<(&'static str, &'a str)> {
    let (scheme, rest) = url.split_once("://")?;
    match scheme.strip_suffix(kind)?.strip_suffix('+')? {
        "redis" => Some(("redis", rest)),
        "rediss" => Some(("rediss", rest)),
        _ => None,
    }
}

/// The parts of `[user:pass@]host:port[,host:port...][/path]`: the `user@` prefix to put
/// back in a master's URL (empty without credentials), the addresses, and the path.
pub fn split_hosts<'a>(rest: &'a str, what: &str) -> Result<(String, Vec<Addr>, &'a str), String> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let addrs = hosts
        .split(',')
        .map(|h| Addr::parse(h).ok_or_else(|| format!("'{h}' is not a host:port {what} address")))
        .collect::<Result<Vec<_>, _>>()?;
    let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    Ok((user, addrs, path))
}

fn read_sentinel_url(scheme: &str, rest: &str) -> Result<SentinelUrl, String> {
    let (user, sentinels, path) = split_hosts(rest, "Sentinel")?;
    let mut parts = path.splitn(2, '/');
    let service = parts.next().unwrap_or("");
    if service.is_empty() {
        return Err("the master's name is missing: redis+sentinel://host:port[,host:port...]/name[/db]".into());
    }
    let db = parts.next().filter(|db| !db.is_empty()).unwrap_or("0");
    Ok(SentinelUrl {
        master_url: format!("{scheme}://{user}{}/{db}", sentinels[0]),
        sentinels,
        service: service.to_owned(),
    })
}

/// Asks a Sentinel group for its current master, keeping one connection per Sentinel.
pub struct Sentinels {
    url: SentinelUrl,
    tls: Option<TlsConnector>,
    timeout: Duration,
    conns: Vec<Option<Pipeline>>,
    /// The Sentinel that answered last: asked first next time.
    preferred: usize,
}

impl Sentinels {
    /// The group `url` names, asked with `timeout` per Sentinel.
    pub fn new(url: SentinelUrl, tls: Option<TlsConnector>, timeout: Duration) -> Sentinels {
        Sentinels {
            conns: vec![None; url.sentinels.len()],
            url,
            tls,
            timeout,
            preferred: 0,
        }
    }

    /// The master the first Sentinel to answer names (`SENTINEL get-master-addr-by-name`).
    /// The connector checks with `ROLE` that it is one before using it: a Sentinel may be
    /// behind a failover.
    pub async fn master(&mut self) -> Result<Addr, String> {
        let mut last = String::from("no Sentinel configured");
        for i in 0..self.conns.len() {
            let at = (self.preferred + i) % self.conns.len();
            match tokio::time::timeout(self.timeout, self.ask(at)).await {
                Ok(Ok(addr)) => {
                    self.preferred = at;
                    return Ok(addr);
                }
                Ok(Err(e)) => last = format!("Sentinel {}: {e}", self.url.sentinels[at]),
                Err(_) => last = format!("Sentinel {}: timed out", self.url.sentinels[at]),
            }
            self.conns[at] = None;
        }
        Err(last)
    }

    async fn ask(&mut self, at: usize) -> Result<Addr, String> {
        if self.conns[at].is_none() {
            let sentinel = &self.url.sentinels[at];
            let tls = self.tls.as_ref().map(|c| (c, sentinel.host.as_str()));
            let conn = Pipeline::connect(&sentinel.to_string(), tls)
                .await
                .map_err(|e| e.to_string())?;
            self.conns[at] = Some(conn);
        }
        let Some(conn) = &self.conns[at] else {
            return Err("not connected".into());
        };
        let service = self.url.service.as_bytes();
        let reply = conn
            .command(&[b"SENTINEL", b"get-master-addr-by-name", service])
            .await
            .map_err(|e| e.to_string())?;
        master_of(&reply).ok_or_else(|| format!("no master named '{}' ({reply:?})", self.url.service))
    }
}

/// `[host, port]`, as Sentinel names a master.
fn master_of(reply: &Reply) -> Option<Addr> {
    let Reply::Array(items) = reply else { return None };
    let [Reply::Bulk(host), Reply::Bulk(port)] = items.as_slice() else {
        return None;
    };
    Some(Addr {
        host: String::from_utf8(host.to_vec()).ok()?,
        port: std::str::from_utf8(port).ok()?.parse().ok()?,
    })
}

/// Whether a `ROLE` reply says master (a demoted master says `slave`).
pub fn is_master(reply: &Reply) -> bool {
    matches!(reply, Reply::Array(items) if matches!(items.first(), Some(Reply::Bulk(role)) if &role[..] == b"master"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn sentinel_urls() {
        let url = sentinel_url("redis+sentinel://u:p@s1:26379,[::1]:26380/mymaster/3")
            .expect("sentinel scheme")
            .expect("valid");
        assert_eq!(url.service, "mymaster");
        assert_eq!(url.sentinels.len(), 2);
        assert_eq!(url.sentinels[1].host, "::1");
        assert_eq!(url.sentinels[1].to_string(), "[::1]:26380");
        assert_eq!(url.master_url, "redis://u:p@s1:26379/3");
        let tls = sentinel_url("rediss+sentinel://s1:26379/m")
            .expect("scheme")
            .expect("valid");
        assert_eq!(tls.master_url, "rediss://s1:26379/0");
        assert!(sentinel_url("redis://h:1").is_none());
        assert!(sentinel_url("redis+sentinel://s1:26379").expect("scheme").is_err());
        assert!(sentinel_url("redis+sentinel://s1/m").expect("scheme").is_err());
    }

    #[test]
    fn replies() {
        let addr = Reply::Array(vec![
            Reply::Bulk(Bytes::from("10.0.0.1")),
            Reply::Bulk(Bytes::from("6380")),
        ]);
        assert_eq!(master_of(&addr), Addr::parse("10.0.0.1:6380"));
        assert_eq!(master_of(&Reply::Nil), None);
        let master = Reply::Array(vec![Reply::Bulk(Bytes::from("master")), Reply::Int(0)]);
        assert!(is_master(&master));
        let replica = Reply::Array(vec![Reply::Bulk(Bytes::from("slave"))]);
        assert!(!is_master(&replica));
    }
}
