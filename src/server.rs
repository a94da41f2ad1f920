//! The accept loop and graceful shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connection::Connection;
use crate::proxy::Proxy;

/// Accepts clients on `listener` until `shutdown` turns true, then stops accepting.
/// Each client is served by its own task.
pub async fn run(listener: TcpListener, proxy: Arc<Proxy>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let connection = Connection::new(stream, proxy.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection.run().await {
                        tracing::debug!(%peer, error = %e, "client connection ended with an error");
                    }
                });
            }
            // Out of file descriptors and the like: keep serving the clients we have.
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}
