//! TLS with rustls: the proxy's own certificate for clients (`tls_listen`), and the CA that
//! `rediss://` masters are verified against.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::StartError;

/// A byte stream a client or master talks over: plain TCP or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The acceptor for `tls_listen`, from PEM files.
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, StartError> {
    let certs = read_certs(cert_file, "tls_cert_file")?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| StartError::Config(format!("tls_key_file: {}: {e}", key_file.display())))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| StartError::Config(format!("tls_cert_file/tls_key_file: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A connector that trusts the CAs in `ca_file` (PEM), for `rediss://` masters.
pub fn connector(ca_file: &Path) -> Result<TlsConnector, StartError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca_file, "tls_ca_file")? {
        roots
            .add(cert)
            .map_err(|e| StartError::Config(format!("tls_ca_file: {e}")))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| StartError::Config(format!("tls_ca_file: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Opens a TLS session to a master over `tcp`, verifying it is `host`.
pub async fn connect(connector: &TlsConnector, host: &str, tcp: TcpStream) -> std::io::Result<impl Io + use<>> {
    let name =
        ServerName::try_from(host.to_owned()).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    connector.connect(name, tcp).await
}

fn provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, StartError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| StartError::Config(format!("{field}: {}: {e}", path.display())))?
        .collect();
    let certs = certs.map_err(|e| StartError::Config(format!("{field}: {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(StartError::Config(format!(
            "{field}: {}: no certificate",
            path.display()
        )));
    }
    Ok(certs)
}
