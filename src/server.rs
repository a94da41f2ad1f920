//! The accept loop and graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use tokio_rustls::TlsAcceptor;

use crate::connection::Connection;
use crate::proxy::Proxy;
use crate::tls::Io;

/// How long, after a shutdown signal, connections may take to finish their requests in flight.
/// An acquisition takes at most two backend timeouts (fan-out, then undo): this is far more.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Accepts clients on `listener` until `shutdown` turns true; then stops accepting, lets every
/// connection finish the requests it has in flight (so no lock is left half-acquired: an
/// acquisition that fails still runs its undo), and returns once they are done or after
/// [`SHUTDOWN_GRACE`].
pub async fn run(
    listener: TcpListener,
    tls: Option<(TcpListener, TlsAcceptor)>,
    proxy: Arc<Proxy>,
    shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let mut stop = shutdown.clone();
    let seats = Arc::new(Semaphore::new(proxy.config.maxclients));
    loop {
        let (accepted, acceptor) = tokio::select! {
            accepted = listener.accept() => (accepted, None),
            Some((accepted, acceptor)) = accept_tls(tls.as_ref()) => (accepted, Some(acceptor)),
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                keepalive(&stream, proxy.config.tcp_keepalive);
                let Ok(seat) = seats.clone().try_acquire_owned() else {
                    // Over `maxclients`: told so and closed, before any buffer is allocated.
                    connections.spawn(refuse(stream));
                    continue;
                };
                let (proxy, shutdown) = (proxy.clone(), shutdown.clone());
                connections.spawn(async move {
                    let stream: Box<dyn Io> = match acceptor {
                        None => Box::new(stream),
                        Some(acceptor) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => Box::new(tls),
                                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                            }
                        }
                    };
                    if let Err(e) = Connection::new(stream, peer.to_string(), proxy, shutdown).run().await {
                        tracing::debug!(%peer, error = %e, "client connection ended with an error");
                    }
                    // The maxclients seat is held until the connection ends: moving it into
                    // this task and dropping it here is what frees it.
                    drop(seat);
                });
            }
            // Out of file descriptors and the like: keep serving the clients we have.
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    // Every client listed now stops; one listed later sees the shutdown flag itself.
    for client in proxy.clients.iter() {
        client.value().raise();
    }
    let open = connections.len();
    let finished = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    match finished {
        Ok(()) => tracing::info!(connections = open, "all connections finished their requests"),
        Err(_) => tracing::warn!(
            remaining = connections.len(),
            "shutdown grace over: closing connections"
        ),
    }
}

/// How long a TLS client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts on the TLS listener, if there is one (else never resolves).
/// `tcp_keepalive` seconds, as Redis sets it: the first probe after that long idle, then one
/// every third of it, three unanswered probes and the connection is dead. A client host that
/// vanished is noticed within about twice `tcp_keepalive`, and its session locks released.
fn keepalive(stream: &TcpStream, seconds: u64) {
    if seconds == 0 {
        return;
    }
    let every = std::time::Duration::from_secs(seconds);
    let probes = socket2::TcpKeepalive::new()
        .with_time(every)
        .with_interval((every / 3).max(std::time::Duration::from_secs(1)))
        .with_retries(3);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&probes) {
        tracing::debug!(error = %e, "cannot set TCP keepalive on a client connection");
    }
}

async fn accept_tls(
    tls: Option<&(TcpListener, TlsAcceptor)>,
) -> Option<(std::io::Result<(TcpStream, std::net::SocketAddr)>, TlsAcceptor)> {
    match tls {
        Some((listener, acceptor)) => Some((listener.accept().await, acceptor.clone())),
        None => std::future::pending().await,
    }
}

/// Tells a client over `maxclients` so, as Redis does, and closes its connection.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(b"-ERR max number of clients reached\r\n"),
    )
    .await;
}
