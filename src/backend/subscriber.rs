//! A pattern subscription on one master: its own connection (a subscribed connection
//! carries messages, not replies), kept open with the same backoff as the request
//! connections. The proxy listens on every master for the release announcements of every
//! proxy (`crate::proxy::wait`).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::locate::Addr;
use crate::tls::Io;
use crate::wire::encode;

/// First and largest pause between reconnection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Where and how to reach the master.
#[derive(Clone)]
pub struct Target {
    /// Where the master is now (a Sentinel group's master moves in a failover).
    pub master: tokio::sync::watch::Receiver<Option<Addr>>,
    /// For a `rediss://` master: the connector (it verifies the host it connects to).
    pub tls: Option<TlsConnector>,
    /// `AUTH` credentials: user (if any) and password.
    pub credentials: Option<(Option<String>, String)>,
    /// Timeout for opening the connection and subscribing.
    pub connect_timeout: Duration,
}

/// Subscribes to `pattern` on the master for as long as `alive` says so, calling
/// `on_message(channel, payload)` for every message; reconnects after any failure.
pub async fn run(
    target: Target,
    pattern: &'static str,
    alive: impl Fn() -> bool + Send + 'static,
    on_message: impl Fn(&[u8], Bytes) + Send + 'static,
) {
    let mut backoff = BACKOFF.0;
    while alive() {
        let subscribed = tokio::time::timeout(target.connect_timeout, subscribe(&target, pattern)).await;
        match subscribed {
            Ok(Ok(stream)) => {
                backoff = BACKOFF.0;
                listen(stream, &alive, &on_message).await;
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "subscription failed"),
            Err(_) => tracing::debug!("subscription timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// Opens the connection, authenticates and subscribes.
async fn subscribe(target: &Target, pattern: &str) -> std::io::Result<Box<dyn Io>> {
    let Some(master) = target.master.borrow().clone() else {
        return Err(std::io::Error::other("no master known yet"));
    };
    let tcp = TcpStream::connect(master.to_string()).await?;
    tcp.set_nodelay(true)?;
    let mut stream: Box<dyn Io> = match &target.tls {
        None => Box::new(tcp),
        Some(connector) => Box::new(crate::tls::connect(connector, &master.host, tcp).await?),
    };
    let mut hello = BytesMut::new();
    if let Some(credentials) = &target.credentials {
        hello.extend_from_slice(&encode(super::auth_args(credentials).into_iter()));
    }
    hello.extend_from_slice(&encode([&b"PSUBSCRIBE"[..], pattern.as_bytes()].into_iter()));
    stream.write_all(&hello).await?;
    Ok(stream)
}

/// Reads messages until the connection fails or the proxy is gone.
async fn listen(mut stream: Box<dyn Io>, alive: &impl Fn() -> bool, on_message: &impl Fn(&[u8], Bytes)) {
    let mut buffer = BytesMut::with_capacity(4096);
    while alive() {
        match stream.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            match decode_bytes_mut(&mut buffer) {
                Ok(Some((BytesFrame::Array(items), _, _))) => deliver(items, on_message),
                // `+OK` to AUTH, the subscription's confirmation: nothing to do.
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// `pmessage pattern channel payload` → `on_message(channel, payload)`.
fn deliver(items: Vec<BytesFrame>, on_message: &impl Fn(&[u8], Bytes)) {
    if let [
        BytesFrame::BulkString(kind),
        _,
        BytesFrame::BulkString(channel),
        BytesFrame::BulkString(payload),
    ] = items.as_slice()
        && kind.as_ref() == b"pmessage"
    {
        on_message(channel, payload.clone());
    }
}
