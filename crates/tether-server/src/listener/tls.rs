//! TLS for the network listeners: a certificate chain and its private key
//! (PEM files) made into a rustls server configuration with the `ring`
//! provider, TLS 1.2 and 1.3, HTTP/1.1 offered by ALPN.
//!
//! **Never belongs here:** where the files are named (the endpoint config,
//! `tether-cli`), and client certificates (not offered: callers prove who
//! they are with bearer tokens).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// The TLS side of a listener, ready to accept.
#[derive(Clone)]
pub struct Tls {
    pub(super) acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// Loads the certificate chain at `cert` and the private key at `key`
    /// (PEM). Every error names the file it is about.
    ///
    /// # Errors
    /// A file that cannot be read, holds no certificate (or no key), or a
    /// key that does not match the certificate.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Tls, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| format!("tls_cert {}: {e}", cert.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls_cert {}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!(
                "tls_cert {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
                cert.display()
            ));
        }
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| format!("tls_key {}: no usable PEM private key ({e})", key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| {
                format!(
                    "tls_key {} does not fit tls_cert {}: {e}",
                    key.display(),
                    cert.display()
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}
